"""Relaxed priority order on the real system: the pop error index (PEI) of a sharded queue.

Run as ``scripts/bench-pei`` (or ``python -m bench.pei``). For each shard count (``--shards``)
a ``ShardedCluster`` starts (one data node per shard, R=1: order, not durability, is measured),
and for each way of choosing a shard (peek-d with ``d`` = 2, at 20 shards also 1, and the
published heads) the paper's experiment runs on it:

1. a standing backlog of ``--backlog`` items, priorities uniform over ``[0, 2**20)``, each put
   on a shard drawn at random;
2. ``--pops`` times: one consumer dequeues an item (and acks it), then a producer enqueues a
   new one (random priority, random shard), so the backlog stays where it was;
3. each pop's PEI: how many waiting items had a strictly better (lower) priority than the one
   popped, counted by the benchmark from what it enqueued and popped (a Fenwick tree).

One JSON line per run (``op`` ``pei``: P(PEI = 0), median, p99, requests to masters per pop)
and the table beside the paper-model reference (``REFERENCE``) at the end; ``--rate`` adds
the throughput lines (``bench/pei_rate.py``: 4 shards against one master).
"""

from __future__ import annotations

import json
import logging
import os
import random
import statistics
import sys
import time
from typing import Any

from bench.common import parser, start
from blizzard.local.shard_cluster import ShardedCluster

log = logging.getLogger(__name__)

PRIORITIES = 2**20
# (shards, peeks) -> (P(PEI = 0), median PEI, p99 PEI): a simulation of the paper's model,
# 20,000 pops, a standing backlog of 10,000, priorities uniform (given with issue 18)
REFERENCE = {(10, 2): (0.20, 3, 32), (20, 2): (0.10, 8, 71), (20, 1): (0.05, 36, 1064),
             (100, 2): (0.02, 47, 365)}
TOLERANCE = 0.30  # the real system's medians and p99s within this of the reference


class Waiting:
    """A multiset of priorities in ``[0, PRIORITIES)``: add, remove, count those below one."""

    def __init__(self) -> None:
        self.tree = [0] * (PRIORITIES + 1)

    def add(self, priority: int, delta: int = 1) -> None:
        i = priority + 1
        while i <= PRIORITIES:
            self.tree[i] += delta
            i += i & -i

    def below(self, priority: int) -> int:
        """How many waiting priorities are strictly lower (better) than ``priority``."""
        i, total = priority, 0
        while i > 0:
            total += self.tree[i]
            i -= i & -i
        return total


def fill(client: Any, queue: str, n: int, rng: random.Random, waiting: Waiting) -> None:
    """``n`` items, each on a random shard with a random priority, staged then committed."""
    stagers = [shard.stager(queue, window=16) for shard in client.shards]
    for _ in range(n):
        priority = rng.randrange(PRIORITIES)
        stagers[rng.randrange(len(stagers))].send([b"b"], priority=priority)
        waiting.add(priority)
    for shard, stager in zip(client.shards, stagers, strict=True):
        shard.commit(stager.flush())


def run(cluster: ShardedCluster, mode: str, peeks: int, args: Any) -> dict[str, Any]:
    """The experiment once; its PEI figures."""
    rng = random.Random(args.seed)
    queue = f"pei-{mode}-{peeks}"
    waiting = Waiting()
    with cluster.client(admin=True) as producer, \
            cluster.client(heads=mode == "heads", peeks=peeks) as consumer:
        fill(producer, queue, args.backlog, rng, waiting)
        log.info("%d shards, %s: backlog of %d in place; %d pops", len(cluster.shards),
                 label(mode, peeks), args.backlog, args.pops)
        peis: list[int] = []
        requests0, started = consumer.picker.requests, time.monotonic()
        for _ in range(args.pops):
            msg = consumer.dequeue(queue)
            assert msg is not None, "the backlog ran dry"
            peis.append(waiting.below(msg.priority))
            waiting.add(msg.priority, -1)
            msg.ack()
            priority = rng.randrange(PRIORITIES)
            producer.shards[rng.randrange(len(producer.shards))].enqueue(queue, b"n",
                                                                        priority=priority)
            waiting.add(priority)
        took = time.monotonic() - started
        requests = consumer.picker.requests - requests0
        producer.purge(queue)
    ordered = sorted(peis)
    return {"system": "blizzard", "op": "pei", "shards": len(cluster.shards),
            "choice": label(mode, peeks), "pops": len(peis), "backlog": args.backlog,
            "p_zero": round(sum(1 for x in peis if x == 0) / len(peis), 3),
            "median": statistics.median(ordered),
            "p99": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
            "mean": round(statistics.fmean(peis), 1),
            "requests_per_pop": round(requests / len(peis), 2),
            "pops_per_s": round(len(peis) / took, 1)}


def label(mode: str, peeks: int) -> str:
    return "published heads" if mode == "heads" else f"peek-{peeks}"


def modes(shards: int) -> list[tuple[str, int]]:
    """peek-2 everywhere, peek-1 where the reference has it, and the published heads."""
    out = [("peek", 2)]
    if (shards, 1) in REFERENCE:
        out.append(("peek", 1))
    return out + [("heads", 2)]


def table(rows: list[dict[str, Any]]) -> str:
    """The measured figures beside the reference, and whether each is within the tolerance."""
    lines = ["| shards | choice | P(PEI=0) | median | p99 | requests/pop | reference "
             "(P0, median, p99) | median, p99 within ±30% |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        peeks = int(r["choice"].split("-")[1]) if r["choice"].startswith("peek") else None
        ref = REFERENCE.get((r["shards"], peeks)) if peeks else None
        if ref is None and peeks is None:
            ref2 = REFERENCE.get((r["shards"], 2))
            verdict = f"p99 {r['p99']} vs peek-2's {ref2[2]}: " \
                f"{'at most' if ref2 and r['p99'] * 10 <= ref2[2] else 'MORE than'} 1/10" \
                if ref2 else ""
            ref_text = "-"
        else:
            ref_text = f"{ref[0]}, {ref[1]}, {ref[2]}" if ref else "-"
            verdict = ("yes" if all(abs(got - want) <= TOLERANCE * want for got, want in
                                    ((r["median"], ref[1]), (r["p99"], ref[2]))) else "NO") \
                if ref else ""
        lines.append(f"| {r['shards']} | {r['choice']} | {r['p_zero']} | {r['median']} | "
                     f"{r['p99']} | {r['requests_per_pop']} | {ref_text} | {verdict} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = parser("scripts/bench-pei", __doc__)
    ap.add_argument("--shards", default="10,20", help="shard counts, comma-separated")
    ap.add_argument("--pops", type=int, default=20_000, help="pops measured per run")
    ap.add_argument("--backlog", type=int, default=10_000, help="items waiting throughout")
    ap.add_argument("--seed", type=int, default=18)
    ap.add_argument("--rate", action="store_true",
                    help="also the throughput lines: 4 shards against one master")
    ap.add_argument("--rate-only", action="store_true", help="only the throughput lines")
    args, rest = ap.parse_known_args(argv)
    if args.pops < 1 or args.backlog < args.pops // 1000:
        ap.error("--pops must be at least 1")
    base = start("bench-pei")
    rows: list[dict[str, Any]] = []
    for shards in ([] if args.rate_only else [int(s) for s in args.shards.split(",")]):
        cluster = ShardedCluster(os.path.join(base, f"shards{shards}"), masters=shards,
                                 datanodes=1, replication=1)
        try:
            cluster.start(timeout_s=120)
            for mode, peeks in modes(shards):
                rows.append(run(cluster, mode, peeks, args))
                print(json.dumps(rows[-1]), flush=True)
        finally:
            cluster.stop()
    if rows:
        print(table(rows), flush=True)
    if args.rate or args.rate_only:
        from bench.pei_rate import main as rate_main
        return rate_main(rest, base)
    return 0


if __name__ == "__main__":
    sys.exit(main())
