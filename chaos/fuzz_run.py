"""``scripts/fuzz``: start a local cluster, fuzz each server, check nothing died or was lost."""

from __future__ import annotations

import json
import tempfile
import time

import click

from blizzard import Client
from blizzard import protocol as p
from blizzard.harness import LocalCluster
from chaos.fuzz import fuzz


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


@click.command()
@click.option("--frames", default=10_000, show_default=True, help="Hostile frames per server.")
@click.option("--seed", default=0, show_default=True, help="First random seed (one per server).")
@click.option("--items", default=200, show_default=True,
              help="Items enqueued before fuzzing, all checked afterwards.")
def main(frames: int, seed: int, items: int) -> None:
    """Fuzz a fresh 1-master, 2-data-node cluster (R=2) on loopback; exit 1 on any loss or exit."""
    with tempfile.TemporaryDirectory(prefix="blizzard-fuzz-") as base, \
            LocalCluster(base, datanodes=2, replication=2, heartbeat_s=0.2, dead_after_s=1.5) as cluster, \
            Client(cluster.master_addr, timeout_s=30) as c:
        kept = {c.enqueue("keep", f"item-{i}".encode()): f"item-{i}".encode() for i in range(items)}
        procs = [cluster.master, *cluster.nodes]
        targets = [("master", cluster.master_addr, p.Status())]
        targets += [(n.name, n.addr, p.Get([min(kept)], None)) for n in cluster.nodes]
        failed = False
        for k, (name, addr, check) in enumerate(targets):
            rss = {proc.name: _rss_mib(proc.popen.pid) for proc in procs}
            key = "client" if addr == cluster.master_addr else "datanode"
            result = fuzz(addr, frames, seed=seed + k, check=check,
                          connect=lambda a: cluster.dealer(a, key))
            alive = all(proc.alive for proc in procs)
            print(json.dumps({
                "target": name, "frames": result.sent, "answered": result.answered,
                "seconds": round(result.seconds, 1), "by_category": result.by_category,
                "errors": result.errors, "exits": sum(not proc.alive for proc in procs),
                "rss_mib_before": round(rss[name], 1),
                "rss_mib_after": round(_rss_mib(procs[k].popen.pid), 1) if alive else None}))
            failed |= not alive
        deadline = time.monotonic() + 15
        real = {n.addr for n in cluster.nodes}
        while {n.addr for n in cluster.status().nodes if n.alive} != real:
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)
        got = c.dequeue_many("keep", items, wait_s=5)
        lost = set(kept) - {m.id for m in got if m.data == kept.get(m.id)}
        c.ack_many(got)
        print(json.dumps({"items": items, "lost": len(lost), "exits": sum(not p.alive for p in procs)}))
        if failed or lost:
            raise SystemExit(1)


if __name__ == "__main__":
    main()
