"""Enqueues passed on by a data node, on a real cluster with keys (master/relays.py): a
producer sends no ``Enqueue`` of its own; a relaying node that stops costs one short wait,
not the enqueue; a relay a data node could have made up or changed is never served."""

from __future__ import annotations

import signal
import time
import zlib

from support.prometheus import scrape, value
from support.sends import kinds, watch_sends
from support.wait import wait_for

from blizzard.client.core import Client
from blizzard.client.pipeline import RELAY_WAIT_S
from blizzard.wire import protocol as p
from blizzard.wire import relay_signature


def warm(c: Client) -> int:
    """Enqueue until this client holds ids whose nodes pass enqueues on (a master offers
    that once they asked it for orders, soon after they start); how many it enqueued."""
    warmed = 0

    def relaying() -> bool:
        nonlocal warmed
        c.pipeline.block = None  # a placement of its own
        c.enqueue("jobs", b"warm")
        warmed += 1
        return c.pipeline.block is not None and bool(c.pipeline.block.placement.relay_key)
    wait_for(relaying, timeout_s=10, what="a placement that takes relays")
    return warmed


def relayed(cluster, outcome: str) -> float:
    return value(scrape(cluster.metrics_url("master")), "blizzard_relayed_enqueues_total",
                 outcome=outcome) or 0.0


def test_a_producer_sends_its_enqueues_with_its_payloads_and_none_to_the_master(
        cluster_factory, monkeypatch):
    cluster = cluster_factory(datanodes=2, replication=2, heartbeat_s=0.2, metrics=True)
    with Client(cluster.master_addr, timeout_s=30) as c:
        warmed = warm(c)  # its placement: a block of ids for the next ones
        sent = watch_sends(monkeypatch)
        ids = [c.enqueue("jobs", b"job-%d" % i) for i in range(20)]
        # two replicas each, one of them passing the enqueue on; on a loaded machine a relay's
        # answer may take longer than RELAY_WAIT_S, and that enqueue then goes to the master
        assert kinds(sent)["Put"] == 40 and kinds(sent)["Enqueue"] <= 2, kinds(sent)
        relays = [msg.relay for _, msg in sent if getattr(msg, "relay", None) is not None]
        assert len(relays) == 20
        assert relayed(cluster, "taken") >= 18
        got = c.dequeue_many("jobs", 20 + warmed)
        assert sorted(m.id for m in got)[warmed:] == ids
        assert sorted(m.data for m in got) == sorted([b"warm"] * warmed +
                                                     [b"job-%d" % i for i in range(20)])


def test_a_stopped_relaying_node_costs_one_short_wait_then_the_enqueue_goes_to_the_master(
        cluster_factory):
    cluster = cluster_factory(datanodes=3, replication=2, heartbeat_s=0.2, dead_after_s=30,
                              master_args=["--suspect-after-s", "20"])
    with Client(cluster.master_addr, timeout_s=30) as c:
        warmed = warm(c)
        assert c.pipeline.block is not None  # the ids the next enqueues take, and their nodes
        relaying = c.pipeline.block.placement.nodes[0]  # the first healthy one relays
        stopped_id = relaying.node_id
        stopped = next(node for node in cluster.nodes if node.addr == relaying.addr)
        stopped.signal(signal.SIGSTOP)  # the master does not notice: only the client may
        try:
            took = []
            for i in range(12):
                t0 = time.monotonic()
                c.enqueue("jobs", b"job-%d" % i)
                took.append(time.monotonic() - t0)
            # a relay through it goes unanswered once; then it relays nothing more, and the
            # master's hedge puts the payloads elsewhere (then the node is avoided)
            assert max(took) < RELAY_WAIT_S + 1.0, took
            assert sum(t > RELAY_WAIT_S for t in took) <= 2, took
            assert stopped_id in c.pipeline.relay_avoid and stopped_id in c.suspected()
        finally:
            stopped.signal(signal.SIGCONT)
        got = c.dequeue_many("jobs", 20 + warmed, wait_s=5)
        assert sorted(m.data for m in got) == sorted([b"warm"] * warmed +
                                                     [b"job-%d" % i for i in range(12)])
        assert c.stats("jobs")["ready"] == 0  # each once: a late relay applied nothing twice


def test_a_relay_not_signed_by_its_producer_is_dropped_and_enqueues_nothing(cluster_factory):
    cluster = cluster_factory(datanodes=1, replication=1, heartbeat_s=0.2, metrics=True)
    with Client(cluster.master_addr, timeout_s=30) as c:
        placement = wait_for(lambda: (lambda pl: pl if pl.relay_key else None)(
            c.master.call(p.Place(2, []))), timeout_s=10, what="a placement that takes relays")
        node = placement.nodes[0]
        blob = b"planted"
        ep = c.datanodes.endpoint(node.addr)
        for k, item_id in enumerate(placement.ids):
            enqueue = p.Enqueue("jobs", [item_id], [len(blob)], [zlib.crc32(blob)], [0], [0.0],
                                [""], False, f"forged-{k}", False, 5.0, placement.grant)
            frame = p.encode(1000 + k, enqueue)
            # signed with another key (a data node making it up), or changed after signing
            key = b"x" * 16 if k == 0 else placement.relay_key
            relay = p.Relay(c.master.routing_id, frame,
                            relay_signature.sign(key, c.master.routing_id, frame), item_id)
            if k == 1:
                relay = p.replace(relay, frame=p.encode(1000 + k, p.replace(enqueue,
                                                                            queue="other")))
            ep.send(p.Put([item_id], [blob], [zlib.crc32(blob)], [], 1, node.node_id, True,
                          placement.grant, [], relay))
        wait_for(lambda: relayed(cluster, "dropped") == 2, timeout_s=10)
        assert relayed(cluster, "taken") == 0
        assert [q["name"] for q in c.queues()] == []  # nothing enqueued, no queue made
