"""Caps on the connections a server socket accepts, so that no one without a key can take
its file descriptors.

libzmq accepts every TCP connection and keeps it until the handshake limit cuts a silent
one; it has no option to cap them. A flood of plain connections that never greet would hold
a descriptor each until the process could open no file (a WAL segment, a LevelDB table) and
no client could connect. The ``ConnectionGuard`` watches a bound socket's monitor (a
``RouterServer``'s, the master's heads feed) in a thread of its own: each accepted connection
(``EVENT_ACCEPTED`` carries its descriptor) is looked at, and shut at once (``shutdown`` on
the descriptor: libzmq then closes it itself) when it would pass one of three caps
(``Admission``, the pure part):

- connections open on the socket: the soft limit less the reserve kept for files
  (``blizzard/server/fd_limits.py``);
- connections still in their handshake, in all and per source address. A connection counts
  as pending while it is younger than the handshake limit and its peer has sent fewer bytes
  than a finished handshake takes (the kernel's count, ``TCP_INFO``): real clients handshake
  within milliseconds, so even many from one address never pile up as pending, while an
  idle flood from one address is held to ``max_pending_per_addr`` descriptors.

At a cap, a pending connection whose peer has sent nothing for ``STALL_S`` (the kernel's
``tcpi_last_data_recv``) and not finished its handshake is shut to make way for the new one;
only when there is none is the new one refused. A real client greets at once, so an idle
flood keeps its share of places but no real client of the same address (a NAT, loopback)
out. Connections through their handshake are never touched: a flood costs the flooders'
connections and, at worst, new ones, never the established ones or the process.

A socket has one monitor, so the guard also tells which connections left
(``GuardDepartures``: ``blizzard/server/departures.py``'s calls).
"""

from __future__ import annotations

import collections
import itertools
import logging
import select
import socket
import struct
import threading
import time
from dataclasses import dataclass
from typing import Callable

import zmq
from zmq.utils.monitor import parse_monitor_message

from blizzard.net.log_limit import Throttled
from blizzard.server import fd_limits

log = logging.getLogger(__name__)

_guard_ids = itertools.count(1)
EVENTS = zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED | \
    zmq.EVENT_MONITOR_STOPPED
MAX_PENDING = 512  # connections in their handshake on one socket (fewer with a low limit)
MAX_PENDING_PER_ADDR = 64  # ... from one source address
# Bytes a peer has sent once its handshake is done: the ZMTP greeting is 64, CURVE's HELLO
# 202 and its INITIATE over 250 more; NULL's READY (no keys) some 30.
GREETED_BYTES = {True: 300, False: 80}
_EVENTS, _POLLIN = int(zmq.EVENTS), int(zmq.POLLIN)
LOOK_AGAIN_S = 0.2  # how often a pending connection's byte count is read again, at most
_TCP_INFO_RECEIVED = struct.Struct("<Q")  # tcpi_bytes_received, at offset 128 (Linux 4.1+)
_TCP_INFO_RECEIVED_AT = 128
_TCP_INFO_SILENT_MS = struct.Struct("<I")  # tcpi_last_data_recv: ms since the peer last sent
_TCP_INFO_SILENT_AT = 52  # (since the connection was made, if it never sent)
STALL_S = 1.0  # a pending connection silent this long is no client greeting: evicted if need be


@dataclass(frozen=True)
class Limits:
    """The caps one server socket enforces."""

    max_open: int
    max_pending: int
    max_pending_per_addr: int
    pending_s: float  # the handshake limit: older connections are cut by libzmq anyway
    greeted_bytes: int

    @classmethod
    def for_process(cls, pending_s: float, secure: bool) -> "Limits":
        """Caps from this process's descriptor limit as it is now."""
        max_open = fd_limits.connection_fds()
        return cls(max_open=max_open, max_pending=max(1, min(MAX_PENDING, max_open // 2)),
                   max_pending_per_addr=max(1, min(MAX_PENDING_PER_ADDR, max_open // 8)),
                   pending_s=pending_s, greeted_bytes=GREETED_BYTES[secure])


@dataclass
class _Conn:
    addr: str
    since: float  # monotonic
    looked: float  # when its byte count was read last


@dataclass(frozen=True)
class Progress:
    """What the kernel says of a connection's peer (``TCP_INFO``)."""

    received: int  # bytes
    silent_s: float  # since it last sent anything (since it connected, if it never did)


class Admission:
    """Which accepted connections to keep: the bookkeeping and the caps, no sockets.

    At a cap, a pending connection whose peer has been silent ``STALL_S`` without finishing
    its handshake (no client greets that slowly) is evicted for the newcomer, the oldest
    first; only when there is none is the newcomer refused. So an idle flood holds its share
    of pending places but cannot keep a real client of the same address out.

    ``peek(fd)`` reads a connection's ``Progress`` (None: no longer ours to read).
    """

    def __init__(self, limits: Limits, peek: Callable[[int], Progress | None]) -> None:
        self.limits = limits
        self.peek = peek
        self.open: dict[int, str] = {}  # fd -> peer address, every admitted connection
        self.pending: collections.OrderedDict[int, _Conn] = collections.OrderedDict()
        self.pending_from: collections.Counter[str] = collections.Counter()
        self.admitted = 0
        self.evicted = 0
        self.refused: collections.Counter[str] = collections.Counter()  # reason -> count

    def admit(self, fd: int, addr: str, now: float) -> tuple[str | None, list[int]]:
        """Note a new connection: (None to keep it, else why it must be shut; the
        descriptors of stalled connections evicted for it, to be shut)."""
        self.forget(fd)  # a descriptor number reused: the connection it named is gone
        self._expire(now)
        evicted: list[int] = []
        why = self._over(addr, now)
        if why is not None:
            stale = self._stale(addr if why == "pending from one address" else None, now)
            if stale is not None:
                self.forget(stale)
                evicted.append(stale)
                self.evicted += 1
                why = self._over(addr, now)
        if why is not None:
            self.refused[why] += 1
            return why, evicted
        self.open[fd] = addr
        self.pending[fd] = _Conn(addr, now, -LOOK_AGAIN_S)  # looked at first when a cap is near
        self.pending_from[addr] += 1
        self.admitted += 1
        return None, evicted

    def forget(self, fd: int) -> None:
        """A connection closed."""
        self.open.pop(fd, None)
        self._unpend(fd)

    def _over(self, addr: str, now: float) -> str | None:
        """The cap a connection from ``addr`` would pass now, if any."""
        if len(self.open) >= self.limits.max_open:
            return "open"
        if len(self.pending) >= self.limits.max_pending or \
                self.pending_from[addr] >= self.limits.max_pending_per_addr:
            self._look(now)
            if len(self.pending) >= self.limits.max_pending:
                return "pending"
            if self.pending_from[addr] >= self.limits.max_pending_per_addr:
                return "pending from one address"
        return None

    def _unpend(self, fd: int) -> None:
        conn = self.pending.pop(fd, None)
        if conn is not None:
            self.pending_from[conn.addr] -= 1
            if not self.pending_from[conn.addr]:
                del self.pending_from[conn.addr]

    def _expire(self, now: float) -> None:
        """Connections past the handshake limit are no longer pending (libzmq has cut them,
        or they are through); the oldest come first."""
        while self.pending:
            fd, conn = next(iter(self.pending.items()))
            if now - conn.since < self.limits.pending_s:
                break
            self._unpend(fd)

    def _look(self, now: float) -> None:
        """Read the byte counts of pending connections not looked at lately: those that sent
        a whole handshake's worth are through and pend no more."""
        for fd, conn in list(self.pending.items()):
            if now - conn.looked < LOOK_AGAIN_S:
                continue
            conn.looked = now
            got = self.peek(fd)
            if got is not None and got.received >= self.limits.greeted_bytes:
                self._unpend(fd)

    def _stale(self, addr: str | None, now: float) -> int | None:
        """The oldest pending connection (from ``addr``, if given) stalled in its handshake."""
        for fd, conn in self.pending.items():
            if now - conn.since < STALL_S:
                return None  # the rest are younger still
            if addr is not None and conn.addr != addr:
                continue
            got = self.peek(fd)
            if got is not None and got.received < self.limits.greeted_bytes and \
                    got.silent_s >= STALL_S:
                return fd
        return None


class _Accepted:
    """An accepted descriptor libzmq owns, looked at through a socket object that never
    closes it (``detach``): no second descriptor is needed, even when none is left."""

    def __init__(self, fd: int, port: int) -> None:
        self.sock: socket.socket | None = None
        try:
            sock = socket.socket(fileno=fd)
        except OSError:  # closed meanwhile, or reused by a file
            return
        try:  # still a TCP connection to our port (not reused by a file or another socket)?
            if sock.family in (socket.AF_INET, socket.AF_INET6) and \
                    sock.getsockname()[1] == port:
                self.sock = sock
                return
        except OSError:
            pass
        finally:
            if self.sock is None:
                sock.detach()  # never closed here: the descriptor is libzmq's

    def __enter__(self) -> socket.socket | None:
        return self.sock

    def __exit__(self, *exc: object) -> None:
        if self.sock is not None:
            self.sock.detach()


def _peek(fd: int, port: int) -> Progress | None:
    with _Accepted(fd, port) as sock:
        if sock is None:
            return None
        try:
            info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
        except OSError:
            return None
        if len(info) < _TCP_INFO_RECEIVED_AT + _TCP_INFO_RECEIVED.size:
            return None
        return Progress(_TCP_INFO_RECEIVED.unpack_from(info, _TCP_INFO_RECEIVED_AT)[0],
                        _TCP_INFO_SILENT_MS.unpack_from(info, _TCP_INFO_SILENT_AT)[0] / 1000)


class ConnectionGuard:
    """Enforces ``Limits`` on one bound ROUTER socket (see the module docstring).

    A socket has one monitor, and this guard holds it; it also tells which connections ended
    (``read_departures``, for ``blizzard/server/departures.py``'s users). Its thread and the reader of
    departures take turns on the monitor under a lock: the departures read in the server's
    loop are read then, so they keep ``Departures``' ordering.

    ``close`` before the socket is closed: it stops the monitoring, and the thread closes
    its end (a monitor whose reader is gone would stall libzmq's I/O thread).
    """

    WAKE_S = 0.25  # the thread's longest sleep: the monitor's wake-up is edge-triggered, and
    # the loop reading departures may take the edge of an event it then misses (rare)

    def __init__(self, sock: zmq.Socket, limits: Limits) -> None:
        self.sock = sock
        endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.port = int(endpoint.rsplit(":", 1)[1])
        self.admission = Admission(limits, lambda fd: _peek(fd, self.port))
        self.say = Throttled(log)
        self.lock = threading.Lock()  # the monitor socket and the bookkeeping
        self._gone: set[int] | None = None  # departed fds, kept once someone reads them
        self._left: set[int] = set()  # ... ended, and no connection accepted on them since
        self._ended = False  # the monitor stopped
        self._closing = False
        inproc = f"inproc://blizzard.conn-guard.{next(_guard_ids)}"
        sock.monitor(inproc, EVENTS)
        self.monitor = sock.context.socket(zmq.PAIR)
        self.monitor.setsockopt(zmq.LINGER, 0)
        self.monitor.setsockopt(zmq.RCVHWM, 0)  # never full: libzmq's I/O thread blocks on it
        self.monitor.connect(inproc)
        self._wake_fd = self.monitor.get(zmq.FD)
        self.thread = threading.Thread(target=self._run, daemon=True,
                                       name=f"conn-guard-{self.port}")
        self.thread.start()

    @property
    def refused(self) -> dict[str, int]:
        """How many new connections were shut, by cap."""
        with self.lock:
            return dict(self.admission.refused)

    @property
    def shut(self) -> int:
        """How many connections the guard shut: new ones refused, stalled ones evicted."""
        with self.lock:
            return sum(self.admission.refused.values()) + self.admission.evicted

    def read_departures(self) -> set[int]:
        """Descriptors of the connections that ended since the last call (the first call
        starts the collecting)."""
        with self.lock:
            if self._gone is None:
                self._gone = set()
            self._drain()
            gone, self._gone = self._gone, set()
        return gone

    def departed(self, fd: int) -> bool:
        """Whether a message read from ``fd`` now is a departed connection's (as
        ``blizzard.server.departures.Departures.departed``; once ``read_departures`` was called)."""
        with self.lock:
            if fd not in self._left:
                return False
            self._drain()
            return fd in self._left

    def _run(self) -> None:
        try:
            while True:
                with self.lock:
                    self._drain()
                    if self._ended:
                        break
                select.select([self._wake_fd], [], [], self.WAKE_S)
        except zmq.ZMQError:  # the context is ending
            pass
        finally:
            with self.lock:
                self.monitor.close(linger=0)
            if not self._closing:
                log.warning("the connection guard of port %d stopped: another monitor took "
                            "the socket, or the context ended", self.port)

    def _drain(self) -> None:
        """Handle every event waiting (the lock held)."""
        monitor = self.monitor
        while not self._ended and monitor.get(_EVENTS) & _POLLIN:
            event = parse_monitor_message(monitor.recv_multipart(zmq.NOBLOCK))
            kind, fd = event["event"], int(event["value"])
            try:
                if kind == zmq.EVENT_ACCEPTED:
                    self._left.discard(fd)
                    self._accepted(fd)
                elif kind in (zmq.EVENT_DISCONNECTED, zmq.EVENT_CLOSED):
                    self.admission.forget(fd)
                    if self._gone is not None and kind == zmq.EVENT_DISCONNECTED:
                        self._gone.add(fd)
                        self._left.add(fd)
                elif kind == zmq.EVENT_MONITOR_STOPPED:
                    self._ended = True
            except Exception:  # the guard must outlive a surprise, or events pile up
                log.exception("internal error in the connection guard")

    def _accepted(self, fd: int) -> None:
        with _Accepted(fd, self.port) as sock:
            if sock is None:
                return
            try:
                addr = sock.getpeername()[0]
            except OSError:  # already gone
                return
            why, evicted = self.admission.admit(fd, addr, time.monotonic())
            if why is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)  # libzmq sees the end and closes its fd
                except OSError:
                    pass
        for stale in evicted:
            with _Accepted(stale, self.port) as old:
                if old is not None:
                    try:
                        old.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
        limits = self.admission.limits
        if evicted:
            self.say("evicted", "shut a connection silent for %.0fs in its handshake, for a new "
                     "one from %s: %d connections from that address (or %d in all) on port %d "
                     "had not finished theirs (cap)", STALL_S, addr,
                     limits.max_pending_per_addr, limits.max_pending, self.port)
        if why == "open":
            self.say(why, "shut a new connection from %s: %d connections open on port %d, "
                     "its cap (the other descriptors are kept for files)", addr,
                     limits.max_open, self.port)
        elif why == "pending":
            self.say(why, "shut a new connection from %s: %d connections on port %d have not "
                     "finished their handshake (cap)", addr, limits.max_pending, self.port)
        elif why is not None:
            self.say(why, "shut a new connection from %s: %d connections from that address "
                     "on port %d have not finished their handshake (cap)", addr,
                     limits.max_pending_per_addr, self.port)

    def close(self, timeout_s: float = 5.0) -> None:
        if self._closing:
            return
        self._closing = True
        if not self.sock.closed:
            self.sock.monitor(None, 0)  # sends MONITOR_STOPPED: the thread ends
        self.thread.join(timeout_s)
        if self.thread.is_alive():
            log.warning("the connection guard of port %d did not stop", self.port)


class GuardDepartures:
    """``blizzard.server.departures.Departures``' calls over a guard's monitor (a socket has one)."""

    def __init__(self, guard: ConnectionGuard) -> None:
        self.guard = guard
        guard.read_departures()  # collected from now on

    def read(self) -> set[int]:
        return self.guard.read_departures()

    def departed(self, fd: int) -> bool:
        return self.guard.departed(fd)

    def close(self) -> None:
        """Close the guard (before its socket; a second close does nothing)."""
        self.guard.close()


def guarded(sock: zmq.Socket, secure: bool) -> GuardDepartures:
    """Guard a bound TCP socket (its handshake limit counts connections as pending) and tell
    which of its connections left: for sockets other than a ``RouterServer``'s (the master's
    heads feed)."""
    pending_ms = sock.getsockopt(zmq.HANDSHAKE_IVL) or 30_000
    guard = ConnectionGuard(sock, Limits.for_process(pending_ms / 1000, secure))
    return GuardDepartures(guard)
