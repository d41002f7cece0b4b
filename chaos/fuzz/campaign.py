"""A fuzz campaign against a running local cluster: every server, every way in, then the checks.

Given a ``LocalCluster`` (secure, with data nodes), ``run``:

1. enqueues known items into ``keep`` (ready ones at three priorities, some delayed an hour)
   and reads the cluster's durable state from a clean stop (``chaos/fuzz/state.py``);
2. fuzzes each server in turn, each way in: over every key that server admits (master:
   client, admin, datanode; data nodes: client, datanode) with frames that never name the
   kept items, their queue or the real nodes (``chaos/fuzz/guard.py``); over sockets it
   refuses (a DEALER without a key, one with a key it does not know); and below ZeroMQ, raw
   TCP connections with hostile bytes, ``hold`` of them left open unread at a time
   (``chaos/fuzz/raw.py``). Each run is paced by a timed round trip over an admitted socket;
3. checks that no process exited, that ``keep``'s counters are as before, that after the
   cluster settled (a clean restart: the data nodes' inventories let the master delete the
   blobs fuzzed ``Put``s left) a clean stop reads the same items, queues and blobs as before,
   and that every kept item dequeues with its exact payload and a new item goes round.

Every run and check is reported through ``emit`` as one dict (``scripts/fuzz`` prints them
as JSON lines); ``run`` returns the problems found, an empty list when the cluster held.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

import zmq

from blizzard import Client
from blizzard.local.harness import LocalCluster
from blizzard.net.secure import connect_curve
from blizzard.wire import protocol as p
from chaos.fuzz.frames import fuzz
from chaos.fuzz.guard import Protected
from chaos.fuzz.raw import raw_fuzz
from chaos.fuzz.state import differences, read_stopped

Emit = Callable[[dict[str, Any]], None]
QUEUE = "keep"
ADMITTED = {"master": ("client", "admin", "datanode"), "datanode": ("client", "datanode")}
REFUSED = ("nokey", "stranger")


@dataclass(frozen=True)
class Plan:
    """How hard to push: per server, ``frames`` over each admitted key and each refused
    socket, ``raw`` TCP connections with ``hold`` open at a time."""

    frames: int = 10_000
    raw: int = 10_000
    hold: int = 200
    items: int = 200
    seed: int = 0


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def _refused_dealer(cluster: LocalCluster, addr: str, mode: str) -> zmq.Socket:
    """A DEALER the server will not admit: no key at all, or a CURVE key not in its directory."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if mode == "stranger":
        mine = cluster.client_keys("client")
        assert mine is not None and mine.datanode is not None
        public, secret = zmq.curve_keypair()
        server = mine.master if addr == cluster.master_addr else mine.datanode
        connect_curve(sock, type(mine)(public, secret, mine.master, mine.datanode), server)
    sock.connect(addr)
    return sock


def _fuzz_one(cluster: LocalCluster, addr: str, mode: str, plan: Plan, seed: int,
              check: Any, protect: Protected) -> dict[str, Any]:
    """One run against one server one way in; its figures."""
    probe = partial(cluster.dealer, name="client")  # an admitted socket
    if mode == "raw":
        raw = raw_fuzz(addr, plan.raw, probe=probe, check=check, seed=seed, hold=plan.hold)
        return {"connections": raw.connections, "refused": raw.refused, "by_kind": raw.by_kind,
                "probe_max_ms": round(raw.probe_max_ms, 1),
                "probe_with_held_ms": round(raw.probe_held_ms, 1),
                "seconds": round(raw.seconds, 1)}
    if mode in REFUSED:
        result = fuzz(addr, plan.frames, seed=seed, check=check, protect=protect, probe=probe,
                      connect=lambda a: _refused_dealer(cluster, a, mode))
    else:
        result = fuzz(addr, plan.frames, seed=seed, check=check, protect=protect,
                      connect=lambda a: cluster.dealer(a, mode))
    out = asdict(result)
    out["seconds"] = round(result.seconds, 1)
    out["probe_max_ms"] = round(result.probe_max_ms, 1)
    return out


def _settle(cluster: LocalCluster, blobs: dict[str, int], timeout_s: float = 30.0) -> bool:
    """Restart cleanly and wait until each data node reports the blob count it had before
    (its inventory lets the master order fuzzed blobs deleted)."""
    read_stopped(cluster)
    addr_of = {n.name: n.addr for n in cluster.nodes}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        counts = {n.addr: n.items for n in cluster.status().nodes if n.alive}
        if all(counts.get(addr_of[name]) == count for name, count in blobs.items()):
            return True
        time.sleep(0.2)
    return False


def _without_strays(cluster: LocalCluster, items: int, timeout_s: float = 30.0) -> bool:
    """Wait until the data nodes hold ``items`` x R blobs in all: an enqueue that failed and
    was retried under fresh ids (a slow node, a loaded machine) leaves blobs the master has
    ordered deleted but a node may not have deleted yet. Read before they go, they would
    count as a change the fuzzing made."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if sum(n.items for n in cluster.status().nodes if n.alive) == items * cluster.replication:
            return True
        time.sleep(0.2)
    return False


def run(cluster: LocalCluster, plan: Plan, emit: Emit) -> list[str]:
    """Fuzz every server of ``cluster`` as the module docstring says; the problems found."""
    problems: list[str] = []
    with Client(cluster.master_addr, timeout_s=30) as c:
        kept = {}
        for i in range(plan.items):
            data = f"item-{i}".encode() * (1 + i % 7)
            delay_s = 3600.0 if i % 10 == 9 else 0.0
            kept[c.enqueue(QUEUE, data, priority=i % 3, delay_s=delay_s)] = data
        stats_before = c.stats(QUEUE)
    nodes = cluster.status().nodes
    protect = Protected.of(kept, {QUEUE, f"{QUEUE}.dead", cluster.master_addr,
                                  *(n.node_id for n in nodes), *(n.addr for n in nodes)})
    quiet = _without_strays(cluster, plan.items)
    if not quiet:  # the master orders them deleted within a heartbeat or two
        problems.append("the setup's stray blobs were still there after 30 s: "
                        f"{cluster.status().nodes}")
    before = read_stopped(cluster)
    emit({"phase": "before", "without_strays": quiet, **before.summary()})
    procs = [cluster.master, *cluster.nodes]  # (a restart makes new ones)

    targets = [("master", cluster.master_addr, p.Status(), cluster.master)]
    targets += [(n.name, n.addr, p.Get([min(kept)], None), n)  # a round trip: Forbidden
                for n in cluster.nodes]
    seed = plan.seed
    for name, addr, check, proc in targets:
        kind = "master" if proc is cluster.master else "datanode"
        for mode in (*ADMITTED[kind], *REFUSED, "raw"):
            seed += 1
            rss_before = rss_mib(proc.popen.pid)
            line: dict[str, Any] = {"target": name, "mode": mode}
            try:
                line.update(_fuzz_one(cluster, addr, mode, plan, seed, check, protect))
            except AssertionError as exc:  # a pacing round trip went unanswered
                problems.append(f"{name}/{mode}: {exc}")
                line["stalled"] = str(exc)
            dead = [q.name for q in procs if not q.alive]
            line.update(rss_mib_before=rss_before,
                        rss_mib_after=rss_mib(proc.popen.pid) if proc.alive else None,
                        exits=dead)
            emit(line)
            if dead:
                problems.append(f"{', '.join(dead)} exited during {name}/{mode}")
                return problems

    real = {n.addr for n in cluster.nodes}
    deadline = time.monotonic() + 15
    while {n.addr for n in cluster.status().nodes if n.alive} != real \
            and time.monotonic() < deadline:
        time.sleep(0.1)  # the fuzzer's heartbeats make nodes of its own; they time out
    with Client(cluster.master_addr, timeout_s=30) as c:
        stats_after = c.stats(QUEUE)
    counters = ("ready", "delayed", "leased", "pending", "dead")
    if [stats_after[k] for k in counters] != [stats_before[k] for k in counters]:
        problems.append(f"{QUEUE} counters {stats_before} -> {stats_after}")

    settled = _settle(cluster, {name: len(b) for name, b in before.blobs.items()})
    after = read_stopped(cluster)
    diff = differences(before, after)
    emit({"phase": "after", "settled": settled, **after.summary(), "differences": diff})
    problems += diff

    procs = [cluster.master, *cluster.nodes]
    ready = {i: d for i, d in kept.items() if before.items[i][-1] == 0}  # status READY
    with Client(cluster.master_addr, timeout_s=30) as c:
        got = c.dequeue_many(QUEUE, len(ready) + 1, wait_s=5)
        wrong = {i for i in ready if i not in {m.id for m in got if m.data == ready.get(m.id)}}
        c.ack_many(got)
        fresh = c.enqueue("fz-after", b"after the fuzz")
        back = c.dequeue("fz-after", wait_s=5)
        went_round = back is not None and (back.id, back.data) == (fresh, b"after the fuzz")
        if back is not None:
            back.ack(wait=True)
    emit({"phase": "dequeue", "items": len(ready), "dequeued": len(got), "lost": len(wrong),
          "extra": len(got) - len(ready) + len(wrong), "fresh_round_trip": went_round,
          "exits": [q.name for q in procs if not q.alive]})
    if wrong or len(got) != len(ready):
        problems.append(f"{len(wrong)} kept items lost or changed, {len(got)} dequeued of "
                        f"{len(ready)}")
    if not went_round:
        problems.append("a new item did not go round after the fuzz")
    problems += [f"{q.name} exited" for q in procs if not q.alive]
    return problems
