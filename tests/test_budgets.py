"""The master's and a data node's per-sender budgets, in process: caps hold, clear errors follow."""

from __future__ import annotations

import time

import pytest
import zmq

from blizzard.local.harness import free_port
from blizzard.net.transport import HEARTBEAT_IVL_MS, raise_if_error
from blizzard.server.router import bind_router
from blizzard.wire import protocol as p
from blizzard.wire.errors import InvalidArgument, ProtocolError, TooManyItems
from datanode.config import DatanodeConfig
from datanode.server import MAX_PEERS, DatanodeServer
from datanode.store import MemoryStore
from master.nodes import blob_deletes as deletes_mod
from master.nodes import membership as membership_mod
from master.nodes.blob_deletes import Deletes
from master.nodes.membership import Membership
from master.produce import enqueue
from master.produce import placements as id_blocks

from support.in_process_master import (
    alloc,
    call,
    enqueue_msg,
    in_process_master,
    place,
    report,
    waiting_replies,
)


def test_the_decoder_refuses_shapes_no_message_has():
    head = bytes([0x93, p.VERSION, 1, 0x92, 12])  # [VERSION, 1, [Commit, ids...]]
    many_empty = head + b"\xdd" + (200_000).to_bytes(4, "big") + b"\x90" * 200_000
    wide = bytes([0x93, p.VERSION, 1, 0x94, 12]) + b"\xdc\xff\xff" + b"\x90" * 0xFFFF  # Commit
    ext = bytes([0x93, p.VERSION, 1, 0x92, 20]) + b"\xc7\x01\x05x"  # a Stats of an ext value
    for frame in (many_empty, wide, b"\x81\xa1k\x01", ext):
        with pytest.raises(ProtocolError):
            p.decode(frame)
    with pytest.raises(ProtocolError, match=f"Get: Expected `int` <= {p.MAX_ID} - at field ids"):
        p.decode(p.encode(1, p.Get([p.MAX_ID + 1], None)))
    assert p.peek_request_id(p.encode(2**63, p.Status())) is None


def test_ids_held_are_capped_per_connection_and_in_all(monkeypatch):
    master = in_process_master(replication=1)
    monkeypatch.setattr(id_blocks, "MAX_HELD_PER_PEER", 15)
    monkeypatch.setattr(id_blocks, "MAX_HELD", 25)
    place(master, 10)
    with pytest.raises(TooManyItems, match="this connection"):
        place(master, 10)
    place(master, 10, peer=b"other")
    with pytest.raises(TooManyItems, match="at most 25"):
        place(master, 10, peer=b"third")
    master.enqueues.expire(time.monotonic() + master.config.pending_timeout_s + 1)
    assert master.id_blocks.by_id == {} and master.id_blocks.by_peer == {}
    place(master, 10)  # room again


def test_staged_items_are_capped_per_connection_and_in_all(monkeypatch):
    master = in_process_master(replication=1)
    monkeypatch.setattr(enqueue, "MAX_PENDING_PER_PEER", 15)
    monkeypatch.setattr(enqueue, "MAX_PENDING", 25)
    alloc(master, 10)
    with pytest.raises(TooManyItems, match="this connection"):
        alloc(master, 10)
    alloc(master, 10, peer=b"other")
    with pytest.raises(TooManyItems, match="at most 25"):
        alloc(master, 10, peer=b"third")
    assert len(master.enqueues.pending) == 20 and master.enqueues.count("q") == 20
    master.enqueues.expire(time.monotonic() + master.config.pending_timeout_s + 1)
    assert master.enqueues.count("q") == 0 and master.enqueues.by_peer == {}
    alloc(master, 10)  # room again


def test_enqueues_waiting_for_reports_are_capped_per_connection(monkeypatch):
    master = in_process_master(replication=1)
    monkeypatch.setattr(enqueue, "MAX_WAITING_PER_PEER", 2)
    placement = place(master, 3)
    for k in range(2):
        assert call(master, enqueue_msg(placement.ids[k:k + 1], request=f"w{k}")) is None
    with pytest.raises(TooManyItems, match="waiting"):
        call(master, enqueue_msg(placement.ids[2:], request="w2"))
    report(master, placement.ids)
    assert len(waiting_replies(master)) == 2 and master.enqueues.waiting_by_peer == {}


def test_pending_counts_per_queue_follow_commits_without_a_scan():
    master = in_process_master(replication=1)
    a = alloc(master, 3, queue="a")
    alloc(master, 2, queue="b")
    call(master, p.Commit(a.ids[:2], ["dn-a"], "c1"))
    stats = {s.queue: s.pending for s in call(master, p.ListQueues()).queues}
    assert stats == {"a": 1}  # b has no committed item yet, so no queue; its count is kept
    assert master.enqueues.count("b") == 2


def test_a_record_too_large_to_log_changes_nothing(monkeypatch):
    master = in_process_master(replication=1)
    placement = alloc(master, 2)
    monkeypatch.setattr("master.log.wal.MAX_RECORD_BYTES", 10)
    with pytest.raises(InvalidArgument, match="log record"):
        call(master, p.Commit(placement.ids, ["dn-a"], "r1"))
    assert master.state.items == {} and len(master.enqueues.pending) == 2
    assert "r1" not in master.state.recent_commits and not master.wal.dirty
    monkeypatch.undo()
    assert call(master, p.Commit(placement.ids, ["dn-a"], "r1")).count == 2
    assert sorted(master.state.items) == placement.ids


def test_long_polls_are_capped_and_keep_no_ack_lists(monkeypatch):
    master = in_process_master(replication=1)
    monkeypatch.setattr("master.consume.leases.MAX_WAITERS_PER_PEER", 3)
    for _ in range(3):
        assert call(master, p.Lease("q", 1, 1.0, 5.0, "", [], [])) is None
    with pytest.raises(TooManyItems, match="long polls"):
        call(master, p.Lease("q", 1, 1.0, 5.0, "", [], []))
    assert all(w.msg.ack_ids == [] for w in master.leases.waiters)
    master.leases.serve_waiters(time.time(), time.monotonic() + 10)  # they time out
    assert master.leases.waiters == [] and master.leases.waiting_by_peer == {}


def test_delete_orders_are_capped(monkeypatch):
    monkeypatch.setattr(deletes_mod, "MAX_PER_NODE", 5)
    monkeypatch.setattr(deletes_mod, "MAX_TOTAL", 8)
    d = Deletes()
    d.order("a", range(10))
    d.order("b", range(10))
    assert d.waiting("a") == 5 and d.waiting("b") == 3 and d.dropped == 12
    assert d.take("a") == [0, 1, 2, 3, 4] and d.total == 3


def test_known_data_nodes_are_capped_and_a_live_node_keeps_its_address(monkeypatch):
    monkeypatch.setattr(membership_mod, "MAX_NODES", 2)
    m = Membership(dead_after_s=5)
    m.heartbeat("a", "tcp://127.0.0.1:1", 0, 0, 0, now=0.0)
    m.heartbeat("b", "tcp://127.0.0.1:2", 0, 0, 0, now=0.0)
    with pytest.raises(InvalidArgument, match="alive at"):
        m.heartbeat("a", "tcp://127.0.0.1:9", 0, 0, 0, now=1.0)
    with pytest.raises(InvalidArgument, match="no more join"):
        m.heartbeat("c", "tcp://127.0.0.1:3", 0, 0, 0, now=1.0)
    m.heartbeat("a", "tcp://127.0.0.1:1", 0, 0, 0, now=7.0)
    assert m.heartbeat("c", "tcp://127.0.0.1:3", 0, 0, 0, now=7.0)  # b is dead: its slot is free
    assert m.heartbeat("a", "tcp://127.0.0.1:1", 0, 0, 0, now=7.5) is False
    assert m.heartbeat("c", "tcp://127.0.0.1:4", 0, 0, 0, now=20.0)  # c died; it may move now


def test_a_data_node_keeps_a_bounded_set_of_peer_connections(tmp_path):
    server = DatanodeServer(DatanodeConfig(data_dir=str(tmp_path),
                                           bind=f"tcp://127.0.0.1:{free_port()}"),
                            store=MemoryStore())
    try:
        for port in range(1, MAX_PEERS + 20):
            server._peer(f"tcp://127.0.0.1:{port}")
        assert len(server.peers) == MAX_PEERS
        assert "tcp://127.0.0.1:1" not in server.peers  # least recently used went first
        with pytest.raises(InvalidArgument):
            server._peer("tcp://x")
    finally:
        server.close()


def test_server_sockets_heartbeat_and_bound_frames():
    sock = bind_router(zmq.Context.instance(), f"tcp://127.0.0.1:{free_port()}", 1234)
    try:
        assert sock.getsockopt(zmq.HEARTBEAT_IVL) == HEARTBEAT_IVL_MS
        assert sock.getsockopt(zmq.HEARTBEAT_TIMEOUT) > 0
        assert sock.getsockopt(zmq.MAXMSGSIZE) == 1234
        assert sock.getsockopt(zmq.TCP_KEEPALIVE) == 1
    finally:
        sock.close(linger=0)


def test_a_data_node_answers_any_broken_request_and_goes_on(tmp_path, monkeypatch):
    server = DatanodeServer(DatanodeConfig(data_dir=str(tmp_path),
                                           bind=f"tcp://127.0.0.1:{free_port()}"),
                            store=MemoryStore())
    replies = []
    monkeypatch.setattr(server.router, "reply", lambda peer, rid, msg: replies.append(msg))

    def broken(ids):
        raise RuntimeError("a bug")
    monkeypatch.setattr(server.store, "get_many", broken)
    try:
        server._handle([(b"c", 1, p.Get([1], None)), (b"c", 2, p.Delete([1], None))])
        assert [type(r) for r in replies] == [p.Error, p.Ok]
        assert replies[0].code == "internal"
        with pytest.raises(Exception, match="internal"):
            raise_if_error(replies[0])
    finally:
        server.close()


def test_the_master_answers_a_broken_handler_and_goes_on(monkeypatch):
    master = in_process_master(replication=1)

    def broken(*args):
        raise KeyError("a bug")
    monkeypatch.setitem(master.handlers, p.Stats, broken)
    reply = master.handle(b"c", 1, p.Stats("q"), time.time(), time.monotonic())
    assert isinstance(reply, p.Error) and reply.code == "internal"
    alloc(master, 2)  # the next request is served as usual


def test_a_pass_over_parked_long_polls_looks_at_a_queue_with_nothing_to_give_once():
    master = in_process_master(replication=1)
    for _ in range(50):
        assert call(master, p.Lease("q", 1, 1.0, 5.0, "", [], [])) is None
    assert call(master, p.Lease("other", 1, 1.0, 5.0, "", [], [])) is None
    looked = []
    take = master.leases._take
    master.leases._take = lambda msg, now, mono: looked.append(msg.queue) or take(msg, now, mono)
    assert master.leases.serve_waiters(time.time(), time.monotonic()) == []
    assert sorted(looked) == ["other", "q"] and len(master.leases.waiters) == 51
