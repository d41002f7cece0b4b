"""Leases answered by a data node, payloads and all (issue 35; master/consume/pushes.py,
datanode/serves.py), on real clusters with keys: a consumer connected to the nodes sends no
``Get``; a push that cannot arrive (no connection there, a stopped node) leaves the master to
answer, so no lease waits long; only data nodes may ask for orders."""

from __future__ import annotations

import signal
import time

import pytest

from blizzard.client.core import Client
from blizzard.net.hedge import CAP_S
from blizzard.wire import protocol as p
from blizzard.wire.errors import Forbidden
from master.consume.pushes import PUSH_TIMEOUT_S

from support.prometheus import scrape, value

pytestmark = pytest.mark.cluster

BOUND_S = PUSH_TIMEOUT_S + CAP_S + 0.75  # a late push, a hedged read, a busy two-core machine


def warm(c: Client, n: int = 40) -> None:
    """Dequeue until a data node answered a lease (the nodes ask for orders once registered,
    and a consumer's first read opens its connections), at most ``n`` items."""
    for _ in range(n):
        msg = c.dequeue("jobs")
        assert msg is not None
        msg.ack()
        if c.datanodes.pushes:
            return
    raise AssertionError(f"no lease of {n} was answered by a data node")


def test_a_consumer_connected_to_the_nodes_has_its_leases_answered_by_one(cluster_factory):
    cluster = cluster_factory(datanodes=2, replication=2, heartbeat_s=0.2)
    with Client(cluster.master_addr, timeout_s=30) as c:
        ids = c.enqueue_many("jobs", [b"job-%d" % i for i in range(60)])
        warm(c)
        gets, pushes = c.datanodes.gets, c.datanodes.pushes
        for _ in range(10):
            msg = c.dequeue("jobs")
            assert msg is not None and msg.data == b"job-%d" % ids.index(msg.id)  # intact (P5)
            msg.ack()
        assert c.datanodes.gets == gets  # no Get: the payloads came with the lease
        assert c.datanodes.pushes == pushes + 10


def test_a_consumer_with_no_connection_to_the_nodes_is_answered_by_the_master(cluster_factory):
    cluster = cluster_factory(datanodes=2, replication=2, heartbeat_s=0.2)
    with Client(cluster.master_addr, timeout_s=30) as warmed:
        warmed.enqueue_many("jobs", [b"x"] * 40 + [b"a", b"b"])
        warm(warmed)  # the nodes answer leases now
        for msg in warmed.dequeue_many("jobs", 40):
            if msg.data == b"x":
                msg.ack()
            else:
                msg.nack(delay_s=0)
    with Client(cluster.master_addr, timeout_s=30) as fresh:
        t0 = time.monotonic()
        msg = fresh.dequeue("jobs")  # the node's push finds no connection: it says so
        took = time.monotonic() - t0
        # answered, not left to the call's retry (attempt_s: 2 s)
        assert msg is not None and msg.data in (b"a", b"b") and took < fresh.master.attempt_s
        assert fresh.datanodes.pushes == 0 and fresh.datanodes.gets >= 1
        msg.ack()


def test_a_stopped_node_costs_its_consumers_the_push_timeout_once(cluster_factory):
    cluster = cluster_factory(datanodes=2, replication=2, heartbeat_s=0.2, dead_after_s=5,
                              master_args=["--suspect-after-s", "4.5"], metrics=True)

    def answered_by_master() -> float:
        """Leases ordered pushed that the master answered itself (late or failed)."""
        return value(scrape(cluster.metrics_url("master")), "blizzard_pushed_leases_total",
                     by="master") or 0.0
    with Client(cluster.master_addr, timeout_s=30) as c:
        ids = c.enqueue_many("jobs", [b"job-%d" % i for i in range(80)])
        warm(c)
        before = answered_by_master()
        node = cluster.nodes[0]
        node.signal(signal.SIGSTOP)
        try:
            for _ in range(20):
                t0 = time.monotonic()
                msg = c.dequeue("jobs")
                took = time.monotonic() - t0
                assert msg is not None and msg.data == b"job-%d" % ids.index(msg.id)
                assert took < BOUND_S, f"a dequeue took {took:.2f}s"
                msg.ack()
        finally:
            node.signal(signal.SIGCONT)
        # the orders out when it stopped (the next lease's, and the last one it served if its
        # report had not gone yet): then no more go to it, though 20 leases came
        assert answered_by_master() - before <= 2


def test_only_a_data_node_may_ask_for_orders(cluster_factory):
    cluster = cluster_factory(datanodes=1, replication=1, heartbeat_s=0.2)
    with Client(cluster.master_addr, timeout_s=30) as c:
        node_id = c.status().nodes[0].node_id
        reply = c.master.call_many([p.AwaitServes(node_id, [], [])], raise_errors=False)[0]
        assert isinstance(reply, p.Error) and reply.code == Forbidden.code
        assert "only data nodes" in reply.message


def test_a_push_the_consumer_never_gets_costs_one_attempt_then_the_master_answers(
        cluster_factory, monkeypatch):
    cluster = cluster_factory(datanodes=2, replication=2, heartbeat_s=0.2)
    with Client(cluster.master_addr, timeout_s=30) as c:
        ids = c.enqueue_many("jobs", [b"job-%d" % i for i in range(60)])
        warm(c)
        # When the node's push reaches the consumer's connection but is never read (as if
        # lost on the way): the consumer listens to the master alone
        monkeypatch.setattr(c.datanodes, "connected", lambda: [])
        pushes = c.datanodes.pushes
        t0 = time.monotonic()
        msg = c.dequeue("jobs")
        took = time.monotonic() - t0
        # Then the retry of the lease (same request id) is answered by the master
        assert msg is not None and msg.data == b"job-%d" % ids.index(msg.id)
        assert c.datanodes.pushes == pushes and took < c.master.attempt_s + 2.0
        msg.ack()
