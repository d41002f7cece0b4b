"""The WAL: group-committed appends, torn tails repaired, damage elsewhere refused."""

from __future__ import annotations

import os

import pytest

from master.log import wal as walmod
from master.log.wal import HEADER, Wal, WalCorrupt, list_segments, segment_name


def records(n: int) -> list[bytes]:
    return [f"record-{i}".encode() * (i % 5 + 1) for i in range(n)]


def write(directory, bodies, **kw) -> Wal:
    w = Wal(str(directory), **kw)
    list(w.replay())
    for body in bodies:
        w.append(body)
    w.flush()
    return w


def replay(directory, **kw) -> list[bytes]:
    w = Wal(str(directory), **kw)
    out = list(w.replay())
    w.close()
    return out


def only_segment(directory) -> str:
    (index,) = list_segments(str(directory))
    return os.path.join(str(directory), segment_name(index))


def test_replay_returns_what_was_flushed(tmp_path):
    bodies = records(50)
    write(tmp_path, bodies).close()
    assert replay(tmp_path) == bodies


def test_unflushed_appends_are_not_on_disk(tmp_path):
    w = write(tmp_path, records(3))
    w.append(b"not flushed")
    w.leave_lock_to_parent()  # as if this process died here
    assert replay(tmp_path) == records(3)


def test_cut_at_every_offset_of_the_last_record_recovers_the_rest(tmp_path):
    bodies = records(6)
    write(tmp_path / "src", bodies).close()
    with open(only_segment(tmp_path / "src"), "rb") as f:
        data = f.read()
    last_start = len(data) - HEADER.size - len(bodies[-1])
    for cut in range(last_start, len(data)):
        d = tmp_path / f"cut{cut}"
        d.mkdir()
        with open(d / segment_name(0), "wb") as f:
            f.write(data[:cut])
        assert replay(d) == bodies[:-1], f"cut at {cut}"
        assert os.path.getsize(d / segment_name(0)) == last_start
        # the repaired log takes new records after the good ones
        w = write(d, [b"after"])
        w.close()
        assert replay(d) == bodies[:-1] + [b"after"]


def test_bad_checksum_in_the_last_record_is_a_torn_write(tmp_path):
    bodies = records(4)
    write(tmp_path, bodies).close()
    path = only_segment(tmp_path)
    with open(path, "r+b") as f:
        f.seek(-1, os.SEEK_END)
        byte = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([byte[0] ^ 0x01]))
    assert replay(tmp_path) == bodies[:-1]


def test_zero_filled_tail_is_a_torn_write(tmp_path):
    bodies = records(4)
    write(tmp_path, bodies).close()
    with open(only_segment(tmp_path), "ab") as f:
        f.write(b"\0" * 4096)
    assert replay(tmp_path) == bodies


def test_flipped_bit_mid_log_refuses_to_start(tmp_path):
    bodies = records(10)
    write(tmp_path, bodies).close()
    path = only_segment(tmp_path)
    with open(path, "r+b") as f:
        f.seek(HEADER.size + 2)  # inside the first record's body
        byte = f.read(1)
        f.seek(HEADER.size + 2)
        f.write(bytes([byte[0] ^ 0x10]))
    size = os.path.getsize(path)
    with pytest.raises(WalCorrupt, match=r"byte offset 0"):
        replay(tmp_path)
    assert os.path.getsize(path) == size  # nothing was "repaired"


def test_segments_roll_and_damage_in_an_older_one_is_fatal(tmp_path):
    w = Wal(str(tmp_path), segment_bytes=200)
    list(w.replay())
    bodies = records(40)
    for body in bodies:
        w.append(body)
        w.flush()
    w.close()
    segments = list_segments(str(tmp_path))
    assert len(segments) > 3
    assert replay(tmp_path, segment_bytes=200) == bodies
    first = os.path.join(str(tmp_path), segment_name(segments[0]))
    with open(first, "r+b") as f:
        f.truncate(os.path.getsize(first) - 3)
    with pytest.raises(WalCorrupt, match=segment_name(segments[0])):
        replay(tmp_path, segment_bytes=200)


def test_failed_fsync_is_fatal(tmp_path, monkeypatch):
    failures = []
    w = Wal(str(tmp_path), on_fatal=failures.append)
    list(w.replay())
    w.append(b"x")

    def broken(fd):
        raise OSError(5, "Input/output error")
    monkeypatch.setattr(walmod.os, "fdatasync", broken)
    with pytest.raises(OSError):
        w.flush()
    assert len(failures) == 1 and failures[0].errno == 5


@pytest.mark.parametrize("kind", ["disk", "memory"])
def test_both_wals_keep_the_same_contract(tmp_path, kind):
    """What the server relies on, for the real log and its in-memory twin alike."""
    from master.log.wal import MemoryWal
    from master.log.wal import Wal as DiskWal

    def open_wal():
        return DiskWal(str(tmp_path / "wal")) if kind == "disk" else shared

    shared = MemoryWal()
    wal = open_wal()
    assert list(wal.replay()) == []
    wal.append(b"one")
    assert wal.dirty and wal.records_appended == 1 and wal.records_written == 0
    wal.flush()
    assert not wal.dirty and wal.records_written == 1
    start = wal.roll()
    wal.append(b"two")
    wal.close()
    again = open_wal()
    assert list(again.replay()) == [b"one", b"two"]
    again.close()
    again = open_wal()
    assert list(again.replay(start)) == [b"two"]
    with pytest.raises(walmod.RecordTooLarge):
        again.append(b"x" * (64 * 1024 * 1024 + 1))
    assert not again.dirty


def test_a_second_wal_on_the_same_directory_is_refused_until_the_first_closes(tmp_path):
    from master.log.wal import Wal, WalLocked
    first = Wal(str(tmp_path / "wal"))
    with pytest.raises(WalLocked, match="in use by another process"):
        Wal(str(tmp_path / "wal"))
    first.close()
    Wal(str(tmp_path / "wal")).close()
