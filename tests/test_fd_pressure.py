"""Running out of file descriptors is pressure, retried later, never the end of a server:
the WAL's roll, the checkpointer, the data node's store (blizzard/host/fd_limits.py)."""

from __future__ import annotations

import errno
import os
import zlib

import plyvel
import pytest

from blizzard.host.fd_limits import connection_fds, is_fd_pressure, leveldb_open_files, reserve_fds
from blizzard.local.harness import free_port
from blizzard.wire import protocol as p
from datanode.config import DatanodeConfig
from datanode.server import DatanodeServer
from datanode.store import LevelDbStore, MemoryStore
from master.log import recovery
from master.log.recovery import Checkpointer
from master.log.wal import Wal, list_segments
from master.state.machine import State

EMFILE = OSError(errno.EMFILE, os.strerror(errno.EMFILE))


def _no_new_files(monkeypatch, where: str) -> None:
    """``os.open`` of anything under ``where`` fails with EMFILE, as with no descriptor left."""
    real = os.open

    def fake(path, *args, **kwargs):
        if str(path).startswith(where):
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE), path)
        return real(path, *args, **kwargs)
    monkeypatch.setattr(os, "open", fake)


def test_the_reserve_leaves_leveldb_and_files_their_descriptors():
    assert reserve_fds(1024) == 256 and connection_fds(1024) == 768
    assert leveldb_open_files(1024) <= reserve_fds(1024) // 2
    assert reserve_fds(1_048_576) == 262_144 and leveldb_open_files(1_048_576) == 1000
    assert connection_fds(100) == 50  # a tiny limit still leaves half for files


def test_out_of_descriptors_is_told_from_a_failing_disk():
    assert is_fd_pressure(EMFILE)
    assert is_fd_pressure(OSError(errno.ENFILE, "table full"))
    assert is_fd_pressure(plyvel.IOError(b"IO error: /d/000012.log: Too many open files"))
    try:
        try:
            raise EMFILE
        except OSError as exc:
            raise RuntimeError("wrapped") from exc
    except RuntimeError as wrapped:
        assert is_fd_pressure(wrapped)
    assert not is_fd_pressure(OSError(errno.EIO, "Input/output error"))
    assert not is_fd_pressure(OSError(errno.ENOSPC, "No space left on device"))


def test_a_wal_roll_with_no_descriptor_writes_on_and_rolls_later(tmp_path, monkeypatch):
    wal_dir = str(tmp_path / "wal")
    wal = Wal(wal_dir, segment_bytes=100, on_fatal=lambda exc: pytest.fail(f"fatal: {exc}"))
    list(wal.replay())
    _no_new_files(monkeypatch, wal_dir)
    for i in range(5):  # each flush passes the segment's size: a roll is due each time
        wal.append(b"x" * 60 + bytes([i]))
        wal.flush()
    assert list_segments(wal_dir) == [0]
    assert wal.flushed_at[0] == 0  # still writing in segment 0, nothing lost
    monkeypatch.undo()
    wal.append(b"after")
    wal.flush()  # the roll goes through now
    assert wal.flushed_at == (1, 0)
    wal.close()
    again = Wal(wal_dir)
    assert list(again.replay()) == [b"x" * 60 + bytes([i]) for i in range(5)] + [b"after"]
    again.close()


@pytest.mark.cluster
def test_a_checkpoint_with_no_descriptor_is_put_off_and_done_later(tmp_path, monkeypatch):
    wal_dir = str(tmp_path / "wal")
    wal = Wal(wal_dir)
    list(wal.replay())
    cp = Checkpointer(wal, every_records=1, replayed=0)
    wal.append(b"r")
    wal.flush()
    assert cp.due()
    _no_new_files(monkeypatch, wal_dir)
    cp.roll_and_fork(State())  # no descriptor for the new segment: put off
    assert cp.child is None and not cp.due()
    monkeypatch.undo()

    # the checkpoint's writer finds none either: put off too, the master goes on
    def no_fd(*args):
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
    monkeypatch.setattr(recovery.checkpoint_file, "write", no_fd)
    monkeypatch.setattr(recovery.log, "critical",  # what precedes exit 70
                        lambda *a: pytest.fail("the master would stop: " + a[0] % a[1:]))
    cp.retry_at = 0.0
    assert cp.due()
    cp.roll_and_fork(State())
    assert cp.child is not None
    cp.poll(block=True)
    assert cp.child is None and not cp.due()
    monkeypatch.undo()

    cp.retry_at = 0.0
    assert cp.due()
    cp.roll_and_fork(State())
    cp.poll(block=True)
    assert any(name.startswith("checkpoint") for name in os.listdir(wal_dir))
    wal.close()


class _NoDescriptors(MemoryStore):
    """A store whose writes fail as LevelDB's do when no file descriptor is left."""

    def __init__(self) -> None:
        super().__init__()
        self.reopened = 0

    def put_many(self, *args, **kwargs) -> None:
        raise plyvel.IOError(b"IO error: blobs/000007.log: Too many open files")

    def reopen(self) -> None:
        self.reopened += 1


def test_a_data_node_whose_store_has_no_descriptor_refuses_the_put_and_goes_on(
        tmp_path, monkeypatch):
    store = _NoDescriptors()
    server = DatanodeServer(DatanodeConfig(data_dir=str(tmp_path),
                                           bind=f"tcp://127.0.0.1:{free_port()}"), store=store)
    replies = []
    monkeypatch.setattr(server.router, "reply", lambda peer, rid, msg: replies.append(msg))
    monkeypatch.setattr("datanode.server.os._exit", lambda code: pytest.fail(f"exit {code}"))
    blob = b"payload"
    put = p.Put(ids=[5], blobs=[blob], crcs=[zlib.crc32(blob)], forward=[], min_replicas=1,
                node_id="", report=False, grant=None)
    try:
        server._handle([(b"c", 1, put)])
        server._handle([(b"c", 2, put)])
        assert [(type(r), r.code) for r in replies] == [(p.Error, "storage")] * 2
        assert "Too many open files" in replies[0].message
        assert store.reopened == 1  # at most one reopen per REOPEN_S
    finally:
        server.close()


class _FailingDisk(MemoryStore):
    """A store whose writes fail as LevelDB's do on a disk that is full, or failing."""

    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.error = error

    def put_many(self, *args, **kwargs) -> None:
        raise self.error


@pytest.mark.parametrize("error, exits", [
    (plyvel.IOError(f"IO error: blobs/000007.log: {os.strerror(errno.ENOSPC)}".encode()), False),
    (OSError(errno.EDQUOT, os.strerror(errno.EDQUOT)), False),
    (plyvel.IOError(f"IO error: blobs/000007.log: {os.strerror(errno.EIO)}".encode()), True),
], ids=["leveldb-enospc", "edquot", "leveldb-eio"])
def test_a_data_node_refuses_puts_on_a_full_disk_and_stops_on_a_failing_one(
        tmp_path, monkeypatch, error, exits):
    server = DatanodeServer(DatanodeConfig(data_dir=str(tmp_path),
                                           bind=f"tcp://127.0.0.1:{free_port()}"),
                            store=_FailingDisk(error))
    replies, exit_codes = [], []
    monkeypatch.setattr(server.router, "reply", lambda peer, rid, msg: replies.append(msg))
    monkeypatch.setattr("datanode.server.os._exit", exit_codes.append)
    blob = b"payload"
    put = p.Put(ids=[5], blobs=[blob], crcs=[zlib.crc32(blob)], forward=[], min_replicas=1,
                node_id="", report=False, grant=None)
    try:
        server._handle([(b"c", 1, put)])
        assert [(type(r), r.code) for r in replies] == [(p.Error, "storage")]
        assert exit_codes == ([70] if exits else [])
    finally:
        server.close()


def test_a_leveldb_store_reopens_with_its_blobs(tmp_path):
    store = LevelDbStore(str(tmp_path / "db"))
    store.put_many([1, 2], [b"a", b"b"], [zlib.crc32(b"a"), zlib.crc32(b"b")])
    store.reopen()
    assert store.get_many([1, 2]) == [(b"a", zlib.crc32(b"a")), (b"b", zlib.crc32(b"b"))]
    store.reopening = True  # as after a reopen whose open failed
    with pytest.raises(OSError) as caught:
        store.put_many([3], [b"c"], [zlib.crc32(b"c")])
    assert is_fd_pressure(caught.value)
    store.close()
