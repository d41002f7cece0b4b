"""Slowloris on a master's ``/metrics`` (blizzard/net/http_guard.py): connections that send
their request a byte at a time hold no place for long, and one address cannot take them all.

Sixteen such connections (the endpoint's cap) once locked every scrape out for as long as
they ran: nothing but the 30 s lifetime cut them. Now a request's head must be in 5 s after
the connection came, and one address holds a quarter of the places at most.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time

from blizzard.net.http_guard import HEAD_S
from blizzard.server.metrics import MAX_SCRAPES

from support.http_get import cut

REQUEST = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"X-a: b\r\n" * 1000


def _scrape(port: int, source: str) -> bytes:
    """A whole GET of /metrics from ``source``: what came back (b"" if the server closed)."""
    with socket.socket() as s:
        s.bind((source, 0))
        s.settimeout(10)
        s.connect(("127.0.0.1", port))
        s.sendall(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        got = b""
        with contextlib.suppress(OSError):
            while chunk := s.recv(65536):
                got += chunk
        return got



def test_slow_requests_lock_no_scrape_out(cluster_factory):
    """Given a master serving metrics, when as many connections as it serves at once (16)
    send a request one byte every 0.5 s from 127.0.0.1, then a scrape from another address
    is answered meanwhile, each slow connection is cut about 5 s after it came (not 30), and
    a scrape from their own address is answered afterwards."""
    cluster = cluster_factory(datanodes=1, replication=1, metrics=True)
    port = int(cluster.metrics_url("master").rsplit(":", 1)[1].split("/")[0])
    slow: list[socket.socket] = []
    cut_after: dict[int, float] = {}
    stop = threading.Event()
    started = time.monotonic()
    for _ in range(MAX_SCRAPES):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.setblocking(False)
        slow.append(s)

    def trickle() -> None:  # the attack's pace; at most 60 bytes each (30 s)
        for sent in range(60):
            for i, s in enumerate(slow):
                if i in cut_after:
                    continue
                if cut(s):
                    cut_after[i] = time.monotonic() - started
                    continue
                with contextlib.suppress(OSError):
                    s.send(REQUEST[sent:sent + 1])
            if len(cut_after) == len(slow) or stop.wait(0.5):
                return

    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    try:
        answer = _scrape(port, "127.0.0.2")
        assert answer.startswith(b"HTTP/1.0 200"), answer[:200]
        thread.join(HEAD_S + 10)
        assert not thread.is_alive(), f"{len(slow) - len(cut_after)} slow requests still held"
        assert max(cut_after.values()) < HEAD_S + 2.5, sorted(cut_after.values())
        answer = _scrape(port, "127.0.0.1")
        assert answer.startswith(b"HTTP/1.0 200"), answer[:200]
    finally:
        stop.set()
        thread.join(10)
        for s in slow:
            s.close()
    assert cluster.master.alive
