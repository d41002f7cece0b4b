"""Fuzzing every server of a real cluster: no exits, nothing acknowledged lost (P1, P7).

A short run per server here; ``scripts/fuzz`` runs the long one (10,000+ frames each).
"""

from __future__ import annotations

from blizzard import Client
from blizzard import protocol as p
from chaos.fuzz import CATEGORIES, fuzz
from tests.conftest import wait_for

FRAMES = 3000


def test_fuzzed_frames_kill_no_server_and_lose_no_item(cluster_factory):
    cluster = cluster_factory(datanodes=2, replication=2, heartbeat_s=0.2, dead_after_s=1.5)
    with Client(cluster.master_addr, timeout_s=15) as c:
        kept = {c.enqueue("keep", f"item-{i}".encode()): f"item-{i}".encode() for i in range(50)}
        before = c.stats("keep")
        targets = [(cluster.master_addr, p.Status()),
                   *((node.addr, p.Get([min(kept)], None)) for node in cluster.nodes)]
        for seed, (addr, check) in enumerate(targets):
            key = "client" if addr == cluster.master_addr else "datanode"
            result = fuzz(addr, FRAMES, seed=seed, check=check,
                          connect=lambda a: cluster.dealer(a, key))
            assert result.sent == FRAMES and set(result.by_category) == set(CATEGORIES)
            assert result.answered > FRAMES // 2  # most frames get an answer, all of them errors or replies
        for proc in [cluster.master, *cluster.nodes]:
            assert proc.alive, f"{proc.name} died:\n{proc.tail()}"
        real = {node.addr for node in cluster.nodes}
        wait_for(lambda: {n.addr for n in cluster.status().nodes if n.alive} == real,
                 what="only the real data nodes alive (fuzzed heartbeats time out)")
        after = c.stats("keep")
        assert (after["ready"], after["leased"], after["delayed"]) == \
            (before["ready"], before["leased"], before["delayed"])
        got = c.dequeue_many("keep", 100, wait_s=5)
        assert {m.id: m.data for m in got} == kept
        c.ack_many(got)
