"""Blob stores: the durable LevelDB one and an in-memory twin with the same contract.

A blob is kept with the CRC-32 it was written with; ``get_many`` re-checks it on every read
and reports a mismatch as corrupt rather than serving bad bytes (P5). With each blob, in the
same entry, a store keeps the item's metadata (opaque bytes here, an encoded ``ItemMeta``: see
``datanode/meta.py``), so a master that lost its data dir can rebuild its queues from a page
through the metadata; it goes with the blob. One entry per copy: a put writes one key, a
delete removes one (stores written before 0.4 kept the metadata under a second key and are
moved to one entry when first opened: ``LevelDbStore._upgrade``). The store also keeps the
highest id it ever stored (P4 after a rebuild).
"""

from __future__ import annotations

import errno
import logging
import os
import struct
import time
import zlib
from collections.abc import Iterator
from itertools import islice, repeat
from typing import Protocol

import plyvel

from blizzard.host.fd_limits import leveldb_open_files
from blizzard.wire.errors import InvalidArgument
from blizzard.wire.protocol import MAX_ID

log = logging.getLogger(__name__)

_KEY = struct.Struct(">Q")
# A copy's entry: the blob's CRC-32, the metadata's length (NO_META: none), the metadata, the
# blob. Blob keys are ids below 2**63, so their first byte is below 0x80; the node's own facts
# (the cluster it joined) live under keys from 0xff on, outside every scan of blobs.
_HEAD = struct.Struct("<II")
NO_META = 0xFFFFFFFF
_BLOBS_END = b"\x80"
_META = b"\xffmeta:"
_ID_HI = _META + b"id_hi"  # above every id ever stored, deleted ones too
_FORMAT = _META + b"format"  # b"2": one entry per copy
FORMAT = b"2"
# Format 1 (before 0.4): an entry of CRC-32 and blob, and the metadata apart under 0x81 + id,
# after the blob's size and CRC-32. While a store moves to format 2, ids below _UPGRADED are.
_CRC = struct.Struct("<I")
_ITEM = b"\x81"
_ITEMS_END = b"\x82"
_SIZE_CRC = struct.Struct("<II")
_UPGRADED = _META + b"upgraded_below"
UPGRADE_BATCH = 10_000  # entries moved per synced batch

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


def _entry_value(crc: int, blob: bytes, meta: bytes | None) -> bytes:
    if meta is None:
        return _HEAD.pack(crc, NO_META) + blob
    return b"".join((_HEAD.pack(crc, len(meta)), meta, blob))


def _blob_at(raw: bytes) -> int:
    """Where an entry's blob begins; past its end if the entry is damaged."""
    if len(raw) < _HEAD.size:
        return len(raw) + 1
    n = _HEAD.unpack_from(raw)[1]
    return _HEAD.size if n == NO_META else _HEAD.size + n


def _blob_size(raw: bytes) -> int:
    return max(0, len(raw) - _blob_at(raw))


def _entry(item_id: int, raw: bytes) -> ItemEntry | None:
    """An entry's (id, blob size, CRC-32, metadata); None if it has no metadata (or is damaged)."""
    if len(raw) < _HEAD.size:
        return None
    crc, n = _HEAD.unpack_from(raw)
    end = _HEAD.size + n
    if n == NO_META or end > len(raw):
        return None
    return item_id, len(raw) - end, crc, raw[_HEAD.size:end]


def _checked(item_id: int, raw: bytes | None, store: BlobStore) -> tuple[bytes, int] | None:
    if raw is None:
        return None
    start = _blob_at(raw)
    if start > len(raw):
        log.error("blob %d is damaged (its entry is cut short); not serving it", item_id)
        store.checksum_failures += 1
        return None
    crc = _HEAD.unpack_from(raw)[0]
    blob = raw[start:]
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
        self._upgrade()
        for key, value in self.db.iterator(stop=_BLOBS_END):
            self._count += 1
            self._bytes += _blob_size(value)
            self._max_id = _KEY.unpack(key)[0]
        kept = self.db.get(_ID_HI)
        self._id_hi = max(self._max_id + 1, _KEY.unpack(kept)[0] if kept else 0)

    def _open(self) -> plyvel.DB:
        # A large memtable means fewer level-0 files and so fewer compactions competing with
        # the synced writes of a node that holds a big backlog (LevelDB's default is 4 MiB);
        # the table cache stays within the descriptors kept for files (blizzard/host/fd_limits.py).
        return plyvel.DB(self.path, create_if_missing=True, write_buffer_size=WRITE_BUFFER_BYTES,
                         max_open_files=leveldb_open_files())

    def _upgrade(self) -> None:
        """Move a store of format 1 (two entries per copy) to format 2 (one), in synced
        batches, each recording how far the move got: a node stopped midway goes on from
        there when next opened. No way back: a node before 0.4 takes a moved copy for a
        damaged one (its checksum fails) and serves none of them."""
        db = self.db
        if db.get(_FORMAT) == FORMAT:
            return
        upgraded = db.get(_UPGRADED)
        if upgraded is None and next(db.iterator(stop=_ITEMS_END, include_value=False),
                                     None) is None:
            db.put(_FORMAT, FORMAT, sync=True)  # a new store (or an empty one)
            return
        start = _KEY.unpack(upgraded)[0] if upgraded else 0
        moved = 0
        while True:
            with db.iterator(start=_KEY.pack(start), stop=_BLOBS_END) as entries:
                chunk = list(islice(entries, UPGRADE_BATCH))
            with db.write_batch(sync=True) as wb:
                for key, old in chunk:
                    item = db.get(_ITEM + key)
                    meta = item[_SIZE_CRC.size:] if item and len(item) >= _SIZE_CRC.size \
                        else None
                    # an entry too short to hold a CRC stays one too short to hold a head
                    wb.put(key, old if len(old) < _CRC.size else
                           _entry_value(_CRC.unpack_from(old)[0], old[_CRC.size:], meta))
                    if item is not None:
                        wb.delete(_ITEM + key)
                if chunk:
                    start = _KEY.unpack(chunk[-1][0])[0] + 1
                    wb.put(_UPGRADED, _KEY.pack(start))
                else:  # every copy moved: metadata with no blob (none expected) goes too
                    for key in db.iterator(start=_ITEM, stop=_ITEMS_END, include_value=False):
                        wb.delete(key)
                    wb.delete(_UPGRADED)
                    wb.put(_FORMAT, FORMAT)
            if not chunk:
                break
            moved += len(chunk)
        log.info("store %s moved to one entry per copy (format %s): %d copies", self.path,
                 FORMAT.decode(), moved)

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
        if self.write_delay_s:
            time.sleep(self.write_delay_s)
        with self.db.write_batch(sync=True) as wb:
            every_meta = metas or repeat(None)  # none given: None for each (repeat outlasts ids)
            for item_id, blob, crc, meta in zip(ids, blobs, crcs, every_meta, strict=False):
                key = _KEY.pack(item_id)
                # a retried put must not count twice; only an id seen before can be a retry
                old = get(key) if item_id <= top else None
                if old is None:
                    count += 1
                    added += len(blob)
                else:
                    added += len(blob) - _blob_size(old)
                wb.put(key, _entry_value(crc, blob, meta))
                top = max(top, item_id)
            if top >= self._id_hi:
                wb.put(_ID_HI, _KEY.pack(top + 1))
        self._id_hi = max(self._id_hi, top + 1)
        self._count += count
        self._bytes += added
        self._max_id = top

    def _entries(self, ids: list[int]) -> list[bytes | None]:
        """Each id's entry (None: absent), read in one scan where the ids are dense (a leased
        or acked batch mostly is: one scan beats many seeks)."""
        lo, hi = _id_range(ids)
        if len(ids) > 8 and hi - lo < 2 * len(ids):
            found: dict[bytes, bytes] = {}
            last = _KEY.pack(hi)
            with self.db.iterator(start=_KEY.pack(lo), stop=_KEY.pack(hi + 1)) as entries:
                for key, value in entries:
                    found[key] = value
                    if key == last:  # no step past it: LevelDB would walk over every deleted
                        break        # entry above it, to the next live one, to find the end
            return [found.get(_KEY.pack(i)) for i in ids]
        get = self.db.get
        return [get(_KEY.pack(i)) for i in ids]

    def get_many(self, ids: list[int]) -> list[tuple[bytes, int] | None]:
        return [_checked(i, raw, self) for i, raw in zip(ids, self._entries(ids), strict=True)]

    def delete_many(self, ids: list[int]) -> None:
        unique = list(dict.fromkeys(ids))  # an id named twice is counted once
        with self.db.write_batch() as wb:
            for item_id, raw in zip(unique, self._entries(unique), strict=True):
                if raw is not None:
                    wb.delete(_KEY.pack(item_id))
                    self._count -= 1
                    self._bytes -= _blob_size(raw)

    def ids(self) -> Iterator[int]:
        for key in self.db.iterator(include_value=False, stop=_BLOBS_END):
            yield _KEY.unpack(key)[0]

    def item_metas(self, start: int, limit: int, max_bytes: int) -> list[ItemEntry]:
        _id_range([start])
        out: list[ItemEntry] = []
        size = 0
        for key, value in self.db.iterator(start=_KEY.pack(start), stop=_BLOBS_END):
            entry = _entry(_KEY.unpack(key)[0], value)
            if entry is None:  # a copy kept without metadata
                continue
            n = _SIZE_CRC.size + len(entry[3])  # as a page counts it: size, CRC and metadata
            if len(out) >= limit or (out and size + n > max_bytes):
                break
            out.append(entry)
            size += n
        return out

    def metas_of(self, ids: list[int]) -> list[ItemEntry | None]:
        _id_range(ids)
        get = self.db.get
        return [None if (raw := get(_KEY.pack(i))) is None else _entry(i, raw) for i in ids]

    def update_metas(self, ids: list[int], meta: bytes) -> int:
        _id_range(ids)
        changed = 0
        with self.db.write_batch() as wb:
            for item_id in dict.fromkeys(ids):
                key = _KEY.pack(item_id)
                raw = self.db.get(key)
                if raw is not None and (entry := _entry(item_id, raw)) is not None:
                    # the blob is written again with the new metadata
                    wb.put(key, _entry_value(entry[2], raw[_blob_at(raw):], meta))
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


class MemoryStore:
    """The in-memory twin of ``LevelDbStore`` for unit tests: the same entries, in a dict."""

    def __init__(self) -> None:
        self.blobs: dict[int, bytes] = {}  # id -> its entry, as LevelDbStore keeps it
        self.meta: dict[str, bytes] = {}
        self.checksum_failures = 0
        self.id_hi = 0

    def put_many(self, ids: list[int], blobs: list[bytes], crcs: list[int],
                 metas: list[bytes | None] | None = None) -> None:
        _id_range(ids)
        every_meta = metas or [None] * len(ids)
        for item_id, blob, crc, meta in zip(ids, blobs, crcs, every_meta, strict=True):
            self.blobs[item_id] = _entry_value(crc, blob, meta)
            self.id_hi = max(self.id_hi, item_id + 1)

    def get_many(self, ids: list[int]) -> list[tuple[bytes, int] | None]:
        _id_range(ids)
        return [_checked(i, self.blobs.get(i), self) for i in ids]

    def delete_many(self, ids: list[int]) -> None:
        _id_range(ids)
        for item_id in ids:
            self.blobs.pop(item_id, None)

    def ids(self) -> Iterator[int]:
        return iter(sorted(self.blobs))

    def item_metas(self, start: int, limit: int, max_bytes: int) -> list[ItemEntry]:
        _id_range([start])
        out: list[ItemEntry] = []
        size = 0
        for item_id in sorted(i for i in self.blobs if i >= start):
            entry = _entry(item_id, self.blobs[item_id])
            if entry is None:
                continue
            n = _SIZE_CRC.size + len(entry[3])
            if len(out) >= limit or (out and size + n > max_bytes):
                break
            out.append(entry)
            size += n
        return out

    def metas_of(self, ids: list[int]) -> list[ItemEntry | None]:
        _id_range(ids)
        return [_entry(i, self.blobs[i]) if i in self.blobs else None for i in ids]

    def update_metas(self, ids: list[int], meta: bytes) -> int:
        _id_range(ids)
        changed = 0
        for item_id in dict.fromkeys(ids):
            raw = self.blobs.get(item_id)
            if raw is not None and (entry := _entry(item_id, raw)) is not None:
                self.blobs[item_id] = _entry_value(entry[2], raw[_blob_at(raw):], meta)
                changed += 1
        return changed

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
        return sum(_blob_size(v) for v in self.blobs.values())

    def close(self) -> None:
        pass
