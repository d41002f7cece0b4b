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
