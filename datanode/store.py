"""Blob stores: the durable LevelDB one and an in-memory twin with the same contract.

A blob is kept with the CRC-32 it was written with; ``get_many`` re-checks it on every read
and reports a mismatch as corrupt rather than serving bad bytes (P5). Beside each blob, in
the same write batch, a store keeps the item's metadata (opaque bytes here, an encoded
``ItemMeta``: see ``datanode/meta.py``) with the blob's size and checksum, so a master that
lost its data dir can rebuild its queues from a page through the metadata alone; it is
deleted with the blob. The store also keeps the highest id it ever stored (P4 after a rebuild).
"""

from __future__ import annotations

import errno
import logging
import os
import struct
import time
import zlib
from collections.abc import Iterator
from itertools import repeat
from typing import Protocol

import plyvel

from blizzard.host.fd_limits import leveldb_open_files
from blizzard.wire.errors import InvalidArgument
from blizzard.wire.protocol import MAX_ID

log = logging.getLogger(__name__)

_KEY = struct.Struct(">Q")
_CRC = struct.Struct("<I")
# Blob keys are ids below 2**63, so their first byte is below 0x80; item metadata lives under
# 0x81 + id, the node's own facts (the cluster it joined) under keys from 0xff on, outside
# every scan of blobs.
_BLOBS_END = b"\x80"
_ITEM = b"\x81"
_ITEMS_END = b"\x82"
_META = b"\xffmeta:"
_ID_HI = _META + b"id_hi"  # above every id ever stored, deleted ones too
_SIZE_CRC = struct.Struct("<II")  # before an item's metadata: its blob's size and CRC-32

ItemEntry = tuple[int, int, int, bytes]  # (id, blob size, CRC-32, metadata)


def _id_range(ids: list[int]) -> tuple[int, int]:
    """The lowest and highest id; refuses ids the key format cannot hold (the codec refuses
    them first, and a store checks too)."""
    if not ids:
        return 0, -1
    lo, hi = min(ids), max(ids)
    if lo < 0 or hi > MAX_ID:
        raise InvalidArgument(f"item ids must lie in 0..{MAX_ID}")
    return lo, hi


class BlobStore(Protocol):
    """What a data node needs from storage."""

    def put_many(self, ids: list[int], blobs: list[bytes], crcs: list[int],
                 metas: list[bytes | None] | None = None) -> None:
        """Store every blob durably (one atomic, fsynced batch) or raise; ``metas[k]`` (if
        given and not None) is kept as ``ids[k]``'s metadata in the same batch."""

    def get_many(self, ids: list[int]) -> list[tuple[bytes, int] | None]:
        """(blob, crc) for each id, or None where absent or failing its checksum."""

    def delete_many(self, ids: list[int]) -> None:
        """Forget these blobs; unknown ids are ignored."""

    def ids(self) -> Iterator[int]:
        """Every stored id, ascending."""

    def item_metas(self, start: int, limit: int, max_bytes: int) -> list[ItemEntry]:
        """Items with metadata from id ``start`` on, ascending: at most ``limit`` of them and
        about ``max_bytes`` of metadata."""

    def metas_of(self, ids: list[int]) -> list[ItemEntry | None]:
        """Each id's entry, or None where it has no metadata."""

    def update_metas(self, ids: list[int], meta: bytes) -> int:
        """Replace the metadata of those ids that have some (not synced: best effort); how many."""

    @property
    def id_hi(self) -> int:
        """Above every id ever stored here."""

    def get_meta(self, name: str) -> bytes | None:
        """A fact about the node kept with its blobs (e.g. ``cluster_id``); None if never set."""

    def put_meta(self, name: str, value: bytes) -> None:
        """Keep a fact durably (synced) before the call returns."""

    def reopen(self) -> None:
        """Open the storage again after it failed for want of file descriptors."""

    checksum_failures: int  # reads that found a blob failing its checksum, since the start

    @property
    def count(self) -> int: ...

    @property
    def bytes_used(self) -> int: ...

    def close(self) -> None: ...


DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
# plyvel raises ``plyvel.IOError`` with LevelDB's status text and no errno: LevelDB spells a
# failed call "IO error: <file>: <strerror(errno)>", so its errno is known by that text
_DISK_FULL_TEXTS = tuple(os.strerror(e) for e in DISK_FULL)


def is_disk_full(exc: BaseException | None) -> bool:
    """Whether a store's failed write (``exc``, or what caused it) ran out of space or quota
    (ENOSPC, EDQUOT): the node refuses writes and goes on serving reads, where any other
    storage error stops it."""
    for _ in range(8):  # a bounded walk down the chain of causes
        if exc is None:
            return False
        code = getattr(exc, "errno", None)
        if code is not None:
            return code in DISK_FULL
        if isinstance(exc, plyvel.Error) and any(t in str(exc) for t in _DISK_FULL_TEXTS):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _checked(item_id: int, raw: bytes | None, store: BlobStore) -> tuple[bytes, int] | None:
    if raw is None or len(raw) < _CRC.size:
        return None
    (crc,) = _CRC.unpack_from(raw)
    blob = raw[_CRC.size:]
    if zlib.crc32(blob) != crc:
        log.error("blob %d fails its checksum; not serving it", item_id)
        store.checksum_failures += 1
        return None
    return blob, crc


WRITE_BUFFER_BYTES = 64 * 1024 * 1024
FAULT_WRITE_DELAY_ENV = "BLIZZARD_FAULT_WRITE_DELAY_S"


def fault_write_delay_s() -> float:
    """A slow disk, for tests and benchmarks only (``scripts/bench --faults``): the seconds
    ``BLIZZARD_FAULT_WRITE_DELAY_S`` asks a store to sleep before each synced write of blobs,
    0 when unset. A data node started with it answers every put that much later while it stays
    alive, which a paused or killed node cannot show. Not an operator's setting, so it is no
    option of the CLI."""
    return max(0.0, float(os.environ.get(FAULT_WRITE_DELAY_ENV) or 0))


class LevelDbStore:
    """Blobs in one LevelDB, keyed by big-endian id, value = crc32 + bytes."""

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            self.db = self._open()
        except plyvel.IOError as exc:
            if "lock" not in str(exc):
                raise
            raise OSError(f"the store in {path} is in use by another process (is a data node "
                          "already running on this data dir?)") from None
        self.reopening = False  # closed by ``reopen``, not open again yet
        self._count = 0
        self._bytes = 0
        self.checksum_failures = 0
        self.write_delay_s = fault_write_delay_s()  # read once: 0 costs one test a write
        self._max_id = -1  # ids only grow: a put above this cannot overwrite anything
        for key, value in self.db.iterator(stop=_BLOBS_END):
            self._count += 1
            self._bytes += len(value) - _CRC.size
            self._max_id = _KEY.unpack(key)[0]
        kept = self.db.get(_ID_HI)
        self._id_hi = max(self._max_id + 1, _KEY.unpack(kept)[0] if kept else 0)

    def _open(self) -> plyvel.DB:
        # A large memtable means fewer level-0 files and so fewer compactions competing with
        # the synced writes of a node that holds a big backlog (LevelDB's default is 4 MiB);
        # the table cache stays within the descriptors kept for files (blizzard/host/fd_limits.py).
        return plyvel.DB(self.path, create_if_missing=True, write_buffer_size=WRITE_BUFFER_BYTES,
                         max_open_files=leveldb_open_files())

    def reopen(self) -> None:
        """Close and open the LevelDB again, after it failed for want of file descriptors:
        LevelDB keeps the error of a failed background write (a compaction that could open
        no file) and refuses every write after it until it is reopened. Raises if the open
        fails; writes then raise EMFILE until a later ``reopen`` succeeds."""
        self.reopening = True
        self.db.close()
        self.db = self._open()
        self.reopening = False

    def put_many(self, ids: list[int], blobs: list[bytes], crcs: list[int],
                 metas: list[bytes | None] | None = None) -> None:
        _id_range(ids)
        if self.reopening:
            raise OSError(errno.EMFILE, "the store is closed until it can be opened again "
                          "(it ran out of file descriptors)")
        added = count = 0
        get = self.db.get
        top = self._max_id
        size_crc = _SIZE_CRC.pack
        if self.write_delay_s:
            time.sleep(self.write_delay_s)
        with self.db.write_batch(sync=True) as wb:
            every_meta = metas or repeat(None)  # none given: None for each (repeat outlasts ids)
            for item_id, blob, crc, meta in zip(ids, blobs, crcs, every_meta, strict=False):
                key = _KEY.pack(item_id)
                if meta is not None:
                    wb.put(_ITEM + key, size_crc(len(blob), crc) + meta)
                # a retried put must not count twice; only an id seen before can be a retry
                old = get(key) if item_id <= top else None
                if old is None:
                    count += 1
                    added += len(blob)
                else:
                    added += len(blob) - (len(old) - _CRC.size)
                wb.put(key, _CRC.pack(crc) + blob)
                top = max(top, item_id)
            if top >= self._id_hi:
                wb.put(_ID_HI, _KEY.pack(top + 1))
        self._id_hi = max(self._id_hi, top + 1)
        self._count += count
        self._bytes += added
        self._max_id = top

    def get_many(self, ids: list[int]) -> list[tuple[bytes, int] | None]:
        lo, hi = _id_range(ids)
        if len(ids) > 8 and hi - lo < 2 * len(ids):  # dense (a leased batch mostly is): one scan
            found = {_KEY.unpack(k)[0]: v for k, v in  # beats many seeks
                     self.db.iterator(start=_KEY.pack(lo), stop=_KEY.pack(hi + 1))}
            return [_checked(i, found.get(i), self) for i in ids]
        get = self.db.get
        return [_checked(i, get(_KEY.pack(i)), self) for i in ids]

    def delete_many(self, ids: list[int]) -> None:
        _id_range(ids)
        with self.db.write_batch() as wb:
            for item_id in ids:
                key = _KEY.pack(item_id)
                raw = self.db.get(key)
                if raw is not None:
                    wb.delete(key)
                    wb.delete(_ITEM + key)
                    self._count -= 1
                    self._bytes -= len(raw) - _CRC.size

    def ids(self) -> Iterator[int]:
        for key in self.db.iterator(include_value=False, stop=_BLOBS_END):
            yield _KEY.unpack(key)[0]

    def item_metas(self, start: int, limit: int, max_bytes: int) -> list[ItemEntry]:
        _id_range([start])
        out: list[ItemEntry] = []
        size = 0
        for key, value in self.db.iterator(start=_ITEM + _KEY.pack(start), stop=_ITEMS_END):
            if len(out) >= limit or (out and size + len(value) > max_bytes):
                break
            out.append(_entry(_KEY.unpack_from(key, 1)[0], value))
            size += len(value)
        return out

    def metas_of(self, ids: list[int]) -> list[ItemEntry | None]:
        _id_range(ids)
        get = self.db.get
        return [None if (raw := get(_ITEM + _KEY.pack(i))) is None else _entry(i, raw)
                for i in ids]

    def update_metas(self, ids: list[int], meta: bytes) -> int:
        _id_range(ids)
        changed = 0
        with self.db.write_batch() as wb:
            for item_id in ids:
                key = _ITEM + _KEY.pack(item_id)
                raw = self.db.get(key)
                if raw is not None:
                    wb.put(key, raw[:_SIZE_CRC.size] + meta)
                    changed += 1
        return changed

    @property
    def id_hi(self) -> int:
        return self._id_hi

    def get_meta(self, name: str) -> bytes | None:
        return self.db.get(_META + name.encode())

    def put_meta(self, name: str, value: bytes) -> None:
        self.db.put(_META + name.encode(), value, sync=True)

    def corrupt_for_test(self, item_id: int) -> None:
        """Flip a payload byte in place (test hook for the checksum path)."""
        key = _KEY.pack(item_id)
        raw = bytearray(self.db.get(key))
        raw[-1] ^= 0xFF
        self.db.put(key, bytes(raw), sync=True)

    @property
    def count(self) -> int:
        return self._count

    @property
    def bytes_used(self) -> int:
        return self._bytes

    def close(self) -> None:
        self.db.close()


def _entry(item_id: int, raw: bytes) -> ItemEntry:
    size, crc = _SIZE_CRC.unpack_from(raw)
    return item_id, size, crc, raw[_SIZE_CRC.size:]


class MemoryStore:
    """The in-memory twin of ``LevelDbStore`` for unit tests."""

    def __init__(self) -> None:
        self.blobs: dict[int, bytes] = {}
        self.items: dict[int, bytes] = {}  # id -> size, crc and metadata
        self.meta: dict[str, bytes] = {}
        self.checksum_failures = 0
        self.id_hi = 0

    def put_many(self, ids: list[int], blobs: list[bytes], crcs: list[int],
                 metas: list[bytes | None] | None = None) -> None:
        _id_range(ids)
        every_meta = metas or [None] * len(ids)
        for item_id, blob, crc, meta in zip(ids, blobs, crcs, every_meta, strict=True):
            self.blobs[item_id] = _CRC.pack(crc) + blob
            if meta is not None:
                self.items[item_id] = _SIZE_CRC.pack(len(blob), crc) + meta
            self.id_hi = max(self.id_hi, item_id + 1)

    def get_many(self, ids: list[int]) -> list[tuple[bytes, int] | None]:
        _id_range(ids)
        return [_checked(i, self.blobs.get(i), self) for i in ids]

    def delete_many(self, ids: list[int]) -> None:
        _id_range(ids)
        for item_id in ids:
            self.blobs.pop(item_id, None)
            self.items.pop(item_id, None)

    def ids(self) -> Iterator[int]:
        return iter(sorted(self.blobs))

    def item_metas(self, start: int, limit: int, max_bytes: int) -> list[ItemEntry]:
        _id_range([start])
        out: list[ItemEntry] = []
        size = 0
        for item_id in sorted(i for i in self.items if i >= start):
            raw = self.items[item_id]
            if len(out) >= limit or (out and size + len(raw) > max_bytes):
                break
            out.append(_entry(item_id, raw))
            size += len(raw)
        return out

    def metas_of(self, ids: list[int]) -> list[ItemEntry | None]:
        _id_range(ids)
        return [_entry(i, self.items[i]) if i in self.items else None for i in ids]

    def update_metas(self, ids: list[int], meta: bytes) -> int:
        _id_range(ids)
        changed = [i for i in ids if i in self.items]
        for item_id in changed:
            self.items[item_id] = self.items[item_id][:_SIZE_CRC.size] + meta
        return len(changed)

    def get_meta(self, name: str) -> bytes | None:
        return self.meta.get(name)

    def put_meta(self, name: str, value: bytes) -> None:
        self.meta[name] = value

    def reopen(self) -> None:
        pass

    def corrupt_for_test(self, item_id: int) -> None:
        raw = bytearray(self.blobs[item_id])
        raw[-1] ^= 0xFF
        self.blobs[item_id] = bytes(raw)

    @property
    def count(self) -> int:
        return len(self.blobs)

    @property
    def bytes_used(self) -> int:
        return sum(len(v) - _CRC.size for v in self.blobs.values())

    def close(self) -> None:
        pass
