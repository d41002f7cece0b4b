"""Floods over HTTP and the heads feed, for ``scripts/fuzz`` (issue 32: items 2 and 8).

``http_flood_campaign`` runs against a ``LocalCluster`` that serves metrics and publishes
heads (``--heads-bind``), and a status page it starts itself:

1. half-open requests: ``hold`` connections to each HTTP port (the master's and every data
   node's ``/metrics``, the dashboard) each send half a request and then nothing; figures:
   how many the server closed at once, the descriptors its process holds meanwhile, the
   master's round-trip latency meanwhile, and how long until the rest were closed too;
2. a request for another Host (DNS rebinding): its status code on every port;
3. scrapes: with ``queues`` queues on the master, ``scrapers`` threads scrape ``/metrics``
   for ``seconds``; figures: the body's size, scrapes served, the master's latency before
   and during;
4. subscriptions: one connection sends ``subscriptions`` distinct topics, then 20 each send
   their share (``master/shard/subscribers.py``) of topics of queues that do not exist; figures:
   the master's count of subscriptions and memory before, at the peak and after they left,
   and whether a well-behaved subscriber still hears of a change.

Each part is emitted as one dict; the problems found are returned (a process exit, a port
holding more connections than its cap, a refused Host answered, a latency over
``SLOW_MS``, subscriptions not freed, memory growing past ``GROWTH_MIB``).
"""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import zmq
from prometheus_client.parser import text_string_to_metric_families

from blizzard import Client
from blizzard.local.harness import LocalCluster, free_port
from blizzard.net.http_guard import IDLE_TIMEOUT_S
from blizzard.net.keys import ENV as KEYS_ENV
from blizzard.net.secure import connect_curve
from blizzard.net.transport import Endpoint, call
from blizzard.server.metrics import MAX_SCRAPES
from blizzard.wire import protocol as p
from blizzard.wire.shard_messages import topic
from chaos.fuzz.campaign import rss_mib
from master.shard.subscribers import PER_CONNECTION

Emit = Callable[[dict[str, Any]], None]
SLOW_MS = 250.0  # a master round trip slower than this under a flood is a problem
GROWTH_MIB = 96.0  # the master's memory may grow this much under the subscription floods
LONG = "x" * 180  # subscription topics as long as queue names may be
TRIPS = 50  # round trips timed in each measurement


@dataclass(frozen=True)
class HttpFloodPlan:
    """How hard: ``hold`` half-open connections per HTTP port; ``queues`` on the master and
    ``scrapers`` threads scraping for ``seconds``; ``subscriptions`` from one connection."""

    hold: int = 1000
    queues: int = 2000
    scrapers: int = 16
    seconds: float = 5.0
    subscriptions: int = 20_000


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def latency_ms(ep: Endpoint, trips: int = TRIPS) -> dict[str, float]:
    """p50, p95 and the slowest of ``trips`` Hello round trips to the master, in ms."""
    took = []
    for _ in range(trips):
        began = time.monotonic()
        call(ep, p.Hello(), timeout_s=30)
        took.append((time.monotonic() - began) * 1000)
    took.sort()
    return {"p50_ms": round(took[len(took) // 2], 2),
            "p95_ms": round(took[int(len(took) * 0.95)], 2), "max_ms": round(took[-1], 2)}


def _closed(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def _get(url: str, host: str) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers={"Host": host}),
                                    timeout=10) as reply:
            reply.read()
            return reply.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0  # closed unanswered (the cap reached)


def _metric(url: str, name: str) -> float | None:
    with urllib.request.urlopen(url, timeout=10) as reply:
        text = reply.read().decode()
    return next((s.value for family in text_string_to_metric_families(text)
                 for s in family.samples if s.name == name), None)


def _start_dashboard(cluster: LocalCluster) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = dict(os.environ, **({KEYS_ENV: cluster.keys} if cluster.keys else {}))
    proc = subprocess.Popen([sys.executable, "-m", "blizzard.cli", "dashboard", "--master",
                             cluster.master_addr, "--port", str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + 30
    while _get(url, "127.0.0.1") != 200:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the dashboard did not start (exit {proc.poll()})")
        time.sleep(0.1)
    return proc, url


def _half_open(name: str, url: str, pid: int, hold: int, ep: Endpoint,
               problems: list[str]) -> dict[str, Any]:
    """``hold`` half-sent requests to ``url``'s port; the figures."""
    port = int(url.split(":")[2].split("/")[0])
    fds_before = fds(pid)
    socks: list[socket.socket] = []
    began = time.monotonic()
    try:
        for _ in range(hold):
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # and no more
            socks.append(sock)
        opened_s = time.monotonic() - began
        time.sleep(0.5)  # what the server does within half a second of the last one
        closed_at_once = sum(map(_closed, socks))
        fds_held = fds(pid) - fds_before
        during = latency_ms(ep)
        deadline = time.monotonic() + IDLE_TIMEOUT_S + 20
        while not all(map(_closed, socks)) and time.monotonic() < deadline:
            time.sleep(0.2)
        all_closed_s = round(time.monotonic() - began, 1)
        left = len(socks) - sum(map(_closed, socks))
    finally:
        for sock in socks:
            sock.close()
    if fds_held > MAX_SCRAPES * 4 + 16:
        problems.append(f"{name}: {fds_held} descriptors held by {hold} half-open requests")
    if left:
        problems.append(f"{name}: {left} half-open requests still open after the timeout")
    if during["p95_ms"] > SLOW_MS:
        problems.append(f"{name}: master p95 {during['p95_ms']} ms with half-open requests")
    return {"part": "half-open", "target": name, "connections": hold,
            "opened_s": round(opened_s, 1), "closed_at_once": closed_at_once,
            "descriptors_held": fds_held, "all_closed_after_s": all_closed_s,
            "still_open": left, "master_during": during}


def _scrape_flood(cluster: LocalCluster, plan: HttpFloodPlan, ep: Endpoint,
                  problems: list[str]) -> dict[str, Any]:
    url = cluster.metrics_url("master")
    with Client(cluster.masters, admin=True, timeout_s=30) as client:
        for i in range(plan.queues):
            client.create_queue(f"fz-http-{i:05}")
    quiet = latency_ms(ep)
    with urllib.request.urlopen(url, timeout=30) as reply:
        size = len(reply.read())
    stop = time.monotonic() + plan.seconds
    served, refused = [0], [0]
    lock = threading.Lock()

    def scrape() -> None:
        while time.monotonic() < stop:
            ok = _get(url, "127.0.0.1") == 200
            with lock:
                served[0] += ok
                refused[0] += not ok

    threads = [threading.Thread(target=scrape, daemon=True) for _ in range(plan.scrapers)]
    for t in threads:
        t.start()
    during = latency_ms(ep)
    for t in threads:
        t.join(plan.seconds + 30)
    if during["p95_ms"] > SLOW_MS:
        problems.append(f"master p95 {during['p95_ms']} ms under {plan.scrapers} scrapers")
    return {"part": "scrapes", "queues": plan.queues, "scrape_bytes": size,
            "scrapers": plan.scrapers, "seconds": plan.seconds, "served": served[0],
            "closed_unanswered": refused[0], "master_quiet": quiet, "master_during": during}


def _peak(count: Callable[[], float | None], seconds: float) -> float:
    """The highest ``count()`` seen over ``seconds`` (read every 0.1 s)."""
    peak, deadline = 0.0, time.monotonic() + seconds
    while time.monotonic() < deadline:
        peak = max(peak, count() or 0)
        time.sleep(0.1)
    return peak


def _subscriber(cluster: LocalCluster, port: int) -> zmq.Socket:
    sock = zmq.Context.instance().socket(zmq.SUB)
    sock.setsockopt(zmq.LINGER, 0)
    keys = cluster.client_keys()
    if keys is not None:
        assert keys.master is not None
        connect_curve(sock, keys, keys.master)
    sock.connect(f"tcp://127.0.0.1:{port}")
    return sock


def _heard(sock: zmq.Socket, queue: str, ready: int, timeout_s: float = 10.0) -> bool:
    """Whether ``sock`` hears ``queue``'s head with ``ready`` items within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while (left := deadline - time.monotonic()) > 0:
        if not sock.poll(int(left * 1000) + 1):
            return False
        frames = sock.recv_multipart()
        head = p.unpack(frames[-1])
        if frames[0] == topic(queue) and isinstance(head, p.QueueHead) and head.ready == ready:
            return True
    return False


def _subscription_flood(cluster: LocalCluster, heads_port: int, plan: HttpFloodPlan,
                        problems: list[str]) -> dict[str, Any]:
    url = cluster.metrics_url("master")
    count = partial(_metric, url, "blizzard_heads_subscriptions")
    pid = cluster.master.popen.pid
    with Client(cluster.masters, admin=True, timeout_s=30) as client:
        client.enqueue("fz-heads", b"x")
        legit = _subscriber(cluster, heads_port)
        legit.subscribe(topic("fz-heads"))
        heard_first = _heard(legit, "fz-heads", 1)
        rss_before, count_before = rss_mib(pid), count()
        flood = _subscriber(cluster, heads_port)
        began = time.monotonic()
        for i in range(plan.subscriptions):
            flood.subscribe(f"fz-flood{i:05}{LONG}\0".encode())
        peak_one = _peak(count, 3.0)
        rss_one = rss_mib(pid)
        flood.close()
        many = [_subscriber(cluster, heads_port) for _ in range(20)]
        for n, sock in enumerate(many):
            for i in range(PER_CONNECTION):
                sock.subscribe(f"fz-c{n:02}-{i:03}{LONG}\0".encode())
        peak_many = _peak(count, 3.0)
        rss_many = rss_mib(pid)
        client.enqueue("fz-heads", b"y")
        heard_change = _heard(legit, "fz-heads", 2)
        for sock in many:
            sock.close()
        deadline = time.monotonic() + 15
        while count() != count_before and time.monotonic() < deadline:
            time.sleep(0.1)
        count_after, rss_after = count(), rss_mib(pid)
        legit.close()
    line = {"part": "subscriptions", "one_connection_topics": plan.subscriptions,
            "count_before": count_before, "peak_one_connection": peak_one,
            "peak_20_connections": peak_many, "count_after": count_after,
            "refused": _metric(url, "blizzard_heads_subscriptions_refused_total"),
            "cut": _metric(url, "blizzard_heads_subscribers_cut_total"),
            "rss_mib_before": rss_before, "rss_mib_one": rss_one, "rss_mib_many": rss_many,
            "rss_mib_after": rss_after, "legit_heard_first": heard_first,
            "legit_heard_change": heard_change, "seconds": round(time.monotonic() - began, 1)}
    if count_before is None or count_after != count_before:
        problems.append(f"heads subscriptions {count_before} before the floods, {count_after} "
                        "after they left")
    if max(rss_one, rss_many) - rss_before > GROWTH_MIB:
        problems.append(f"master memory {rss_before} -> {max(rss_one, rss_many)} MiB under "
                        "subscription floods")
    if not (heard_first and heard_change):
        problems.append("a well-behaved heads subscriber stopped hearing changes")
    return line


def http_flood_campaign(cluster: LocalCluster, heads_port: int, plan: HttpFloodPlan,
                        emit: Emit) -> list[str]:
    """Run the four parts (module docstring) against ``cluster``; the problems found."""
    problems: list[str] = []
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:  # this process holds the half-open connections
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    procs = [cluster.master, *cluster.nodes]
    dashboard, page = _start_dashboard(cluster)
    ep = cluster.endpoint(cluster.master_addr)
    try:
        targets = [("master", cluster.metrics_url("master"), cluster.master.popen.pid)]
        targets += [(n.name, cluster.metrics_url(n.name), n.popen.pid) for n in cluster.nodes]
        targets += [("dashboard", page, dashboard.pid)]
        emit({"part": "master-quiet", **latency_ms(ep)})
        for name, url, pid in targets:
            emit(_half_open(name, url, pid, plan.hold, ep, problems))
        codes = {name: _get(url, "evil.example") for name, url, _ in targets}
        emit({"part": "foreign-host", "status": codes})
        problems += [f"{name} answered a request for Host evil.example"
                     for name, code in codes.items() if code == 200]
        emit(_scrape_flood(cluster, plan, ep, problems))
        emit(_subscription_flood(cluster, heads_port, plan, problems))
    finally:
        ep.close()
        dashboard.terminate()
        dashboard.wait(10)
    problems += [f"{q.name} exited during the HTTP and subscription floods"
                 for q in procs if not q.alive]
    return problems
