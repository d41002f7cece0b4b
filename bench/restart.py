"""Benchmark the master's restart: time back to serving, and memory per queued item.

Run as ``python -m bench.restart`` (``scripts/bench-restart`` does that). For each
item count it writes a master data dir holding that many committed, ready items straight into
the WAL, shaped as a live master logs them (``Reserve`` every 100k ids, three ``NodeSeen``,
``CommitItems`` of 1000 items of 256 B each), then restarts a real master process on a fresh
copy of it ``--repeat`` times, in two variants:

- ``wal``: no checkpoint, every record is replayed (a master that crashed before checkpointing);
- ``checkpoint``: a checkpoint covers every item. The master writes it itself: it is started
  once on the WAL-only dir and stopped with SIGTERM, whose clean shutdown writes one.

One JSON line per (items, variant) on stdout, medians over the repeats; progress on stderr.
``restart_s`` runs from process start to the first ``Stats`` reply counting all items ready
(interpreter start-up and imports included: the ``empty`` line shows that fixed cost);
``recover_s`` is the master's own "recovered in" figure (checkpoint load + WAL replay).
``rss_mb`` is the master's VmRSS once it has left safe mode and settled; ``bytes_per_item`` is
that minus the empty master's, divided by the item count. ``stop_s`` is SIGTERM -> exit, which
includes writing the final checkpoint. Page cache is warm: the data dir was just written.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import random
import re
import shutil
import socket
import statistics
import sys
import time
import typing
from typing import Any

import zmq

from bench.common import int_list, parser, start
from blizzard.local.harness import LOOPBACK, Proc, free_port
from blizzard.net.transport import Endpoint, call
from blizzard.wire import protocol as p
from master.log import checkpoint_file
from master.log.wal import Wal
from master.state.records import CommitItems, NodeSeen, Reserve

log = logging.getLogger(__name__)

QUEUE = "bench"
ITEM_BYTES = 256
PER_RECORD = 1000  # items per CommitItems record
RECORDS_PER_FLUSH = 100
ID_BLOCK = 100_000  # as MasterConfig.id_block
NODES = [(f"bench-node-{i}", f"tcp://{LOOPBACK}:{7001 + i}") for i in range(3)]
# A short safe mode lets the settled RSS include what the master builds when it leaves safe
# mode (the repair rescan), without waiting the default 5 s on every run.
MASTER_ARGS = ["--replication", "1", "--heartbeat-s", "0.2", "--dead-after-s", "1.0"]
RECOVERED = re.compile(r"recovered in ([0-9.]+)s")


def commit_items(count: int, **values: Any) -> CommitItems:
    """A ``CommitItems`` of ``count`` items from ``values`` (those the record has).

    Fields not given get their neutral value (0, "", False, or one per item for a list), so
    the benchmark keeps working as the record grows (delays, keys, ...).
    """
    hints = typing.get_type_hints(CommitItems)
    fields = {}
    for f in dataclasses.fields(CommitItems):
        tp = hints[f.name]
        if f.name in values:
            fields[f.name] = values[f.name]
        elif typing.get_origin(tp) is list:
            fields[f.name] = [typing.get_args(tp)[0]()] * count
        else:
            fields[f.name] = tp()
    return CommitItems(**fields)


def build_wal(data_dir: str, n: int) -> None:
    """Write a WAL holding ``n`` committed items in queue ``bench``, as a live master would."""
    wal = Wal(os.path.join(data_dir, "wal"))
    for _ in wal.replay():  # opens the first segment for appending
        pass
    rnd = random.Random(n)
    client = f"{rnd.getrandbits(64):016x}"
    for node_id, addr in NODES:
        wal.append(p.pack(NodeSeen(node_id, addr)))
    id_hi, at = 1, time.time() - 3600.0
    for k, first in enumerate(range(1, n + 1, PER_RECORD)):
        count = min(PER_RECORD, n + 1 - first)
        if first + count > id_hi:
            id_hi = first + count + ID_BLOCK
            wal.append(p.pack(Reserve(id_hi=id_hi)))
        wal.append(p.pack(commit_items(
            count, queue=QUEUE, ids=list(range(first, first + count)), sizes=[ITEM_BYTES] * count,
            crcs=[rnd.getrandbits(32) for _ in range(count)], priorities=[0] * count,
            nodes=[NODES[k % len(NODES)][0]], at=at + k * 0.01, request=f"{client}-{k}")))
        if k % RECORDS_PER_FLUSH == RECORDS_PER_FLUSH - 1:
            wal.flush()
    wal.close()


def disk_mb(data_dir: str) -> float:
    total = 0
    for root, _, files in os.walk(data_dir):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    return round(total / 1e6, 2)


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of a process, in bytes."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) * 1024
    return out


class Restarts:
    """Starts masters on copies of data dirs and measures them; kills all of them at the end."""

    def __init__(self, base: str, timeout_s: float, settle_s: float) -> None:
        self.base = base
        self.timeout_s = timeout_s
        self.settle_s = settle_s
        self.ctx = zmq.Context.instance()
        self.procs: list[Proc] = []
        self.runs = 0

    def start(self, data_dir: str) -> tuple[Proc, int, float]:
        self.runs += 1
        port = free_port()
        addr = f"tcp://{LOOPBACK}:{port}"
        argv = [sys.executable, "-m", "master", "--data-dir", data_dir, "--bind", addr,
                "--insecure", *MASTER_ARGS]  # only the restart is measured here
        proc = Proc("master", argv, os.path.join(self.base, f"master-{self.runs}.log"), addr)
        started = time.monotonic()
        self.procs.append(proc.start())
        return proc, port, started

    def wait_serving(self, proc: Proc, port: int, n: int, started: float) -> float:
        """Seconds from ``started`` until the master reports ``n`` ready items."""
        deadline = started + self.timeout_s

        def check() -> None:
            assert proc.popen is not None
            if proc.popen.poll() is not None:
                raise RuntimeError(f"master exited with {proc.popen.returncode}:\n{proc.tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"master not serving after {self.timeout_s}s:\n{proc.tail()}")

        # The master binds its socket only after recovery; a refused TCP connect is cheap and
        # fine-grained, where a ZeroMQ socket would back off its reconnects up to a second.
        while True:
            check()
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                if s.connect_ex((LOOPBACK, port)) == 0:
                    break
            time.sleep(0.002)
        ep = Endpoint(self.ctx, proc.addr)
        try:
            while True:
                check()
                try:
                    stats: p.QueueStats = call(ep, p.Stats(QUEUE), 5.0)
                    if stats.ready == n:
                        return time.monotonic() - started
                    log.warning("master answers with %d ready items, %d expected", stats.ready, n)
                except TimeoutError:
                    pass
                time.sleep(0.005)
        finally:
            ep.close()

    def stop(self, proc: Proc) -> float:
        """SIGTERM (clean shutdown: final checkpoint) and wait; seconds until it exited."""
        started = time.monotonic()
        proc.stop(timeout_s=self.timeout_s)
        assert proc.popen is not None
        if proc.popen.returncode != 0:
            raise RuntimeError(f"master exited with {proc.popen.returncode} on SIGTERM:\n"
                               f"{proc.tail()}")
        return time.monotonic() - started

    def measure(self, template: str | None, n: int) -> dict[str, float]:
        """One restart on a fresh copy of ``template`` (None: an empty data dir)."""
        data_dir = os.path.join(self.base, "run")
        shutil.rmtree(data_dir, ignore_errors=True)
        if template is not None:
            shutil.copytree(template, data_dir)
        proc, port, started = self.start(data_dir)
        try:
            restart_s = self.wait_serving(proc, port, n, started)
            assert proc.popen is not None
            serving = proc_status(proc.popen.pid)
            time.sleep(self.settle_s)
            settled = proc_status(proc.popen.pid)
            stop_s = self.stop(proc)
        finally:
            proc.kill()
        found = RECOVERED.search(proc.tail(20000))
        shutil.rmtree(data_dir, ignore_errors=True)
        return {"restart_s": restart_s,
                "recover_s": float(found.group(1)) if found else float("nan"),
                "rss": settled["VmRSS"], "rss_serving": serving["VmRSS"],
                "peak_rss": settled["VmHWM"], "stop_s": stop_s}

    def checkpointed(self, wal_template: str, n: int) -> str:
        """A copy of ``wal_template`` with a checkpoint the master wrote on its clean shutdown."""
        data_dir = os.path.join(self.base, f"ckpt-{n}")
        shutil.copytree(wal_template, data_dir)
        proc, port, started = self.start(data_dir)
        try:
            self.wait_serving(proc, port, n, started)
            self.stop(proc)
        finally:
            proc.kill()
        if not checkpoint_file.list_checkpoints(os.path.join(data_dir, "wal")):
            raise RuntimeError(f"no checkpoint after a clean shutdown:\n{proc.tail()}")
        return data_dir

    def kill_all(self) -> None:
        for proc in self.procs:
            proc.kill()


def report(runs: list[dict[str, float]], n: int, variant: str, base_rss: float | None,
           disk: float) -> dict[str, Any]:
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    rec = {"system": "blizzard", "op": "master_restart", "items": n, "variant": variant,
           "restart_s": round(med["restart_s"], 3), "recover_s": round(med["recover_s"], 3),
           "rss_mb": round(med["rss"] / 1e6, 1),
           "bytes_per_item": round((med["rss"] - base_rss) / n, 1) if n and base_rss else None,
           "rss_serving_mb": round(med["rss_serving"] / 1e6, 1),
           "peak_rss_mb": round(med["peak_rss"] / 1e6, 1), "stop_s": round(med["stop_s"], 3),
           "disk_mb": disk, "repeat": len(runs),
           "restart_runs_s": [round(r["restart_s"], 3) for r in runs]}
    print(json.dumps(rec), flush=True)
    return rec


def restarts(bench: Restarts, data_dir: str, n: int, variant: str, repeat: int) -> list[dict]:
    """``repeat`` restarts of a master on copies of ``data_dir``, logged as they finish."""
    runs = []
    for i in range(repeat):
        runs.append(bench.measure(data_dir, n))
        log.info("%d items, %s: restart %d/%d took %.3fs", n, variant, i + 1, repeat,
                 runs[-1]["restart_s"])
    return runs


def run(args: argparse.Namespace, bench: Restarts) -> None:
    log.info("empty master: %d restarts", args.repeat)
    runs = [bench.measure(None, 0) for _ in range(args.repeat)]
    report(runs, 0, "empty", None, 0.0)
    base_rss = statistics.median(r["rss"] for r in runs)
    for n in args.items:
        wal_dir = os.path.join(bench.base, f"wal-{n}")
        started = time.monotonic()
        build_wal(wal_dir, n)
        log.info("%d items: WAL written in %.1fs (%.1f MB)", n, time.monotonic() - started,
                 disk_mb(wal_dir))
        report(restarts(bench, wal_dir, n, "wal", args.repeat), n, "wal", base_rss,
               disk_mb(wal_dir))
        ckpt_dir = bench.checkpointed(wal_dir, n)
        shutil.rmtree(wal_dir)
        log.info("%d items: checkpoint written by the master (%.1f MB)", n, disk_mb(ckpt_dir))
        report(restarts(bench, ckpt_dir, n, "checkpoint", args.repeat), n, "checkpoint",
               base_rss, disk_mb(ckpt_dir))
        shutil.rmtree(ckpt_dir)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = parser("scripts/bench-restart", __doc__)
    ap.add_argument("--items", type=int_list, default=[100_000, 1_000_000],
                    help="queued item counts, e.g. 100000,1000000")
    ap.add_argument("--repeat", type=int, default=None,
                    help="restarts per measurement, median reported (default 3, 1 with --quick)")
    ap.add_argument("--settle-s", type=float, default=1.5,
                    help="wait after serving before reading the settled RSS (past safe mode)")
    ap.add_argument("--timeout-s", type=float, default=300.0,
                    help="give up on a master not serving (or not stopping) within this")
    ap.add_argument("--quick", action="store_true", help="smoke run: 10000 items, one restart")
    args = ap.parse_args(argv)
    if args.quick:
        args.items = [10_000]
    if args.repeat is None:
        args.repeat = 1 if args.quick else 3
    if not args.items or min(args.items) < 1 or args.repeat < 1 or args.settle_s < 0:
        ap.error("--items must be >= 1, --repeat >= 1, --settle-s >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    base = start("bench-restart")
    bench = Restarts(base, args.timeout_s, args.settle_s)
    rc = 0
    try:
        run(args, bench)
    except KeyboardInterrupt:
        log.info("interrupted; stopping")
        rc = 130
    except Exception:
        log.exception("benchmark failed")
        rc = 1
    finally:
        bench.kill_all()
        shutil.rmtree(base, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
