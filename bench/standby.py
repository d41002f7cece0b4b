"""What a hot standby costs, and how long a failover takes.

Run as ``scripts/bench --standby`` (or ``python -m bench.standby``). Two local clusters alike,
one master alone and one with a synchronous standby (the default ``--sync-standby``):

1. one warm-up run of the batched pipeline on each;
2. ``--repeat`` runs on each, alternating (A B B A ...): a producer enqueues ``--n`` items
   ``--batch`` per call, then a consumer dequeues and acks them (``bench.backlog.pipeline``);
   one JSON line per run (``op`` ``pipeline_alone`` / ``pipeline_standby``) and a summary
   (``op`` ``standby_cost``) whose ``enqueue_ratio`` / ``ack_ratio`` compare the medians
   (1.0: the standby costs nothing);
3. ``--failovers`` times: the primary is killed (``kill -9``) while a client enqueues one item
   at a time; the failover time is from the kill to the first enqueue confirmed after it (by
   the new primary, with the default settings). The killed master then comes back as the new
   primary's standby, and the next round waits until it is in sync. A line per failover
   (``op`` ``failover``) and a summary (``op`` ``failovers``: p50, p90, max).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time
from typing import Any

from bench.backlog import pipeline, pipeline_options
from bench.common import on_clusters, parser, start
from bench.throughput import HDR
from blizzard import Client
from blizzard.local.harness import LocalCluster

log = logging.getLogger(__name__)


def wait_in_sync(cluster: LocalCluster, timeout_s: float = 120.0) -> float:
    """Seconds until the primary names the standby as the one it waits for."""
    assert cluster.second is not None
    started = time.monotonic()
    with Client(cluster.masters, timeout_s=10) as c:
        while c.status().standby != cluster.second.addr:
            if time.monotonic() - started > timeout_s:
                raise TimeoutError(f"the standby {cluster.second.addr} is not in sync after "
                                   f"{timeout_s:g}s")
            time.sleep(0.05)
    return time.monotonic() - started


def failover(cluster: LocalCluster, round_: int) -> dict[str, Any]:
    """Kill the primary while enqueueing; the time to the first confirmed enqueue after it."""
    assert cluster.master is not None
    with Client(cluster.masters, timeout_s=60) as c:
        c.enqueue("failover", b"before %d" % round_)
        killed = time.monotonic()
        cluster.master.kill()
        c.enqueue("failover", b"after %d" % round_)
        took = time.monotonic() - killed
        epoch = c.status().epoch
    cluster.follow_new_primary()
    in_sync = wait_in_sync(cluster)
    return {"system": "blizzard", "op": "failover", "round": round_,
            "failover_s": round(took, 3), "epoch": epoch, "standby_back_in_sync_s":
            round(in_sync, 3)}


def summarize(label: str, rows: list[dict], keys: tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in keys:
        out[f"{label}_{key}"] = statistics.median(r[key] for r in rows)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = parser("scripts/bench --standby", __doc__)
    ap.add_argument("--standby", action="store_true", help=argparse.SUPPRESS)
    pipeline_options(ap, repeat=4, window=4)
    ap.add_argument("--failovers", type=int, default=10, help="primaries killed, one by one")
    args = ap.parse_args(argv)
    if args.size < HDR.size or min(args.n, args.batch) < 1 or args.repeat < 0 or \
            args.failovers < 0:
        ap.error(f"--size must be >= {HDR.size}; counts >= 1 (--repeat, --failovers >= 0)")
    base = start("bench")
    clusters = {label: LocalCluster(os.path.join(base, label), datanodes=args.datanodes,
                                    replication=args.replication, standby=label == "standby")
                for label in ("alone", "standby")}

    def body() -> int:
        wait_in_sync(clusters["standby"])
        runs: dict[str, list[dict]] = {"alone": [], "standby": []}
        if args.repeat:
            for cluster in clusters.values():
                pipeline(cluster, "warm-up", args)
            for i in range(args.repeat):  # alternating (ABBA): drift weighs on both alike
                for label in ("alone", "standby") if i % 2 == 0 else ("standby", "alone"):
                    log.info("%s: run %d of %d", label, i + 1, args.repeat)
                    rec = pipeline(clusters[label], f"pipe-{i}", args)
                    runs[label].append(rec)
                    print(json.dumps({"system": "blizzard", "op": f"pipeline_{label}",
                                      "size": args.size, "batch": args.batch, **rec}), flush=True)
            cost = {**summarize("alone", runs["alone"], ("enqueue_per_s", "ack_per_s")),
                    **summarize("standby", runs["standby"], ("enqueue_per_s", "ack_per_s"))}
            for name in ("enqueue", "ack"):
                cost[f"{name}_ratio"] = round(cost[f"standby_{name}_per_s"] /
                                              cost[f"alone_{name}_per_s"], 3)
            print(json.dumps({"system": "blizzard", "op": "standby_cost", "size": args.size,
                              "batch": args.batch, "window": args.window, **cost}), flush=True)
        times = []
        for i in range(args.failovers):
            row = failover(clusters["standby"], i)
            times.append(row["failover_s"])
            print(json.dumps(row), flush=True)
        if times:
            ordered = sorted(times)
            print(json.dumps({"system": "blizzard", "op": "failovers", "count": len(times),
                              "p50_s": round(statistics.median(ordered), 3),
                              "p90_s": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))],
                              "max_s": ordered[-1]}), flush=True)
        return 0
    return on_clusters(base, list(clusters.values()), body)


if __name__ == "__main__":
    sys.exit(main())
