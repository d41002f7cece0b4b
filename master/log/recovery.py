"""Recovery (newest checkpoint + WAL replay) and the forked writing of checkpoints.

Shared by the primary (``master/server.py``), which checkpoints after it rolls its log, and a
standby (``master/ha/standby.py``), which checkpoints where its primary rolled: both snapshot a
state that holds exactly the records before a segment boundary.
"""

from __future__ import annotations

import gc
import logging
import os
import time
from collections.abc import Callable

from blizzard.host.fd_limits import is_fd_pressure
from blizzard.host.log_limit import Throttled
from master.log import checkpoint_file
from master.log.wal import MemoryWal, Wal
from master.state import records
from master.state.machine import State

log = logging.getLogger(__name__)

# A full collection after 1,000 middle-aged ones (Python's default: 10): each walks every item
# record (tracked tuples). A million commits took 4.2 s with the default, 1.6 s with this;
# 300k leases, extends and acks spent 1.0-1.2 s in collections, 0.2 s with 100 (measured).
GC_THRESHOLDS = (700, 10, 1000)
CHILD_NO_FDS = 3  # a checkpoint child's exit code: it found no file descriptor (try later)
RETRY_S = 5.0  # a checkpoint put off for want of descriptors is tried again after this


def recover(wal: Wal | MemoryWal) -> tuple[State, int]:
    """Load the newest checkpoint, then replay the WAL segments after it; (state, replayed).

    The cyclic garbage collector is off meanwhile and the result frozen: recovery makes
    millions of objects and none of them is garbage, so collection only costs time (more
    than half of it with 1M items, measured) and later pauses. Afterwards full collections
    are made rare (``GC_THRESHOLDS``) for the same reason: the items a running master adds
    are long-lived tuples in no cycle, and each full collection walks all of them.
    """
    gc.disable()
    try:
        return _load(wal)
    finally:
        gc.freeze()
        gc.set_threshold(*GC_THRESHOLDS)
        gc.enable()


def _load(wal: Wal | MemoryWal) -> tuple[State, int]:
    started = time.monotonic()
    found = checkpoint_file.load_latest(wal.directory) if wal.directory else None
    wal_start, state = 0, State()
    if found is not None:
        wal_start, exported = found
        state = State.restore(exported)
    replayed = 0
    for body in wal.replay(wal_start):
        state.apply(records.unpack(body))
        replayed += 1
    log.info("recovered in %.3fs: checkpoint at segment %s, %d WAL records replayed, %d items, "
             "id high-water %d", time.monotonic() - started,
             wal_start if found else "none", replayed, len(state.items), state.id_hi)
    return state, replayed


class Checkpointer:
    """Writes checkpoints in a forked child (so serving goes on) and prunes what they cover.

    ``on_done(seconds)`` is told how long each one took (the metrics); ``keep_from()`` names
    the oldest segment a standby still reads, which pruning keeps.

    Running out of file descriptors (for the new segment, the checkpoint file, the listing
    that prunes) puts a checkpoint off by ``RETRY_S``; it never stops the master.
    """

    def __init__(self, wal: Wal | MemoryWal, every_records: int, replayed: int,
                 on_done: Callable[[float], None] = lambda s: None,
                 keep_from: Callable[[], int | None] = lambda: None) -> None:
        self.wal = wal
        self.every_records = every_records
        self.mark = -replayed  # a long replay makes the next checkpoint come sooner
        self.child: int | None = None  # pid of the child writing a checkpoint
        self.start = 0
        self.forked = 0.0  # monotonic
        self.on_done = on_done
        self.keep_from = keep_from  # the oldest segment a standby still reads (None: none)
        self.retry_at = 0.0  # monotonic: no checkpoint before (one was put off)
        self.pressure = Throttled(log)

    def due(self) -> bool:
        return self.wal.directory is not None and self.child is None and \
            self.wal.records_written - self.mark >= self.every_records and \
            time.monotonic() >= self.retry_at

    def roll_and_fork(self, state: State) -> None:
        """Roll the log and checkpoint everything before the new segment (the primary's way);
        put off when the new segment finds no file descriptor."""
        try:
            start = self.wal.roll()
        except OSError as exc:
            if not is_fd_pressure(exc):
                raise
            self._put_off("no file descriptor for a new WAL segment (%s)", exc)
            return
        self.fork(state, start)

    def _put_off(self, why: str, *args: object) -> None:
        self.retry_at = time.monotonic() + RETRY_S
        self.pressure("put off", "checkpoint put off for %.0fs: " + why, RETRY_S, *args)

    def poll(self, block: bool = False) -> None:
        """Reap a finished child (``block``: wait for it): prune what its checkpoint covers,
        or stop if it failed."""
        if self.child is None:
            return
        pid, status = os.waitpid(self.child, 0 if block else os.WNOHANG)
        if pid == 0:
            return
        self.child = None
        self.on_done(time.monotonic() - self.forked)
        code = os.waitstatus_to_exitcode(status)
        if code == CHILD_NO_FDS:
            self.mark -= self.every_records  # due again once the retry time has come
            self._put_off("its writer found no file descriptor (segment %d)", self.start)
            return
        if code != 0:
            log.critical("writing the checkpoint failed (exit status %d); stopping", status)
            os._exit(70)
        try:
            removed = checkpoint_file.prune(self._directory(), self.start, self.keep_from())
        except OSError as exc:
            if not is_fd_pressure(exc):
                raise
            self.pressure("prune", "checkpoint at segment %d done; old files not removed yet "
                          "(no file descriptor: %s), the next checkpoint removes them",
                          self.start, exc)
            return
        log.info("checkpoint at segment %d done; %d old files removed", self.start, removed)

    def fork(self, state: State, wal_start: int) -> None:
        """Snapshot ``state``, which holds exactly the records before segment ``wal_start``.

        The child writes from a copy-on-write image, so this process keeps serving meanwhile.
        """
        directory = self._directory()
        self.mark = self.wal.records_written
        self.start = wal_start
        pid = os.fork()
        if pid == 0:  # child: no sockets, no logging handlers, just the file
            gc.disable()  # collecting would touch (and so copy) the parent's pages for nothing
            self.wal.leave_lock_to_parent()
            code = 1
            try:
                checkpoint_file.write(directory, wal_start, state.export_parts())
                code = 0
            except OSError as exc:
                code = CHILD_NO_FDS if is_fd_pressure(exc) else 1
            finally:
                os._exit(code)
        self.child = pid
        self.forked = time.monotonic()

    def _directory(self) -> str:
        """Where checkpoints go: the WAL's directory (a ``MemoryWal``, which has none, is never
        ``due``, so never forks a writer)."""
        directory = self.wal.directory
        if directory is None:
            raise RuntimeError("checkpoints need a WAL on disk")
        return directory

    def now(self, state: State) -> None:
        """Write a checkpoint synchronously (clean shutdown) and drop what it covers."""
        if self.wal.directory is None:
            return
        if self.child is not None:
            os.waitpid(self.child, 0)
            self.child = None
        self.wal.flush()
        start = self.wal.roll()
        checkpoint_file.write(self.wal.directory, start, state.export_parts())
        checkpoint_file.prune(self.wal.directory, start, self.keep_from())
        log.info("checkpoint at segment %d written", start)
