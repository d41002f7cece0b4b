"""Enqueues a data node passes on for their producers (master/relays.py, datanode/relays.py):
served as the producer's own request only under its placement's key, answered to the
producer's connection, never applied twice; the node checks their shape and passes them on
with its report."""

from __future__ import annotations

import time
import zlib

import pytest
import zmq
from support.in_process_master import call, enqueue_msg, in_process_master, place, report

from blizzard.local.harness import free_port
from blizzard.server.router import REVOKED, RouterServer
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
        placement.relay_key if key is None else key, reply_to, frame), placement.first)


def pass_of(master, *requests) -> list:
    """One pass of the loop over ``requests`` (peer, message): the replies after its fsync."""
    master._handle_all([(peer, 0, msg) for peer, msg in requests], time.time(), time.monotonic())
    master.wal.flush()
    replies, master._replies = master._replies, []
    return replies


def test_a_relayed_enqueue_is_served_as_its_producers_request_and_answered_there(master):
    placement = place(master, 2, TO)
    assert len(placement.relay_key) == relay_signature.KEY_BYTES
    relay = relay_of(placement, enqueue_msg(placement.ids))
    replies = pass_of(master, (b"dn-a", p.PutReport("dn-a", placement.ids, [], "", [relay])))
    assert replies == [(TO, 7, p.Committed(2))]  # the reports came with it: committed at once
    assert sorted(master.state.items) == placement.ids
    assert master.relays.counts == {"taken": 1, "dropped": 0}


def test_a_relay_that_comes_before_its_reports_waits_for_them_like_any_enqueue():
    server = relaying_master()
    try:
        placement = place(server, 1, TO)
        relay = relay_of(placement, enqueue_msg(placement.ids, request="e1"))
        assert pass_of(server, (b"dn-a", p.PutReport("dn-a", [], [], "", [relay]))) == []
        assert server.enqueues.waiting  # parked for the producer
        report(server, placement.ids)
        replies = server.enqueues.serve_waiting(time.time(), time.monotonic())
        assert replies == [(TO, 7, p.Committed(1))]
    finally:
        server.close()


@pytest.mark.parametrize("forge", ["another key", "changed frame", "no enqueue", "short id",
                                   "another placement", "short signature", "another first",
                                   "another connection"])
def test_a_relay_not_signed_with_its_placements_key_is_dropped_and_changes_nothing(master,
                                                                                   forge):
    placement = place(master, 1, TO)
    other = place(master, 1, TO)
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
    elif forge == "another first":  # the frame's ids are not those the signature was checked for
        relay = p.replace(relay, first=other.first)
    elif forge == "another connection":  # a client's signed relay, its answer sent elsewhere
        relay = relay_of(placement, msg, reply_to=b"v" * 16)
    replies = pass_of(master, (b"dn-a", p.PutReport("dn-a", placement.ids, [], "", [relay])))
    assert replies == [] and master.state.items == {} and master.enqueues.waiting == {}
    assert master.relays.counts == {"taken": 0, "dropped": 1}
    # the producer, answered by nobody, sends its enqueue itself: its ids are still its own
    assert call(master, msg, TO) == p.Committed(1)


def test_a_master_offers_no_relays_unless_every_placed_node_passes_them_on():
    server = in_process_master(replication=1)  # dn-a never asked for orders: an older node
    try:
        placement = place(server, 1, TO)
        assert placement.relay_key == b""
        relay = relay_of(placement, enqueue_msg(placement.ids))  # (anyone can sign with b"")
        assert pass_of(server, (b"dn-a", p.PutReport("dn-a", placement.ids, [], "", [relay]))) \
            == [] and server.state.items == {}
    finally:
        server.close()


def test_a_relay_that_comes_after_its_enqueue_landed_is_not_applied_twice(master):
    placement = place(master, 1, TO)
    msg = enqueue_msg(placement.ids, request="e1")
    report(master, placement.ids)
    assert call(master, msg, TO) == p.Committed(1)  # the producer gave up waiting, sent it
    relay = relay_of(placement, msg)
    assert pass_of(master, (b"dn-a", p.PutReport("dn-a", [], [], "", [relay]))) == []
    assert list(master.state.items) == placement.ids


def test_a_relay_and_its_producers_own_enqueue_at_once_are_answered_once(master):
    placement = place(master, 1, TO)
    msg = enqueue_msg(placement.ids, request="e1")
    relay = relay_of(placement, msg)
    assert pass_of(master, (b"dn-a", p.PutReport("dn-a", [], [], "", [relay]))) == []
    # the producer's own copy of it (its wait ran out) takes the answer over
    assert master.handle(TO, 8, msg, time.time(), time.monotonic()) is None
    report(master, placement.ids)
    assert master.enqueues.serve_waiting(time.time(), time.monotonic()) == \
        [(TO, 8, p.Committed(1))]
    assert list(master.state.items) == placement.ids


def test_a_relay_that_comes_after_its_producers_own_copy_leaves_the_answer_there(master):
    placement = place(master, 1, TO)
    msg = enqueue_msg(placement.ids, request="e1")
    # the relaying node was slow: the producer sent the enqueue itself (request id 8) ...
    assert master.handle(TO, 8, msg, time.time(), time.monotonic()) is None
    # ... and the relay (request id 7, which the producer no longer waits for) comes after
    assert pass_of(master, (b"dn-a", p.PutReport("dn-a", placement.ids, [], "",
                                                  [relay_of(placement, msg)]))) == []
    assert master.relays.counts == {"taken": 0, "dropped": 1}
    assert master.enqueues.serve_waiting(time.time(), time.monotonic()) == \
        [(TO, 8, p.Committed(1))]


def test_a_relay_of_an_enqueue_refused_meanwhile_never_lands(master):
    placement = place(master, 1, TO)
    msg = p.replace(enqueue_msg(placement.ids, request="e1"), only_existing=True)
    # the producer's own copy is refused for what the master holds now (no such queue) ...
    replies = pass_of(master, (TO, msg))
    assert [type(r) for _, _, r in replies] == [p.Error]
    call(master, p.Configure(**dict.fromkeys(p.fields_of(p.Configure)) | {"queue": "q",
                                                                           "create": True}))
    # ... and the relay, which would pass now that the queue exists, comes late: dropped
    assert pass_of(master, (b"dn-a", p.PutReport("dn-a", placement.ids, [], "",
                                                  [relay_of(placement, msg)]))) == []
    assert master.state.items == {} and master.relays.counts["dropped"] == 1


def test_a_relay_is_served_with_the_role_of_the_key_that_placed_its_ids(monkeypatch):
    server = relaying_master()
    # (grants are unsigned here, with no keys: shown in test_grants.py)
    monkeypatch.setattr(server.capabilities, "check_owned", lambda *args: None)
    try:
        server.router.roles = {TO: "client:KEY"}  # a secure router's view of this pass
        placement = place(server, 1, TO)
        server.router.roles = {b"dn-a": "node:NODEKEY"}  # the next pass: only the node speaks
        grant = placement.grant
        msg = p.replace(enqueue_msg(placement.ids), grant=grant)
        replies = pass_of(server, (b"dn-a", p.PutReport("dn-a", placement.ids, [], "",
                                                         [relay_of(placement, msg)])))
        assert replies == [(TO, 7, p.Committed(1))]
        assert server.router.roles[TO] == "client:KEY"  # vouched for by its placement
    finally:
        server.close()


def test_a_vouched_key_no_longer_admitted_is_taken_for_revoked():
    class Admitted:
        def current(self, who: str) -> bool:
            return who != "client:GONE"
    router = RouterServer(zmq.Context.instance(), "inproc://relays-vouch")
    try:
        router.secure, router.admitted = True, Admitted()
        router.vouch(TO, "client:KEY")
        assert router.role_of(TO) == "client"
        router.vouch(TO, "client:GONE")  # removed since it placed the ids
        assert router.roles[TO] == REVOKED
        router.vouch(TO, "client:KEY")  # its own connection showed a revoked key this pass
        assert router.roles[TO] == REVOKED
    finally:
        router.close()


def test_a_report_relaying_too_many_enqueues_is_refused_but_its_reports_count(master):
    placement = place(master, 1, TO)
    relay = relay_of(placement, enqueue_msg(placement.ids))
    reply = master.handle(b"dn-a", 1, p.PutReport("dn-a", placement.ids, [], "",
                                                  [relay] * (master_relays.MAX_RELAYED + 1)),
                          time.time(), time.monotonic())
    assert isinstance(reply, p.Error) and "at most 512" in reply.message
    assert master.relays.waiting == [] and master.id_blocks.holders(placement.ids[0]) == ["dn-a"]


def test_only_the_node_a_report_speaks_for_may_relay_in_it(master):
    placement = place(master, 1, TO)
    relay = relay_of(placement, enqueue_msg(placement.ids))
    replies = pass_of(master, (b"someone", p.PutReport("dn-a", [], [], "", [relay])))
    assert [type(r) for _, _, r in replies] == [p.Error]  # the report refused, nothing relayed
    assert master.relays.waiting == [] and master.state.items == {}


# -- the data node's side ------------------------------------------------------------------

def _relay(size: int = 100) -> p.Relay:
    return p.Relay(TO, b"f" * size, b"m" * 16, 1)


@pytest.mark.parametrize("relay, report, words", [
    (_relay(), False, "only a put that reports"),
    (p.Relay(b"t" * 8, b"f", b"m" * 16, 1), True, "routing id of 16 bytes"),
    (p.Relay(TO, b"f", b"m" * 15, 1), True, "signature of 16"),
    (p.Relay(TO, b"", b"m" * 16, 1), True, "1 to"),
    (p.Relay(TO, b"f" * (1024 * 1024 + 1), b"m" * 16, 1), True, "1 to"),
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
    first, second = _relay(), p.Relay(b"u" * 16, b"g", b"m" * 16, 2)
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
