"""Floods of connections that hold a server's file descriptors: plain TCP connections to the
master's and the data nodes' ports that never greet, never send a key.

``ConnectionFlood`` holds up to ``hold`` of them open to each server at once, making a new
one for each the server shuts (its connection guard: ``blizzard/server/conn_guard.py``), at most
``rate_per_s`` new connections a second in all, for a given time. ``flood_campaign`` runs one
against every server of a cluster while a client connected before keeps doing timed round
trips (enqueue, dequeue, ack), and reports the figures: connections made and shut by the
servers, the most held at once, the round trips' latency before and during the flood, whether
every server lived and a new client is served afterwards.
"""

from __future__ import annotations

import errno
import selectors
import socket
import statistics
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from blizzard import Client
from blizzard.host.fd_limits import raise_fd_limit
from blizzard.local.harness import LocalCluster

Emit = Callable[[dict[str, Any]], None]
BASELINE_TRIPS = 50  # round trips timed before the flood, to compare with those during it


def host_port(addr: str) -> tuple[str, int]:
    host, port = addr[len("tcp://"):].rsplit(":", 1)
    return host.strip("[]"), int(port)


@dataclass
class FloodFigures:
    """What one target saw of a flood."""

    made: int = 0  # connections that were established
    failed: int = 0  # connects refused or timed out (a full backlog)
    shut: int = 0  # established connections the server ended while the flood held them
    held_max: int = 0  # the most open at once


@dataclass
class ConnectionFlood:
    """Idle TCP connections held open to each of ``targets`` (``tcp://HOST:PORT``)."""

    targets: list[str]
    hold: int = 1500
    rate_per_s: float = 1500.0
    figures: dict[str, FloodFigures] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self, seconds: float) -> dict[str, FloodFigures]:
        """Flood for ``seconds`` (or until ``stop`` is set); then close every connection."""
        sel = selectors.DefaultSelector()
        held: dict[str, set[socket.socket]] = {t: set() for t in self.targets}
        connecting: set[socket.socket] = set()
        self.figures = {t: FloodFigures() for t in self.targets}
        tokens, last = 0.0, time.monotonic()
        deadline = last + seconds
        try:
            while time.monotonic() < deadline and not self.stop.is_set():
                now = time.monotonic()
                tokens = min(self.rate_per_s / 10, tokens + (now - last) * self.rate_per_s)
                last = now
                wanting = [t for t in self.targets if len(held[t]) < self.hold]
                while wanting and tokens >= 1:  # in turn: a server that shuts fast takes
                    for target in list(wanting):  # no more than its share
                        if tokens < 1 or len(held[target]) >= self.hold:
                            wanting.remove(target)
                            continue
                        tokens -= 1
                        self._connect(target, sel, held, connecting)
                for key, _ in sel.select(0.02):
                    self._event(key.fileobj, key.data, sel, held, connecting)
                for target in self.targets:
                    fig = self.figures[target]
                    fig.held_max = max(fig.held_max, len(held[target]) - sum(
                        1 for s in connecting if s in held[target]))
        finally:
            for socks in held.values():
                for s in socks:
                    _abort(s)
            sel.close()
        return self.figures

    def _connect(self, target: str, sel: selectors.BaseSelector,
                 held: dict[str, set[socket.socket]], connecting: set[socket.socket]) -> None:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        code = s.connect_ex(host_port(target))
        if code not in (0, errno.EINPROGRESS):
            self.figures[target].failed += 1
            _abort(s)
            return
        held[target].add(s)
        connecting.add(s)
        sel.register(s, selectors.EVENT_WRITE, target)

    def _event(self, s: Any, target: str, sel: selectors.BaseSelector,
               held: dict[str, set[socket.socket]], connecting: set[socket.socket]) -> None:
        fig = self.figures[target]
        if s in connecting:
            connecting.discard(s)
            if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                fig.failed += 1
                self._drop(s, target, sel, held)
                return
            fig.made += 1
            sel.modify(s, selectors.EVENT_READ, target)
            return
        try:
            ended = not s.recv(4096)  # the server's greeting is read and dropped
        except BlockingIOError:
            return
        except OSError:
            ended = True
        if ended:
            fig.shut += 1
            self._drop(s, target, sel, held)

    @staticmethod
    def _drop(s: socket.socket, target: str, sel: selectors.BaseSelector,
              held: dict[str, set[socket.socket]]) -> None:
        sel.unregister(s)
        held[target].discard(s)
        _abort(s)


def _abort(s: socket.socket) -> None:
    """Close with an RST: thousands of closes leave no TIME_WAIT behind."""
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    s.close()


def round_trip(client: Client, queue: str, n: int) -> float:
    """Enqueue, dequeue and ack one item; its time in ms (AssertionError if it does not come
    back whole)."""
    started = time.monotonic()
    data = f"flood-{n}".encode()
    item_id = client.enqueue(queue, data)
    msg = client.dequeue(queue, wait_s=10)
    assert msg is not None and (msg.id, msg.data) == (item_id, data), \
        f"round trip {n}: {msg!r} instead of {item_id}"
    msg.ack(wait=True)
    return (time.monotonic() - started) * 1000


@dataclass(frozen=True)
class FloodPlan:
    """How hard: ``hold`` connections to each server for ``seconds``, ``rate_per_s`` new ones
    a second at most."""

    hold: int = 1500
    seconds: float = 8.0
    rate_per_s: float = 1500.0


def flood_campaign(cluster: LocalCluster, plan: FloodPlan, emit: Emit,
                   queue: str = "flood-rt") -> list[str]:
    """Flood every server of ``cluster`` at once while a client connected before does round
    trips; emit the figures as one dict; the problems found."""
    problems: list[str] = []
    procs = [cluster.master, *cluster.nodes]
    targets = {p.name: p.addr for p in procs if p is not None}
    soft, _, _ = raise_fd_limit()  # the flood's own sockets; fewer each if the limit is low
    hold = max(1, min(plan.hold, (soft - 500) // len(targets)))
    with Client(cluster.master_addr, timeout_s=30) as client:
        # connected to the master and every data node it uses; the latency without a flood
        quiet = [round_trip(client, queue, -2 - n) for n in range(BASELINE_TRIPS)]
        flood = ConnectionFlood(list(targets.values()), hold, plan.rate_per_s)
        thread = threading.Thread(target=flood.run, args=(plan.seconds,), daemon=True)
        started = time.monotonic()
        thread.start()
        latencies: list[float] = []
        failures: list[str] = []
        while thread.is_alive() and len(failures) < 5:
            try:
                latencies.append(round_trip(client, queue, len(latencies) + 1))
            except Exception as exc:  # a timeout, a refusal: counted, the flood goes on
                failures.append(f"{type(exc).__name__}: {exc}")
        flood.stop.set()
        thread.join(plan.seconds + 30)
        seconds = time.monotonic() - started
    dead = [p.name for p in procs if p is not None and not p.alive]
    after_ms = None
    if not dead:
        try:
            with Client(cluster.master_addr, timeout_s=30) as fresh:
                after_ms = round(round_trip(fresh, queue, -1), 1)
        except Exception as exc:
            problems.append(f"no round trip with a new client after the flood: {exc}")
    line: dict[str, Any] = {
        "flood": "connections", "hold": hold, "seconds": round(seconds, 1),
        "rate_per_s": plan.rate_per_s,
        "targets": {name: vars(flood.figures.get(addr, FloodFigures()))
                    for name, addr in targets.items()},
        "round_trips": len(latencies), "round_trip_failures": len(failures),
        "round_trip_ms": _summary(latencies), "round_trip_ms_before": _summary(quiet),
        "after_ms": after_ms, "exits": dead,
    }
    if failures:
        line["first_failure"] = failures[0][:300]
    emit(line)
    problems += [f"{name} exited during the connection flood" for name in dead]
    if failures:
        problems.append(f"{len(failures)} round trips failed during the connection flood: "
                        f"{failures[0][:200]}")
    return problems


def _summary(ms: list[float]) -> dict[str, float]:
    if not ms:
        return {}
    ordered = sorted(ms)
    return {"p50": round(statistics.median(ordered), 1),
            "p95": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))], 1),
            "max": round(ordered[-1], 1)}
