"""A data node's item metadata: taken with puts, copied with blobs, updated, paged for a rebuild.

Each blob's item metadata (``ItemMeta``: queue, priority, not-before, key, attempts, a dead
item's origin) is stored beside it in the same synced write batch (``datanode/store.py``). A
producer's put carries it; a copy to another node carries the copied items'; heartbeat
replies bring the master's changes (best effort: a lost reply loses them). A master that lost
its data dir reads it all back, page by page (``ListMeta``), to rebuild its queues.

Everything taken from the wire is checked (``blizzard/wire/item_meta.py``) before it is stored, so
bad metadata refuses the put (P7) and never reaches a rebuild.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from blizzard.wire import item_meta
from blizzard.wire import protocol as p
from blizzard.wire.errors import Forbidden, InvalidArgument
from datanode.store import BlobStore, ItemEntry

log = logging.getLogger(__name__)

MAX_PAGE = 5_000  # items in one MetaPage: each its own group stays far below a frame's elements
MAX_PAGE_BYTES = 4 * 1024 * 1024  # stored metadata in one page
READERS = ("node", "admin")  # roles that may page through the metadata of a secure node


def check_put(put: p.Put) -> None:
    """``InvalidArgument`` unless ``put.meta`` is one group without ids (a producer's: every
    id's), or groups each naming ids of the put, and every entry is valid."""
    if not put.meta:
        return
    if len(put.meta) == 1 and not put.meta[0].ids:
        item_meta.check(put.meta[0])
        return
    ids = set(put.ids)
    named = 0
    for meta in put.meta:
        item_meta.check(meta)
        named += len(meta.ids)
        if not meta.ids or named > len(ids) or not ids.issuperset(meta.ids):
            raise InvalidArgument("a put's metadata groups must each name ids of the put")


def for_put(put: p.Put) -> list[bytes | None] | None:
    """Each id's encoded metadata, as the store takes it (None: the put carries none)."""
    if not put.meta:
        return None
    if len(put.meta) == 1 and not put.meta[0].ids:
        return [item_meta.encode(put.meta[0])] * len(put.ids)  # one encoding for the put
    by_id: dict[int, bytes] = {}
    for meta in put.meta:
        by_id.update(dict.fromkeys(meta.ids, item_meta.encode(meta)))
    return [by_id.get(i) for i in put.ids]


def grouped(entries: list[ItemEntry | None] | list[ItemEntry]
            ) -> tuple[list[p.ItemMeta], list[int], list[int]]:
    """Entries as groups of consecutive items with equal metadata, plus their sizes and crcs
    in the groups' id order; an entry that does not decode is left out (and logged)."""
    metas: list[p.ItemMeta] = []
    sizes: list[int] = []
    crcs: list[int] = []
    last = b""
    for entry in entries:
        if entry is None:
            continue
        item_id, size, crc, raw = entry
        if raw != last or not metas:
            try:
                meta = item_meta.check(item_meta.decode(raw))
            except Exception as exc:  # damaged on disk: that item is left out, not the page
                log.error("metadata of item %d is unreadable (%s); leaving it out", item_id, exc)
                continue
            metas.append(meta)
            last = raw
        metas[-1].ids.append(item_id)
        sizes.append(size)
        crcs.append(crc)
    return metas, sizes, crcs


def for_copy(store: BlobStore, ids: list[int]) -> list[p.ItemMeta]:
    """The metadata groups a copy of ``ids`` to another node carries."""
    return grouped(store.metas_of(ids))[0]


def update(store: BlobStore, metas: list[p.ItemMeta]) -> None:
    """The master's changes from a heartbeat reply; an invalid group is skipped (and logged)."""
    for meta in metas:
        try:
            item_meta.check(meta)
        except InvalidArgument as exc:
            log.warning("ignoring a metadata update of %d items: %s", len(meta.ids), exc)
            continue
        store.update_metas(meta.ids, item_meta.encode(meta))


def page(store: BlobStore, msg: p.ListMeta, node_id: str, addr: str, cluster_id: str,
         role: Callable[[], str | None] | None) -> p.MetaPage:
    """One page of this node's item metadata from ``msg.start`` on (``role``: the asking
    peer's, on a secure node; only data node and admin keys may read it)."""
    if role is not None and role() not in READERS:
        raise Forbidden("only a data node or admin key may list item metadata")
    if not 1 <= msg.limit <= MAX_PAGE:
        raise InvalidArgument(f"a metadata page holds 1..{MAX_PAGE} items")
    entries = store.item_metas(msg.start, msg.limit, MAX_PAGE_BYTES)
    nxt = entries[-1][0] + 1 if entries else msg.start
    done = nxt > p.MAX_ID or not store.item_metas(nxt, 1, 1)
    metas, sizes, crcs = grouped(entries)
    return p.MetaPage(node_id, addr, cluster_id, store.id_hi, metas, sizes, crcs,
                      min(nxt, p.MAX_ID), done)
