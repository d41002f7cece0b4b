"""Argument checks for master requests: each raises ``InvalidArgument`` with a clear message."""

from __future__ import annotations

import math

from blizzard.wire.errors import InvalidArgument, TooManyItems
from blizzard.wire.limits import PRIORITY_RANGE
from blizzard.wire.protocol import MAX_BATCH
from blizzard.wire.queue_settings import check_queue_name


def queue_name(name: str, what: str = "queue name") -> str:
    """The rule the client checks too (``blizzard.wire.queue_settings.check_queue_name``)."""
    return check_queue_name(name, what)


def batch(count: int, what: str = "items") -> None:
    if count < 1:
        raise InvalidArgument(f"a request needs at least one of its {what}")
    if count > MAX_BATCH:
        raise TooManyItems(f"{count} {what} in one request; at most {MAX_BATCH}")


def same_length(**lists: list) -> int:
    lengths = {name: len(v) for name, v in lists.items()}
    if len(set(lengths.values())) != 1:
        raise InvalidArgument(f"parallel lists differ in length: {lengths}")
    return next(iter(lengths.values()))


def seconds(value: float, name: str, *, low: float, high: float, low_ok: bool = True) -> float:
    if math.isnan(value) or value > high or value < low or (value == low and not low_ok):
        bound = ">=" if low_ok else ">"
        raise InvalidArgument(f"{name} must be {bound} {low:g} and <= {high:g} seconds, "
                              f"got {value!r}")
    return value


def priority(value: int) -> int:
    if not PRIORITY_RANGE[0] <= value <= PRIORITY_RANGE[1]:
        raise InvalidArgument(f"priority {value} is outside the 32-bit signed range")
    return value


def checksum(value: int) -> int:
    if not 0 <= value < 2**32:
        raise InvalidArgument(f"checksum {value} is not a CRC-32 value")
    return value


MAX_REQUEST_ID = 128
MAX_NODE_ID = 64
MAX_NODE_LIST = 64


def request_id(value: str) -> str:
    if len(value) > MAX_REQUEST_ID:
        raise InvalidArgument(f"a request id is at most {MAX_REQUEST_ID} characters")
    return value


def node_id(value: str) -> str:
    if not value or len(value) > MAX_NODE_ID or not value.isprintable() or " " in value:
        raise InvalidArgument(f"node id {value[:40]!r} must be 1-{MAX_NODE_ID} printable "
                              "characters without spaces")
    return value


def node_ids(values: list[str], what: str) -> list[str]:
    if len(values) > MAX_NODE_LIST:
        raise InvalidArgument(f"{what} lists {len(values)} nodes; at most {MAX_NODE_LIST}")
    if values and max(map(len, values)) > MAX_NODE_ID:
        raise InvalidArgument(f"{what}: a node id is at most {MAX_NODE_ID} characters")
    return values


ERROR_SHOWN = 2_000  # characters of an error in a reply, at most ...
ERROR_BYTES = 4 * 1024 * 1024  # ... and a reply's errors together (a character: 4 bytes)


def error_cut(n: int) -> int:
    """Characters of each of ``n`` errors a reply shows, so all fit in ``ERROR_BYTES``."""
    return min(ERROR_SHOWN, max(100, ERROR_BYTES // (4 * max(1, n))))
