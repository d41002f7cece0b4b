"""Caps on the connections a server socket accepts, so that no one without a key can take
its file descriptors.

libzmq accepts every TCP connection and keeps it until the handshake limit cuts one that has
not finished; it has no option to cap them. A flood of plain connections that never greet
(or greet a byte at a time, or send a frame header and stop) would hold a descriptor each
until the process could open no file (a WAL segment, a LevelDB table) and no client could
connect. The ``ConnectionGuard`` watches a bound socket's monitor (a ``RouterServer``'s, the
master's heads feed) in a thread of its own: each accepted connection (``EVENT_ACCEPTED``
carries its descriptor) is looked at, and shut at once (``shutdown`` on the descriptor:
libzmq then closes it itself) when it would pass one of three caps (``Admission``, the pure
part):

- connections open in the process: the soft limit less the reserve kept for files
  (``blizzard/host/fd_limits.py``), one budget for every guarded socket of the process;
- connections still pending, in all and per source address. A connection pends until it is
  proven: the server read a message from it (``established``: a request on a
  ``RouterServer``, a subscription on the heads feed; each message names its descriptor,
  ``zmq.SRCFD``), which with keys only a peer whose key was let in can send; or it outlived
  the handshake limit (libzmq cuts every connection that has not finished its handshake by
  then). Nothing a peer sends short of a message counts (bytes of a greeting trickled, a
  frame header and no frame): the kernel's byte counts once did, and were fooled.

At a cap, the oldest pending connection (of the newcomer's address, at that address's cap)
that is ``EVICT_AGE_S`` old is shut to make way for the newcomer: a real client is through
its handshake and sends within milliseconds, so whatever pends that long is no client
greeting (however busily it trickles); only when there is none is the newcomer refused. So a
flood holds its share of pending places only by making new connections faster than one per
place each ``EVICT_AGE_S``, and cannot keep a real client of the same address (a NAT,
loopback) out by going slowly. Proven connections are never touched: a flood costs the
flooders' connections and, at worst, new ones, never the established ones or the process.

A socket has one monitor, so the guard also tells which connections left
(``GuardDepartures``: ``blizzard/server/departures.py``'s calls).
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import logging
import select
import socket
import struct
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import cast

import zmq
from zmq.utils.monitor import parse_monitor_message

from blizzard.host import fd_limits
from blizzard.host.log_limit import Throttled

log = logging.getLogger(__name__)

_guard_ids = itertools.count(1)
EVENTS = zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED | \
    zmq.EVENT_MONITOR_STOPPED
MAX_PENDING = 512  # connections not yet proven on one socket (fewer with a low limit)
MAX_PENDING_PER_ADDR = 64  # ... from one source address
# A pending connection this old is no client handshaking (those take milliseconds, and send
# their first message at once): at a cap, it makes way for a newcomer, the oldest first.
EVICT_AGE_S = 1.0
_EVENTS, _POLLIN = int(zmq.EVENTS), int(zmq.POLLIN)


@dataclass(frozen=True)
class Limits:
    """The caps a server socket enforces (``max_open``: the process's, all sockets)."""

    max_open: int
    max_pending: int
    max_pending_per_addr: int
    pending_s: float  # the handshake limit: older connections are cut by libzmq, or through

    @classmethod
    def for_process(cls, pending_s: float) -> Limits:
        """Caps from this process's descriptor limit as it is now."""
        max_open = fd_limits.connection_fds()
        return cls(max_open=max_open, max_pending=max(1, min(MAX_PENDING, max_open // 2)),
                   max_pending_per_addr=max(1, min(MAX_PENDING_PER_ADDR, max_open // 8)),
                   pending_s=pending_s)


@dataclass
class _Conn:
    addr: str
    since: float  # monotonic


class Admission:
    """Which accepted connections of one socket to keep: the bookkeeping and the caps, no
    sockets.

    Open connections take their places from ``budget``, which the process's other guarded
    sockets share (by default one of its own). At a cap, the oldest pending connection
    ``EVICT_AGE_S`` old (of the newcomer's address, at that address's cap) is evicted for the
    newcomer; only when there is none is the newcomer refused.
    """

    def __init__(self, limits: Limits, budget: fd_limits.ConnectionBudget | None = None) -> None:
        self.limits = limits
        self.budget = budget if budget is not None else fd_limits.ConnectionBudget()
        self.open: dict[int, str] = {}  # fd -> peer address, every admitted connection
        self.pending: collections.OrderedDict[int, _Conn] = collections.OrderedDict()
        self.pending_from: collections.Counter[str] = collections.Counter()
        self.admitted = 0
        self.evicted = 0
        self.refused: collections.Counter[str] = collections.Counter()  # reason -> count

    def admit(self, fd: int, addr: str, now: float) -> tuple[str | None, list[int]]:
        """Note a new connection: (None to keep it, else why it must be shut; the
        descriptors of pending connections evicted for it, to be shut)."""
        self.forget(fd)  # a descriptor number reused: the connection it named is gone
        self._expire(now)
        evicted: list[int] = []
        while True:  # at most two rounds: an eviction frees a place under every cap
            why = self._over(addr)
            if why is None or len(evicted) >= 2:
                break
            old = self._oldest(addr if why == "pending from one address" else None, now)
            if old is None:
                break
            self.forget(old)
            evicted.append(old)
            self.evicted += 1
        if why is None and not self.budget.take(self.limits.max_open):
            why = "open"  # taken meanwhile by another socket of the process
        if why is not None:
            self.refused[why] += 1
            return why, evicted
        self.open[fd] = addr
        self.pending[fd] = _Conn(addr, now)
        self.pending_from[addr] += 1
        self.admitted += 1
        return None, evicted

    def established(self, fd: int) -> None:
        """Connection ``fd`` is proven (a message was read from it): it pends no more."""
        self._unpend(fd)

    def forget(self, fd: int) -> None:
        """A connection closed."""
        if self.open.pop(fd, None) is not None:
            self.budget.give()
        self._unpend(fd)

    def forget_all(self) -> None:
        """The socket closes: its connections give their places back."""
        self.budget.give(len(self.open))
        self.open.clear()
        self.pending.clear()
        self.pending_from.clear()

    def _over(self, addr: str) -> str | None:
        """The cap a connection from ``addr`` would pass now, if any."""
        if self.budget.used >= self.limits.max_open:
            return "open"
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

    def _oldest(self, addr: str | None, now: float) -> int | None:
        """The oldest pending connection (from ``addr``, if given) ``EVICT_AGE_S`` old."""
        for fd, conn in self.pending.items():
            if now - conn.since < EVICT_AGE_S:
                return None  # the rest are younger still
            if addr is None or conn.addr == addr:
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


_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: a close resets the connection


def _refuse(sock: socket.socket) -> None:
    """End a connection libzmq holds, so that its peer can tell: libzmq reads the end (a
    shutdown of the reading side) and closes the descriptor, which with a zero linger resets
    the connection. The peer's handshake then fails with ECONNRESET, where a server that
    refused its key (or that its key does not match) ends it with a plain close
    (``blizzard.net.secure.HandshakeWatch`` tells them apart)."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
        sock.shutdown(socket.SHUT_RD)
    except OSError:  # gone meanwhile
        pass


class ConnectionGuard:
    """Enforces ``Limits`` on one bound ROUTER socket (see the module docstring).

    A socket has one monitor, and this guard holds it; it also tells which connections ended
    (``read_departures``, for ``blizzard/server/departures.py``'s users). Its thread and the reader
    of departures take turns on the monitor under a lock: the departures read in the server's loop
    are read then, so they keep ``Departures``' ordering.

    ``close`` before the socket is closed: it stops the monitoring, and the thread closes
    its end (a monitor whose reader is gone would stall libzmq's I/O thread).
    """

    WAKE_S = 0.25  # the thread's longest sleep: the monitor's wake-up is edge-triggered, and
    # the loop reading departures may take the edge of an event it then misses (rare)

    def __init__(self, sock: zmq.Socket, limits: Limits) -> None:
        self.sock = sock
        endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.port = int(endpoint.rsplit(":", 1)[1])
        self.admission = Admission(limits, fd_limits.process_connections())
        self.say = Throttled(log)
        self.lock = threading.Lock()  # the monitor socket and the bookkeeping
        self._gone: set[int] | None = None  # departed fds, kept once someone reads them
        self._left: set[int] = set()  # ... ended, and no connection accepted on them since
        # fd -> the peer (address, port) accepted on it: an fd is shut as evicted only if it
        # still names that connection (under a flood the events lag, and numbers are reused)
        self._peers: dict[int, tuple] = {}
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
        """How many connections the guard shut: new ones refused, pending ones evicted."""
        with self.lock:
            return sum(self.admission.refused.values()) + self.admission.evicted

    def established(self, fds: Iterable[int]) -> None:
        """The server read a message from each of ``fds`` (``source_fd``, -1 for none): their
        connections are proven, they pend no more. The events waiting are handled first, so
        a connection accepted a moment ago is known before it is proven."""
        with self.lock:
            self._drain()
            for fd in fds:
                if fd >= 0:
                    self.admission.established(fd)

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
        if monitor.closed:  # the thread ended (the context ends): nothing more will come
            return
        while not self._ended and monitor.get(_EVENTS) & _POLLIN:
            event = parse_monitor_message(monitor.recv_multipart(zmq.NOBLOCK))
            kind, fd = event["event"], int(event["value"])
            try:
                if kind == zmq.EVENT_ACCEPTED:
                    self._left.discard(fd)
                    self._accepted(fd)
                elif kind in (zmq.EVENT_DISCONNECTED, zmq.EVENT_CLOSED):
                    self.admission.forget(fd)
                    self._peers.pop(fd, None)
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
                peer = sock.getpeername()
            except OSError:  # already gone
                return
            addr = peer[0]
            why, evicted = self.admission.admit(fd, addr, time.monotonic())
            if why is not None:
                _refuse(sock)
            else:
                self._peers[fd] = peer
        for stale in evicted:
            expected = self._peers.pop(stale, None)
            with _Accepted(stale, self.port) as old:
                with contextlib.suppress(OSError):
                    if old is not None and old.getpeername() == expected:
                        _refuse(old)
        limits = self.admission.limits
        if evicted:
            self.say("evicted", "shut %d connection(s) pending %.0fs or more (no message sent "
                     "yet) on port %d, for a new one from %s: at the cap of %d pending from "
                     "one address, %d in all, or %d open in the process", len(evicted),
                     EVICT_AGE_S, self.port, addr, limits.max_pending_per_addr,
                     limits.max_pending, limits.max_open)
        if why == "open":
            self.say(why, "shut a new connection from %s on port %d: %d connections open in "
                     "this process, its cap (the other descriptors are kept for files)", addr,
                     self.port, limits.max_open)
        elif why == "pending":
            self.say(why, "shut a new connection from %s: %d connections on port %d have not "
                     "sent their first message (cap)", addr, limits.max_pending, self.port)
        elif why is not None:
            self.say(why, "shut a new connection from %s: %d connections from that address "
                     "on port %d have not sent their first message (cap)", addr,
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
        with self.lock:
            self.admission.forget_all()  # the process's budget gets their places back


class GuardDepartures:
    """``blizzard.server.departures.Departures``' calls over a guard's monitor (a socket has
    one)."""

    def __init__(self, guard: ConnectionGuard) -> None:
        self.guard = guard
        guard.read_departures()  # collected from now on

    def read(self) -> set[int]:
        return self.guard.read_departures()

    def established(self, fds: Iterable[int]) -> None:
        """Connections proven by a message read from them (``ConnectionGuard.established``)."""
        self.guard.established(fds)

    def departed(self, fd: int) -> bool:
        return self.guard.departed(fd)

    def close(self) -> None:
        """Close the guard (before its socket; a second close does nothing)."""
        self.guard.close()


def guarded(sock: zmq.Socket) -> GuardDepartures:
    """Guard a bound TCP socket (connections pend until ``established``, or past its handshake
    limit) and tell which of its connections left: for sockets other than a
    ``RouterServer``'s (the master's heads feed)."""
    pending_ms = cast(int, sock.getsockopt(zmq.HANDSHAKE_IVL)) or 30_000
    guard = ConnectionGuard(sock, Limits.for_process(pending_ms / 1000))
    return GuardDepartures(guard)
