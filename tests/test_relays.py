"""Enqueues a data node passes on for their producers (master/relays.py, datanode/relays.py):
served as the producer's own request only under its placement's key, answered to the
producer's connection, never applied twice; the node checks their shape and passes them on
with its report."""

from __future__ import annotations

import time
import zlib

import pytest
from support.in_process_master import call, enqueue_msg, in_process_master, place, report

from blizzard.local.harness import free_port
from blizzard.wire import protocol as p
from blizzard.wire import relay_signature
from blizzard.wire.errors import InvalidArgument
from datanode.config import DatanodeConfig
from datanode.relays import MAX_RELAYED, REPORT_RELAY_BYTES, check_relay, relay_groups
from datanode.server import DatanodeServer
from datanode.store import MemoryStore
from master import relays as master_relays

TO = b"t" * 16  # the producer's routing id on its master connection


def relaying_master():
    """A master whose data node ``dn-a`` asks for leases to answer: of this release."""
    server = in_process_master(replication=1)
    server.await_serves(p.AwaitServes("dn-a", [], []), time.time(), time.monotonic(), b"dn-a", 1)
    return server


@pytest.fixture
def master():
    server = relaying_master()
    yield server
    server.close()


def relay_of(placement: p.Placement, msg, rid: int = 7, key: bytes | None = None,
             reply_to: bytes = TO) -> p.Relay:
    frame = p.encode(rid, msg)
    return p.Relay(reply_to, frame, relay_signature.sign(
        placement.relay_key if key is None else key, reply_to, frame))


def pass_of(master, *requests) -> list:
    """One pass of the loop over ``requests`` (peer, message): the replies after its fsync."""
    master._handle_all([(peer, 0, msg) for peer, msg in requests], time.time(), time.monotonic())
    master.wal.flush()
    replies, master._replies = master._replies, []
    return replies


def test_a_relayed_enqueue_is_served_as_its_producers_request_and_answered_there(master):
    placement = place(master, 2)
    assert len(placement.relay_key) == relay_signature.KEY_BYTES
    relay = relay_of(placement, enqueue_msg(placement.ids))
    replies = pass_of(master, (b"dn-a", p.PutReport("dn-a", placement.ids, [], "", [relay])))
    assert replies == [(TO, 7, p.Committed(2))]  # the reports came with it: committed at once
    assert sorted(master.state.items) == placement.ids
    assert master.relays.counts == {"taken": 1, "dropped": 0}


def test_a_relay_that_comes_before_its_reports_waits_for_them_like_any_enqueue():
    server = relaying_master()
    try:
        placement = place(server, 1)
        relay = relay_of(placement, enqueue_msg(placement.ids, request="e1"))
        assert pass_of(server, (b"dn-a", p.PutReport("dn-a", [], [], "", [relay]))) == []
        assert server.enqueues.waiting  # parked for the producer
        report(server, placement.ids)
        replies = server.enqueues.serve_waiting(time.time(), time.monotonic())
        assert replies == [(TO, 7, p.Committed(1))]
    finally:
        server.close()


@pytest.mark.parametrize("forge", ["another key", "changed frame", "no enqueue", "short id",
                                   "another placement", "short signature"])
def test_a_relay_not_signed_with_its_placements_key_is_dropped_and_changes_nothing(master,
                                                                                   forge):
    placement = place(master, 1)
    other = place(master, 1)
    msg = enqueue_msg(placement.ids)
    relay = relay_of(placement, msg)
    if forge == "another key":  # a data node making an enqueue up
        relay = relay_of(placement, msg, key=b"k" * 16)
    elif forge == "changed frame":  # ... or changing one on the way (another queue)
        relay = p.replace(relay, frame=p.encode(7, p.replace(msg, queue="elsewhere")))
    elif forge == "no enqueue":
        relay = relay_of(placement, p.Ack(placement.ids, [1], "q"))
    elif forge == "short id":
        relay = relay_of(placement, msg, reply_to=b"t" * 15)
    elif forge == "another placement":  # signed by the producer of other ids
        relay = relay_of(other, msg)
    elif forge == "short signature":
        relay = p.replace(relay, mac=relay.mac[:8])
    replies = pass_of(master, (b"dn-a", p.PutReport("dn-a", placement.ids, [], "", [relay])))
    assert replies == [] and master.state.items == {} and master.enqueues.waiting == {}
    assert master.relays.counts == {"taken": 0, "dropped": 1}
    # the producer, answered by nobody, sends its enqueue itself: its ids are still its own
    assert call(master, msg) == p.Committed(1)


def test_a_master_offers_no_relays_unless_every_placed_node_passes_them_on():
    server = in_process_master(replication=1)  # dn-a never asked for orders: an older node
    try:
        placement = place(server, 1)
        assert placement.relay_key == b""
        relay = relay_of(placement, enqueue_msg(placement.ids), key=b"k" * 16)
        assert pass_of(server, (b"dn-a", p.PutReport("dn-a", placement.ids, [], "", [relay]))) \
            == [] and server.state.items == {}
    finally:
        server.close()


def test_a_relay_that_comes_after_its_enqueue_landed_is_not_applied_twice(master):
    placement = place(master, 1)
    msg = enqueue_msg(placement.ids, request="e1")
    report(master, placement.ids)
    assert call(master, msg) == p.Committed(1)  # the producer gave up waiting and sent it
    relay = relay_of(placement, msg)
    assert pass_of(master, (b"dn-a", p.PutReport("dn-a", [], [], "", [relay]))) == []
    assert list(master.state.items) == placement.ids


def test_a_relay_and_its_producers_own_enqueue_at_once_are_answered_once(master):
    placement = place(master, 1)
    msg = enqueue_msg(placement.ids, request="e1")
    relay = relay_of(placement, msg)
    assert pass_of(master, (b"dn-a", p.PutReport("dn-a", [], [], "", [relay]))) == []
    # the producer's own copy of it (its wait ran out) takes the answer over
    assert master.handle(TO, 8, msg, time.time(), time.monotonic()) is None
    report(master, placement.ids)
    assert master.enqueues.serve_waiting(time.time(), time.monotonic()) == \
        [(TO, 8, p.Committed(1))]
    assert list(master.state.items) == placement.ids


def test_a_report_relaying_too_many_enqueues_is_refused_but_its_reports_count(master):
    placement = place(master, 1)
    relay = relay_of(placement, enqueue_msg(placement.ids))
    reply = master.handle(b"dn-a", 1, p.PutReport("dn-a", placement.ids, [], "",
                                                  [relay] * (master_relays.MAX_RELAYED + 1)),
                          time.time(), time.monotonic())
    assert isinstance(reply, p.Error) and "at most 512" in reply.message
    assert master.relays.waiting == [] and master.id_blocks.holders(placement.ids[0]) == ["dn-a"]


def test_only_the_node_a_report_speaks_for_may_relay_in_it(master):
    placement = place(master, 1)
    relay = relay_of(placement, enqueue_msg(placement.ids))
    replies = pass_of(master, (b"someone", p.PutReport("dn-a", [], [], "", [relay])))
    assert [type(r) for _, _, r in replies] == [p.Error]  # the report refused, nothing relayed
    assert master.relays.waiting == [] and master.state.items == {}


# -- the data node's side ------------------------------------------------------------------

def _relay(size: int = 100) -> p.Relay:
    return p.Relay(TO, b"f" * size, b"m" * 16)


@pytest.mark.parametrize("relay, report, words", [
    (_relay(), False, "only a put that reports"),
    (p.Relay(b"t" * 8, b"f", b"m" * 16), True, "routing id of 16 bytes"),
    (p.Relay(TO, b"f", b"m" * 15), True, "signature of 16"),
    (p.Relay(TO, b"", b"m" * 16), True, "1 to"),
    (p.Relay(TO, b"f" * (1024 * 1024 + 1), b"m" * 16), True, "1 to"),
])
def test_a_node_refuses_a_relay_of_the_wrong_shape(relay, report, words):
    with pytest.raises(InvalidArgument, match=words):
        check_relay(relay, report)


def test_relays_are_grouped_within_a_reports_bounds_the_first_group_last():
    assert relay_groups([]) == []
    many = [_relay() for _ in range(MAX_RELAYED + 3)]
    groups = relay_groups(many)
    assert [len(g) for g in groups] == [3, MAX_RELAYED]
    big = [_relay(size=REPORT_RELAY_BYTES // 2 + 1) for _ in range(3)]
    assert [len(g) for g in relay_groups(big)] == [1, 1, 1]


def _granted_put(item_id: int, relay: p.Relay | None, node_id: str) -> p.Put:
    blob = f"blob-{item_id}".encode()
    return p.Put([item_id], [blob], [zlib.crc32(blob)], [], 1, node_id, True,
                 p.PutGrant(item_id, 1, [node_id], 0, 0.0, b""), [], relay)


def test_a_node_passes_relays_on_with_the_passs_report_after_the_write(tmp_path, monkeypatch):
    store = MemoryStore()
    server = DatanodeServer(DatanodeConfig(data_dir=str(tmp_path),
                                           bind=f"tcp://127.0.0.1:{free_port()}"), store=store)
    reports = []
    monkeypatch.setattr(server, "_report", reports.append)
    monkeypatch.setattr(server.router, "reply", lambda *a: reports.append(a))
    first, second = _relay(), p.Relay(b"u" * 16, b"g", b"m" * 16)
    try:
        server._handle([(b"p1", 1, _granted_put(1, first, server.node_id)),
                        (b"p2", 2, _granted_put(2, second, server.node_id)),
                        (b"p3", 3, _granted_put(3, None, server.node_id))])
        assert reports == [p.PutReport(server.node_id, [1, 2, 3], [], "", [first, second])]
        assert store.count == 3
        reports.clear()
        # a put refused (here: to another node id) is not relayed; its producer's wait runs out
        server._handle([(b"p4", 4, _granted_put(4, first, "dn-other"))])
        assert [r.relayed for r in reports] == [[]] and reports[0].failed == [4]
    finally:
        server.close()
