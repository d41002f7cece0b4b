"""Item metadata on a data node: kept beside blobs (both stores), checked, grouped, paged."""

from __future__ import annotations

import zlib

import pytest

from blizzard.wire import item_meta
from blizzard.wire import protocol as p
from blizzard.wire.errors import Forbidden, InvalidArgument
from datanode import meta
from datanode.store import LevelDbStore, MemoryStore

Q = p.ItemMeta([], "jobs", 1, 0.0, "", 0, "")


@pytest.fixture(params=["leveldb", "memory"])
def store(request, tmp_path):
    s = LevelDbStore(str(tmp_path / "db")) if request.param == "leveldb" else MemoryStore()
    yield s
    s.close()


def put(store, items: dict[int, bytes], m: p.ItemMeta | None = Q) -> None:
    raw = item_meta.encode(m) if m is not None else None
    store.put_many(list(items), list(items.values()), [zlib.crc32(b) for b in items.values()],
                   [raw] * len(items))


def test_metadata_is_kept_with_size_and_crc_and_goes_with_the_blob(store):
    put(store, {1: b"one", 2: b"", 5: b"five"})
    put(store, {3: b"bare"}, None)  # a put without metadata (an older client's)
    assert store.item_metas(0, 10, 10**6) == [
        (1, 3, zlib.crc32(b"one"), item_meta.encode(Q)), (2, 0, 0, item_meta.encode(Q)),
        (5, 4, zlib.crc32(b"five"), item_meta.encode(Q))]
    assert [e and e[0] for e in store.metas_of([5, 3, 9])] == [5, None, None]
    store.delete_many([1, 5])
    assert [e[0] for e in store.item_metas(0, 10, 10**6)] == [2]
    assert store.id_hi == 6  # deleted ids stay below it


def test_pages_are_bounded_by_count_and_bytes(store):
    put(store, {i: b"x" for i in range(1, 11)})
    assert [e[0] for e in store.item_metas(4, 3, 10**6)] == [4, 5, 6]
    one = len(store.item_metas(1, 1, 10**6)[0][3]) + 8
    assert [e[0] for e in store.item_metas(1, 10, 2 * one)] == [1, 2]
    assert [e[0] for e in store.item_metas(1, 10, 1)] == [1]  # one at least


def test_updates_change_only_items_that_have_metadata(store):
    put(store, {1: b"a", 2: b"b"})
    dead = p.ItemMeta([], "jobs.dead", 1, 0.0, "", 3, "jobs")
    assert store.update_metas([2, 7], item_meta.encode(dead)) == 1
    assert store.metas_of([1, 2, 7])[1] == (2, 1, zlib.crc32(b"b"), item_meta.encode(dead))
    assert store.metas_of([7]) == [None]


def test_leveldb_keeps_the_id_high_water_after_every_blob_is_deleted(tmp_path):
    s = LevelDbStore(str(tmp_path / "db"))
    put(s, {10: b"a", 41: b"b"})
    s.delete_many([10, 41])
    s.close()
    s = LevelDbStore(str(tmp_path / "db"))
    assert (s.id_hi, s.item_metas(0, 10, 10**6), list(s.ids())) == (42, [], [])
    s.close()


def test_grouping_joins_neighbours_with_equal_metadata_and_skips_damage(store):
    put(store, {1: b"a", 2: b"b"})
    put(store, {3: b"c"}, p.ItemMeta([], "other", 0, 5.0, "k", 2, ""))
    put(store, {4: b"d"})
    store.put_many([6], [b"e"], [zlib.crc32(b"e")], [b"\x93garbage"])
    metas, sizes, crcs = meta.grouped(store.item_metas(0, 10, 10**6))
    assert [(m.ids, m.queue) for m in metas] == [([1, 2], "jobs"), ([3], "other"), ([4], "jobs")]
    assert sizes == [1, 1, 1, 1] and crcs == [zlib.crc32(x) for x in (b"a", b"b", b"c", b"d")]


def test_a_page_says_who_and_where_and_refuses_bad_requests(store):
    put(store, {i: b"x" for i in range(1, 8)})
    page = meta.page(store, p.ListMeta(3, 2), "dn-a", "tcp://h:1", "c1", None)
    assert (page.node_id, page.cluster_id, page.metas[0].ids, page.next, page.done) == \
        ("dn-a", "c1", [3, 4], 5, False)
    last = meta.page(store, p.ListMeta(5, 100), "dn-a", "tcp://h:1", "c1", lambda: "admin")
    assert (last.metas[0].ids, last.done, last.id_hi) == ([5, 6, 7], True, 8)
    for limit in (0, meta.MAX_PAGE + 1):
        with pytest.raises(InvalidArgument):
            meta.page(store, p.ListMeta(0, limit), "dn-a", "tcp://h:1", "c1", None)
    with pytest.raises(Forbidden):
        meta.page(store, p.ListMeta(0, 10), "dn-a", "tcp://h:1", "c1", lambda: "client")


def _put(*metas: p.ItemMeta) -> p.Put:
    return p.Put([1, 2], [b"a", b"b"], [zlib.crc32(b"a"), zlib.crc32(b"b")], [], 1, "", True,
                 None, list(metas))


@pytest.mark.parametrize("metas", [
    [p.ItemMeta([3], "q", 0, 0.0, "", 0, "")],  # an id the put does not carry
    [p.ItemMeta([], "q", 0, 0.0, "", 0, ""), p.ItemMeta([], "q", 0, 0.0, "", 0, "")],
    [p.ItemMeta([1, 1, 2], "q", 0, 0.0, "", 0, "")],  # more ids than the put's
    [p.ItemMeta([], "no spaces", 0, 0.0, "", 0, "")],
    [p.ItemMeta([], "q", 2**31, 0.0, "", 0, "")],
    [p.ItemMeta([], "q", 0, float("inf"), "", 0, "")],
    [p.ItemMeta([], "q", 0, -1.0, "", 0, "")],
    [p.ItemMeta([], "q", 0, 0.0, "k" * 257, 0, "")],
    [p.ItemMeta([], "q", 0, 0.0, "", -1, "")],
    [p.ItemMeta([], "q", 0, 0.0, "", 0, "bad origin")],
], ids=["foreign-id", "two-without-ids", "too-many-ids", "queue", "priority", "inf", "negative",
        "key", "attempts", "origin"])
def test_bad_metadata_refuses_the_put(metas):
    with pytest.raises(InvalidArgument):
        meta.check_put(_put(*metas))


def test_a_puts_metadata_per_id():
    shared = p.ItemMeta([], "q", 0, 0.0, "", 0, "")
    assert meta.for_put(_put()) is None
    assert meta.for_put(_put(shared)) == [item_meta.encode(shared)] * 2
    one = p.ItemMeta([2], "q", 0, 0.0, "", 4, "")
    meta.check_put(_put(one))
    assert meta.for_put(_put(one)) == [None, item_meta.encode(one)]


def test_copies_carry_the_stored_metadata_and_updates_skip_bad_groups(store):
    put(store, {1: b"a", 2: b"b"})
    meta.update(store, [p.ItemMeta([2], "q", 0, 0.0, "", 1, ""),
                        p.ItemMeta([1], "bad queue", 0, 0.0, "", 9, "")])
    assert [(m.ids, m.queue, m.attempts) for m in meta.for_copy(store, [1, 2, 3])] == \
        [([1], "jobs", 0), ([2], "q", 1)]
