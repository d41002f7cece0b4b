"""One contract for every BlobStore: LevelDB and the in-memory twin."""

from __future__ import annotations

import errno
import os
import zlib

import plyvel
import pytest

from blizzard.wire.errors import InvalidArgument
from datanode.store import LevelDbStore, MemoryStore, is_disk_full


@pytest.fixture(params=["leveldb", "memory"])
def store(request, tmp_path):
    s = LevelDbStore(str(tmp_path / "db")) if request.param == "leveldb" else MemoryStore()
    yield s
    s.close()


def put(store, items: dict[int, bytes]) -> None:
    store.put_many(list(items), list(items.values()), [zlib.crc32(b) for b in items.values()])


def test_put_get_delete(store):
    put(store, {1: b"one", 2: b"", 3: b"x" * 5000})
    assert store.get_many([3, 1, 2, 4]) == [(b"x" * 5000, zlib.crc32(b"x" * 5000)),
                                             (b"one", zlib.crc32(b"one")), (b"", 0), None]
    assert (store.count, store.bytes_used) == (3, 5003)
    store.delete_many([1, 99])
    assert store.get_many([1]) == [None]
    assert (store.count, store.bytes_used) == (2, 5000)
    assert list(store.ids()) == [2, 3]


def test_rewriting_an_id_does_not_count_twice(store):
    put(store, {1: b"abc"})
    put(store, {1: b"abcdef"})
    assert (store.count, store.bytes_used) == (1, 6)


def test_corrupt_blob_is_never_served(store):
    put(store, {1: b"payload", 2: b"other"})
    store.corrupt_for_test(1)
    assert store.get_many([1, 2]) == [None, (b"other", zlib.crc32(b"other"))]


def test_leveldb_survives_reopen(tmp_path):
    s = LevelDbStore(str(tmp_path / "db"))
    put(s, {10: b"a", 11: b"bb"})
    s.close()
    s = LevelDbStore(str(tmp_path / "db"))
    assert s.get_many([10, 11]) == [(b"a", zlib.crc32(b"a")), (b"bb", zlib.crc32(b"bb"))]
    assert (s.count, s.bytes_used) == (2, 3)
    s.close()


@pytest.mark.parametrize("bad", [-1, 2**63, 2**64 - 1])
def test_ids_the_key_format_cannot_hold_are_refused_and_change_nothing(store, bad):
    put(store, {1: b"one"})
    for call in (lambda: put(store, {bad: b"x"}), lambda: store.get_many([1, bad] * 5),
                 lambda: store.delete_many([1, bad])):
        with pytest.raises(InvalidArgument):
            call()
    assert store.get_many([1]) == [(b"one", zlib.crc32(b"one"))] and store.count == 1


def test_a_full_disk_is_told_by_errno_and_by_leveldb_s_text_of_that_errno():
    assert is_disk_full(OSError(errno.ENOSPC, "No space left on device"))
    assert is_disk_full(OSError(errno.EDQUOT, "Disk quota exceeded"))
    # plyvel.IOError has no errno: LevelDB writes "<file>: <strerror(errno)>"
    assert is_disk_full(plyvel.IOError(f"IO error: /d/000012.log: {os.strerror(errno.ENOSPC)}"
                                       .encode()))
    assert is_disk_full(plyvel.IOError(f"IO error: /d/MANIFEST: {os.strerror(errno.EDQUOT)}"
                                       .encode()))
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as exc:
            raise RuntimeError("wrapped") from exc
    except RuntimeError as wrapped:
        assert is_disk_full(wrapped)
    # an errno decides, whatever the text says; text counts only from plyvel
    assert not is_disk_full(OSError(errno.EIO, "No space left on device"))
    assert not is_disk_full(RuntimeError("No space left on device"))
    assert not is_disk_full(plyvel.IOError(b"IO error: /d/000012.log: Input/output error"))
    assert not is_disk_full(plyvel.CorruptionError(b"Corruption: bad block"))


def test_a_copy_is_one_entry_and_its_delete_removes_it(tmp_path):
    s = LevelDbStore(str(tmp_path / "db"))
    s.put_many([1, 2], [b"one", b"two"], [zlib.crc32(b"one"), zlib.crc32(b"two")],
               [b"meta-1", None])
    s.delete_many([2, 2, 7])  # an id named twice is counted once; an unknown id is ignored
    assert (s.count, s.bytes_used) == (1, 3)
    s.close()
    db = plyvel.DB(str(tmp_path / "db"))
    assert [k for k, _ in db.iterator(stop=b"\xff")] == [(1).to_bytes(8, "big")]
    db.close()


def _format_1(path, items: dict[int, tuple[bytes, bytes | None]]) -> None:
    """A store as 0.3 wrote it: CRC-32 + blob under the id, metadata apart under 0x81 + id."""
    db = plyvel.DB(path, create_if_missing=True)
    for item_id, (blob, meta) in items.items():
        key = item_id.to_bytes(8, "big")
        crc = zlib.crc32(blob)
        db.put(key, crc.to_bytes(4, "little") + blob)
        if meta is not None:
            db.put(b"\x81" + key, len(blob).to_bytes(4, "little") + crc.to_bytes(4, "little")
                   + meta)
    db.put(b"\xffmeta:cluster_id", b"c-1")
    db.close()


def _upgraded_as_expected(s: LevelDbStore, items: dict[int, tuple[bytes, bytes | None]]) -> None:
    ids = list(items)
    assert s.get_many(ids) == [(blob, zlib.crc32(blob)) for blob, _ in items.values()]
    assert s.metas_of(ids) == [None if meta is None else (i, len(blob), zlib.crc32(blob), meta)
                               for i, (blob, meta) in items.items()]
    assert (s.count, s.bytes_used, s.get_meta("cluster_id")) == (
        len(items), sum(len(blob) for blob, _ in items.values()), b"c-1")
    assert not list(s.db.iterator(start=b"\x81", stop=b"\x82"))  # no second entry is left


def test_a_store_of_format_1_is_moved_to_one_entry_per_copy_when_opened(tmp_path, monkeypatch):
    items = {i: (bytes([i]) * i, None if i % 3 == 0 else b"meta-%d" % i) for i in range(1, 8)}
    _format_1(str(tmp_path / "db"), items)
    monkeypatch.setattr("datanode.store.UPGRADE_BATCH", 3)  # several batches
    s = LevelDbStore(str(tmp_path / "db"))
    _upgraded_as_expected(s, items)
    s.delete_many([1])
    s.close()
    s = LevelDbStore(str(tmp_path / "db"))  # the second open moves nothing
    del items[1]
    _upgraded_as_expected(s, items)
    s.close()


def test_a_move_stopped_midway_goes_on_from_where_it_got(tmp_path):
    """Ids below the mark were moved (one entry each); the rest are still of format 1."""
    path = str(tmp_path / "db")
    items = {1: (b"a", b"m1"), 2: (b"bb", None), 3: (b"ccc", b"m3"), 4: (b"dddd", b"m4")}
    _format_1(path, {i: v for i, v in items.items() if i >= 3})
    db = plyvel.DB(path)
    for i in (1, 2):  # as format 2 writes them: CRC-32, the metadata's length, metadata, blob
        blob, meta = items[i]
        n = 0xFFFFFFFF if meta is None else len(meta)
        db.put(i.to_bytes(8, "big"), zlib.crc32(blob).to_bytes(4, "little")
               + n.to_bytes(4, "little") + (meta or b"") + blob)
    db.put(b"\xffmeta:upgraded_below", (3).to_bytes(8, "big"), sync=True)
    db.close()
    s = LevelDbStore(path)
    _upgraded_as_expected(s, items)
    assert s.get_meta("upgraded_below") is None and s.get_meta("format") == b"2"
    s.close()


def test_a_damaged_entry_is_refused_and_counted_not_served(store):
    put(store, {1: b"payload"})
    raw = store.blobs[1] if isinstance(store, MemoryStore) else store.db.get((1).to_bytes(8, "big"))
    cut = raw[:6]  # shorter than its head
    longer = raw[:4] + (10**6).to_bytes(4, "little") + raw[8:]  # its metadata past its end
    for bad in (cut, longer):
        if isinstance(store, MemoryStore):
            store.blobs[1] = bad
        else:
            store.db.put((1).to_bytes(8, "big"), bad)
        failures = store.checksum_failures
        assert store.get_many([1]) == [None] and store.checksum_failures == failures + 1
        assert store.metas_of([1]) == [None] and store.item_metas(0, 10, 10**6) == []
