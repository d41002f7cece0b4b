"""The front ends against Blizzard's own client, in one run: beanstalkd clients through
``blizzard beanstalkd`` and boto3 through ``blizzard sqs``.

Run as ``scripts/bench --frontends`` (or ``python -m bench.gateway``). On one local cluster
(insecure, R=2), P producer and C consumer processes move one job per call for ``--seconds``:
first with Blizzard's client (``enqueue``; ``dequeue`` + ``ack``), then with greenstalk
through a ``blizzard beanstalkd`` process (``put``; ``reserve`` + ``delete``), then with boto3
through a ``blizzard sqs`` process (``send_message``; ``receive_message`` + ``delete_message``).
Prints one JSON line per client and the ratios: the issue's goal is at least 0.8 each.
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
from bench.throughput import own_cpu_s, proc_cpu_s
from blizzard.local.harness import LocalCluster, free_port

MP = mp.get_context("spawn")


def worker(kind: str, role: str, where: Any, size: int, seconds: float, barrier: Any,
           out: Any) -> None:
    """One producer or consumer loop with ``kind``'s client, bounded by ``seconds``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    body, n, cpu0 = os.urandom(size), 0, 0.0
    try:
        if kind == "blizzard":
            from blizzard.client.core import Client
            with Client(where, timeout_s=30) as c:
                c.stats("g")
                barrier.wait(60)
                cpu0 = own_cpu_s()
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
        elif kind == "sqs-gateway":
            import boto3
            from botocore.config import Config
            sqs = boto3.client("sqs", endpoint_url=where, region_name="us-east-1",
                               aws_access_key_id="bench", aws_secret_access_key="bench-secret",
                               config=Config(retries={"max_attempts": 0}))
            url = sqs.create_queue(QueueName="g")["QueueUrl"]
            text = body.hex()[:size]
            barrier.wait(60)
            cpu0 = own_cpu_s()
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                if role == "p":
                    sqs.send_message(QueueUrl=url, MessageBody=text)
                else:
                    got = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1).get("Messages")
                    if not got:
                        continue
                    sqs.delete_message(QueueUrl=url, ReceiptHandle=got[0]["ReceiptHandle"])
                n += 1
        else:
            import greenstalk
            with greenstalk.Client(where, encoding=None, use="g", watch="g") as c:
                barrier.wait(60)
                cpu0 = own_cpu_s()
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
        out.put((role, n, None, own_cpu_s() - cpu0))
    except Exception as exc:  # reported to the parent
        out.put((role, n, repr(exc), own_cpu_s() - cpu0))


def run(kind: str, where: Any, producers: int, consumers: int, size: int,
        seconds: float, servers: dict[str, int]) -> dict[str, Any]:
    """One client's run; with CPU µs per acked item of the clients (from the start of their
    loops) and of ``servers`` (name -> pid: the cluster's and the gateway's, all threads,
    those that ended too)."""
    out, barrier = MP.Queue(), MP.Barrier(producers + consumers + 1)
    procs = [MP.Process(target=worker, args=(kind, r, where, size, seconds, barrier, out),
                        daemon=True) for r in ["p"] * producers + ["c"] * consumers]
    for proc in procs:
        proc.start()
    barrier.wait(120)
    before = {name: proc_cpu_s(pid, children=True) or 0.0 for name, pid in servers.items()}
    t0 = time.monotonic()
    counts, errors, cpu = {"p": 0, "c": 0}, [], {"p": 0.0, "c": 0.0}
    for _ in procs:
        role, n, err, used = out.get(timeout=seconds + 120)
        counts[role] += n
        cpu[role] += used
        if err:
            errors.append(err)
    elapsed = time.monotonic() - t0
    after = {name: proc_cpu_s(pid, children=True) or 0.0 for name, pid in servers.items()}
    for proc in procs:
        proc.join(10)
    acked = max(1, counts["c"])
    per_item = {"producers": cpu["p"], "consumers": cpu["c"],
                **{name: after[name] - before[name] for name in servers}}
    line = {"system": kind, "producers": producers, "consumers": consumers, "size": size,
            "enqueued_per_s": round(counts["p"] / elapsed),
            "acked_per_s": round(counts["c"] / elapsed),
            "cpu_us_per_acked": {name: round(used / acked * 1e6)
                                 for name, used in per_item.items()},
            "errors": errors[:3]}
    line["cpu_us_per_acked"]["total"] = sum(line["cpu_us_per_acked"].values())
    print(json.dumps(line), flush=True)
    return line


def main(argv: list[str] | None = None) -> int:
    ap = parser("scripts/bench --frontends", __doc__)
    ap.add_argument("--frontends", "--gateway", action="store_true", help=argparse.SUPPRESS)
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
        servers = {"master": cluster.master.popen.pid,
                   **{f"datanode{i}": node.popen.pid for i, node in enumerate(cluster.nodes)}}
        native = run("blizzard", cluster.master_addr, p_, c_, args.size, args.seconds, servers)
        lines = [native]
        for kind, command in (("beanstalkd-gateway", "beanstalkd"), ("sqs-gateway", "sqs")):
            port = free_port()
            env = dict(os.environ, BLIZZARD_MASTER=cluster.master_addr)
            env.pop("BLIZZARD_KEYS", None)
            gateway = subprocess.Popen([sys.executable, "-m", "blizzard.cli", command,
                                        "--listen", f"127.0.0.1:{port}", "--log-level",
                                        "warning"], env=env)
            where: Any = ("127.0.0.1", port) if command == "beanstalkd" \
                else f"http://127.0.0.1:{port}"
            try:
                _wait_for_port(port, gateway)
                lines.append(run(kind, where, p_, c_, args.size, args.seconds,
                                 {**servers, "gateway": gateway.pid}))
            finally:
                gateway.send_signal(signal.SIGINT)
                gateway.wait(20)
        print(json.dumps({f"{line['system']}_over_own_client":
                          round(line["acked_per_s"] / max(1, native["acked_per_s"]), 2)
                          for line in lines[1:]}), flush=True)
        return 1 if any(line["errors"] for line in lines) else 0
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
