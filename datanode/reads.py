"""A data node's reads: the blobs a ``Get`` asks for, each id once, up to a reply's size."""

from __future__ import annotations

from blizzard.wire import protocol as p
from blizzard.wire.errors import InvalidArgument
from datanode.grants import Gate
from datanode.store import BlobStore

MAX_REPLY_BYTES = 20 * 1024 * 1024  # blob bytes in one Get reply (plus at most one item over)
GET_SLICE = 256  # ids read from the store at a time while filling a reply


def read(store: BlobStore, msg: p.Get, gate: Gate | None, peer: bytes) -> p.Blobs:
    """The blobs asked for, each id once, up to ``MAX_REPLY_BYTES``.

    Ids past the cap are in neither ``ids`` nor ``missing``: the client asks again.
    """
    if not 1 <= len(msg.ids) <= p.MAX_BATCH:
        raise InvalidArgument("a get needs 1..10000 ids")
    if gate is not None:
        gate.check_get(msg, peer)
    wanted = list(dict.fromkeys(msg.ids))  # a repeated id is served once
    ids: list[int] = []
    blobs: list[bytes] = []
    crcs: list[int] = []
    missing: list[int] = []
    size = 0
    for start in range(0, len(wanted), GET_SLICE):  # read no more than the reply can take
        part = wanted[start:start + GET_SLICE]
        for item_id, found in zip(part, store.get_many(part), strict=True):
            if found is None:
                missing.append(item_id)
            elif size and size + len(found[0]) > MAX_REPLY_BYTES:
                return p.Blobs(ids, blobs, crcs, missing)
            else:
                ids.append(item_id)
                blobs.append(found[0])
                crcs.append(found[1])
                size += len(found[0])
    return p.Blobs(ids, blobs, crcs, missing)
