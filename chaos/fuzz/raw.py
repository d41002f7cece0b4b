"""Hostile bytes below ZeroMQ: raw TCP connections to a server's port that never finish a
handshake.

Each connection sends one of: random bytes; a ZMTP 3.0 greeting cut short; a greeting
announcing CURVE followed by a bogus HELLO (random box, wrong size, truncated, or a long
command frame declaring 2^63 bytes); a NULL-mechanism greeting and READY (a server that
demands CURVE must refuse it); an older ZMTP's greeting; a greeting with a huge declared
frame length. Up to ``hold`` connections stay open, never read, before the oldest is closed
(with an RST, so ten thousand of them leave no TIME_WAIT behind), and at the end all of them
are. ``raw_fuzz`` paces with a round trip over an admitted socket (``probe``), timed: the
server must keep serving while strangers hold its connections.
"""

from __future__ import annotations

import random
import socket
import struct
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import zmq

from blizzard.wire import protocol as p

KINDS = ("random", "short_greeting", "curve_hello", "null_ready", "old_zmtp", "huge_frame")


def greeting(mechanism: bytes, major: int = 3, minor: int = 0, as_server: int = 0) -> bytes:
    """A ZMTP 3.x greeting: signature, version, mechanism (20 bytes), as-server, filler."""
    return (b"\xff" + b"\x00" * 8 + b"\x7f" + bytes([major, minor])
            + mechanism.ljust(20, b"\x00")[:20] + bytes([as_server]) + b"\x00" * 31)


def command(name: bytes, body: bytes, long: bool = False) -> bytes:
    """A ZMTP command frame: flags (command, short or long), size, name length, name, body."""
    payload = bytes([len(name)]) + name + body
    if long or len(payload) > 255:
        return b"\x06" + struct.pack(">Q", len(payload)) + payload
    return b"\x04" + bytes([len(payload)]) + payload


def one_connection(rng: random.Random, kind: str) -> bytes:
    """The bytes one hostile connection sends."""
    if kind == "random":
        return rng.randbytes(rng.randrange(1, 600))
    if kind == "short_greeting":
        return greeting(rng.choice([b"CURVE", b"NULL", b"PLAIN"]))[:rng.randrange(1, 64)]
    if kind == "curve_hello":
        hello = b"\x01\x00" + b"\x00" * 72 + rng.randbytes(32 + 8 + 80)  # version, pad, key, box
        shape = rng.randrange(4)
        if shape == 0:
            frame = command(b"HELLO", hello)
        elif shape == 1:
            frame = command(b"HELLO", hello + rng.randbytes(rng.randrange(1, 4000)))
        elif shape == 2:
            frame = command(b"HELLO", hello)[:rng.randrange(1, 200)]
        else:
            frame = b"\x06" + struct.pack(">Q", 2**63) + b"\x05HELLO" + hello
        return greeting(b"CURVE") + frame
    if kind == "null_ready":
        ready = command(b"READY", b"\x0bSocket-Type\x00\x00\x00\x06DEALER")
        return greeting(b"NULL") + ready + b"\x00\x05hello"
    if kind == "old_zmtp":
        return rng.choice([b"\x01\x00", b"\xff" + b"\x00" * 8 + b"\x01\x7f\x01\x05",
                           b"\xff" + b"\x00" * 8 + b"\x7f\x02\x05\x00"])
    size = rng.choice([2**63, 2**64 - 1, 2**40, 50 * 1024 * 1024])
    flags = rng.choice([0x02, 0x06, 0x03])  # long message, long command, long + more
    return greeting(b"CURVE") + bytes([flags]) + struct.pack(">Q", size) + rng.randbytes(64)


@dataclass
class RawResult:
    connections: int = 0
    refused: int = 0  # connects the server's kernel refused (backlog full)
    by_kind: dict[str, int] = field(default_factory=dict)
    alive_checks: int = 0
    probe_max_ms: float = 0.0
    probe_held_ms: float = 0.0  # a round trip while ``hold`` connections were open
    seconds: float = 0.0


def _host_port(addr: str) -> tuple[str, int]:
    host, port = addr[len("tcp://"):].rsplit(":", 1)
    return host.strip("[]"), int(port)


def _abort(s: socket.socket) -> None:
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()


def raw_fuzz(addr: str, n: int, *, probe: Callable[[str], zmq.Socket], check: Any,
             seed: int = 0, hold: int = 200, check_every: int = 250,
             timeout_s: float = 5.0) -> RawResult:
    """Open ``n`` hostile TCP connections to ``addr`` (``hold`` open at a time), with a timed
    round trip over ``probe``'s socket every ``check_every``; AssertionError if one fails."""
    rng = random.Random(seed)
    target = _host_port(addr)
    held: deque[socket.socket] = deque()
    checker = probe(addr)
    result = RawResult()
    started = time.monotonic()

    def round_trip() -> float:
        rid = 2**62 + result.connections
        asked = time.monotonic()
        checker.send(p.encode(rid, check))
        while True:
            left_ms = int((asked + timeout_s - time.monotonic()) * 1000)
            if left_ms <= 0 or not checker.poll(left_ms):
                raise AssertionError(f"{addr} stopped answering after {result.connections} "
                                     f"raw connections ({len(held)} open)")
            if p.decode(checker.recv())[0] == rid:
                result.alive_checks += 1
                return (time.monotonic() - asked) * 1000

    try:
        # first a round trip: a connection counts as a client's once a request came on it
        # (the guard may shut one still silent to make way during a flood from its address)
        result.probe_max_ms = round_trip()
        while result.connections < n:
            kind = rng.choice(KINDS)
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.settimeout(2.0)
            try:
                s.connect(target)
                s.sendall(one_connection(rng, kind))
            except OSError:  # refused, reset or a full backlog: the server's kernel said no
                result.refused += 1
                _abort(s)
            else:
                held.append(s)
            result.connections += 1
            result.by_kind[kind] = result.by_kind.get(kind, 0) + 1
            if len(held) == hold and not result.probe_held_ms:  # once, the first time
                result.probe_held_ms = round_trip()
            if len(held) >= hold:
                _abort(held.popleft())
            if result.connections % check_every == 0:
                result.probe_max_ms = max(result.probe_max_ms, round_trip())
    finally:
        while held:
            _abort(held.popleft())
        checker.close(linger=0)
    result.probe_max_ms = max(result.probe_max_ms, round_trip_after(addr, probe, check, timeout_s))
    result.seconds = time.monotonic() - started
    return result


def round_trip_after(addr: str, probe: Callable[[str], zmq.Socket], check: Any,
                     timeout_s: float) -> float:
    """One timed round trip over a fresh admitted socket (ms); AssertionError if none."""
    sock = probe(addr)
    try:
        asked = time.monotonic()
        sock.send(p.encode(1, check))
        if not sock.poll(int(timeout_s * 1000)):
            raise AssertionError(f"{addr} does not answer a new connection after the raw fuzz")
        sock.recv()
        return (time.monotonic() - asked) * 1000
    finally:
        sock.close(linger=0)
