"""Benchmark Blizzard on a local cluster: enqueue, dequeue+ack, and a concurrent pipeline.

Run as ``python -m bench.throughput`` (``scripts/bench`` does that). Each measurement runs in
worker processes with their own ``Client`` and prints one JSON line on stdout, shaped like
the lines of ``peerbench/peers.py`` so the two can be compared; progress goes to stderr.

Latency (``p50_us``/``p99_us``, ``lat_unit: batch``) is one client call carrying ``batch``
items: ``enqueue_many`` for enqueue, ``dequeue_many(ack=previous batch)`` (the ack rides on the
next lease, one master round trip) for dequeue_ack and
pipeline. Pipeline lines add ``e2e_p50_us``/``e2e_p99_us``: producer timestamp -> ack done.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing as mp
import os
import random
import resource
import signal
import struct
import sys
import time
from collections.abc import Callable
from typing import Any

from bench.common import (
    client_keys,
    clusters_for,
    int_list,
    metrics_of,
    metrics_option,
    no_sync_option,
    on_clusters,
    parser,
    security_of,
    security_option,
    start,
    unsafe_no_sync,
)
from blizzard.client.core import Client
from blizzard.local.harness import LocalCluster

log = logging.getLogger(__name__)

HDR = struct.Struct(">QQ")  # producer's monotonic_ns timestamp, sequence number
MP = mp.get_context("spawn")  # workers start clean: no inherited zmq context or sockets
now_ns = time.monotonic_ns  # CLOCK_MONOTONIC is shared by all processes on Linux


class Payloads:
    """Distinct, incompressible payloads of exactly ``size`` bytes with a timestamp header."""

    def __init__(self, size: int, pool: int = 512) -> None:
        rnd = random.Random(size)
        self.bodies = [rnd.randbytes(size - HDR.size) for _ in range(pool)]

    def make(self, seq: int, ts_ns: int = 0) -> bytes:
        return HDR.pack(ts_ns, seq) + self.bodies[seq % len(self.bodies)]


def own_cpu_s() -> float:
    """CPU seconds this process has used, all its threads (ZeroMQ's I/O thread too)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def proc_cpu_s(pid: int, children: bool = False) -> float | None:
    """CPU seconds another process has used (Linux /proc), or None where unreadable;
    ``children``: with its children that exited and were waited for.

    Without children it is the sum of its threads' scheduler clocks (nanoseconds), not the
    clock ticks of ``stat`` (10 ms each: a 30,000-item run could not tell 0.3 µs per item).
    """
    if not children:
        try:
            total = 0
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                    total += int(f.read().split()[0])
            return total / 1e9
        except (OSError, ValueError, IndexError):
            pass  # no schedstat here (or a thread left meanwhile): the coarse clock
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        used = fields[11:15] if children else fields[11:13]
        return sum(map(int, used)) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of process ``pid`` and its descendants, the reaped ones included (Spark's
    JVM and the Python workers it forks; a RabbitMQ node's script and its Erlang VM)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    tree, todo = {pid}, [pid]
    while todo:
        parent = todo.pop()
        children = [p for p, pp in parents.items() if pp == parent and p not in tree]
        tree.update(children)
        todo += children
    return sum(proc_cpu_s(p, children=True) or 0.0 for p in tree)


def machine_cpu() -> tuple[int, int] | None:
    """(busy, total) clock ticks of all cores since boot (Linux /proc/stat), or None."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = ticks[3] + ticks[4]  # idle + iowait
    return sum(ticks) - idle, sum(ticks)


class CpuMeter:
    """Where CPU went during a measurement: per server process, and how busy the machine was."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.pids = {proc.name: proc.popen.pid
                     for proc in [cluster.master, cluster.second, *cluster.nodes]
                     if proc is not None and proc.popen is not None}
        self.start = {name: proc_cpu_s(pid) for name, pid in self.pids.items()}

    def report(self, items: int, workers: dict[str, dict]) -> dict[str, Any]:
        """CPU microseconds per item of each part, and the machine's busy share meanwhile
        (sampled by the consumer from the start barrier to its last ack)."""
        if not items:
            return {}
        spent: dict[str, float] = {}
        for name, pid in self.pids.items():
            now, then = proc_cpu_s(pid), self.start.get(name)
            if now is not None and then is not None:
                group = "datanodes" if name.startswith("datanode") else name
                spent[group] = spent.get(group, 0.0) + now - then
        for role, res in workers.items():
            spent[role] = res.get("cpu_s", 0.0)
        out: dict[str, Any] = {"cpu_us_per_item": {k: round(v / items * 1e6, 1)
                                                   for k, v in spent.items()}}
        before, after = workers.get("consumer", {}).get("machine") or (None, None)
        if before and after and after[1] > before[1]:
            out["machine_busy"] = round((after[0] - before[0]) / (after[1] - before[1]), 2)
        return out


def percentile(sorted_vals: list[int], q: float) -> int | None:
    if not sorted_vals:
        return None
    return sorted_vals[min(len(sorted_vals) - 1, int(q * len(sorted_vals)))]


def _us(ns: int | None) -> float | None:
    return round(ns / 1000, 1) if ns is not None else None


# -- workers (run in child processes; each builds its own Client after the process starts) --

def produce(master: str, keys: str, queue: str, size: int, n: int, batch: int, max_s: float,
            window: int, barrier: Any, out: Any) -> None:
    """Enqueue ``n`` items in calls of ``batch``; report count, times and per-call latencies.

    ``window`` > 1: through ``Client.producer``, that many batches in flight at once.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's: it terminates us
    try:
        pay = Payloads(size)
        with Client(master, timeout_s=30.0, keys=keys) as client:
            client.stats(queue)  # connect before the clock starts
            barrier.wait(60)
            cpu0 = own_cpu_s()
            t0 = now_ns()
            deadline = t0 + int(max_s * 1e9)
            lats: list[int] = []
            done = 0
            prod = client.producer(queue, window=window) if window > 1 else None
            while done < n and now_ns() < deadline:
                items = [pay.make(i, now_ns()) for i in range(done, min(n, done + batch))]
                start = now_ns()
                if prod is not None:
                    prod.send(items)
                else:
                    client.enqueue_many(queue, items)
                lats.append(now_ns() - start)
                done += len(items)
            if prod is not None:
                prod.flush()
            out.put(("producer", {"done": done, "t0": t0, "t1": now_ns(), "lats": lats,
                                  "cpu_s": own_cpu_s() - cpu0}))
    except Exception as exc:  # reported to the parent, which fails the measurement
        out.put(("producer", {"error": repr(exc)}))


def consume(master: str, keys: str, queue: str, n: int, batch: int, max_s: float,
            barrier: Any, out: Any) -> None:
    """Dequeue and ack until ``n`` items are acked or ``max_s`` passes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with Client(master, timeout_s=30.0, keys=keys) as client:
            client.stats(queue)
            barrier.wait(60)
            cpu0, machine0 = own_cpu_s(), machine_cpu()
            t0 = t_last = now_ns()
            deadline = t0 + int(max_s * 1e9)
            lats: list[int] = []
            e2e: list[int] = []
            got = 0
            done: list = []  # the previous batch, acked with the next lease in one round trip
            while got + len(done) < n and now_ns() < deadline:
                start = now_ns()
                msgs = client.dequeue_many(queue, min(batch, n - got - len(done)), lease_s=60,
                                           wait_s=0.5, ack=done)
                t_last = now_ns()
                if done:
                    lats.append(t_last - start)
                    e2e.extend(t_last - HDR.unpack_from(m.data)[0] for m in done)
                    got += len(done)
                done = msgs
            if done:
                start = now_ns()
                client.ack_many(done)
                t_last = now_ns()
                lats.append(t_last - start)
                e2e.extend(t_last - HDR.unpack_from(m.data)[0] for m in done)
                got += len(done)
            out.put(("consumer", {"got": got, "t0": t0, "t_last": t_last, "lats": lats,
                                  "e2e": e2e, "cpu_s": own_cpu_s() - cpu0,
                                  "machine": (machine0, machine_cpu())}))
    except Exception as exc:
        out.put(("consumer", {"error": repr(exc)}))


def run_workers(workers: dict[str, tuple[Callable[..., None], tuple]], max_s: float
                ) -> dict[str, dict]:
    """Start the workers together (a shared barrier), collect one result from each."""
    out = MP.Queue()
    barrier = MP.Barrier(len(workers))
    procs = [MP.Process(target=fn, args=(*args, barrier, out), daemon=True, name=role)
             for role, (fn, args) in workers.items()]
    results: dict[str, dict] = {}
    try:
        for proc in procs:
            proc.start()
        end = time.monotonic() + max_s + 90  # start-up, the last call's timeout, teardown
        while len(results) < len(procs) and time.monotonic() < end:
            try:
                role, res = out.get(timeout=0.5)
                results[role] = res
            except Exception:  # queue.Empty: see whether someone died without reporting
                if not any(p.is_alive() for p in procs) and out.empty():
                    break
    except BaseException:  # Ctrl-C, SIGTERM: do not wait for the workers
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
        raise
    finally:
        for proc in procs:
            proc.join(5)
            if proc.is_alive():
                log.warning("worker %s (pid %d) still running; terminating", proc.name, proc.pid)
                proc.terminate()
                proc.join(5)
    for role in workers:
        if role not in results:
            raise RuntimeError(f"{role} gave no result")
        if "error" in results[role]:
            raise RuntimeError(f"{role} failed: {results[role]['error']}")
    return results


# -- measurements ---------------------------------------------------------------------------

def emit(op: str, n: int, n_req: int, batch: int, size: int, replication: int,
         elapsed_ns: int, lats_ns: list[int], **extra: Any) -> dict:
    lats = sorted(lats_ns)
    rec = {"system": "blizzard", "op": op, "n": n, "batch": batch, "size": size,
           "replication": replication,
           "ops_per_s": round(n / (elapsed_ns / 1e9), 1) if elapsed_ns > 0 and n else 0.0,
           "p50_us": _us(percentile(lats, 0.50)), "p99_us": _us(percentile(lats, 0.99)),
           "lat_unit": "batch", "elapsed_s": round(elapsed_ns / 1e9, 3), "n_req": n_req,
           "capped": n < n_req, **extra}
    print(json.dumps(rec), flush=True)
    return rec


def measure(cluster: LocalCluster, size: int, batch: int, n: int,
            args: argparse.Namespace) -> None:
    """Enqueue-only, then dequeue+ack of what was enqueued, then a fresh concurrent pipeline."""
    master = cluster.master_addr
    keys = client_keys(cluster)
    common = {"size": size, "batch": batch, "replication": args.replication,
              "security": security_of(cluster), "metrics": metrics_of(cluster),
              **({"bound": ["no-sync"]} if args.no_sync else {})}
    queue = f"bench-{size}-{batch}"
    log.info("enqueue: %d items of %d B, batch %d", n, size, batch)
    work = (master, keys, queue, size, n, batch, args.max_seconds, 1)
    prod = run_workers({"producer": (produce, work)}, args.max_seconds)["producer"]
    emit("enqueue", prod["done"], n, elapsed_ns=prod["t1"] - prod["t0"], lats_ns=prod["lats"],
         **common)

    log.info("dequeue+ack: %d items, batch %d", prod["done"], batch)
    cons = run_workers({"consumer": (consume, (master, keys, queue, prod["done"], batch,
                                               args.max_seconds))}, args.max_seconds)["consumer"]
    emit("dequeue_ack", cons["got"], prod["done"], elapsed_ns=cons["t_last"] - cons["t0"],
         lats_ns=cons["lats"], **common)

    windows = [1] + ([args.window] if batch > 1 and args.window > 1 else [])
    for window in windows:
        queue = f"bench-pipe-{size}-{batch}-{window}"
        log.info("pipeline: %d items, batch %d, producer window %d, producer and consumer "
                 "together", n, batch, window)
        meter = CpuMeter(cluster)
        res = run_workers({
            "consumer": (consume, (master, keys, queue, n, batch, args.max_seconds)),
            "producer": (produce, (master, keys, queue, size, n, batch, args.max_seconds, window)),
        }, args.max_seconds)
        prod, cons = res["producer"], res["consumer"]
        cpu = meter.report(cons["got"], res)
        e2e = sorted(cons["e2e"])
        emit("pipeline" if window == 1 else f"pipeline_window{window}", cons["got"], n,
             elapsed_ns=cons["t_last"] - prod["t0"], lats_ns=cons["lats"],
             e2e_p50_us=_us(percentile(e2e, 0.50)), e2e_p99_us=_us(percentile(e2e, 0.99)),
             items_per_call=round(cons["got"] / len(cons["lats"]), 1) if cons["lats"] else 0,
             producer_ops_per_s=round(prod["done"] / ((prod["t1"] - prod["t0"]) / 1e9), 1),
             **cpu, **common)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = parser("scripts/bench", __doc__)
    ap.add_argument("--sizes", type=int_list, default=[256, 4096],
                    help="payload bytes, e.g. 256,4096")
    ap.add_argument("--batches", type=int_list, default=[1, 100],
                    help="items per call, e.g. 1,100")
    ap.add_argument("--n", type=int, default=20000, help="items per measurement when batch > 1")
    ap.add_argument("--n-unbatched", type=int, default=2000,
                    help="items per measurement when batch = 1")
    ap.add_argument("--max-seconds", type=float, default=60.0, help="time cap per measurement")
    ap.add_argument("--replication", type=int, default=1, help="replicas per item (R)")
    ap.add_argument("--datanodes", type=int, default=3, help="data nodes to start")
    ap.add_argument("--window", type=int, default=4,
                    help="also run the pipeline with this many producer batches in flight "
                         "(Client.producer); 1 to skip")
    ap.add_argument("--quick", action="store_true", help="smoke run: 500 items per measurement")
    no_sync_option(ap)
    security_option(ap)
    metrics_option(ap)
    args = ap.parse_args(argv)
    if args.quick:
        args.n = args.n_unbatched = 500
    if min(args.sizes, default=0) < HDR.size or min(args.batches, default=0) < 1 or args.n < 1 \
            or args.n_unbatched < 1:
        ap.error(f"sizes must be >= {HDR.size}, batches and counts >= 1")
    if not 1 <= args.replication <= args.datanodes:
        ap.error("--replication must be between 1 and --datanodes")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.no_sync:
        unsafe_no_sync()
    base = start("bench")
    clusters = clusters_for(base, args.security, args.metrics, datanodes=args.datanodes,
                            replication=args.replication)

    def body() -> int:
        rc = 0
        log.info("%d cluster(s) up: %d data nodes each, R=%d, dir %s", len(clusters),
                 args.datanodes, args.replication, base)
        for size in args.sizes:
            for batch in args.batches:
                n = args.n if batch > 1 else args.n_unbatched
                for cluster in clusters:  # with --security/--metrics both, side by side
                    try:
                        measure(cluster, size, batch, n, args)
                    except RuntimeError as exc:
                        rc = 1
                        log.error("size %d batch %d failed: %s\n%s", size, batch, exc,
                                  cluster.logs())
        return rc
    return on_clusters(base, clusters, body)


if __name__ == "__main__":
    sys.exit(main())
