"""Liveness through one data-node fault (docs/design.md, liveness): no read and no write waits
on one stopped or dead node for longer than the hedge cap, on a real cluster.

The master is told to suspect nodes late here (``--suspect-after-s``), so what is shown is the
hedging itself, not the master's faster news of a silent node. A call that waits on a stopped
node would take the client's ``node_timeout_s`` (5 s); the bound asserted is the hedge cap
(0.25 s) with room for a loaded machine.
"""

from __future__ import annotations

import signal
import time

import pytest

from blizzard.client.core import Client
from blizzard.client.message import leased_items
from blizzard.net.hedge import CAP_S
from blizzard.wire import protocol as p

from support.wait import wait_for

pytestmark = pytest.mark.cluster

BOUND_S = CAP_S + 0.75  # the cap, plus a round trip or two on a busy two-core machine
LATE = ["--suspect-after-s", "4.5"]


def stopped(node):
    """A context that stops a process (SIGSTOP) and lets it go on (SIGCONT) at the end."""
    class Stopped:
        def __enter__(self):
            node.signal(signal.SIGSTOP)

        def __exit__(self, *exc):
            node.signal(signal.SIGCONT)
    return Stopped()


def timed(call):
    t0 = time.monotonic()
    result = call()
    return result, time.monotonic() - t0


def test_a_paused_node_does_not_stall_a_dequeue_past_the_hedge_cap(cluster_factory):
    # Given three nodes, every item on all three, and a backlog
    cluster = cluster_factory(datanodes=3, replication=3, heartbeat_s=0.2, dead_after_s=5,
                              master_args=LATE)
    with Client(cluster.master_addr, timeout_s=30) as c:
        ids = c.enqueue_many("jobs", [b"job-%d" % i for i in range(30)])
        with Client(cluster.master_addr, admin=True) as admin:
            first = leased_items(admin.master.call(p.Peek("jobs", 1)))[0].nodes[0]
        # When the node asked first for them is stopped, and a consumer takes them one by one
        with stopped(next(n for n in cluster.nodes if n.addr == first.addr)):
            for _ in range(30):
                msg, took = timed(lambda: c.dequeue("jobs"))
                # Then no dequeue waits on the stopped node past the hedge cap
                assert msg is not None and took < BOUND_S, f"a dequeue took {took:.2f}s"
                assert msg.data == b"job-%d" % ids.index(msg.id)
                msg.ack()
        # (the stopped node cost one wait at most: a read hedged once, after which the client
        # asks it last; or, had it an order to answer a lease, the master answering that one
        # past PUSH_TIMEOUT_S and naming it a suspect, so no read asked it first)
        assert c.datanodes.hedges <= 1
        assert c.datanodes.hedges == 0 or first.node_id in c.suspected()


def test_a_killed_node_does_not_stall_an_enqueue_past_the_hedge_cap(cluster_factory):
    # Given four nodes, R = W = 3, and one node killed (the master does not know for 4.5 s)
    cluster = cluster_factory(datanodes=4, replication=3, heartbeat_s=0.2, dead_after_s=5,
                              master_args=LATE)
    cluster.nodes[1].kill()
    with Client(cluster.master_addr, timeout_s=30) as c:
        # When a producer enqueues one item per call
        ids = []
        for i in range(20):
            item_id, took = timed(lambda i=i: c.enqueue("jobs", b"item-%d" % i))
            # Then no enqueue waits on the dead node past the hedge cap
            assert took < BOUND_S, f"an enqueue took {took:.2f}s"
            ids.append(item_id)
        # and every acknowledged item is there, with its payload
        got = {m.id: m.data for m in c.dequeue_many("jobs", 20)}
        assert got == {item_id: b"item-%d" % i for i, item_id in enumerate(ids)}


def test_a_hedged_write_leaves_no_orphan_blob_and_loses_nothing(cluster_factory):
    # Given four nodes, R = W = 3, one of them stopped while items are enqueued (so their
    # writes are hedged onto the fourth node), then let go on (it stores its late copies)
    cluster = cluster_factory(datanodes=4, replication=3, heartbeat_s=0.2, dead_after_s=5,
                              master_args=LATE)
    with Client(cluster.master_addr, timeout_s=30) as c:
        with stopped(cluster.nodes[2]):
            ids = [c.enqueue("jobs", b"item-%d" % i) for i in range(12)]
        # Then every item is there with its payload, and once all are acked no data node keeps
        # a blob: the late copies on the stopped node were strays, deleted when reported
        msgs = c.dequeue_many("jobs", 12)
        assert {m.id: m.data for m in msgs} == {i: b"item-%d" % k for k, i in enumerate(ids)}
        c.ack_many(msgs)
        wait_for(lambda: all(n.items == 0 for n in cluster.status().nodes), timeout_s=20,
                   what="every blob deleted after the acks")


def test_a_silent_node_is_suspect_in_status_and_log_before_it_is_dead(cluster_factory):
    cluster = cluster_factory(datanodes=3, replication=2, heartbeat_s=0.2, dead_after_s=5)
    node = cluster.nodes[1]
    with stopped(node):
        shown = wait_for(lambda: [n for n in cluster.status().nodes
                                  if n.addr == node.addr and n.alive and n.suspect],
                         timeout_s=10, what="the stopped node shown suspect")
        assert "is suspect (silent for" in cluster.master.tail()
    wait_for(lambda: not any(n.suspect for n in cluster.status().nodes), timeout_s=10,
             what="the node healthy again once it heartbeats")
    assert shown


def test_a_spark_executors_planned_node_paused_costs_a_hedge_not_a_timeout(cluster_factory):
    # Given items on every node of three, planned for Spark's executors by node
    from blizzard.spark.fetch import _RunReader
    from blizzard.spark.plan import Batch, plan_partitions

    cluster = cluster_factory(datanodes=3, replication=3, heartbeat_s=0.2, dead_after_s=5,
                              master_args=LATE)
    with Client(cluster.master_addr, timeout_s=30) as c:
        ids = c.enqueue_many("rows", [b"row-%d" % i for i in range(300)])
        leased = c.lease_columns("rows", 300)
        parts = plan_partitions(Batch([leased]), {n.node_id for n in cluster.status().nodes})
        part = parts[0]
        # When the node a partition was planned on is stopped and its executor reads the runs
        with stopped(next(n for n in cluster.nodes if n.addr == part.value)):
            reader = _RunReader(c)
            got, took = timed(lambda: {i: b for run in part.runs
                                       for i, b in reader.read(run, 0, len(run)).items()})
        # Then the other replicas serve them, after one hedge delay, not a node timeout
        assert took < BOUND_S, f"the partition took {took:.2f}s"
        assert got == {i: b"row-%d" % ids.index(i) for run in part.runs for i in run.ids}
