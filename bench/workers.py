"""Many workers, one item per call: P producer and C consumer processes on a local cluster.

Run as ``scripts/bench --workers P,C`` (or ``python -m bench.workers``). Each producer calls
``Client.enqueue(queue, body)`` in a loop, each consumer ``Client.dequeue(queue, wait_s=0.5)``
then ``msg.ack()``, one ``Client`` per process, for ``--seconds``. This is the workload of
``peerbench/workers.py``, so the two lines can be read side by side.

Prints one JSON line: enqueued and acked items/s, the p50/p99 of one ``enqueue`` and of one
``dequeue`` + ``ack`` under that load, and per acked item, for the master, each data node and
all clients together: the CPU microseconds, the voluntary wake-ups (context switches of all
the process's threads, ZeroMQ's I/O threads included, from ``/proc``) and, with
``--metrics on``, the ZeroMQ messages received (every message is received once, so their sum
is the messages an item costs). Also how many of the consumers' reads were hedged.

Estimates of what a change of design could win, by leaving work out (the line is tagged
``bound``; docs/benchmarks.md says what each leaves out and what it keeps). ``--no-read``:
consumers lease and ack without reading the payload (with ``--ride``, a lease answered with
its payload). ``--ride``: consumers ack
each item with their next lease instead of on its own. ``--no-sync``: the servers skip their
own fsyncs and synced LevelDB writes (``bench/no_sync_site``; what any change in where or
when they sync could save, such as the master logging an enqueue while the nodes store it);
``unsynced_servers`` counts the servers whose logs say so. ``--sync-hold-ms`` sets the
servers' hold (without syncs it still gathers put reports, and adds latency).
``--replication 1``: a producer sends one copy. None of these is a way to run Blizzard.

``--peers NAMES`` then runs the same load on the queues a user would pick instead
(``bench/peers.py``: each peer's line says what its acknowledgement promises) and prints the
ratios of Blizzard's acked items/s to theirs. ``--replication 3 --datanodes 3
--min-replicas 2`` is Blizzard at three copies, acknowledged at two.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing as mp
import os
import signal
import sys
import time
from typing import Any, NamedTuple

from bench import peers
from bench.common import (
    NO_SYNC_NOTICE,
    client_keys,
    clusters_for,
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
from bench.peers import PEERS
from bench.throughput import machine_cpu, own_cpu_s, percentile, proc_cpu_s
from blizzard.client.core import Client
from blizzard.local.harness import LocalCluster
from blizzard.net.transport import FRAMES

log = logging.getLogger(__name__)

MP = mp.get_context("spawn")
QUEUE = "w"


def worker(role: str, master: str, keys: str, size: int, seconds: float, barrier: Any, out: Any,
           read: bool = True, ride: bool = False) -> None:
    """One producer (``role`` "p") or consumer ("c") loop, bounded by ``seconds``. A consumer
    that does not ``read`` leases and acks without fetching the payload (``--no-read``); one
    that ``ride``s acks each item with its next lease (``--ride``) instead of on its own."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        body = os.urandom(size)
        with Client(master, timeout_s=30.0, keys=keys) as client:
            client.stats(QUEUE)  # connected before the clock starts
            barrier.wait(60)
            cpu0, wakes0, frames0 = own_cpu_s(), wakeups(os.getpid()), FRAMES["received"]
            end = time.monotonic() + seconds
            n, lats = 0, []
            done: list[Any] = []  # (ride) the last item, acked with the next lease
            while time.monotonic() < end:
                t0 = time.perf_counter_ns()
                if role == "p":
                    client.enqueue(QUEUE, body)
                else:  # (acks that rode on a lease are settled, items or none)
                    got = consume_one(client, read, done)
                    done = got if ride else []
                    if not got:
                        continue
                    if not ride:
                        client.leases.ack_unawaited(got)  # what ``Message.ack()`` sends
                lats.append(time.perf_counter_ns() - t0)
                n += 1
            if done:
                client.leases.ack_unawaited(done)
            client.close()  # anything the client still holds is settled before the count
            counts = (client.datanodes.gets, client.datanodes.hedges,
                      (wakeups(os.getpid()) or 0) - (wakes0 or 0), FRAMES["received"] - frames0)
            out.put((role, n, lats, own_cpu_s() - cpu0, None, counts))
    except Exception as exc:  # reported to the parent
        out.put((role, 0, [], 0.0, repr(exc), (0, 0, 0, 0)))


def consume_one(client: Client, read: bool, ack: list[Any]) -> list[Any]:
    """Lease one item, acking ``ack`` with the lease, and read it if ``read``: the item (not
    acked) as a list of one, or [] if the queue stayed empty."""
    if read:
        got: list[Any] = client.dequeue_many(QUEUE, 1, wait_s=0.5, ack=ack)
    else:  # ids and lease tokens only, named with their queue as a Message is
        got = [Taken(i.id, i.lease, QUEUE)
               for i in client.lease(QUEUE, 1, wait_s=0.5, ack=ack)]
    return got


class Taken(NamedTuple):
    """A leased item the consumer did not read: what an ack needs."""

    id: int
    lease: int
    queue: str


def wakeups(pid: int) -> int | None:
    """Voluntary context switches of all of a process's threads so far (Linux /proc): each is
    a thread going to sleep to wait, so about one wake-up each; None where unreadable."""
    total = 0
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/status") as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches:"):
                        total += int(line.split()[1])
    except (OSError, ValueError):
        return None
    return total


def received(cluster: LocalCluster) -> dict[str, float]:
    """Messages each server process has received (its ``blizzard_messages_total``); empty
    without ``--metrics on``."""
    import urllib.request
    out = {}
    for name in cluster.metrics_ports:
        try:
            with urllib.request.urlopen(cluster.metrics_url(name), timeout=5) as r:
                text = r.read().decode()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith('blizzard_messages_total{direction="received"}'):
                out[name] = float(line.split()[-1])
    return out


def run(cluster: LocalCluster, producers: int, consumers: int, size: int,
        seconds: float, bounds: tuple[str, ...] = ()) -> dict[str, Any]:
    """One measurement; ``bounds`` (``no-read``, ``ride``, ``no-sync``) as the module says."""
    out = MP.Queue()
    barrier = MP.Barrier(producers + consumers + 1)
    roles = ["p"] * producers + ["c"] * consumers
    procs = [MP.Process(target=worker, args=(r, cluster.master_addr, client_keys(cluster), size,
                                                     seconds, barrier, out,
                                                     "no-read" not in bounds,
                                                     "ride" in bounds),
                        daemon=True) for r in roles]
    for proc in procs:
        proc.start()
    pids = {proc.name: proc.popen.pid for proc in [cluster.master, *cluster.nodes]
            if proc is not None and proc.popen is not None}
    barrier.wait(120)
    t0, machine0 = time.monotonic(), machine_cpu()
    cpu0 = {name: proc_cpu_s(pid) for name, pid in pids.items()}
    wakes0 = {name: wakeups(pid) for name, pid in pids.items()}
    msgs0 = received(cluster)
    counts = {"p": 0, "c": 0}
    lats: dict[str, list[int]] = {"p": [], "c": []}
    client_cpu, errors = {"p": 0.0, "c": 0.0}, []
    gets = hedges = client_wakes = client_msgs = 0
    try:
        for _ in procs:
            role, n, role_lats, cpu, err, counts_ = out.get(timeout=seconds + 120)
            gets += counts_[0]
            hedges += counts_[1]
            client_wakes += counts_[2]
            client_msgs += counts_[3]
            counts[role] += n
            lats[role] += role_lats
            client_cpu[role] += cpu
            if err:
                errors.append(err)
    finally:
        for proc in procs:
            proc.join(10)
            if proc.is_alive():
                proc.terminate()
    elapsed = time.monotonic() - t0
    machine1 = machine_cpu()
    acked = counts["c"]
    cpu_us = {name: round(((proc_cpu_s(pid) or 0.0) - (cpu0[name] or 0.0)) * 1e6 / max(1, acked), 1)
              for name, pid in pids.items()}
    cpu_us["producers"] = round(client_cpu["p"] * 1e6 / max(1, acked), 1)
    cpu_us["consumers"] = round(client_cpu["c"] * 1e6 / max(1, acked), 1)
    cpu_us["clients"] = round(cpu_us["producers"] + cpu_us["consumers"], 1)
    cpu_us["total"] = round(sum(v for k, v in cpu_us.items() if k != "clients"), 1)
    cpu_us["servers"] = round(cpu_us["total"] - cpu_us["clients"], 1)  # as the peers' lines
    per_item = max(1, acked)
    wakes = {name: round(((wakeups(pid) or 0) - (wakes0[name] or 0)) / per_item, 1)
             for name, pid in pids.items()}
    wakes["clients"] = round(client_wakes / per_item, 1)
    msgs1 = received(cluster)
    msgs: dict[str, Any] = {name: round((msgs1[name] - msgs0.get(name, 0)) / per_item, 2)
                            for name in msgs1 if name in pids}
    if msgs:
        msgs["clients"] = round(client_msgs / per_item, 2)
        msgs["total"] = round(sum(msgs.values()), 2)
    line: dict[str, Any] = {
        "system": "blizzard", "op": "workers", "producers": producers, "consumers": consumers,
        "size": size, "replication": cluster.replication,
        "min_replicas": cluster.min_replicas or cluster.replication,
        "security": security_of(cluster),
        "metrics": metrics_of(cluster), **({"bound": list(bounds)} if bounds else {}),
        **({"sync_hold_ms": float(cluster.master_args[1])} if cluster.master_args else {}),
        # the servers that said they skip their syncs (bench/no_sync_site): evidence, not the flag
        "unsynced_servers": sum(unsynced(proc) for proc in [cluster.master, *cluster.nodes]),
        "enqueued_per_s": round(counts["p"] / elapsed), "acked_per_s": round(acked / elapsed),
        "seconds": round(elapsed, 1), "cpu_us_per_acked_item": cpu_us,
        "wakeups_per_acked_item": wakes, "messages_received_per_acked_item": msgs or None,
        # reads hedged (a second Get because the first node was slow), of all Gets sent
        "hedged_reads": hedges, "gets": gets, "errors": errors[:3]}
    for role, name in (("p", "enqueue"), ("c", "dequeue_ack")):
        ordered = sorted(lats[role])
        for q in (0.5, 0.99):
            v = percentile(ordered, q)
            line[f"{name}_p{int(q * 100)}_us"] = round(v / 1000, 1) if v is not None else None
    if machine0 and machine1 and machine1[1] > machine0[1]:
        line["machine_busy"] = round((machine1[0] - machine0[0]) / (machine1[1] - machine0[1]), 2)
    print(json.dumps(line), flush=True)
    return line


def unsynced(proc: Any) -> bool:
    """Whether a server's log says it skips its syncs (``bench/no_sync_site``)."""
    if proc is None:
        return False
    try:
        with open(proc.log_path, "rb") as f:
            return NO_SYNC_NOTICE.encode() in f.read()
    except OSError:
        return False


def parse_workers(text: str) -> tuple[int, int]:
    p_, _, c_ = text.partition(",")
    return int(p_), int(c_ or p_)


def main(argv: list[str] | None = None) -> int:
    ap = parser("scripts/bench --workers", __doc__)
    ap.add_argument("--workers", type=parse_workers, default=(8, 8),
                    help="producer and consumer processes, e.g. 8,8 (default)")
    ap.add_argument("--seconds", type=float, default=10.0, help="how long the load runs")
    ap.add_argument("--size", type=int, default=256, help="payload bytes")
    ap.add_argument("--replication", type=int, default=2, help="replicas per item (R)")
    ap.add_argument("--datanodes", type=int, default=2, help="data nodes to start")
    ap.add_argument("--min-replicas", type=int, default=None,
                    help="copies stored before an enqueue is acknowledged (W; default: R)")
    ap.add_argument("--repeat", type=int, default=1, help="measurements on the same cluster")
    ap.add_argument("--configs", type=replica_configs, default=[],
                    help="Blizzard's replication settings measured in turn, each R or R/W, "
                         "e.g. 2,3/2 (R=2; then R=3 acknowledged at W=2, on 3 data nodes); "
                         "instead of --replication and --min-replicas")
    ap.add_argument("--peers-first", action="store_true",
                    help="measure the peers before Blizzard (to swap the order between runs)")
    ap.add_argument("--peers", type=peer_names, default=[],
                    help="then the same load on these peers, comma-separated, and the ratios: "
                         + ", ".join(PEERS))
    ap.add_argument("--no-read", action="store_true",
                    help="an estimate: consumers lease and ack without reading the payload")
    ap.add_argument("--ride", action="store_true",
                    help="consumers ack each item with their next lease, not on its own")
    no_sync_option(ap)
    ap.add_argument("--sync-hold-ms", type=float, default=None,
                    help="the master's and data nodes' --sync-hold-ms (default: theirs)")
    security_option(ap)
    metrics_option(ap)
    args = ap.parse_args(argv)
    producers, consumers = args.workers
    if producers < 1 or consumers < 1 or not 0 < args.seconds <= 600 or args.size < 1:
        ap.error("--workers needs at least one of each; --seconds in (0, 600]; --size >= 1")
    if not 1 <= args.replication <= args.datanodes:
        ap.error("--replication must be between 1 and --datanodes")
    if args.min_replicas is not None and not 1 <= args.min_replicas <= args.replication:
        ap.error("--min-replicas must be between 1 and --replication")
    if args.no_sync:
        unsafe_no_sync()
    bounds = tuple(b for b, on in (("no-read", args.no_read), ("ride", args.ride),
                                   ("no-sync", args.no_sync)) if on)
    base = start("bench")
    hold = () if args.sync_hold_ms is None else ("--sync-hold-ms", str(args.sync_hold_ms))
    configs = args.configs or [(args.replication, args.min_replicas)]
    lines: list[dict[str, Any]] = []
    measured: list[dict[str, Any]] = []

    def measure_peers() -> int:  # one system on the machine at a time
        for name in args.peers:
            log.info("peer %s: %d producers, %d consumers", name, producers, consumers)
            measured.append(peers.run(PEERS[name], producers, consumers, args.size,
                                      args.seconds))
            print(json.dumps(measured[-1]), flush=True)
        return 1 if any(line["errors"] for line in measured) else 0

    code = measure_peers() if args.peers_first else 0
    for replication, min_replicas in configs:  # one cluster (per security, metrics) at a time
        clusters = clusters_for(os.path.join(base, f"r{replication}w{min_replicas}"),
                                args.security, args.metrics,
                                datanodes=max(args.datanodes, replication),
                                replication=replication, min_replicas=min_replicas,
                                master_args=hold, node_args=hold)

        def body(clusters: list[LocalCluster] = clusters) -> int:
            measured = [run(cluster, producers, consumers, args.size, args.seconds, bounds)
                        for _ in range(args.repeat) for cluster in clusters]
            lines.extend(measured)
            return 1 if any(line["errors"] for line in measured) else 0
        # each config is measured whatever an earlier one or a peer gave
        code = on_clusters(os.path.join(base, f"r{replication}w{min_replicas}"),
                           clusters, body) or code
    if args.peers and not args.peers_first:
        code = measure_peers() or code
    if args.peers:
        print(json.dumps(peers.ratios(lines, measured)), flush=True)
        print(peers.table(lines, measured), file=sys.stderr, flush=True)
    return code


def replica_configs(text: str) -> list[tuple[int, int | None]]:
    configs: list[tuple[int, int | None]] = []
    for part in text.split(","):
        r, _, w = part.strip().partition("/")
        try:
            config = (int(r), int(w) if w else None)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{part!r}: want R or R/W, e.g. 3/2") from None
        if not 1 <= (config[1] or config[0]) <= config[0] <= 5:
            raise argparse.ArgumentTypeError(f"{part!r}: want 1 <= W <= R <= 5")
        configs.append(config)
    return configs


def peer_names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in PEERS]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown peer {', '.join(unknown)}; known: {', '.join(PEERS)}")
    return names


if __name__ == "__main__":
    sys.exit(main())
