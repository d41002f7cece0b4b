"""Replicated data nodes: R copies, dead-node repair, restarts, corrupt replicas, quorum."""

from __future__ import annotations

import os
import threading
import time

import pytest

from blizzard import Client
from blizzard.client.message import leased_items
from blizzard.wire import protocol as p
from blizzard.wire.errors import BlizzardError, DataCorrupt, NotEnoughDatanodes
from datanode.store import LevelDbStore

from support.wait import wait_for

FAST = dict(heartbeat_s=0.2, dead_after_s=1.5)


def payloads(n: int, tag: str = "item") -> list[bytes]:
    return [f"{tag}-{i:06d}-".encode() * 20 for i in range(n)]


def drain(c: Client, queue: str) -> list:
    got = []
    while msgs := c.dequeue_many(queue, 500, lease_s=60):
        got += msgs
        c.ack_many(msgs)
    return got


def replicas_total(c: Client) -> int:
    return sum(n.items for n in c.status().nodes if n.alive)


def holder_of_first(c: Client, cl, queue: str) -> int:
    """The index of a data node holding the queue's head item: a client's ids come in blocks
    placed together, so a node chosen blindly may hold none of a test's items."""
    with Client(cl.master_addr, timeout_s=5, admin=True) as admin:  # peeking is an admin's
        addr = leased_items(admin.master.call(p.Peek(queue, 1)))[0].nodes[0].addr
    return next(i for i, node in enumerate(cl.nodes) if node.addr == addr)


def test_losing_a_node_loses_nothing_and_repair_restores_r_copies(cluster_factory):
    # copies are reported to the master 0.5 s after they are stored (--copy-confirm-s): the
    # repair's copies must be kept then, not taken for planted strays
    cl = cluster_factory(datanodes=3, replication=2, node_args=["--copy-confirm-s", "0.5"],
                         **FAST)
    data = payloads(400)
    with Client(cl.master_addr, timeout_s=5) as c:
        c.enqueue_many("jobs", data[:200])
        for blob in data[200:]:  # one call each
            c.enqueue("jobs", blob)
        wait_for(lambda: replicas_total(c) == 800, what="two copies of every item")
        cl.nodes[holder_of_first(c, cl, "jobs")].kill()
        wait_for(lambda: sum(n.alive for n in c.status().nodes) == 2, timeout_s=10,
                 what="the node to be declared dead")
        wait_for(lambda: c.status().under_replicated == 0 and replicas_total(c) == 800,
                 timeout_s=1.5 + 8, what="re-replication to finish")
        until = time.monotonic() + 2.0  # past the copies' confirmation: all of them stay
        while time.monotonic() < until:
            assert replicas_total(c) == 800 and c.status().under_replicated == 0
        assert [m.data for m in drain(c, "jobs")] == data


def test_every_acknowledged_enqueue_survives_a_node_killed_mid_stream(cluster_factory):
    cl = cluster_factory(datanodes=3, replication=2, **FAST)
    acked: list[int] = []
    failures: list[BlizzardError] = []
    stop = threading.Event()

    def produce() -> None:
        with Client(cl.master_addr, timeout_s=3) as c:
            for i in range(400):
                if stop.is_set():
                    return
                try:
                    acked.extend(c.enqueue_many("stream", payloads(10, f"b{i}")))
                except BlizzardError as exc:
                    failures.append(exc)

    t = threading.Thread(target=produce)
    t.start()
    wait_for(lambda: len(acked) >= 500, what="the stream to get going")
    cl.nodes[1].kill()
    wait_for(lambda: len(acked) >= 2500 or not t.is_alive(), timeout_s=60, what="more enqueues")
    stop.set()
    t.join(60)
    with Client(cl.master_addr, timeout_s=5) as c:
        got = {m.id for m in drain(c, "stream")}
    assert set(acked) <= got, f"lost {len(set(acked) - got)} acknowledged items"
    assert len(failures) <= 3, failures  # the client re-places around the dead node


def test_a_restarted_node_drops_stale_and_excess_blobs(cluster_factory):
    cl = cluster_factory(datanodes=3, replication=2, **FAST)
    with Client(cl.master_addr, timeout_s=5) as c:
        for blob in payloads(60):
            c.enqueue("jobs", blob)
        wait_for(lambda: replicas_total(c) == 120, what="two copies of every item")
        cl.nodes[2].kill()
        wait_for(lambda: sum(n.alive for n in c.status().nodes) == 2, timeout_s=10,
                 what="the node to be declared dead")
        wait_for(lambda: c.status().under_replicated == 0 and replicas_total(c) == 120,
                 timeout_s=10, what="re-replication while the node is down")
        c.ack_many(c.dequeue_many("jobs", 20))  # the down node keeps stale blobs of these
        cl.restart_node(2)
        wait_for(lambda: all(n.alive for n in c.status().nodes), what="the node to come back")
        wait_for(lambda: replicas_total(c) == 2 * 40, timeout_s=10,
                 what="stale and excess blobs to be deleted")
        assert c.status().under_replicated == 0
        assert len(drain(c, "jobs")) == 40


def test_a_corrupt_replica_is_never_served(cluster_factory):
    cl = cluster_factory(datanodes=3, replication=2, heartbeat_s=0.2, dead_after_s=5.0)
    data = payloads(30)
    with Client(cl.master_addr, timeout_s=5) as c:
        ids = [c.enqueue("jobs", blob) for blob in data]
        wait_for(lambda: replicas_total(c) == 60, what="two copies of every item")
        k = holder_of_first(c, cl, "jobs")
    cl.nodes[k].kill()  # stopped, so its LevelDB can be opened and damaged directly
    store = LevelDbStore(os.path.join(cl.base_dir, f"datanode{k}", "blobs"))
    damaged = [i for i in ids if store.get_many([i])[0] is not None]
    for item_id in damaged:
        store.corrupt_for_test(item_id)
    store.close()
    assert damaged
    cl.restart_node(k)
    with Client(cl.master_addr, timeout_s=5) as c:
        wait_for(lambda: all(n.alive for n in c.status().nodes), what="the node to come back")
        assert [m.data for m in drain(c, "jobs")] == data



def test_an_item_corrupt_on_every_replica_raises_data_corrupt_and_is_dead_lettered(
        cluster_factory):
    cl = cluster_factory(datanodes=1, replication=1, **FAST)
    with Client(cl.master_addr, timeout_s=5, admin=True) as c:
        c.configure_queue("jobs", max_attempts=1)
        item_id = c.enqueue("jobs", b"precious")
    cl.nodes[0].kill()
    store = LevelDbStore(os.path.join(cl.base_dir, "datanode0", "blobs"))
    store.corrupt_for_test(item_id)
    store.close()
    cl.restart_node(0)
    with Client(cl.master_addr, timeout_s=5) as c:
        wait_for(lambda: all(n.alive for n in c.status().nodes), what="the node to come back")
        with pytest.raises(DataCorrupt, match=str(item_id)):
            c.dequeue("jobs")
        # Given back with its attempt counted: past max_attempts, it waits in the dead-letter
        # queue, kept (its only replica is never dropped) rather than delivered again and again.
        assert (c.stats("jobs")["ready"], c.stats("jobs")["dead"]) == (0, 1)
        assert c.dequeue("jobs") is None

def test_fewer_live_nodes_than_min_replicas_refuses_the_enqueue(cluster_factory):
    cl = cluster_factory(datanodes=2, replication=3, **FAST)
    with Client(cl.master_addr, timeout_s=5) as c:
        with pytest.raises(NotEnoughDatanodes, match="3 needed"):
            c.enqueue("jobs", b"x")
        assert c.stats("jobs") == {"queue": "jobs", "ready": 0, "delayed": 0, "leased": 0,
                                   "pending": 0, "dead": 0, "oldest_age_s": 0.0}
        assert replicas_total(c) == 0


def test_a_node_replaced_at_the_same_address_refuses_puts_meant_for_the_old_one(cluster_factory):
    from blizzard.net.transport import call
    from blizzard.wire.errors import WrongNode
    cl = cluster_factory(datanodes=1, replication=1, **FAST)
    ep = cl.endpoint(cl.nodes[0].addr, "datanode")
    try:
        with pytest.raises(WrongNode):
            call(ep, p.Put([10**9], [b"x"], [0x8CDC1683], [], 1, "dn-gone", False, None), 5)
    finally:
        ep.close()
