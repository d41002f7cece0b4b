"""The throughput lines of ``scripts/bench-pei --rate``: 4 shards against one master.

The batched pipeline of ``bench.backlog`` (a producer enqueues ``--n`` items ``--batch`` per
call with ``--window`` batches in flight, then a consumer dequeues and acks them) on two
clusters started side by side: one master, and ``--shards`` shards, each with the same data
nodes and R as the one master; and that sharded cluster again with its clients on its last
shard alone (a shard master's own cost, the other shards idle; the last, since shard 0's ids
are as small as a lone master's and the others' are not). Runs alternate. Per run: the
enqueue and ack rates; CPU per item of the masters together, of the data nodes together and
of the clients; and what the masters did per 100 items, counted rather than timed (requests,
group commits, wake-ups, preemptions: ``bench/master_work.py``). At 100 and at 400 items per
call (``--rate-batches``), since what a master spends on a request besides its items weighs
per item by the batch. Once, after the warm-up: what each master and data node spends idle,
in CPU ms a second. On this 2-core machine every process shares the same two cores, so
sharding cannot add speed here; what must hold is that the cost per item does not grow (what
more cores or hosts would give follows from it: ``docs/design.md``, "Sharded queues").
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import time
from typing import Any

from bench.backlog import pipeline_options
from bench.common import on_clusters, parser
from bench.master_work import master_work, masters_of
from bench.throughput import HDR, consume, proc_cpu_s, produce, run_workers
from blizzard.local.harness import LocalCluster
from blizzard.local.shard_cluster import ShardedCluster

log = logging.getLogger(__name__)


def processes(cluster: Any) -> dict[str, int]:
    """Server pids by group name (``masters``, ``datanodes``) and a per-process suffix."""
    pids = {}
    for k, shard in enumerate(masters_of(cluster)):
        pids[f"masters/{k}"] = shard.master.popen.pid
        for node in shard.nodes:
            pids[f"datanodes/{k}/{node.name}"] = node.popen.pid
    return pids


def cpu(pids: dict[str, int]) -> dict[str, float]:
    return {name: proc_cpu_s(pid) or 0.0 for name, pid in pids.items()}


def phase(cluster: Any, role: str, worker: Any, args_: tuple,
          max_s: float) -> tuple[dict, dict, dict]:
    """One worker's run; the servers' CPU seconds meanwhile by group, and what the masters
    did meanwhile (``bench/master_work.py``)."""
    pids = processes(cluster)
    work = master_work(cluster)
    before = cpu(pids)
    res = run_workers({role: (worker, args_)}, max_s)[role]
    after = cpu(pids)
    work = {k: v - work[k] for k, v in master_work(cluster).items()}
    spent: dict[str, float] = {role: res.get("cpu_s", 0.0)}
    for name in pids:
        group = name.split("/")[0]
        spent[group] = spent.get(group, 0.0) + after[name] - before[name]
    return res, spent, work


def idle_cpu(cluster: Any, seconds: float = 5.0) -> dict[str, float]:
    """CPU milliseconds a second that each server spends with no client at all, by group
    (the mean of the group's processes)."""
    pids = processes(cluster)
    before = cpu(pids)
    time.sleep(seconds)  # the measurement's span, not a wait for a condition
    after = cpu(pids)
    spent: dict[str, list[float]] = {}
    for name in pids:
        spent.setdefault(name.split("/")[0], []).append(after[name] - before[name])
    return {group: round(statistics.mean(v) / seconds * 1000, 2) for group, v in spent.items()}


def spec(cluster: Any, only: int | None = None) -> str:
    """The clients' master list: every shard, or shard ``only`` alone (the others idle)."""
    if not isinstance(cluster, ShardedCluster):
        return cluster.masters
    return " ".join(cluster.addrs) if only is None else cluster.addrs[only]


def pipeline(cluster: Any, queue: str, args: Any, only: int | None = None) -> dict[str, Any]:
    keys = cluster.keys or ""
    masters = spec(cluster, only)
    prod, enq_cpu, enq_work = phase(cluster, "producer", produce,
                                    (masters, keys, queue, args.size, args.n, args.batch,
                                     args.max_seconds, args.window), args.max_seconds)
    done = prod["done"]
    cons, ack_cpu, ack_work = phase(cluster, "consumer", consume,
                                    (masters, keys, queue, done, args.batch, args.max_seconds),
                                    args.max_seconds)
    per_item = {f"enqueue_{k}": round(v / max(1, done) * 1e6, 1) for k, v in enq_cpu.items()}
    per_item |= {f"ack_{k}": round(v / max(1, cons["got"]) * 1e6, 1) for k, v in ack_cpu.items()}
    return {"enqueue_per_s": round(done / ((prod["t1"] - prod["t0"]) / 1e9), 1),
            "ack_per_s": round(cons["got"] / ((cons["t_last"] - cons["t0"]) / 1e9), 1),
            "n": cons["got"], "cpu_us_per_item": per_item,
            "masters_per_100_items": {**{f"enqueue_{k}": hundredths(v, done)
                                         for k, v in enq_work.items()},
                                      **{f"ack_{k}": hundredths(v, cons["got"])
                                         for k, v in ack_work.items()}}}


def hundredths(count: float, items: int) -> float:
    return round(count / max(1, items) * 100, 2)


def main(argv: list[str], base: str) -> int:
    ap = parser("scripts/bench-pei --rate", __doc__)
    pipeline_options(ap, repeat=4, window=4)
    ap.add_argument("--rate-shards", type=int, default=4, help="shards against one master")
    ap.add_argument("--rate-batches", default="100,400",
                    help="items per call, comma-separated: each size is measured in turn "
                         "(--batch is ignored); a pass's fixed cost weighs per item by it")
    args, _ = ap.parse_known_args(argv)
    batches = [int(b) for b in args.rate_batches.split(",")]
    if args.size < HDR.size:
        ap.error(f"--size must be >= {HDR.size}")
    # metrics served (never scraped but at a phase's ends) for what the masters did
    one = LocalCluster(os.path.join(base, "one"), datanodes=args.datanodes,
                       replication=args.replication, metrics=True)
    many = ShardedCluster(os.path.join(base, "many"), masters=args.rate_shards,
                          datanodes=args.datanodes, replication=args.replication, metrics=True)
    # the third: the same sharded cluster with the clients on its last shard alone, the others
    # idle: a shard master's own cost per item, without the load spread over more processes
    # than cores (what tells code from contention on a small machine)
    labels = {"one master": (one, None), f"{args.rate_shards} shards": (many, None),
              f"{args.rate_shards} shards, one used": (many, args.rate_shards - 1)}

    def body() -> int:
        many.start(timeout_s=120)
        for cluster, only in labels.values():
            pipeline(cluster, "warm-up", args, only)
        for label, (cluster, only) in labels.items():
            if only is None:
                print(json.dumps({"system": "blizzard", "op": "shard_idle", "cluster": label,
                                  "cpu_ms_per_s": idle_cpu(cluster)}), flush=True)
        for batch in batches:
            measure(argparse.Namespace(**{**vars(args), "batch": batch}))
        return 0

    def measure(args: Any) -> None:
        runs: dict[str, list[dict]] = {label: [] for label in labels}
        for i in range(args.repeat):
            order = list(labels) if i % 2 == 0 else list(reversed(labels))
            for label in order:
                cluster, only = labels[label]
                rec = pipeline(cluster, f"pipe-{args.batch}-{i}", args, only)
                runs[label].append(rec)
                print(json.dumps({"system": "blizzard", "op": "shard_rate", "cluster": label,
                                  "size": args.size, "batch": args.batch, **rec}), flush=True)
        for label, rows in runs.items():
            med = {key: statistics.median(r["cpu_us_per_item"].get(key, 0.0) for r in rows)
                   for key in rows[0]["cpu_us_per_item"]}
            work = {key: statistics.median(r["masters_per_100_items"][key] for r in rows)
                    for key in rows[0]["masters_per_100_items"]}
            print(json.dumps({"system": "blizzard", "op": "shard_rate_median", "cluster": label,
                              "batch": args.batch,
                              "enqueue_per_s": statistics.median(r["enqueue_per_s"] for r in rows),
                              "ack_per_s": statistics.median(r["ack_per_s"] for r in rows),
                              "cpu_us_per_item": med, "masters_per_100_items": work}),
                  flush=True)
    try:
        return on_clusters(base, [one], body, scrape=False)
    finally:
        many.stop()
