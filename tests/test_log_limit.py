"""Lines an outsider can cause are throttled with a count (blizzard/host/log_limit.py), and the ZAP
handler's refusals go through it: handshakes with random keys cannot flood a server's log."""

from __future__ import annotations

import logging
import time

import pytest
import zmq

from blizzard.host.log_limit import Throttled
from blizzard.local.harness import free_port
from blizzard.net import keys as k
from blizzard.net.secure import connect_curve, guard
from blizzard.server.router import bind_router


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_throttled_logs_the_first_then_one_line_per_interval_with_the_count(caplog):
    clock = Clock()
    say = Throttled(logging.getLogger("test.throttled"), every_s=10.0, clock=clock)
    with caplog.at_level(logging.WARNING, logger="test.throttled"):
        written = [say("knock", "knocked by %s", n) for n in range(50)]
        say("other", "another reason")  # counted apart
        clock.now += 10.0
        written.append(say("knock", "knocked by %s", 50))
    lines = [r.getMessage() for r in caplog.records]
    assert written.count(True) == 2
    assert lines == ["knocked by 0", "another reason",
                     "knocked by 50 (and 49 more since the last such line, 10s ago)"]
    assert say.total == {"knock": 51, "other": 1}


@pytest.mark.cluster
def test_a_thousand_handshakes_with_random_keys_make_few_lines_and_the_count_shows(
        tmp_path, caplog):
    """Given a CURVE server whose ZAP handler knows only the key directory's keys,
    when 1,000 connections with random keys knock, then at most a few lines are logged,
    and the line after the interval says how many were refused meanwhile."""
    keys = str(tmp_path / "keys")
    k.generate(keys)
    server_ctx, client_ctx = zmq.Context(), zmq.Context()
    addr = f"tcp://127.0.0.1:{free_port()}"
    server = bind_router(server_ctx, addr, keys=k.ServerKeys.from_dir(keys, "master"))
    gate = guard(server_ctx, keys)
    clock = Clock()
    gate.keys.refusals.clock = clock  # the interval passes when the test says so
    master_public = k.load_public(keys, "master")

    def knock(n: int) -> None:
        for _ in range(n):
            sock = client_ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.RECONNECT_IVL, 60_000)  # one handshake each
            public, secret = zmq.curve_keypair()
            connect_curve(sock, k.ClientKeys(public, secret, master_public, None), master_public)
            sock.connect(addr)
            sockets.append(sock)

    def refused() -> int:
        return gate.keys.refusals.total.get("unknown key", 0)

    def wait_refused(n: int) -> None:
        deadline = time.monotonic() + 60
        while refused() < n and time.monotonic() < deadline:
            time.sleep(0.05)
        assert refused() >= n, f"only {refused()} handshakes refused"

    sockets: list[zmq.Socket] = []
    try:
        with caplog.at_level(logging.INFO, logger="blizzard.net.secure"):
            for batch in range(1, 11):
                knock(100)
                wait_refused(100 * batch)
                for sock in sockets:
                    sock.close(linger=0)
                sockets.clear()
            lines = [r.getMessage() for r in caplog.records if "unknown key" in r.getMessage()]
            assert refused() >= 1000
            assert 1 <= len(lines) <= 3, lines

            clock.now += gate.keys.refusals.every_s
            before = refused()
            knock(1)
            wait_refused(before + 1)
        lines = [r.getMessage() for r in caplog.records if "unknown key" in r.getMessage()]
        assert len(lines) == 2, lines
        assert f"and {before - 1} more since the last such line" in lines[-1]
    finally:
        for sock in sockets:
            sock.close(linger=0)
        server.close(linger=0)
        gate.stop()
        client_ctx.term()
        server_ctx.term()
