"""Does a backlog slow Blizzard down? The batched pipeline with and without items waiting.

Run as ``scripts/bench --backlog N`` (or ``python -m bench.backlog``). Two local clusters alike,
one empty and one holding a backlog:

1. one warm-up run of the batched pipeline on each (first runs are slower);
2. ``N`` items put in a queue of the backlog cluster that nobody reads (large batches, several
   in flight), with its master's resident memory read before and after: bytes per queued item;
3. ``--repeat`` runs on each cluster, alternating between them (A B B A ...): a producer
   enqueues ``--n`` items ``--batch`` per call into a fresh queue, then a consumer dequeues
   and acks them ``--batch`` per call, each ack riding on the next lease.

Prints one JSON line per pipeline run (``op`` ``pipeline_empty`` / ``pipeline_backlog``), one for
the fill (``op`` ``backlog_fill``, with ``master_rss_bytes_per_item``) and a summary
(``op`` ``backlog``) whose ``enqueue_ratio`` and ``ack_ratio`` compare the medians of the two
sets of runs (1.0 = a backlog costs nothing); ``*_ratio_paired`` is the median of the ratios
of runs taken one after the other.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
from typing import Any

from bench.common import client_keys, on_clusters, parser, start
from bench.throughput import HDR, CpuMeter, consume, produce, run_workers
from blizzard.local.harness import LocalCluster

log = logging.getLogger(__name__)

FILL_BATCH = 1000  # items per call while filling: the fill is set-up, not the measurement
FILL_WINDOW = 4


def rss_bytes(pid: int) -> int:
    """Resident set size of a process (Linux /proc)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def pipeline(cluster: LocalCluster, queue: str, args: Any) -> dict[str, Any]:
    """Enqueue ``args.n`` items into ``queue``, then dequeue and ack them, one phase at a time
    (as ``bench.throughput`` does), so each rate is its own and neither waits for the other."""
    master = cluster.master_addr
    meter = CpuMeter(cluster)
    keys = client_keys(cluster)
    prod = run_workers({"producer": (produce, (master, keys, queue, args.size, args.n,
                                               args.batch, args.max_seconds, args.window))},
                       args.max_seconds)
    enqueue_cpu = meter.report(prod["producer"]["done"], prod).get("cpu_us_per_item", {})
    meter = CpuMeter(cluster)
    done = prod["producer"]["done"]
    cons = run_workers({"consumer": (consume, (master, keys, queue, done, args.batch,
                                               args.max_seconds))}, args.max_seconds)
    ack_cpu = meter.report(cons["consumer"]["got"], cons).get("cpu_us_per_item", {})
    prod, cons = prod["producer"], cons["consumer"]
    return {"enqueue_per_s": round(done / ((prod["t1"] - prod["t0"]) / 1e9), 1),
            "ack_per_s": round(cons["got"] / ((cons["t_last"] - cons["t0"]) / 1e9), 1),
            "n": cons["got"], "enqueue_cpu_us_per_item": enqueue_cpu,
            "ack_cpu_us_per_item": ack_cpu}


def pipeline_options(ap: argparse.ArgumentParser, *, repeat: int, window: int) -> None:
    """The options of a side-by-side comparison of ``pipeline`` runs (also ``bench.standby``)."""
    ap.add_argument("--n", type=int, default=30_000, help="items per pipeline run")
    ap.add_argument("--repeat", type=int, default=repeat, help="pipeline runs on each cluster")
    ap.add_argument("--batch", type=int, default=100, help="items per call in the pipeline")
    ap.add_argument("--window", type=int, default=window, help="producer batches in flight")
    ap.add_argument("--size", type=int, default=256, help="payload bytes")
    ap.add_argument("--replication", type=int, default=2, help="replicas per item (R)")
    ap.add_argument("--datanodes", type=int, default=2, help="data nodes per cluster")
    ap.add_argument("--max-seconds", type=float, default=60.0, help="time cap per pipeline run")


def fill(cluster: LocalCluster, queue: str, n: int, args: Any) -> dict[str, Any]:
    """Put ``n`` items in ``queue``; how much more memory the master holds afterwards."""
    pid = cluster.master.popen.pid
    before = rss_bytes(pid)
    res = run_workers({"producer": (produce, (cluster.master_addr, client_keys(cluster), queue,
                                              args.size, n,
                                              FILL_BATCH, args.max_seconds * 20, FILL_WINDOW))},
                      args.max_seconds * 20)["producer"]
    after = rss_bytes(pid)
    done = res["done"]
    return {"items": done, "fill_per_s": round(done / ((res["t1"] - res["t0"]) / 1e9), 1),
            "master_rss_before": before, "master_rss_after": after,
            "master_rss_bytes_per_item": round((after - before) / max(1, done), 1)}


def measure(cluster: LocalCluster, label: str, i: int, args: Any) -> dict[str, Any]:
    log.info("%s cluster: run %d of %d (%d items, batch %d)", label, i + 1, args.repeat,
             args.n, args.batch)
    rec = pipeline(cluster, f"pipe-{i}", args)
    print(json.dumps({"system": "blizzard", "op": f"pipeline_{label}", **common(args), **rec}),
          flush=True)
    return rec


def common(args: Any) -> dict[str, Any]:
    return {"size": args.size, "batch": args.batch, "replication": args.replication,
            "window": args.window}


def summarize(args: Any, filled: dict[str, Any], empty: list[dict], loaded: list[dict]) -> dict:
    """Medians of each side and their ratios; also the median of the run-by-run ratios, which
    drift on this machine (the disk's fsync times wander) cancels out of."""
    out: dict[str, Any] = {"system": "blizzard", "op": "backlog", **common(args),
                           "backlog": filled["items"],
                           "master_rss_bytes_per_item": filled["master_rss_bytes_per_item"]}
    for rate in ("enqueue_per_s", "ack_per_s"):
        name = rate.split("_")[0]
        was = statistics.median(r[rate] for r in empty)
        now = statistics.median(r[rate] for r in loaded)
        out[f"empty_{rate}"], out[f"backlog_{rate}"] = was, now
        out[f"{name}_ratio"] = round(now / was, 3)
        out[f"{name}_ratio_paired"] = round(statistics.median(
            b[rate] / a[rate] for a, b in zip(empty, loaded, strict=True)), 3)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = parser("scripts/bench --backlog", __doc__)
    ap.add_argument("--backlog", type=int, default=1_000_000, help="items left waiting")
    pipeline_options(ap, repeat=6, window=1)
    args = ap.parse_args(argv)
    if args.size < HDR.size or min(args.backlog, args.n, args.repeat, args.batch) < 1:
        ap.error(f"--size must be >= {HDR.size}; counts >= 1")
    if not 1 <= args.replication <= args.datanodes:
        ap.error("--replication must be between 1 and --datanodes")
    base = start("bench")
    clusters = {label: LocalCluster(os.path.join(base, label), datanodes=args.datanodes,
                                    replication=args.replication)
                for label in ("empty", "backlog")}

    def body() -> int:
        for cluster in clusters.values():
            pipeline(cluster, "warm-up", args)  # first runs are slower (caches, LevelDB's files)
        log.info("filling a backlog of %d items", args.backlog)
        filled = fill(clusters["backlog"], "backlog", args.backlog, args)
        print(json.dumps({"system": "blizzard", "op": "backlog_fill", "size": args.size,
                          **filled}), flush=True)
        results: dict[str, list[dict]] = {"empty": [], "backlog": []}
        for i in range(args.repeat):
            # alternating (ABBA) so that drift over time weighs on both sides alike
            for label in ("empty", "backlog") if i % 2 == 0 else ("backlog", "empty"):
                results[label].append(measure(clusters[label], label, i, args))
        print(json.dumps(summarize(args, filled, results["empty"], results["backlog"])),
              flush=True)
        return 0
    return on_clusters(base, list(clusters.values()), body)


if __name__ == "__main__":
    sys.exit(main())
