"""The parts of high availability, without processes: choosing a master, shipping the log."""

from __future__ import annotations

import os

import pytest
import zmq

from blizzard import protocol as p
from blizzard.errors import InvalidArgument
from blizzard.harness import free_port
from blizzard.masters import MasterChoice, split_masters
from blizzard.transport import Endpoint, call_many
from master.wal import Wal, WalCorrupt, read_segments, segment_name

A, B = "tcp://127.0.0.1:5555", "tcp://127.0.0.1:5556"


def test_masters_are_split_checked_and_deduplicated():
    assert split_masters(f"{A}, {B},{A}") == [A, B]
    assert split_masters([B]) == [B]
    for bad in ("", "tcp://127.0.0.1", f"{A},localhost:1"):
        with pytest.raises(InvalidArgument):
            split_masters(bad)


def test_a_silent_master_is_left_and_a_standby_waited_on_while_the_other_is_silent():
    choice = MasterChoice(f"{A},{B}")
    assert choice.current == A
    assert choice.timed_out() and choice.current == B  # A is silent: on to B
    assert not choice.not_primary() and choice.current == B  # B is a standby of a silent A: stay
    choice.silent.clear()
    assert choice.not_primary() and choice.current == A  # a standby of a live primary: go there
    alone = MasterChoice(A)
    assert not alone.timed_out() and not alone.not_primary() and alone.current == A


def records(wal: Wal, bodies: list[bytes]) -> None:
    for body in bodies:
        wal.append(body)
    wal.flush()


def test_the_log_is_shipped_in_whole_records_and_lands_byte_for_byte(tmp_path):
    primary = Wal(str(tmp_path / "p"))
    list(primary.replay())
    bodies = [bytes([i]) * (10 + i) for i in range(20)]
    records(primary, bodies)
    standby = Wal(str(tmp_path / "s"))
    list(standby.replay())
    standby.rolls = False
    pos = (0, 0)
    while pos < primary.flushed_at:
        data = primary.read_at(*pos, max_bytes=50)  # a few records at a time, never half of one
        assert data
        standby.write_at(pos[0], pos[1], data, 1)
        pos = standby.flushed_at
    with open(tmp_path / "p" / segment_name(0), "rb") as a, \
            open(tmp_path / "s" / segment_name(0), "rb") as b:
        assert a.read() == b.read()
    assert next(read_segments(str(tmp_path / "s"))).bodies == bodies
    assert primary.read_at(0, primary.flushed_at[1], 50) == b""  # nothing new yet
    assert primary.read_at(7, 0, 50) is None  # a segment that is not there
    with pytest.raises(WalCorrupt):
        standby.write_at(0, 3, b"x", 1)  # not where its log ends
    primary.close()
    standby.close()


def test_a_record_larger_than_a_reply_is_shipped_whole(tmp_path):
    wal = Wal(str(tmp_path / "p"))
    list(wal.replay())
    records(wal, [b"a" * 100, b"b" * 10])
    first = wal.read_at(0, 0, 20)
    assert len(first) == 108 and first.endswith(b"a" * 100)
    assert os.path.getsize(tmp_path / "p" / segment_name(0)) == 108 + 18
    wal.close()


def test_a_server_that_stops_answering_pings_times_out_early():
    """A master may park an enqueue for seconds; with probes, a dead one is noticed at once."""
    endpoint = Endpoint(zmq.Context.instance(), f"tcp://127.0.0.1:{free_port()}")
    try:
        (reply,) = call_many([(endpoint, p.Ping())], 30.0, probe_s=0.1)
    finally:
        endpoint.close()
    assert isinstance(reply, TimeoutError) and "stopped answering pings" in str(reply)
