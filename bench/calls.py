"""CPU per call, one client calling one item at a time: the cost of a call in each process's
main thread (where Blizzard's own Python runs) and in all its threads (ZeroMQ's I/O thread
and the kernel's work for it too), with nothing else running to share a pass with.

Where ``--workers`` measures a loaded cluster, whose passes and syncs serve many callers at
once, this measures what one call costs each process on its own: the figure a change to the
per-message path (the receive loops, the codec, a handler) moves, and steady enough between
runs to show a change of 10%. A client does ``--n`` enqueues, then ``--n`` dequeues, each
acked at once (``Message.ack``), on a cluster of 2 data nodes, R=2, insecure.

One JSON line per op (``enqueue``, ``dequeue_ack``): CPU µs per call of the client's main
thread (``time.thread_time``), and of each server's main thread and all its threads (the
threads' scheduler clocks in /proc), and the wall time per call.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable

from bench.common import on_clusters, parser, start
from blizzard.client import Client
from blizzard.local.harness import LocalCluster


def thread_cpu_s(pid: int, tid: int | None = None) -> float:
    """CPU seconds of one thread of ``pid`` (``tid``; default its main thread), or of all its
    threads (``tid`` 0), from the scheduler's clocks."""
    tasks = os.listdir(f"/proc/{pid}/task") if tid == 0 else [str(tid or pid)]
    total = 0
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):  # a thread that ended meanwhile
            pass
    return total / 1e9


def measure(cluster: LocalCluster, op: str, n: int, call: Callable[[], None]) -> dict:
    """``call`` ``n`` times: µs per call in each process (see the module docstring)."""
    pids = {"master": cluster.master.popen.pid} if cluster.master and cluster.master.popen \
        else {}
    pids.update({f"datanode{i}": proc.popen.pid for i, proc in enumerate(cluster.nodes)
                 if proc.popen is not None})
    before = {name: (thread_cpu_s(pid), thread_cpu_s(pid, 0)) for name, pid in pids.items()}
    own, wall = time.thread_time(), time.monotonic()
    for _ in range(n):
        call()
    own, wall = time.thread_time() - own, time.monotonic() - wall
    after = {name: (thread_cpu_s(pid), thread_cpu_s(pid, 0)) for name, pid in pids.items()}
    per = 1e6 / n
    line = {"system": "blizzard", "op": op, "calls": n, "wall_us": round(wall * per, 1),
            "cpu_us_main_thread": {"client": round(own * per, 1)},
            "cpu_us_all_threads": {}}
    for name in pids:
        line["cpu_us_main_thread"][name] = round((after[name][0] - before[name][0]) * per, 1)
        line["cpu_us_all_threads"][name] = round((after[name][1] - before[name][1]) * per, 1)
    return line


def run(cluster: LocalCluster, n: int, size: int) -> list[dict]:
    payload = b"x" * size
    client = Client(cluster.master_addr, keys="")  # the cluster runs without keys
    try:
        for _ in range(min(n, 200)):  # warm: connections made, id blocks and delays known
            client.enqueue("calls", payload)
        for _ in range(min(n, 200)):
            client.dequeue("calls").ack()

        def dequeue_ack() -> None:
            msg = client.dequeue("calls")
            assert msg is not None and msg.data == payload, "the queue ran dry"
            msg.ack()
        lines = [measure(cluster, "enqueue", n, lambda: client.enqueue("calls", payload)),
                 measure(cluster, "dequeue_ack", n, dequeue_ack)]
    finally:
        client.close()
    for line in lines:
        print(json.dumps({**line, "size": size}), flush=True)
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = parser("scripts/bench --calls", __doc__)
    ap.add_argument("--calls", type=int, default=3000, help="enqueues, then dequeue + acks")
    ap.add_argument("--size", type=int, default=256, help="payload bytes")
    args = ap.parse_args(argv)
    if not 1 <= args.calls <= 100_000 or not 1 <= args.size <= 1 << 20:
        ap.error("--calls in [1, 100000]; --size in [1, 1 MiB]")
    base = start("bench")
    cluster = LocalCluster(os.path.join(base, "cluster"), datanodes=2, replication=2, keys=None)

    def body() -> int:
        run(cluster, args.calls, args.size)
        return 0
    return on_clusters(base, [cluster], body)


if __name__ == "__main__":
    sys.exit(main())
