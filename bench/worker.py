"""The Python worker's jobs/s for a no-op task, next to the raw client's dequeue+ack rate.

Run as ``scripts/bench --worker`` (or ``python -m bench.worker``). On one local cluster, for
the same number of items each time: ``--n`` calls of ``noop`` (defined here) are enqueued, then
drained either by the raw client, once per ``--batch`` size (``dequeue_many`` of that many
items, each batch's ack riding on the next lease, as ``bench.throughput``'s dequeue_ack), or by
a real ``blizzard worker bench.worker --burst --concurrency C`` process, once per value of
``--concurrency``.

Prints one JSON line per measurement: ``op`` raw_dequeue_ack or worker, ``ops_per_s`` (jobs
acked per second; the worker's own count and clock, from its first lease to its last ack
being durable; its start-up is not counted, its CPU is), the worker's CPU microseconds per job
(its whole process), and ``vs_raw``, its rate over the best raw client's.
"""

from __future__ import annotations

import json
import logging
import os
import re
import resource
import subprocess
import sys
import time
from typing import Any

from bench.common import (
    client_keys,
    clusters_for,
    int_list,
    on_clusters,
    parser,
    security_of,
    security_option,
    start,
)
from blizzard.client.core import Client
from blizzard.local.harness import LocalCluster
from blizzard.net.keys import ENV as KEYS_ENV
from blizzard.worker.task import task

log = logging.getLogger(__name__)

QUEUE = "bench-worker"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DONE = re.compile(r"worker done: (\d+) jobs? succeeded, (\d+) failed in ([0-9.]+) s")


@task(queue=QUEUE)
def noop() -> None:
    """The job measured: it does nothing, so what is left is the worker's own cost."""


def fill(client: Client, n: int) -> None:
    """``n`` calls of ``noop`` in the queue."""
    for start_at in range(0, n, 10_000):
        noop.with_options(client=client).enqueue_many([()] * min(10_000, n - start_at))


def raw(client: Client, n: int, batch: int) -> tuple[int, float]:
    """Dequeue and ack ``n`` items, each batch's ack on the next lease: (acked, seconds)."""
    t0 = time.monotonic()
    done: list = []
    got = 0
    while got + len(done) < n and time.monotonic() - t0 < 120:
        msgs = client.dequeue_many(QUEUE, min(batch, n - got - len(done)), lease_s=60,
                                   wait_s=0.5, ack=done)
        got += len(done)
        done = msgs
    client.ack_many(done)
    return got + len(done), time.monotonic() - t0


def cpu_of_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def worker(cluster: LocalCluster, concurrency: int) -> tuple[int, float, float]:
    """Run ``blizzard worker --burst`` until the queue is empty: (jobs, seconds, CPU seconds)."""
    env = {k: v for k, v in os.environ.items() if k != KEYS_ENV}
    if cluster.keys:
        env[KEYS_ENV] = cluster.keys
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
    cpu0 = cpu_of_children()
    proc = subprocess.run([sys.executable, "-m", "blizzard.cli", "worker", "bench.worker",
                           "--burst", "--concurrency", str(concurrency), "--master",
                           cluster.master_addr, "--timeout-s", "30"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    found = DONE.search(proc.stderr)
    if proc.returncode != 0 or found is None:
        raise RuntimeError(f"the worker exited {proc.returncode}: {proc.stderr[-2000:]}")
    return int(found[1]), float(found[3]), cpu_of_children() - cpu0


def emit(op: str, n: int, seconds: float, **extra: Any) -> dict[str, Any]:
    rec = {"system": "blizzard", "op": op, "n": n,
           "ops_per_s": round(n / seconds, 1) if seconds > 0 else 0.0,
           "elapsed_s": round(seconds, 3), **extra}
    print(json.dumps(rec), flush=True)
    return rec


def measure(cluster: LocalCluster, n: int, batches: list[int], concurrencies: list[int],
            round_no: int) -> None:
    """The raw client at each batch size, then the worker at each concurrency; ``vs_raw`` is
    the worker's rate over the best raw one of this round."""
    common = {"replication": cluster.replication, "security": security_of(cluster),
              "round": round_no}
    best = 0.0
    with Client(cluster.master_addr, timeout_s=30.0, keys=client_keys(cluster)) as client:
        for batch in batches:
            log.info("raw client: %d items, batch %d", n, batch)
            fill(client, n)
            acked, seconds = raw(client, n, batch)
            best = max(best, emit("raw_dequeue_ack", acked, seconds, batch=batch,
                                  capped=acked < n, **common)["ops_per_s"])
        for concurrency in concurrencies:
            log.info("blizzard worker: %d jobs, concurrency %d", n, concurrency)
            fill(client, n)
            jobs, seconds, cpu_s = worker(cluster, concurrency)
            rate = jobs / seconds if seconds > 0 else 0.0
            emit("worker", jobs, seconds, processes=1, concurrency=concurrency,
                 capped=jobs < n, vs_raw=round(rate / best, 2) if best else None,
                 worker_cpu_us_per_job=round(cpu_s / max(1, jobs) * 1e6, 1), **common)


def main(argv: list[str] | None = None) -> int:
    ap = parser("scripts/bench --worker", __doc__)
    ap.add_argument("--worker", action="store_true", help="(how scripts/bench picks this one)")
    ap.add_argument("--n", type=int, default=20_000, help="jobs per measurement")
    ap.add_argument("--batch", type=int_list, default=[100, 1000],
                    help="the raw client's items per lease, one measurement each, e.g. 100,1000")
    ap.add_argument("--concurrency", type=int_list, default=[1, 8],
                    help="worker threads, one measurement each, e.g. 1,8")
    ap.add_argument("--rounds", type=int, default=1,
                    help="measure everything this many times in turn (on a busy machine)")
    ap.add_argument("--replication", type=int, default=1, help="replicas per item (R)")
    ap.add_argument("--datanodes", type=int, default=2, help="data nodes to start")
    security_option(ap)
    args = ap.parse_args(argv)
    if min(args.n, args.rounds, min(args.batch, default=0), min(args.concurrency, default=0)) < 1:
        ap.error("--n, --rounds, --batch and --concurrency must be >= 1")
    base = start("bench-worker")
    clusters = clusters_for(base, args.security, datanodes=args.datanodes,
                            replication=args.replication)

    def body() -> int:
        for round_no in range(1, args.rounds + 1):  # alternating, so noise hits both sides
            for cluster in clusters:
                measure(cluster, args.n, args.batch, args.concurrency, round_no)
        return 0
    return on_clusters(base, clusters, body)


if __name__ == "__main__":
    sys.exit(main())
