"""A sharded consumer's acks held for a lease to their shard, against acks sent beside each
lease: ``python -m bench.shard_acks`` (``--runs``, ``--items``).

A 4-shard cluster (one data node a shard, R=1); each run enqueues ``--items`` items in
batches of 100, each batch of a random priority out of 20, so that a consumer's leases hop
between shards; then one consumer dequeues 100 at a time, acking each batch with the next
lease, with ``shard_acks.HOLD_S`` at 0 (every ack beside the next lease) or at its default
(held for a lease to its shard). Runs alternate. Per run: the masters' CPU per item and how
many leases went to another shard than the one before; at the end the medians.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import sys
import tempfile

from bench.common import parser
from bench.throughput import proc_cpu_s
from blizzard import Client, shard_acks
from blizzard.shard_cluster import ShardedCluster


def run(cluster: ShardedCluster, queue: str, items: int, hold_s: float, seed: int) -> dict:
    addrs = " ".join(cluster.addrs)
    keys = cluster.keys or ""
    with Client(addrs, keys=keys) as client:
        rng = random.Random(seed)
        for _ in range(items // 100):
            client.enqueue_many(queue, [b"x" * 64] * 100, priority=rng.randrange(20))
    shard_acks.HOLD_S = hold_s
    pids = [shard.master.popen.pid for shard in cluster.shards]
    with Client(addrs, keys=keys) as client:
        client.stats(queue)  # connected to every shard before the clock starts
        before = sum(proc_cpu_s(pid) or 0.0 for pid in pids)
        done: list = []
        got = hops = 0
        last = None
        while got < items:
            msgs = client.dequeue_many(queue, 100, lease_s=60, wait_s=0.5, ack=done)
            if not msgs:
                break
            got += len(msgs)
            hops += (msgs[0].id >> 56) != last
            last, done = msgs[0].id >> 56, msgs
        client.ack_many(done)
        spent = sum(proc_cpu_s(pid) or 0.0 for pid in pids) - before
    return {"hold_s": hold_s, "items": got, "leases_to_another_shard": hops,
            "masters_us_per_item": round(spent / max(1, got) * 1e6, 1)}


def main(argv: list[str]) -> int:
    ap = parser("python -m bench.shard_acks", __doc__)
    ap.add_argument("--runs", type=int, default=4, help="runs of each setting")
    ap.add_argument("--items", type=int, default=20_000, help="items per run")
    args = ap.parse_args(argv)
    held = shard_acks.HOLD_S
    base = tempfile.mkdtemp(prefix="bench-shard-acks-")
    cluster = ShardedCluster(os.path.join(base, "shards"), masters=4, datanodes=1,
                             replication=1).start(timeout_s=120)
    try:
        rows: dict[float, list[float]] = {0.0: [], held: []}
        for i in range(args.runs):
            for hold_s in (0.0, held) if i % 2 == 0 else (held, 0.0):
                rec = run(cluster, f"acks-{i}-{hold_s}", args.items, hold_s, seed=i)
                rows[hold_s].append(rec["masters_us_per_item"])
                print(json.dumps({"system": "blizzard", "op": "shard_acks", **rec}), flush=True)
        for hold_s, values in rows.items():
            print(json.dumps({"system": "blizzard", "op": "shard_acks_median", "hold_s": hold_s,
                              "masters_us_per_item": statistics.median(values)}), flush=True)
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
