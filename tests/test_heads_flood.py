"""The heads feed on a real secure cluster, flooded with subscriptions (issue 32, item 8): a
connection asking for more than its share is cut, distinct topics of queues that do not exist
are capped in all (connections asking for more of them are cut), and what a subscriber held
is freed when it leaves, as the master's own count shows; the master's memory grows by a
bounded amount, and a well-behaved subscriber keeps getting heads throughout."""

from __future__ import annotations

import time
import urllib.request

import zmq
from prometheus_client.parser import text_string_to_metric_families

from blizzard import Client
from blizzard.local.harness import LocalCluster, free_port
from blizzard.net.secure import connect_curve
from blizzard.wire import protocol as p
from blizzard.wire.shard_messages import topic
from master.shard.subscribers import PER_CONNECTION, UNKNOWN

from support.wait import wait_for

FLOOD = 20_000  # distinct subscriptions one connection sends
LONG = "x" * 180  # topics as long as a queue name may be: what each costs is per byte
GROWTH_BYTES = 96 * 1024 * 1024  # the master's memory may grow this much under the floods (20,000
# distinct topics of this length once cost it about 300 MB)


def metric(cluster: LocalCluster, name: str) -> float | None:
    with urllib.request.urlopen(cluster.metrics_url("master"), timeout=10) as reply:
        text = reply.read().decode()
    return next((s.value for family in text_string_to_metric_families(text)
                 for s in family.samples if s.name == name), None)


def subscriptions(cluster: LocalCluster) -> float | None:
    return metric(cluster, "blizzard_heads_subscriptions")


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def subscriber(cluster: LocalCluster, port: int) -> zmq.Socket:
    sock = zmq.Context.instance().socket(zmq.SUB)
    sock.setsockopt(zmq.LINGER, 0)
    keys = cluster.client_keys()
    assert keys is not None and keys.master is not None
    connect_curve(sock, keys, keys.master)
    sock.connect(f"tcp://127.0.0.1:{port}")
    return sock


def next_head(sock: zmq.Socket, queue: str, timeout_s: float = 10.0) -> p.QueueHead:
    """The next head of ``queue`` published to ``sock``."""
    deadline = time.monotonic() + timeout_s
    while True:
        left_ms = int((deadline - time.monotonic()) * 1000)
        assert left_ms > 0 and sock.poll(left_ms), f"no head of {queue} published"
        frames = sock.recv_multipart()
        head = p.unpack(frames[-1])
        if frames[0] == topic(queue) and isinstance(head, p.QueueHead):
            return head


def test_subscription_floods_are_capped_and_freed_when_the_subscriber_leaves(cluster_factory):
    # Given a secure master publishing heads, a queue with one item, and one subscriber to it
    port = free_port()
    cluster = cluster_factory(datanodes=1, replication=1, metrics=True,
                              master_args=["--heads-bind", f"tcp://127.0.0.1:{port}"])
    pid = cluster.master.popen.pid
    with Client(cluster.masters, admin=True) as client:
        client.enqueue("jobs", b"x")
        legit = subscriber(cluster, port)
        legit.subscribe(topic("jobs"))
        assert next_head(legit, "jobs").ready == 1
        wait_for(lambda: subscriptions(cluster) == 1, what="one subscription counted")
        rss_before = rss_bytes(pid)

        # When one connection asks for 20,000 distinct topics
        flood = subscriber(cluster, port)
        for i in range(FLOOD):
            flood.subscribe(f"flood{i:05}{LONG}\0".encode())
        # Then it is cut (again at each reconnection), holding its share at most meanwhile
        wait_for(lambda: (metric(cluster, "blizzard_heads_subscribers_cut_total") or 0) >= 1,
                 what="the flooding connection to be cut")
        for _ in range(10):
            assert subscriptions(cluster) <= 1 + PER_CONNECTION
        # and when it leaves, only the first subscriber's subscription is left
        flood.close()
        wait_for(lambda: subscriptions(cluster) == 1, what="the flood's subscriptions freed")

        # When many connections each ask for their share of topics of queues that do not exist
        cut_before = metric(cluster, "blizzard_heads_subscribers_cut_total") or 0
        many = [subscriber(cluster, port) for _ in range(20)]
        for n, sock in enumerate(many):
            for i in range(PER_CONNECTION):
                sock.subscribe(f"c{n:02}-{i:03}{LONG}\0".encode())
        # Then those asking past the cap on such topics are cut, and no more than the cap
        # are ever applied, all together
        wait_for(lambda: (metric(cluster, "blizzard_heads_subscribers_cut_total") or 0)
                 >= cut_before + 20 - UNKNOWN // PER_CONNECTION, what="connections cut")
        for _ in range(10):
            assert subscriptions(cluster) <= 1 + UNKNOWN
        # and the master's memory grew by a bounded amount
        assert rss_bytes(pid) - rss_before < GROWTH_BYTES
        # and the first subscriber still hears of a change to its queue
        client.enqueue("jobs", b"y")
        while next_head(legit, "jobs").ready != 2:
            pass
        # and when they leave, their subscriptions are freed
        for sock in many:
            sock.close()
        wait_for(lambda: subscriptions(cluster) == 1, what="the subscriptions freed")
    legit.close()
