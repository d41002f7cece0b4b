"""Group commit across callers: a busy server holds a pass's sync for what is on its way."""

from __future__ import annotations

import threading
import time
import zlib

import pytest

from blizzard import Client
from blizzard.local.harness import free_port
from blizzard.net import keys as k
from blizzard.server.sync_hold import MAX_PEERS, SyncHold
from blizzard.wire import protocol as p
from datanode.config import DatanodeConfig
from datanode.server import DatanodeServer
from datanode.store import MemoryStore

from support.in_process_master import (
    NoRouter,
    call,
    enqueue_msg,
    in_process_master,
    place,
    report,
)
from support.prometheus import scrape, value
from support.wait import wait_for


def test_a_pass_holds_only_while_enough_other_callers_were_busy_lately():
    hold = SyncHold(window_s=0.001, min_others=2, recent_s=0.02)
    hold.saw([b"a"], 10.0)
    assert not hold.should_hold({b"a"}, 10.0)  # nobody else
    hold.saw([b"b"], 10.001)
    assert not hold.should_hold({b"a"}, 10.002)  # one other
    hold.saw([b"c"], 10.002)
    assert hold.should_hold({b"a"}, 10.003)  # b and c
    assert not hold.should_hold({b"a", b"b"}, 10.003)  # the pass's own callers do not count
    assert not hold.should_hold({b"a"}, 10.0215)  # b and c have gone quiet
    assert hold.holds == 1
    assert SyncHold(window_s=0).should_hold(set(), 0.0) is False  # off


def test_the_callers_remembered_are_bounded():
    hold = SyncHold()
    hold.saw([str(k).encode() for k in range(MAX_PEERS + 100)], 1.0)
    assert len(hold.last) == MAX_PEERS and b"0" not in hold.last


def _scripted(master, batches: list[list]) -> NoRouter:
    """The master's stand-in router, from now on with ``batches`` arriving one ``receive``
    after another."""
    router = master.router
    router.sent.clear()
    router.waits.clear()
    router.batches = batches
    return router


def _master_with_two_ready_items():
    master = in_process_master(replication=1)
    placement = place(master, 2)
    report(master, placement.ids)
    assert isinstance(call(master, enqueue_msg(placement.ids, request="e1")), p.Committed)
    return master


def _lease(request: str) -> p.Lease:
    return p.Lease("q", 1, 30.0, 0.0, request, [], [])


def _flushes(master) -> list[int]:
    """How many records each WAL flush made durable, from now on."""
    flushes, flush = [], master.wal.flush

    def counting() -> None:
        before = master.wal.records_written
        flush()
        if master.wal.records_written > before:
            flushes.append(master.wal.records_written - before)

    master.wal.flush = counting
    return flushes


def test_a_busy_master_takes_the_next_callers_request_into_the_same_fsync():
    master = _master_with_two_ready_items()
    router = _scripted(master, [[(b"c1", 1, _lease("l1"))], [(b"c2", 2, _lease("l2"))]])
    master.hold.saw([b"c2", b"c3"], time.monotonic())  # two other clients busy just now
    flushes = _flushes(master)
    master.run_once(timeout_ms=50)
    assert [type(msg) for _, _, msg in router.sent] == [p.Leased, p.Leased]
    assert flushes == [2]  # both leases' records, one fsync
    assert router.waits[1] <= 1  # held for at most the window


def test_a_master_with_few_callers_does_not_hold():
    master = _master_with_two_ready_items()
    router = _scripted(master, [[(b"c1", 1, _lease("l1"))], [(b"c2", 2, _lease("l2"))]])
    flushes = _flushes(master)
    master.run_once(timeout_ms=50)
    assert [(peer, type(msg)) for peer, _, msg in router.sent] == [(b"c1", p.Leased)]
    assert flushes == [1] and len(router.batches) == 1  # the second is the next pass's


class CountingStore(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[list[int]] = []

    def put_many(self, ids, blobs, crcs, metas=None) -> None:
        self.writes.append(list(ids))
        super().put_many(ids, blobs, crcs, metas)


def _put(item_id: int) -> p.Put:
    blob = f"blob-{item_id}".encode()
    return p.Put([item_id], [blob], [zlib.crc32(blob)], [], 1, "", False, None)


def test_a_busy_data_node_writes_the_puts_on_their_way_in_one_synced_batch(tmp_path, monkeypatch):
    store = CountingStore()
    server = DatanodeServer(DatanodeConfig(data_dir=str(tmp_path),
                                           bind=f"tcp://127.0.0.1:{free_port()}"), store=store)
    replies = []
    monkeypatch.setattr(server.router, "reply", lambda peer, rid, msg: replies.append((peer, msg)))
    arriving = [[(b"p2", 2, _put(2))]]
    monkeypatch.setattr(server.router, "receive",
                        lambda timeout_ms: arriving.pop(0) if arriving else [])
    try:
        server.hold.saw([b"p2", b"p3"], time.monotonic())  # other producers busy just now
        server._handle([(b"p1", 1, _put(1))])
        assert store.writes == [[1, 2]]
        assert replies == [(b"p1", p.Stored([server.node_id])), (b"p2", p.Stored([server.node_id]))]
        server.hold.last.clear()  # quiet: the next pass writes at once
        arriving.append([(b"p2", 4, _put(4))])
        server._handle([(b"p1", 3, _put(3))])
        assert store.writes[-1] == [3] and arriving  # not taken in
    finally:
        server.close()


def test_callers_that_only_ping_or_wait_do_not_make_a_master_hold():
    master = _master_with_two_ready_items()
    router = _scripted(master, [
        [(b"c2", 1, p.Ping()), (b"c3", 2, p.Ping()), (b"c4", 3, p.Hello())],
        [(b"c1", 4, _lease("l1"))], [(b"c5", 5, _lease("l2"))]])
    flushes = _flushes(master)
    master.run_once(timeout_ms=50)  # the pings: nothing to sync
    master.run_once(timeout_ms=50)  # a lease: three callers seen, none of them waits on a sync
    assert flushes == [1] and len(router.batches) == 1 and master.hold.holds == 0


@pytest.mark.cluster
def test_busy_producers_share_syncs_and_lose_nothing(cluster_factory, monkeypatch):
    monkeypatch.delenv(k.ENV, raising=False)
    cluster = cluster_factory(datanodes=2, replication=2, keys=None, metrics=True)
    stop, acked, errors = threading.Event(), [], []

    def produce(n: int) -> None:
        try:
            with Client(cluster.master_addr, timeout_s=30) as c:
                for i in range(300):  # bounded: stops at the first holds seen, or after 300
                    if stop.is_set():
                        return
                    acked.append(c.enqueue("busy", b"p%d-%d" % (n, i)))
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=produce, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: _holds(cluster) > 0 or not any(t.is_alive() for t in threads),
                 timeout_s=60, what="a held pass on the master and on a data node")
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert not errors
    assert _holds(cluster) > 0
    with Client(cluster.master_addr, timeout_s=30) as c:  # every acknowledged enqueue is there
        assert c.stats("busy")["ready"] == len(acked) == len(set(acked))


def _holds(cluster) -> float:
    """The fewer of the master's and the busier data node's held passes."""
    master = value(scrape(cluster.metrics_url("master")), "blizzard_master_sync_holds_total")
    nodes = [value(scrape(cluster.metrics_url(name)), "blizzard_datanode_sync_holds_total")
             for name in ("datanode0", "datanode1")]
    return min(master or 0, max(n or 0 for n in nodes))
