"""beanstalkd clients through ``blizzard beanstalkd`` against Blizzard's own client, one run.

Run as ``scripts/bench --gateway`` (or ``python -m bench.gateway``). On one local cluster
(insecure, R=2), P producer and C consumer processes move one job per call for ``--seconds``:
first with Blizzard's client (``enqueue``; ``dequeue`` + ``ack``), then with greenstalk
through a ``blizzard beanstalkd`` process (``put``; ``reserve`` + ``delete``). Prints one JSON
line per client and the ratio: the issue's goal is at least 0.8.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any

from bench.common import on_clusters, parser, start
from blizzard.local.harness import LocalCluster, free_port

MP = mp.get_context("spawn")


def worker(kind: str, role: str, where: Any, size: int, seconds: float, barrier: Any,
           out: Any) -> None:
    """One producer or consumer loop with ``kind``'s client, bounded by ``seconds``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    body, n = os.urandom(size), 0
    try:
        if kind == "blizzard":
            from blizzard.client.core import Client
            with Client(where, timeout_s=30) as c:
                c.stats("g")
                barrier.wait(60)
                end = time.monotonic() + seconds
                while time.monotonic() < end:
                    if role == "p":
                        c.enqueue("g", body)
                    else:
                        msg = c.dequeue("g", wait_s=0.5)
                        if msg is None:
                            continue
                        msg.ack()
                    n += 1
        else:
            import greenstalk
            with greenstalk.Client(where, encoding=None, use="g", watch="g") as c:
                barrier.wait(60)
                end = time.monotonic() + seconds
                while time.monotonic() < end:
                    if role == "p":
                        c.put(body)
                    else:
                        try:
                            job = c.reserve(timeout=1)
                        except greenstalk.TimedOutError:
                            continue
                        c.delete(job)
                    n += 1
        out.put((role, n, None))
    except Exception as exc:  # reported to the parent
        out.put((role, n, repr(exc)))


def run(kind: str, where: Any, producers: int, consumers: int, size: int,
        seconds: float) -> dict[str, Any]:
    out, barrier = MP.Queue(), MP.Barrier(producers + consumers + 1)
    procs = [MP.Process(target=worker, args=(kind, r, where, size, seconds, barrier, out),
                        daemon=True) for r in ["p"] * producers + ["c"] * consumers]
    for proc in procs:
        proc.start()
    barrier.wait(120)
    t0 = time.monotonic()
    counts, errors = {"p": 0, "c": 0}, []
    for _ in procs:
        role, n, err = out.get(timeout=seconds + 120)
        counts[role] += n
        if err:
            errors.append(err)
    elapsed = time.monotonic() - t0
    for proc in procs:
        proc.join(10)
    line = {"system": kind, "producers": producers, "consumers": consumers, "size": size,
            "enqueued_per_s": round(counts["p"] / elapsed), "acked_per_s": round(counts["c"] / elapsed),
            "errors": errors[:3]}
    print(json.dumps(line), flush=True)
    return line


def main(argv: list[str] | None = None) -> int:
    ap = parser("scripts/bench --gateway", __doc__)
    ap.add_argument("--gateway", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--workers", default="8,8", help="producer and consumer processes")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--size", type=int, default=256)
    args = ap.parse_args(argv)
    producers, _, consumers = args.workers.partition(",")
    p_, c_ = int(producers), int(consumers or producers)
    if not (1 <= p_ <= 64 and 1 <= c_ <= 64 and 0 < args.seconds <= 600):
        ap.error("--workers 1..64 of each, --seconds in (0, 600]")
    base = start("bench-gateway")
    cluster = LocalCluster(os.path.join(base, "cluster"), datanodes=2, replication=2,
                           keys=None)

    def body() -> int:
        native = run("blizzard", cluster.master_addr, p_, c_, args.size, args.seconds)
        port = free_port()
        env = dict(os.environ, BLIZZARD_MASTER=cluster.master_addr)
        env.pop("BLIZZARD_KEYS", None)
        gateway = subprocess.Popen([sys.executable, "-m", "blizzard.cli", "beanstalkd",
                                    "--listen", f"127.0.0.1:{port}", "--log-level", "warning"],
                                   env=env)
        try:
            _wait_for_port(port, gateway)
            beans = run("beanstalkd-gateway", ("127.0.0.1", port), p_, c_, args.size,
                        args.seconds)
        finally:
            gateway.send_signal(signal.SIGINT)
            gateway.wait(20)
        ratio = beans["acked_per_s"] / max(1, native["acked_per_s"])
        print(json.dumps({"gateway_over_own_client": round(ratio, 2)}), flush=True)
        return 1 if native["errors"] or beans["errors"] else 0
    return on_clusters(base, [cluster], body, scrape=False)


def _wait_for_port(port: int, proc: subprocess.Popen[bytes], timeout_s: float = 30) -> None:
    """Until the gateway accepts connections (or ``RuntimeError`` if it exits or is slow)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the gateway exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"the gateway did not listen on {port} within {timeout_s:g}s")


if __name__ == "__main__":
    sys.exit(main())
