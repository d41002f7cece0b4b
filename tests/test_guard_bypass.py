"""No-key ways around the connection guard's caps on pending connections
(blizzard/server/conn_guard.py): trickling a greeting a byte at a time, or sending a greeting
and a frame header and stopping, must not hold places a real client of the same address
needs; and a client the guard turns away is told so, not that its key is wrong.

A server in this process on loopback; the attackers are raw TCP sockets, bounded in number
and time.
"""

from __future__ import annotations

import contextlib
import resource
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import zmq

from blizzard.local.harness import free_port
from blizzard.net import keys as k
from blizzard.net.secure import connect_curve, guard
from blizzard.net.transport import Endpoint, call
from blizzard.server.conn_guard import EVICT_AGE_S, Limits
from blizzard.server.router import RouterServer
from blizzard.wire import protocol as p
from blizzard.wire.errors import AuthenticationFailed

from support.http_get import cut
from support.wait import wait_for

# A valid ZMTP 3.0 greeting asking for CURVE, as a client sends it
GREETING = b"\xff" + b"\x00" * 8 + b"\x7f" + b"\x03\x00" + b"CURVE".ljust(20, b"\x00") + \
    b"\x00" + b"\x00" * 31
# ... and the header of a long command frame announcing 1,000 bytes, 250 of them sent: libzmq
# waits for the rest until its handshake limit (323 bytes: past the 300 once taken as "done")
GREETED = GREETING + b"\x06" + (1000).to_bytes(8, "big") + b"\x05HELLO" + b"\x00" * 244


@pytest.fixture
def server(tmp_path) -> Iterator[tuple[RouterServer, str, k.ClientKeys]]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 4096 <= hard:  # the attackers' sockets and the server's, in this process
        resource.setrlimit(resource.RLIMIT_NOFILE, (4096, hard))
    keys = str(tmp_path / "keys")
    k.generate(keys)
    ctx = zmq.Context()
    addr = f"tcp://127.0.0.1:{free_port()}"
    srv = RouterServer(ctx, addr, keys=k.ServerKeys.from_dir(keys, "master"))
    try:
        yield srv, addr, k.ClientKeys.from_dir(keys, "client")
    finally:
        srv.close()
        guard(ctx, keys).stop()
        ctx.term()


def _attacker(port: int, source: str) -> socket.socket:
    s = socket.socket()
    s.bind((source, 0))
    s.connect(("127.0.0.1", port))
    s.setblocking(False)
    return s



@contextlib.contextmanager
def _client(ctx: zmq.Context, addr: str, mine: k.ClientKeys) -> Iterator[zmq.Socket]:
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    connect_curve(sock, mine, mine.master)
    sock.connect(addr)
    try:
        yield sock
    finally:
        sock.close()


def _answered_within(srv: RouterServer, sock: zmq.Socket, rid: int, timeout_s: float) -> float:
    """Seconds until the server reads request ``rid`` from ``sock`` (inf: not within
    ``timeout_s``)."""
    started = time.monotonic()
    sock.send(p.encode(rid, p.Ping()))
    while time.monotonic() - started < timeout_s:
        if rid in [r for _, r, _ in srv.receive(50)]:
            return time.monotonic() - started
    return float("inf")


def test_a_trickled_greeting_holds_no_place_a_real_client_of_its_address_needs(server):
    """Given a CURVE server, when as many connections as one address may have pending send a
    valid greeting one byte every 0.4 s (never silent for a second) and then a real client
    from the same address connects, then the client is answered at once: the oldest trickler
    makes way for it (before, none did until the handshake limit cut them, 5 s)."""
    srv, addr, mine = server
    port = int(addr.rsplit(":", 1)[1])
    cap = srv.guard.admission.limits.max_pending_per_addr
    ctx = zmq.Context()
    tricklers = [_attacker(port, "127.0.0.1") for _ in range(cap)]
    stop = threading.Event()

    def trickle() -> None:  # a byte each every 0.4 s: the attack's pace, at most 20 s
        for sent in range(50):
            for s in tricklers:
                with contextlib.suppress(OSError):
                    s.send(GREETING[sent % len(GREETING):][:1])
            if stop.wait(0.4):
                return

    thread = threading.Thread(target=trickle, daemon=True)
    try:
        wait_for(lambda: srv.guard.admission.pending_from.get("127.0.0.1") == cap, 5,
                 "the tricklers to take every pending place of their address")
        thread.start()
        # older than a handshake takes: the time passing is what is tested
        stop.wait(EVICT_AGE_S + 0.5)
        assert not any(cut(s) for s in tricklers)  # all held, none silent
        with _client(ctx, addr, mine) as legit:
            took_s = _answered_within(srv, legit, 1, 4.0)
        assert took_s < 2.0, f"a real client waited {took_s:.1f}s behind a trickling flood"
        assert srv.guard.admission.evicted >= 1
    finally:
        stop.set()
        if thread.is_alive():
            thread.join(5)
        for s in tricklers:
            s.close()
        ctx.term()


def test_a_greeting_and_a_frame_header_still_pend(server):
    """Given a CURVE server, when 200 connections from one address each send a greeting and
    the header of a long frame (323 bytes: more than the 300 once taken as a finished
    handshake) and wait, then all but the per-address cap are shut within a second: they
    pend (no message came from them) and are capped, instead of holding their descriptors
    for the whole handshake limit."""
    srv, addr, _ = server
    port = int(addr.rsplit(":", 1)[1])
    cap = srv.guard.admission.limits.max_pending_per_addr
    flood: list[socket.socket] = []
    try:
        for _ in range(200):
            s = _attacker(port, "127.0.0.1")
            try:
                s.sendall(GREETED)
            except OSError:  # shut already
                pass
            flood.append(s)
        started = time.monotonic()
        deadline = started + 1.5
        shut = 0
        while time.monotonic() < deadline:
            shut = sum(cut(s) for s in flood)
            if shut >= 200 - cap:
                break
            time.sleep(0.02)
        assert shut >= 200 - cap, f"{shut} of 200 shut within 1.5s (cap {cap})"
        assert srv.guard.admission.pending_from.get("127.0.0.1", 0) <= cap
    finally:
        for s in flood:
            s.close()


def test_a_client_the_guard_turns_away_is_told_the_server_is_busy_not_that_its_key_is_wrong(
        server):
    """Given a server whose guard turns every new connection away (its caps reached), a
    request times out saying the server closed the connection before the handshake (busy
    or flooded?), not that the server's key is not the one pinned; a client that pinned a
    wrong server key is still told that."""
    srv, addr, mine = server
    limits = srv.guard.admission.limits
    srv.guard.admission.limits = Limits(max_open=limits.max_open, max_pending=0,
                                        max_pending_per_addr=0, pending_s=limits.pending_s)
    ctx = zmq.Context()
    try:
        ep = Endpoint(ctx, addr, mine, mine.master)
        try:  # (time for the guard's thread to turn the connection away on a busy machine)
            with pytest.raises(TimeoutError) as timed_out:
                call(ep, p.Ping(), 6.0)
        finally:
            ep.close()
        assert not isinstance(timed_out.value, AuthenticationFailed)
        assert "closed the connection before the handshake" in str(timed_out.value)
        assert "busy or flooded" in str(timed_out.value)

        srv.guard.admission.limits = limits
        wrong = Endpoint(ctx, addr, mine, zmq.curve_keypair()[0])
        try:
            with pytest.raises(AuthenticationFailed, match="not the one this process was given"):
                call(wrong, p.Ping(), 5.0)
        finally:
            wrong.close()
    finally:
        ctx.term()
