"""The parts of high availability, without processes: choosing a master, shipping the log."""

from __future__ import annotations

import os
import threading
import time

import pytest
import zmq

from blizzard.client.master_link import MasterLink
from blizzard.local.harness import free_port
from blizzard.net.masters import MasterChoice, split_masters
from blizzard.net.transport import Endpoint, call_many
from blizzard.server.router import RouterServer
from blizzard.wire import protocol as p
from blizzard.wire.errors import InvalidArgument
from master.log.wal import Wal, WalCorrupt, read_segments, segment_name
from master.state.records import StandbySynced

from support.in_process_master import in_process_master

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


# -- the primary's guard: hostile or foreign Follows and heartbeats --------------------------


@pytest.fixture
def primary():
    server = in_process_master(replication=1)
    server.replication.on_fenced = fenced.append
    fenced.clear()
    yield server
    server.close()


fenced: list[str] = []


def ask(server, msg, peer: bytes = b"standby"):
    return server.handle(peer, 1, msg, time.time(), time.monotonic())


def test_malformed_follows_are_refused_and_change_nothing(primary):
    cid = primary.state.cluster_id
    for bad in (p.Follow("", "a", cid, 0, 0, 0), p.Follow("a", "a", cid, 0, 0, -1),
                p.Follow("a", "a", cid, 0, -2**50, 0), p.Follow("x" * 201, "a", cid, 0, 0, 0)):
        reply = ask(primary, bad)
        assert isinstance(reply, p.Error) and reply.code == "invalid_argument", bad
    assert primary.replication.seen == {} and primary.state.standby == ("", "") and not fenced


def test_a_foreign_node_or_standby_of_a_newer_epoch_does_not_fence_this_master(primary):
    foreign = ask(primary, p.Heartbeat("dn-x", "tcp://127.0.0.1:9", 0, 0, 1, "0123456789abcdef", 7))
    assert foreign.code == "foreign_cluster"
    follow = ask(primary, p.Follow("s", "s", "0123456789abcdef", 99, 0, 0))
    assert follow.code == "foreign_cluster" and not fenced
    ask(primary, p.Heartbeat("dn-a", "tcp://127.0.0.1:1", 0, 0, 1, primary.state.cluster_id, 3))
    assert fenced and "epoch 3" in fenced[0]  # one of its own cluster: it was replaced


def test_a_second_standby_is_refused_while_the_one_in_sync_is_alive(primary):
    primary.log_record(StandbySynced("tcp://127.0.0.1:1", "tcp://127.0.0.1:1"))
    primary.replication.seen["tcp://127.0.0.1:1"] = time.monotonic()
    reply = ask(primary, p.Follow("tcp://127.0.0.1:2", "tcp://127.0.0.1:2",
                                  primary.state.cluster_id, 0, 0, 0))
    assert reply.code == "invalid_argument" and "standby in sync" in reply.message
    assert primary.state.standby[0] == "tcp://127.0.0.1:1"


def test_a_client_leaves_a_master_of_an_older_epoch_at_once():
    """An old primary that was replaced without being fenced (no sync standby) answers as a
    primary still; the client, having seen the newer epoch, does not use it."""
    ctx = zmq.Context.instance()
    new_addr, old_addr = (f"tcp://127.0.0.1:{free_port()}" for _ in range(2))
    new, old = RouterServer(ctx, new_addr), RouterServer(ctx, old_addr)
    stop = threading.Event()

    def answer(server: RouterServer, epoch: int) -> None:
        while not stop.is_set():
            for peer, rid, _ in server.receive(20):
                server.reply(peer, rid, p.Welcome(False, b"", "", epoch, ""))
    threads = [threading.Thread(target=answer, args=(s, e)) for s, e in ((new, 1), (old, 0))]
    for t in threads:
        t.start()
    link = MasterLink(ctx, f"{new_addr},{old_addr}", timeout_s=5)
    try:
        link._check_epoch()
        assert link.epoch == 1
        link.move_on(TimeoutError("the new primary was slow once"))
        assert link.endpoint.addr == new_addr  # the old one was asked, and left
    finally:
        stop.set()
        for t in threads:
            t.join()
        link.close()
        new.close()
        old.close()


def test_a_links_call_ids_cannot_be_guessed_from_the_last():
    ctx = zmq.Context()
    try:
        link = MasterLink(ctx, "tcp://127.0.0.1:1", timeout_s=1)
        ids = [link.call_id() for _ in range(50)]
        randoms = [i.rsplit("-", 1)[0] for i in ids]
        assert len(set(randoms)) == 50 and all(len(r) == 16 for r in randoms)  # 64 bits each
        assert [int(i.rsplit("-", 1)[1]) for i in ids] == list(range(50))
        link.close()
    finally:
        ctx.term()
