"""Liveness under one data-node fault: how long producers and consumers stall, and a slow disk.

Run as ``scripts/bench --faults`` (or ``python -m bench.faults``). Two experiments, each on
clusters of its own (1 master, ``--datanodes`` 5 data nodes, R=``--replication`` 3, the
master's default W unless ``--min-replicas``, heartbeat 0.2 s, dead after 1.5 s, insecure):

The timeline. A backlog of ``--backlog`` ready items, then one producer thread
(``client.enqueue(q, body)``) and one consumer thread (``client.dequeue(q, wait_s=0.5)`` then
``msg.ack()``), each with a ``Client`` of its own, one item per call, for ``--seconds``. At
``--pause-at`` one data node gets SIGSTOP for ``--pause-s`` (then SIGCONT); at ``--kill-at``
another gets ``kill -9``. Each acked enqueue and each acked dequeue (once its ack returned) is
timed. Printed: acked enqueues and dequeues per half second (a table on stderr), and for each
window (fault-free: before the pause; pause: from it to 1 s after SIGCONT; kill: from it to the
end) the longest stretch without an acked enqueue and without an acked dequeue, and the
p50/p99/max of one enqueue and of one dequeue + ack that completed in that window, and the
fewest items ready in it (near 0: the backlog ran out and the consumer waited on the producer).

The slow disk. The same layout twice: fault-free, then with one data node whose every synced
write sleeps ``--slow-delay-s`` first (``BLIZZARD_FAULT_WRITE_DELAY_S``, a test and bench knob
of ``datanode/store.py``). One producer thread enqueues ``--slow-enqueues`` items one per call,
or for ``--slow-max-s``, whichever ends first; printed: the p99 of one enqueue with the slow node
over the fault-free p99 (the goal: at most 2, docs/benchmarks.md).

One JSON line with all of it on stdout; progress on stderr. Exit 1 if a call raised something
other than a Blizzard error or a thread did not stop.
"""

from __future__ import annotations

import argparse
import bisect
import json
import logging
import math
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.common import client_keys, on_clusters, parser, start
from blizzard.client.core import Client
from blizzard.local.harness import AUTO_KEYS, LocalCluster
from blizzard.wire.errors import BlizzardError
from datanode.store import FAULT_WRITE_DELAY_ENV

log = logging.getLogger(__name__)

QUEUE = "faults"
BIN_S = 0.5
CLIENT_TIMEOUT_S = 10.0  # one call's bound, so the threads stop soon after the end
JOIN_S = CLIENT_TIMEOUT_S + 5.0
WARMUP_ENQUEUES = 20  # before a slow-disk measurement: connections made, first placements done
PAUSED, KILLED = 0, 1  # which data node each fault hits


# -- what is computed from the recorded times (pure) --

def longest_gap(times: Sequence[float], start: float, end: float) -> tuple[float, float]:
    """The longest stretch of ``[start, end]`` holding none of ``times`` (ascending), and
    where it begins: the window's edges count as its bounds, so no event at all gives
    ``(end - start, start)``."""
    last, worst, at = start, 0.0, start
    for t in times[bisect.bisect_left(times, start):bisect.bisect_right(times, end)]:
        if t - last > worst:
            worst, at = t - last, last
        last = t
    if end - last > worst:
        worst, at = end - last, last
    return worst, at


def bins(times: Sequence[float], seconds: float, width: float = BIN_S) -> list[int]:
    """How many of ``times`` fall in each ``width``-long bin of ``[0, seconds)``."""
    out = [0] * math.ceil(seconds / width - 1e-9)
    for t in times:
        k = int(t // width)
        if 0 <= k < len(out):
            out[k] += 1
    return out


def fewest_ready(enq_ends: Sequence[float], deq_ends: Sequence[float], backlog: int,
                 start: float, end: float) -> int:
    """The fewest items ready during ``[start, end]``, counted as the backlog plus the acked
    enqueues minus the acked dequeues (both ascending) so far, not below 0 (an item can be
    dequeued before its enqueue returns). Near 0, the consumer waited on the producer: its
    stall there says nothing of reads."""
    ready = backlog + bisect.bisect_right(enq_ends, start) - bisect.bisect_right(deq_ends, start)
    fewest = ready
    changes = sorted([(t, 1) for t in enq_ends if start < t <= end]
                     + [(t, -1) for t in deq_ends if start < t <= end])
    for _, change in changes:
        ready += change
        fewest = min(fewest, ready)
    return max(0, fewest)


@dataclass(frozen=True)
class Window:
    """A stretch of the timeline, in seconds from the start of the load."""

    name: str
    start_s: float
    end_s: float


def windows_for(seconds: float, pause_at: float, pause_s: float, kill_at: float) -> list[Window]:
    """The fault-free window (before the pause), the pause's (to 1 s after SIGCONT, not past
    the kill) and the kill's (to the end)."""
    return [Window("fault_free", 0.0, pause_at),
            Window("pause", pause_at, min(pause_at + pause_s + 1.0, kill_at)),
            Window("kill", kill_at, seconds)]


@dataclass
class Calls:
    """One thread's calls that succeeded, as (start, done) seconds from the start of the load,
    and those that raised (done time, what)."""

    done: list[tuple[float, float]] = field(default_factory=list)
    errors: list[tuple[float, str]] = field(default_factory=list)
    fatal: str | None = None  # what stopped the thread early, other than a Blizzard error

    def ends(self) -> list[float]:
        return sorted(end for _, end in self.done)


def percentile(ordered: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile of ascending ``ordered`` (None if empty), by bench.throughput's rule."""
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else None


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


def latencies(calls: Sequence[tuple[float, float]], window: Window) -> dict[str, float | None]:
    """p50, p99 and max (ms) of the calls that completed within ``window`` (one stalled call
    among hundreds shows in the max, not in the p99)."""
    lats = sorted(end - begin for begin, end in calls if window.start_s <= end <= window.end_s)
    return {"p50_ms": _ms(percentile(lats, 0.5)), "p99_ms": _ms(percentile(lats, 0.99)),
            "max_ms": _ms(lats[-1] if lats else None)}


def window_figures(window: Window, enq: Calls, deq: Calls, backlog: int) -> dict[str, Any]:
    """A window's figures: counts, longest stretches without an acked enqueue or dequeue, the
    latencies of the calls that completed in it, and the fewest items ready in it."""
    out: dict[str, Any] = {"from_s": window.start_s, "to_s": window.end_s,
                           "ready_min": fewest_ready(enq.ends(), deq.ends(), backlog,
                                                     window.start_s, window.end_s)}
    for name, calls in (("enqueue", enq), ("dequeue", deq)):
        ends = calls.ends()
        gap, at = longest_gap(ends, window.start_s, window.end_s)
        inside = bisect.bisect_right(ends, window.end_s) - bisect.bisect_left(ends, window.start_s)
        lat = latencies(calls.done, window)
        label = "enqueue" if name == "enqueue" else "dequeue_ack"
        out.update({f"{name}s": inside, f"no_{name}_s": round(gap, 2),
                    f"no_{name}_from_s": round(at, 2),
                    **{f"{label}_{q}": v for q, v in lat.items()},
                    f"{name}_errors": sum(1 for t, _ in calls.errors
                                          if window.start_s <= t <= window.end_s)})
    return out


def bin_table(enq_bins: Sequence[int], deq_bins: Sequence[int], marks: dict[int, str],
              per_line: int = 10) -> str:
    """Acked enqueues and dequeues per bin, ``per_line`` bins a line; ``marks`` puts a letter
    after the count of a bin where a fault began (bin index -> letter)."""
    def row(counts: Sequence[int], lo: int) -> str:
        return "".join(f"{counts[k]:>5}{marks.get(k, ' ')}" for k in range(lo, min(lo + per_line,
                                                                                  len(counts))))
    width = 6 * per_line
    lines = [f"{'t (s)':>7} | {'acked enqueues per 0.5 s':<{width}} | acked dequeues per 0.5 s"]
    for lo in range(0, len(enq_bins), per_line):
        lines.append(f"{lo * BIN_S:>7.1f} | {row(enq_bins, lo):<{width}} | {row(deq_bins, lo)}")
    return "\n".join(lines)


# -- the experiments (processes, threads, clocks) --

def new_cluster(base: str, args: argparse.Namespace,
                node_env: dict[int, dict[str, str]] | None = None) -> LocalCluster:
    return LocalCluster(base, datanodes=args.datanodes, replication=args.replication,
                        min_replicas=args.min_replicas, heartbeat_s=args.heartbeat_s,
                        dead_after_s=args.dead_after_s,
                        keys=AUTO_KEYS if args.security == "on" else None,
                        node_env=node_env or {})


def new_client(cluster: LocalCluster) -> Client:
    return Client(cluster.master_addr, timeout_s=CLIENT_TIMEOUT_S, keys=client_keys(cluster))


def produce(client: Client, body: bytes, t0: float, end: float, stop: threading.Event,
            calls: Calls) -> None:
    """Enqueue one item per call until ``end`` (monotonic) or ``stop``."""
    try:
        while not stop.is_set() and time.monotonic() < end:
            begin = time.monotonic()
            try:
                client.enqueue(QUEUE, body)
            except BlizzardError as exc:
                calls.errors.append((time.monotonic() - t0, repr(exc)))
                stop.wait(0.05)  # a refusal can come at once: no busy loop
                continue
            calls.done.append((begin - t0, time.monotonic() - t0))
    except Exception as exc:  # reported by the main thread
        calls.fatal = repr(exc)


def consume(client: Client, t0: float, end: float, stop: threading.Event, calls: Calls) -> None:
    """Dequeue and ack one item per call until ``end`` (monotonic) or ``stop``."""
    try:
        while not stop.is_set() and time.monotonic() < end:
            begin = time.monotonic()
            try:
                msg = client.dequeue(QUEUE, wait_s=0.5)
                if msg is None:
                    continue
                msg.ack()
            except BlizzardError as exc:
                calls.errors.append((time.monotonic() - t0, repr(exc)))
                stop.wait(0.05)
                continue
            calls.done.append((begin - t0, time.monotonic() - t0))
    except Exception as exc:
        calls.fatal = repr(exc)


def sleep_until(deadline: float) -> None:
    """Sleep to a point of the fault schedule (a time to act at, not a condition to wait for)."""
    time.sleep(max(0.0, deadline - time.monotonic()))


def timeline(cluster: LocalCluster, args: argparse.Namespace) -> dict[str, Any]:
    """The backlog, then the producer and the consumer through a pause and a kill."""
    body = os.urandom(args.size)
    with new_client(cluster) as client:
        for _ in range(math.ceil(args.backlog / 500)):
            left = args.backlog - client.stats(QUEUE)["ready"]
            if left > 0:
                client.enqueue_many(QUEUE, [body] * min(500, left))
        log.info("backlog: %d ready", client.stats(QUEUE)["ready"])
    paused, killed = cluster.nodes[PAUSED], cluster.nodes[KILLED]
    enq, deq, stop = Calls(), Calls(), threading.Event()
    producer_client, consumer_client = new_client(cluster), new_client(cluster)
    t0 = time.monotonic()
    end = t0 + args.seconds
    threads = [threading.Thread(target=produce, name="producer", daemon=True,
                                args=(producer_client, body, t0, end, stop, enq)),
               threading.Thread(target=consume, name="consumer", daemon=True,
                                args=(consumer_client, t0, end, stop, deq))]
    for thread in threads:
        thread.start()
    try:
        sleep_until(t0 + args.pause_at)
        paused.signal(signal.SIGSTOP)
        log.info("t=%.1f s: SIGSTOP %s", time.monotonic() - t0, paused.name)
        sleep_until(t0 + args.pause_at + args.pause_s)
        paused.signal(signal.SIGCONT)
        log.info("t=%.1f s: SIGCONT %s", time.monotonic() - t0, paused.name)
        sleep_until(t0 + args.kill_at)
        killed.kill()
        log.info("t=%.1f s: kill -9 %s", time.monotonic() - t0, killed.name)
        sleep_until(end)
    finally:
        stop.set()
        paused.signal(signal.SIGCONT)  # whatever happened, nothing stays stopped
        for thread in threads:
            thread.join(JOIN_S)
    stuck = [thread.name for thread in threads if thread.is_alive()]
    for c in (producer_client, consumer_client):
        if not stuck:  # a client is closed in no thread but the one that used it last
            c.close()
    windows = windows_for(args.seconds, args.pause_at, args.pause_s, args.kill_at)
    figures = {w.name: window_figures(w, enq, deq, args.backlog) for w in windows}
    enq_bins, deq_bins = bins(enq.ends(), args.seconds), bins(deq.ends(), args.seconds)
    marks = {int(args.pause_at // BIN_S): "P", int(args.kill_at // BIN_S): "K"}
    log.info("P: %s paused at %.1f s for %.1f s; K: %s killed at %.1f s\n%s", paused.name,
             args.pause_at, args.pause_s, killed.name, args.kill_at,
             bin_table(enq_bins, deq_bins, marks))
    for w in windows:
        f = figures[w.name]
        log.info("%-10s [%4.1f, %4.1f] s: no acked enqueue for %.2f s (from %.2f), no acked "
                 "dequeue for %.2f s (from %.2f); enqueue p99 %s ms, dequeue+ack p99 %s ms; "
                 "fewest ready %d", w.name, w.start_s, w.end_s, f["no_enqueue_s"],
                 f["no_enqueue_from_s"], f["no_dequeue_s"], f["no_dequeue_from_s"],
                 f["enqueue_p99_ms"], f["dequeue_ack_p99_ms"], f["ready_min"])
        if f["ready_min"] < 10:
            log.warning("%s: the backlog ran out: the consumer also waited on the producer "
                        "(a larger --backlog keeps the two apart)", w.name)
    faulty = [figures[name] for name in ("pause", "kill")]
    return {
        "pause": {"node": paused.name, "at_s": args.pause_at, "for_s": args.pause_s},
        "kill": {"node": killed.name, "at_s": args.kill_at},
        "bin_s": BIN_S, "enqueue_bins": enq_bins, "dequeue_bins": deq_bins,
        "windows": figures,
        "worst_no_enqueue_s": max(f["no_enqueue_s"] for f in faulty),
        "worst_no_dequeue_s": max(f["no_dequeue_s"] for f in faulty),
        "enqueued": len(enq.done), "acked": len(deq.done),
        "errors": [e for _, e in (enq.errors + deq.errors)[:3]],
        "n_errors": len(enq.errors) + len(deq.errors),
        "fatal": [c.fatal for c in (enq, deq) if c.fatal] + [f"{n} did not stop" for n in stuck],
    }


def enqueue_latencies(cluster: LocalCluster, args: argparse.Namespace) -> dict[str, Any]:
    """One producer, one item per call: ``--slow-enqueues`` of them or ``--slow-max-s``."""
    body = os.urandom(args.size)
    lats: list[float] = []
    errors: list[str] = []
    with new_client(cluster) as client:
        for _ in range(WARMUP_ENQUEUES):
            client.enqueue(QUEUE, body)
        end = time.monotonic() + args.slow_max_s
        while len(lats) < args.slow_enqueues and time.monotonic() < end:
            begin = time.monotonic()
            try:
                client.enqueue(QUEUE, body)
            except BlizzardError as exc:
                errors.append(repr(exc))
                continue
            lats.append(time.monotonic() - begin)
    lats.sort()
    return {"n": len(lats), "capped": len(lats) < args.slow_enqueues,
            "p50_ms": _ms(percentile(lats, 0.5)), "p99_ms": _ms(percentile(lats, 0.99)),
            "max_ms": _ms(lats[-1] if lats else None), "errors": errors[:3]}


def run_on(base: str, cluster: LocalCluster, measure: Callable[[LocalCluster], dict[str, Any]],
           ) -> dict[str, Any] | None:
    """``measure`` on ``cluster``, started and stopped around it; None if it failed."""
    out: dict[str, Any] = {}

    def body() -> int:
        out.update(measure(cluster))
        return 0
    return out if on_clusters(base, [cluster], body, scrape=False) == 0 else None


def slow_disk(base: str, args: argparse.Namespace) -> dict[str, Any] | None:
    """The enqueue latencies fault-free and with one node's writes slowed, on two clusters."""
    delay = {PAUSED: {FAULT_WRITE_DELAY_ENV: str(args.slow_delay_s)}}
    measure = lambda c: enqueue_latencies(c, args)  # noqa: E731
    fault_free = run_on(os.path.join(base, "fault-free"), new_cluster(
        os.path.join(base, "fault-free"), args), measure)
    if fault_free is None:
        return None
    slow = run_on(os.path.join(base, "slow"), new_cluster(
        os.path.join(base, "slow"), args, delay), measure)
    if slow is None:
        return None
    ratio = (round(slow["p99_ms"] / fault_free["p99_ms"], 2)
             if slow["p99_ms"] and fault_free["p99_ms"] else None)
    log.info("slow disk (datanode%d, %.3f s a write): enqueue p99 %s ms vs %s ms fault-free "
             "(%sx; p50 %s vs %s ms, %d and %d enqueues)", PAUSED, args.slow_delay_s,
             slow["p99_ms"], fault_free["p99_ms"], ratio, slow["p50_ms"], fault_free["p50_ms"],
             slow["n"], fault_free["n"])
    return {"node": f"datanode{PAUSED}", "write_delay_s": args.slow_delay_s,
            "fault_free": fault_free, "slow": slow, "p99_ratio": ratio}


def main(argv: list[str] | None = None) -> int:
    ap = parser("scripts/bench --faults", __doc__)
    ap.add_argument("--faults", action="store_true", help=argparse.SUPPRESS)  # scripts/bench's
    ap.add_argument("--seconds", type=float, default=25.0, help="how long the timeline's load runs")
    ap.add_argument("--pause-at", type=float, default=5.0, help="when a data node gets SIGSTOP")
    ap.add_argument("--pause-s", type=float, default=5.0, help="how long it stays stopped")
    ap.add_argument("--kill-at", type=float, default=15.0, help="when another gets kill -9")
    ap.add_argument("--backlog", type=int, default=3000, help="items ready before the load")
    ap.add_argument("--size", type=int, default=256, help="payload bytes")
    ap.add_argument("--datanodes", type=int, default=5, help="data nodes to start")
    ap.add_argument("--replication", type=int, default=3, help="replicas per item (R)")
    ap.add_argument("--min-replicas", type=int, default=None,
                    help="replicas fsynced before an enqueue is acknowledged (W); default: the "
                         "master's (R)")
    ap.add_argument("--heartbeat-s", type=float, default=0.2, help="data nodes' heartbeat")
    ap.add_argument("--dead-after-s", type=float, default=1.5,
                    help="silence after which the master counts a data node dead")
    ap.add_argument("--security", choices=["on", "off"], default="off",
                    help="CURVE keys on every socket (on) or --insecure (off, the default)")
    ap.add_argument("--slow-delay-s", type=float, default=0.2,
                    help="the slow node's sleep before each synced write")
    ap.add_argument("--slow-enqueues", type=int, default=2000,
                    help="enqueues measured on each slow-disk cluster")
    ap.add_argument("--slow-max-s", type=float, default=10.0,
                    help="at most this long on each slow-disk cluster")
    ap.add_argument("--only", choices=["timeline", "slow-disk"], default=None,
                    help="run one experiment (default: the timeline, then the slow disk)")
    args = ap.parse_args(argv)
    if not 0 < args.pause_at < args.pause_at + args.pause_s < args.kill_at < args.seconds <= 600:
        ap.error("need 0 < --pause-at < --pause-at + --pause-s < --kill-at < --seconds <= 600")
    if not 2 <= args.datanodes or not 1 <= args.replication <= args.datanodes:
        ap.error("need at least 2 data nodes (one paused, one killed) and 1 <= R <= --datanodes")
    if args.min_replicas is not None and not 1 <= args.min_replicas <= args.replication:
        ap.error("--min-replicas must be between 1 and --replication")
    if args.backlog < 0 or args.size < 1 or args.slow_enqueues < 1 \
            or not 0 < args.slow_max_s <= 600 or not 0 < args.slow_delay_s <= 10:
        ap.error("--backlog >= 0, --size >= 1, --slow-enqueues >= 1, --slow-max-s in (0, 600], "
                 "--slow-delay-s in (0, 10]")
    base = start("faults")
    line: dict[str, Any] = {
        "system": "blizzard", "op": "faults", "datanodes": args.datanodes,
        "replication": args.replication,
        "min_replicas": args.min_replicas,  # None: the master's default (R when written)
        "heartbeat_s": args.heartbeat_s, "dead_after_s": args.dead_after_s,
        "security": args.security, "size": args.size, "backlog": args.backlog,
        "seconds": args.seconds}
    rc = 0
    if args.only in (None, "timeline"):
        where = os.path.join(base, "timeline")
        got = run_on(where, new_cluster(where, args), lambda c: timeline(c, args))
        if got is None or got["fatal"]:
            rc = 1
        line["timeline"] = got
    if args.only in (None, "slow-disk") and rc == 0:
        line["slow_disk"] = got = slow_disk(os.path.join(base, "slow-disk"), args)
        if got is None:
            rc = 1
    print(json.dumps(line), flush=True)
    if rc == 0:
        shutil.rmtree(base, ignore_errors=True)
    else:
        log.info("scratch dir (logs of a failed run) kept in %s", base)
    return rc


if __name__ == "__main__":
    sys.exit(main())
