"""The master's write-ahead log: append-only segments of CRC-checked records, group-committed.

Record layout: ``<u32 length><u32 crc32(body)><body>`` (little endian). Segments are files
``wal-<index>.log`` in the data dir; a new one starts when the current one passes
``segment_bytes``. ``append`` only buffers; ``flush`` writes the buffer and fdatasyncs once,
so every request handled in one server-loop pass shares one fsync.

Recovery: a partial or CRC-bad record that runs to the very end of the last segment is a
torn write and is truncated; any other damage raises ``WalCorrupt`` naming file and offset.
A failed write or fsync calls ``on_fatal`` (by default, exit the process): after a failed
fsync the kernel may have dropped the dirty pages, so carrying on would be lying (P6).
A roll that finds no file descriptor (EMFILE, ENFILE) is no such failure: the log goes on in
the current segment, whole, and the next write tries the roll again.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import struct
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from blizzard.host.fd_limits import is_fd_pressure
from blizzard.host.log_limit import Throttled
from blizzard.wire.errors import InvalidArgument

log = logging.getLogger(__name__)

HEADER = struct.Struct("<II")
MAX_RECORD_BYTES = 64 * 1024 * 1024
_SEGMENT = re.compile(r"^wal-(\d{12})\.log$")


class WalLocked(Exception):
    """Another process (a running master) holds this WAL directory."""


class WalCorrupt(Exception):
    """Raised when the log is damaged somewhere other than a torn tail."""


class RecordTooLarge(InvalidArgument):
    """Raised when a record exceeds ``MAX_RECORD_BYTES``; nothing was appended."""


def _check_size(body: bytes) -> None:
    if len(body) > MAX_RECORD_BYTES:
        raise RecordTooLarge(f"the request makes a log record of {len(body)} bytes; "
                             f"at most {MAX_RECORD_BYTES}")


def _fatal_exit(exc: BaseException) -> None:
    log.critical("WAL write failed, stopping: %s", exc)
    os._exit(70)


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def segment_name(index: int) -> str:
    return f"wal-{index:012d}.log"


def list_segments(directory: str) -> list[int]:
    out = []
    for name in os.listdir(directory):
        m = _SEGMENT.match(name)
        if m:
            out.append(int(m.group(1)))
    return sorted(out)


def scan(data: bytes) -> tuple[list[bytes], int, str | None]:
    """Split a segment's bytes into record bodies; return (bodies, good_end, problem)."""
    bodies: list[bytes] = []
    pos = 0
    end = len(data)
    while pos < end:
        if end - pos < HEADER.size:
            return bodies, pos, "partial header"
        length, crc = HEADER.unpack_from(data, pos)
        stop = pos + HEADER.size + length
        if length > MAX_RECORD_BYTES or stop > end:
            return bodies, pos, "record runs past the end"
        body = data[pos + HEADER.size:stop]
        if length == 0 or zlib.crc32(body) != crc:
            return bodies, pos, "checksum mismatch"
        bodies.append(body)
        pos = stop
    return bodies, pos, None


def _is_torn_tail(data: bytes, pos: int, problem: str) -> bool:
    """A bad record is a torn write only if nothing whole could follow it."""
    if problem != "checksum mismatch":
        return True
    length, _ = HEADER.unpack_from(data, pos)
    stop = pos + HEADER.size + length
    return stop >= len(data) or not data[stop:].strip(b"\0")


@dataclass
class Segment:
    """One segment file as read: its whole records, and the damage after them, if any."""

    index: int
    path: str
    size: int
    bodies: list[bytes]
    good_end: int  # bytes of whole, checked records
    problem: str | None
    torn: bool  # the damage is a torn write at the log's very end (repairable by truncation)


def read_segments(directory: str, start_index: int = 0) -> Iterator[Segment]:
    """Every segment from ``start_index`` on, in order; the one reader of WAL files.

    Only the last segment can have a torn tail; ``torn`` is False for damage anywhere else.
    """
    indexes = [i for i in list_segments(directory) if i >= start_index]
    for n, index in enumerate(indexes):
        path = os.path.join(directory, segment_name(index))
        with open(path, "rb") as f:
            data = f.read()
        bodies, good_end, problem = scan(data)
        torn = problem is not None and n == len(indexes) - 1 and \
            _is_torn_tail(data, good_end, problem)
        yield Segment(index, path, len(data), bodies, good_end, problem, torn)


class Wal:
    """An append-only, group-committed log in ``directory``."""

    def __init__(self, directory: str, *, segment_bytes: int = 64 * 1024 * 1024,
                 on_fatal: Callable[[BaseException], None] = _fatal_exit) -> None:
        self.directory = directory
        self.segment_bytes = segment_bytes
        self.on_fatal = on_fatal
        # told (seconds, bytes) after each durable write: the metrics' fsync histogram
        self.on_sync: Callable[[float, int], None] | None = None
        self._buf: list[bytes] = []
        self._fd: int | None = None
        self._index = 0
        self._size = 0
        self.records_written = 0
        self.records_appended = 0
        self.flushed_at = (0, 0)  # (segment, bytes): the end of the log on disk, before a roll
        self.rolls = True  # False in a standby: it rolls where its primary did, no sooner
        self.pressure = Throttled(log)  # out of descriptors: a line now and then, not each pass
        os.makedirs(directory, exist_ok=True)
        self._lock: int | None = _lock_directory(directory)  # None once closed

    # -- recovery ----------------------------------------------------------------------------

    def replay(self, start_index: int = 0) -> Iterator[bytes]:
        """Yield every record body from segment ``start_index`` on, repairing a torn tail.

        Must be consumed fully before ``append``: it also opens the last segment for writing.
        """
        last = None
        for seg in read_segments(self.directory, start_index):
            last = seg.index
            if seg.problem is not None:
                if not seg.torn:
                    raise WalCorrupt(f"{seg.path}: {seg.problem} at byte offset {seg.good_end} "
                                     f"(record {len(seg.bodies) + 1} of the segment); "
                                     "refusing to start")
                log.warning("%s: torn tail at byte %d (%s, %d bytes dropped); truncating",
                            seg.path, seg.good_end, seg.problem, seg.size - seg.good_end)
                with open(seg.path, "r+b") as f:
                    f.truncate(seg.good_end)
                    f.flush()
                    os.fsync(f.fileno())
            yield from seg.bodies
        self._open(last if last is not None else max(start_index, 0))

    def _open(self, index: int) -> None:
        """Continue in segment ``index`` (made if missing); on an error, in the segment as
        before (the caller closes the old one after this returns)."""
        path = os.path.join(self.directory, segment_name(index))
        existed = os.path.exists(path)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            size = os.fstat(fd).st_size
            if not existed or size == 0:  # (empty: made by a roll whose dir sync failed)
                fsync_dir(self.directory)
        except BaseException:
            os.close(fd)
            raise
        self._fd, self._index, self._size = fd, index, size
        self.flushed_at = max(self.flushed_at, (index, self._size))

    def _switch(self, index: int) -> None:
        """Go on in segment ``index``: opened before the current one is closed, so a failure
        leaves the log writing where it was."""
        old = self._fd
        self._open(index)
        if old is not None:
            os.close(old)

    # -- writing -----------------------------------------------------------------------------

    def append(self, body: bytes) -> None:
        _check_size(body)
        self._buf.append(HEADER.pack(len(body), zlib.crc32(body)))
        self._buf.append(body)
        self.records_appended += 1

    @property
    def dirty(self) -> bool:
        return bool(self._buf)

    def flush(self) -> None:
        """Write everything appended so far and make it durable with one fdatasync."""
        if not self._buf:
            return
        if self._fd is None:
            raise RuntimeError("Wal.replay() must run before the first flush")
        data = b"".join(self._buf)
        records = len(self._buf) // 2
        self._buf.clear()
        self._write(data, records)

    def _write(self, data: bytes, records: int) -> None:
        fd = self._fd
        if fd is None:
            raise RuntimeError("Wal.replay() must run before the first write")
        started = time.perf_counter()
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fdatasync(fd)
        except OSError as exc:
            self.on_fatal(exc)
            raise
        if self.on_sync is not None:
            self.on_sync(time.perf_counter() - started, len(data))
        self._size += len(data)
        self.records_written += records
        self.flushed_at = (self._index, self._size)
        if self._size >= self.segment_bytes and self.rolls:
            try:
                self.roll()
            except OSError as exc:
                if not is_fd_pressure(exc):
                    raise
                self.pressure("roll", "WAL segment %d is full but no file descriptor is free "
                              "for the next (%s): writing on in it, retrying",
                              self._index, exc)

    def roll(self) -> int:
        """Start a new segment; return its index (records before it live in older segments).

        Raises ``OSError`` (e.g. EMFILE) with the log still writing in the current segment.
        """
        self._switch(self._index + 1)
        return self._index

    # -- shipping to a standby (master/ha/wal_shipping.py, master/ha/standby.py) -------------------

    def read_at(self, index: int, offset: int, max_bytes: int) -> bytes | None:
        """Whole records of segment ``index`` on disk from ``offset`` on, about ``max_bytes``
        (at least one record); None if the segment is gone (a checkpoint covered it)."""
        end = self._size if index == self._index else None
        try:
            fd = os.open(os.path.join(self.directory, segment_name(index)), os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            end = os.fstat(fd).st_size if end is None else end
            data = os.pread(fd, max(0, min(end - offset, max_bytes)), offset)
            if offset + len(data) < end:  # cut short: keep whole records only
                pos = 0
                while pos + HEADER.size <= len(data):
                    stop = pos + HEADER.size + HEADER.unpack_from(data, pos)[0]
                    if stop > len(data):
                        break
                    pos = stop
                if pos == 0:  # one record over max_bytes: send it whole
                    length = HEADER.unpack(os.pread(fd, HEADER.size, offset))[0]
                    return os.pread(fd, HEADER.size + length, offset)
                data = data[:pos]
            return data
        finally:
            os.close(fd)

    def has_segment(self, index: int) -> bool:
        return os.path.exists(os.path.join(self.directory, segment_name(index)))

    def write_at(self, index: int, offset: int, data: bytes, records: int) -> None:
        """A standby's write: the primary's bytes at the same place in the same segment,
        made durable before it returns (a standby acknowledges only what is on its disk)."""
        if index != self._index:
            if index < self._index or offset != 0:
                raise WalCorrupt(f"segment {index} at {offset} does not follow {self._index}")
            self.roll_to(index)
        if offset != self._size:
            raise WalCorrupt(f"segment {index}: data for offset {offset}, the log ends at "
                             f"{self._size}")
        if self._buf:
            raise RuntimeError("a standby's log takes no records of its own")
        self._write(data, records)

    def roll_to(self, index: int) -> None:
        """Continue in segment ``index`` (a standby follows the primary's rolls)."""
        self._switch(index)

    def start_over(self, index: int) -> None:
        """Remove every segment and begin an empty one at ``index`` (a standby's snapshot)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        for old in list_segments(self.directory):
            os.unlink(os.path.join(self.directory, segment_name(old)))
        self.flushed_at = (0, 0)
        self._open(index)

    def leave_lock_to_parent(self) -> None:
        """In a forked child: close the child's copy of the lock, so the lock goes when the
        master does, not when a checkpoint child still writing after a kill -9 finishes."""
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None

    def close(self) -> None:
        if self._fd is not None:
            self.flush()
            os.close(self._fd)
            self._fd = None
        if self._lock is not None:
            os.close(self._lock)  # closing the file releases the lock
            self._lock = None


def _lock_directory(directory: str) -> int:
    """Hold an exclusive lock on ``directory`` for this process's life: a second master on the
    same data dir would replay, and might truncate the torn tail of, a WAL being written."""
    fd = os.open(os.path.join(directory, "LOCK"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise WalLocked(f"the WAL in {directory} is in use by another process "
                        "(is a master already running on this data dir?)") from None
    return fd


class MemoryWal:
    """The in-memory twin of ``Wal`` for process-free tests: same calls, nothing on disk.

    ``directory`` is None, which tells the server there is no place for checkpoints.
    """

    directory = None

    def __init__(self) -> None:
        self.on_sync: Callable[[float, int], None] | None = None  # never called: no disk
        self.records: list[bytes] = []  # flushed ("durable")
        self._buf: list[bytes] = []
        self._segment_starts = [0]
        self.records_written = 0
        self.records_appended = 0

    @property
    def flushed_at(self) -> tuple[int, int]:
        """(segment, records): where the flushed log ends, for the replication's bookkeeping."""
        return len(self._segment_starts) - 1, len(self.records)

    def replay(self, start_index: int = 0) -> Iterator[bytes]:
        starts = self._segment_starts
        yield from self.records[starts[min(start_index, len(starts) - 1)]:]

    def append(self, body: bytes) -> None:
        _check_size(body)
        self._buf.append(body)
        self.records_appended += 1

    @property
    def dirty(self) -> bool:
        return bool(self._buf)

    def flush(self) -> None:
        self.records += self._buf
        self.records_written += len(self._buf)
        self._buf.clear()

    def roll(self) -> int:
        self._segment_starts.append(len(self.records))
        return len(self._segment_starts) - 1

    def leave_lock_to_parent(self) -> None:
        """Nothing to leave: no directory, no lock."""

    def close(self) -> None:
        self.flush()
