"""Item metadata kept beside a blob: its checks and the bytes a data node stores.

A producer's put, a copy between nodes, a master's update and a rebuilding master's page all
carry ``ItemMeta``; whoever takes one checks it here first (P7), so a node never stores
metadata a master would refuse, and a rebuild never takes a damaged entry on trust.
"""

from __future__ import annotations

import math

from blizzard.wire import protocol as p
from blizzard.wire.errors import InvalidArgument, ProtocolError
from blizzard.wire.limits import MAX_KEY, PRIORITY_RANGE
from blizzard.wire.queue_settings import check_queue_name

MAX_ATTEMPTS = 2**31 - 1
MAX_NOT_BEFORE = 2.0**40  # unix seconds: far beyond any delay the master allows


def check(meta: p.ItemMeta) -> p.ItemMeta:
    """``meta`` if every field is one the master could have written, else ``InvalidArgument``."""
    check_queue_name(meta.queue, "an item's queue")
    if meta.origin:
        check_queue_name(meta.origin, "a dead item's origin")
    if not PRIORITY_RANGE[0] <= meta.priority <= PRIORITY_RANGE[1]:
        raise InvalidArgument(f"priority {meta.priority} is outside the 32-bit signed range")
    if not (math.isfinite(meta.not_before) and 0 <= meta.not_before <= MAX_NOT_BEFORE):
        raise InvalidArgument(f"not_before {meta.not_before!r} is not a unix time")
    if len(meta.key) > MAX_KEY:
        raise InvalidArgument(f"a key is at most {MAX_KEY} characters")
    if not 0 <= meta.attempts <= MAX_ATTEMPTS:
        raise InvalidArgument(f"attempts {meta.attempts} out of range")
    return meta


def encode(meta: p.ItemMeta) -> bytes:
    """The bytes stored per item (the same for every id of a group: made once per group)."""
    return p.pack(p.replace(meta, ids=[]) if meta.ids else meta)


def decode(raw: bytes) -> p.ItemMeta:
    """Inverse of ``encode``; ``ProtocolError`` if the bytes are damaged or not an ItemMeta."""
    meta = p.unpack(raw)
    if not isinstance(meta, p.ItemMeta):
        raise ProtocolError(f"stored metadata holds a {p.op_name(meta)}")
    return meta


def same(meta: p.ItemMeta) -> tuple[str, int, float, str, int, str]:
    """What two items must share to be listed in one group: every field but the ids."""
    return (meta.queue, meta.priority, meta.not_before, meta.key, meta.attempts, meta.origin)
