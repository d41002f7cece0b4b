"""HTTP push delivery: tasks/s through ``blizzard dispatch`` next to the raw client's rate.

Run as ``scripts/bench --dispatch`` (or ``python -m bench.dispatch``). On one local cluster:

1. raw: ``--items`` items are enqueued, then one ``Client`` drains them with
   ``dequeue_many(--batch)`` + ``ack_many``: the rate a plain consumer moves items at;
2. dispatch: as many HTTP tasks (POST, 256 B body) are enqueued, then a real
   ``blizzard dispatch --workers W`` process sends them to a local aiohttp endpoint (in a
   thread of this process) that answers 200 at once; timed from its first request until
   the queue is empty (every task acked).

Prints one JSON line with both rates, their ratio, the dispatcher's CPU per task (with its
start-up) and how busy the machine was. Bounded: ``--timeout-s`` per phase.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import threading
import time
from typing import Any

from aiohttp import web

from bench.common import client_keys, on_clusters, parser, start
from bench.throughput import machine_cpu, proc_cpu_s
from blizzard.client.core import Client
from blizzard.client.http_delivery import HttpTask
from blizzard.local.harness import LocalCluster, Proc, free_port

log = logging.getLogger(__name__)


class Endpoint:
    """An aiohttp endpoint in a thread answering 200 at once, counting requests."""

    def __init__(self) -> None:
        self.port = free_port()
        self.count = 0
        self.first = self.last = 0.0  # monotonic
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        asyncio.run_coroutine_threadsafe(self._serve(), self.loop).result(10)

    async def _serve(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{key}", self._handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", self.port).start()

    async def _handle(self, request: web.Request) -> web.Response:
        await request.read()
        now = time.monotonic()
        self.first = self.first or now
        self.last = now
        self.count += 1
        return web.Response(text="ok")


def raw_rate(c: Client, items: int, batch: int, timeout_s: float) -> float:
    """Items/s of one client draining ``items`` with dequeue_many + ack_many."""
    for start_at in range(0, items, 1000):
        c.enqueue_many("raw", [os.urandom(256)] * min(1000, items - start_at))
    done, t0 = 0, time.monotonic()
    while done < items and time.monotonic() - t0 < timeout_s:
        msgs = c.dequeue_many("raw", batch, wait_s=0.5)
        c.ack_many(msgs)
        done += len(msgs)
    return done / (time.monotonic() - t0)


def dispatch_rate(cluster: LocalCluster, c: Client, items: int, workers: int,
                  timeout_s: float, log_path: str) -> dict[str, Any]:
    """Tasks/s of a ``blizzard dispatch`` process sending ``items`` tasks to a local endpoint."""
    endpoint = Endpoint()
    url = f"http://127.0.0.1:{endpoint.port}/task"
    payload = HttpTask.make(url, body=os.urandom(128).hex()).encode()
    for start_at in range(0, items, 1000):
        c.enqueue_many("tasks", [payload] * min(1000, items - start_at))
    proc = Proc("dispatch", [sys.executable, "-m", "blizzard.cli", "dispatch", "--master",
                             cluster.master_addr, "--queues", "tasks", "--workers", str(workers)],
                log_path, "").start()
    assert proc.popen is not None
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            stats = c.stats("tasks")
            if endpoint.count >= items and stats["ready"] + stats["leased"] == 0:
                break
            time.sleep(0.05)
        acked_at = time.monotonic()
        cpu_s = proc_cpu_s(proc.popen.pid)
    finally:
        proc.stop()
    elapsed = acked_at - endpoint.first
    return {"tasks": items, "requests": endpoint.count, "seconds": round(elapsed, 2),
            "dispatch_tasks_per_s": round(items / elapsed),
            "requests_per_s": round(endpoint.count / max(endpoint.last - endpoint.first, 1e-9)),
            "dispatcher_cpu_us_per_task": round(cpu_s * 1e6 / items) if cpu_s else None}


def main() -> int:
    ap = parser("bench.dispatch", __doc__)
    ap.add_argument("--dispatch", action="store_true", help="(how scripts/bench picks this)")
    ap.add_argument("--items", type=int, default=20_000, help="items per phase")
    ap.add_argument("--workers", type=int, default=16, help="the dispatcher's senders")
    ap.add_argument("--batch", type=int, default=100, help="the raw client's batch")
    ap.add_argument("--timeout-s", type=float, default=300.0, help="bound of each phase")
    args = ap.parse_args()
    base = start("dispatch")
    cluster = LocalCluster(os.path.join(base, "cluster"), datanodes=2, replication=2)

    def body() -> int:
        machine0 = machine_cpu()
        with Client(cluster.master_addr, timeout_s=30, keys=client_keys(cluster)) as c:
            log.info("raw client: %d items, batches of %d", args.items, args.batch)
            raw = raw_rate(c, args.items, args.batch, args.timeout_s)
            log.info("dispatch: %d tasks, %d workers", args.items, args.workers)
            line = dispatch_rate(cluster, c, args.items, args.workers, args.timeout_s,
                                 os.path.join(base, "dispatch.log"))
        machine1 = machine_cpu()
        if machine0 and machine1:
            line["machine_busy"] = round((machine1[0] - machine0[0]) /
                                         max(1, machine1[1] - machine0[1]), 2)
        line.update({"bench": "dispatch", "workers": args.workers, "replication": 2,
                     "raw_batch": args.batch, "raw_dequeue_ack_items_per_s": round(raw),
                     "dispatch_over_raw": round(line["dispatch_tasks_per_s"] / raw, 3)})
        print(json.dumps(line), flush=True)
        return 0 if line["requests"] >= args.items else 1
    return on_clusters(base, [cluster], body)


if __name__ == "__main__":
    sys.exit(main())
