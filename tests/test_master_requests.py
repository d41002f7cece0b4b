"""The master's requests in-process: place, put reports, enqueue, staged commits.

A real ``MasterServer`` over an in-memory WAL and a stand-in router, its requests handled in
process, with data nodes that exist only as heartbeats, so each rule is shown without a cluster.
"""

from __future__ import annotations

import math
import time

import pytest

from blizzard.wire import protocol as p
from blizzard.wire.errors import InvalidArgument, PayloadTooLarge, UnknownItem
from master.server import MasterServer

from support.in_process_master import (
    alloc,
    call,
    enqueue_msg,
    in_process_master,
    join,
    place,
    report,
    waiting_replies,
)


@pytest.fixture
def master():
    server = in_process_master(replication=1, max_item_bytes=1000)
    yield server
    server.close()


@pytest.mark.parametrize("field, value, error, words", [
    ("sizes", 1001, PayloadTooLarge, "exceeds max-item-bytes"),
    ("sizes", -1, PayloadTooLarge, "-1 bytes"),
    ("crcs", -5, InvalidArgument, "checksum -5"),
    ("crcs", 2**32, InvalidArgument, "not a CRC-32"),
    ("priorities", 2**31, InvalidArgument, "32-bit"),
    ("delays", math.nan, InvalidArgument, "delay_s"),
    ("delays", math.inf, InvalidArgument, "delay_s"),
    ("delays", -0.5, InvalidArgument, "delay_s"),
    ("keys", "k" * 257, InvalidArgument, "at most 256"),
])
def test_one_bad_item_refuses_the_whole_enqueue(master, field, value, error, words):
    placement = place(master, 5)
    report(master, placement.ids)
    good = {"sizes": [10] * 5, "crcs": [7] * 5, "priorities": [0] * 5, "delays": [0.0] * 5,
            "keys": [""] * 5}
    good[field][3] = value
    with pytest.raises(error, match=words):
        call(master, enqueue_msg(placement.ids, **good))
    assert master.state.items == {} and master.enqueues.waiting == {}
    assert all(master.id_blocks.holds(i) for i in placement.ids)  # still the producer's to use


def test_an_enqueue_waits_for_its_reports_then_commits_each_items_metadata(master):
    placement = place(master, 3)
    msg = enqueue_msg(placement.ids, sizes=[1, 2, 3], priorities=[2, 0, 1], keys=["a", "", "c"])
    assert call(master, msg) is None  # parked: no node reported yet
    assert waiting_replies(master) == [] and master.state.items == {}
    report(master, placement.ids[:2])
    assert waiting_replies(master) == [] and master.state.items == {}
    report(master, placement.ids[2:])
    assert waiting_replies(master) == [p.Committed(3)]
    items = [master.state.items[i] for i in placement.ids]
    assert [(i.size, i.priority, i.key, i.nodes) for i in items] == \
        [(1, 2, "a", ("dn-a",)), (2, 0, "", ("dn-a",)), (3, 1, "c", ("dn-a",))]
    assert master.enqueues.waiting == {} and not master.id_blocks.holds(placement.ids[0])


def test_reports_that_come_first_commit_the_enqueue_at_once(master):
    placement = place(master, 2)
    report(master, placement.ids)
    assert call(master, enqueue_msg(placement.ids)) == p.Committed(2)
    assert sorted(master.state.items) == placement.ids


def test_a_retried_enqueue_is_answered_once_and_never_applied_twice(master):
    placement = place(master, 1)
    assert master.handle(b"peer", 1, enqueue_msg(placement.ids, request="e1"), time.time(),
                         time.monotonic()) is None
    # the producer timed out and sent it again: the one answer goes to the retry
    assert master.handle(b"peer", 2, enqueue_msg(placement.ids, request="e1"), time.time(),
                         time.monotonic()) is None
    report(master, placement.ids)
    assert [(rid, reply) for _, rid, reply in master.enqueues.serve_waiting(
        time.time(), time.monotonic())] == [(2, p.Committed(1))]
    assert call(master, enqueue_msg(placement.ids, request="e1")) == p.Committed(1)
    assert len(master.state.items) == 1


def test_a_refused_put_fails_the_enqueue_at_once_and_names_the_node(master):
    placement = place(master, 2)
    assert call(master, enqueue_msg(placement.ids)) is None
    report(master, placement.ids[:1], failed=placement.ids[1:], error="disk full")
    assert waiting_replies(master) == [p.Unstored(["dn-a"], "dn-a: disk full")]
    assert master.state.items == {} and master.enqueues.waiting == {}


def test_an_enqueue_whose_nodes_stay_silent_is_unstored_after_its_wait(master):
    placement = place(master, 1)
    assert call(master, enqueue_msg(placement.ids, wait_s=0.5)) is None
    assert waiting_replies(master) == []
    [reply] = waiting_replies(master, time.monotonic() + 1)
    assert isinstance(reply, p.Unstored) and reply.nodes == ["dn-a"]
    assert master.state.items == {}


def test_ids_never_handed_out_are_refused_and_their_blobs_deleted(master):
    placement = place(master, 1)
    stranger = placement.first + 10_000
    with pytest.raises(UnknownItem, match="not handed out"):
        call(master, enqueue_msg([stranger]))
    report(master, [stranger])  # a node stored it anyway: the blob is a stray
    assert master.deletes.take("dn-a") == [stranger]
    with pytest.raises(InvalidArgument, match="own connection"):
        call(master, p.PutReport("dn-nobody", [placement.first], [], ""))


def test_ids_stored_but_never_enqueued_are_deleted_when_their_block_expires(master_w1_of_2):
    master = master_w1_of_2
    placement = place(master, 3)
    report(master, placement.ids[:2])
    call(master, enqueue_msg(placement.ids[:1]))
    master.enqueues.expire(time.monotonic() + master.config.pending_timeout_s + 1)
    # on every placed node, whether it reported or not (a report can be lost on the way)
    assert master.deletes.take("dn-a") == placement.ids[1:2]
    assert master.deletes.take("dn-b") == placement.ids[1:2]
    assert not master.id_blocks.holds(placement.ids[2])  # never used: forgotten, nothing to delete
    assert list(master.state.items) == placement.ids[:1]
    with pytest.raises(UnknownItem):
        call(master, enqueue_msg(placement.ids[2:], request="late"))


def test_a_failed_enqueue_never_lands_later(master):
    placement = place(master, 2)
    assert call(master, enqueue_msg(placement.ids, request="e1", wait_s=0.5)) is None
    [reply] = waiting_replies(master, time.monotonic() + 1)
    assert isinstance(reply, p.Unstored)
    report(master, placement.ids)  # the slow node's report comes in after all
    for request in ("e1", "e2"):  # a stale copy of the same enqueue, or another naming the ids
        with pytest.raises(UnknownItem):
            call(master, enqueue_msg(placement.ids, request=request))
    assert master.state.items == {}
    assert sorted(master.deletes.take("dn-a")) == sorted(placement.ids * 2)  # failure, late report


def test_a_retry_from_another_connection_takes_over_the_wait_and_its_count(master):
    a, b = place(master, 1), place(master, 1)
    assert call(master, enqueue_msg(a.ids, request="ra", wait_s=0.5), b"p1") is None
    assert call(master, enqueue_msg(b.ids, request="rb", wait_s=0.5), b"p2") is None
    assert call(master, enqueue_msg(a.ids, request="ra", wait_s=0.5), b"p2") is None
    assert master.enqueues.waiting_by_peer == {b"p2": 2}
    assert len(waiting_replies(master, time.monotonic() + 1)) == 2
    assert master.enqueues.waiting_by_peer == {} and master.enqueues.waiting == {}


def test_a_retry_the_master_no_longer_remembers_is_answered_from_its_items(master):
    placement = place(master, 2)
    report(master, placement.ids)
    assert call(master, enqueue_msg(placement.ids, request="old")) == p.Committed(2)
    master.state.recent_commits.clear()  # as after many other enqueues
    assert call(master, enqueue_msg(placement.ids, request="old")) == p.Committed(2)
    assert len(master.state.items) == 2


def test_put_reports_are_taken_only_from_the_nodes_own_connection(master):
    placement = place(master, 1)
    assert call(master, enqueue_msg(placement.ids)) is None
    with pytest.raises(InvalidArgument, match="own connection"):
        call(master, p.PutReport("dn-a", placement.ids, [], ""), b"a-client")
    assert waiting_replies(master) == [] and master.state.items == {}


def test_staged_items_keep_the_holders_each_one_reported(master_w1_of_2):
    m = master_w1_of_2
    placement = place(m, 2)
    report(m, placement.ids[:1], node="dn-a")
    report(m, placement.ids[1:], node="dn-b")
    stored = call(m, enqueue_msg(placement.ids, request="s1", hold=True))
    assert stored == p.Stored(["dn-a", "dn-b"])
    call(m, p.Commit(placement.ids, stored.nodes, "c1"))
    assert [m.state.items[i].nodes for i in placement.ids] == [("dn-a",), ("dn-b",)]


@pytest.fixture
def master_w1_of_2():
    server = in_process_master(replication=2, min_replicas=1)
    join(server, "dn-b", port=2)
    yield server
    server.close()


def test_a_whole_staged_batch_commits_with_each_items_own_metadata(master):
    placement = alloc(master, 3, sizes=[1, 2, 3], crcs=[11, 12, 13], priorities=[2, 0, 1],
                      keys=["a", "", "c"])
    call(master, p.Commit(placement.ids, ["dn-a"], "r1"))
    items = [master.state.items[i] for i in placement.ids]
    assert [(i.size, i.crc, i.priority, i.key) for i in items] == \
        [(1, 11, 2, "a"), (2, 12, 0, ""), (3, 13, 1, "c")]
    assert master.enqueues.pending == {}
    assert master.state.head("q", 10, time.time()) == [placement.ids[1], placement.ids[2],
                                                      placement.ids[0]]


def test_parts_of_staged_batches_commit_in_any_order_and_across_batches(master):
    first = alloc(master, 4, sizes=[1, 2, 3, 4])
    second = alloc(master, 2, sizes=[5, 6])
    call(master, p.Commit([first.ids[3], second.ids[0], first.ids[1]], ["dn-a"], "r1"))
    sizes = {i: master.state.items[i].size for i in master.state.items}
    assert sizes == {first.ids[3]: 4, second.ids[0]: 5, first.ids[1]: 2}
    assert set(master.enqueues.pending) == {first.ids[0], first.ids[2], second.ids[1]}
    call(master, p.Commit([first.ids[0], first.ids[2], second.ids[1]], ["dn-a"], "r2"))
    assert [master.state.items[i].size for i in first.ids + second.ids] == [1, 2, 3, 4, 5, 6]
    assert master.enqueues.pending == {}


def test_a_commit_naming_an_id_twice_is_refused_and_commits_nothing(master):
    placement = alloc(master, 3)
    with pytest.raises(InvalidArgument, match="more than once"):
        call(master, p.Commit([placement.ids[0], placement.ids[0]], ["dn-a"], "r1"))
    assert master.state.items == {} and len(master.enqueues.pending) == 3


def test_a_retried_commit_succeeds_and_an_unknown_id_is_refused(master):
    placement = alloc(master, 2)
    call(master, p.Commit(placement.ids, ["dn-a"], "r1"))
    assert call(master, p.Commit(placement.ids, ["dn-a"], "r1")).count == 2
    assert call(master, p.Commit(placement.ids, ["dn-a"], "r-other")).count == 2
    with pytest.raises(UnknownItem, match="not staged"):
        call(master, p.Commit([placement.ids[-1] + 1000], ["dn-a"], "r3"))


def test_an_uncommitted_rest_expires_and_its_blobs_are_deleted(master):
    placement = alloc(master, 3)
    call(master, p.Commit(placement.ids[:1], ["dn-a"], "r1"))
    master.enqueues.expire(time.monotonic() + master.config.pending_timeout_s + 1)
    assert master.enqueues.pending == {}
    assert master.deletes.take("dn-a") == placement.ids[1:]
    assert list(master.state.items) == placement.ids[:1]


def replies_and_fsyncs(master: MasterServer, monkeypatch, passes: list[list]) -> list[tuple]:
    """Feed ``passes`` of requests to the loop; the list it returns records replies and fsyncs
    in the order they happen."""
    events: list[tuple] = []
    monkeypatch.setattr(master.router, "on_reply",
                        lambda peer, rid, msg: events.append(("reply", rid)))
    real_flush = master.wal.flush

    def flush() -> None:
        if master.wal.dirty:
            events.append(("fsync",))
        real_flush()
    monkeypatch.setattr(master.wal, "flush", flush)
    monkeypatch.setattr(master.router, "receive", lambda timeout_ms: passes.pop(0))
    return events


def test_a_place_is_answered_before_the_fsync_only_if_its_ids_are_reserved_on_disk(
        master, monkeypatch):
    def alloc_msg(n: int) -> p.Place:
        return p.Place(n, [])

    passes = [[(b"c", 1, alloc_msg(5)), (b"c", 2, alloc_msg(5))], [(b"c", 3, alloc_msg(3))]]
    events = replies_and_fsyncs(master, monkeypatch, passes)

    master.run_once(0)  # the first place reserves ids; the second uses that reservation
    assert events == [("fsync",), ("reply", 1), ("reply", 2)]
    events.clear()
    master.run_once(0)  # the reservation is on disk now: no need to wait for a sync
    assert events == [("reply", 3)]


def test_a_lease_is_answered_before_the_fsync_unless_acks_ride_on_it(master, monkeypatch):
    placement = place(master, 2)
    report(master, placement.ids)
    call(master, enqueue_msg(placement.ids))
    passes = [[(b"c", 1, p.Lease("q", 1, 30.0, 0.0, "l1", [], []))]]
    events = replies_and_fsyncs(master, monkeypatch, passes)
    master.run_once(0)  # losing this lease in a crash only delivers the item again
    assert events == [("reply", 1), ("fsync",)]
    leased = master.state.leased_by("l1")
    lease = master.state.items[leased[0]]
    events.clear()
    tokens = [master.leases.describe("q", leased, [], time.time()).leases[0]]
    passes.append([(b"c", 2, p.Lease("q", 1, 30.0, 0.0, "l2", leased, tokens))])
    master.run_once(0)  # this one confirms an ack: not before it is on disk
    assert events == [("fsync",), ("reply", 2)] and lease.id not in master.state.items


def test_an_inventory_that_never_comes_is_asked_for_again():
    """A node still reporting its inventory is no copy target, so an inventory report lost
    on the way would stall repair for good: the master asks again when none of it came for
    INVENTORY_RETRY_S, and stops asking once it has it."""
    from master.nodes.repair import INVENTORY_RETRY_S

    master = in_process_master(dead_after_s=60.0)  # heartbeats below never miss
    now, mono = time.time(), time.monotonic()
    beat = p.Heartbeat("dn-b", "tcp://127.0.0.1:2", 0, 0, 10**12)
    hb = master.datanodes.heartbeat
    assert hb(beat, now, mono, b"dn-b").inventory  # new: asked
    assert not hb(beat, now, mono + 1.0, b"dn-b").inventory  # being reported: not again yet
    # nothing came (the report was lost): asked again, once per stall
    assert hb(beat, now, mono + INVENTORY_RETRY_S + 1, b"dn-b").inventory
    assert not hb(beat, now, mono + INVENTORY_RETRY_S + 2, b"dn-b").inventory
    master.datanodes.inventory(p.Inventory("dn-b", [], True), now, mono + INVENTORY_RETRY_S + 3)
    assert not hb(beat, now, mono + 10 * INVENTORY_RETRY_S, b"dn-b").inventory  # it came
