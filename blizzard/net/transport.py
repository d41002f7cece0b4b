"""ZeroMQ calls: a DEALER connection to a server (``Endpoint``), requests in flight matched to
their replies, and the bounds every Blizzard socket has. The servers' side, the ROUTER loop,
is ``blizzard/server/router.py``."""

from __future__ import annotations

import itertools
import logging
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any, cast

import zmq

from blizzard.host.log_limit import Throttled
from blizzard.net.addrs import check_addr
from blizzard.net.keys import ClientKeys
from blizzard.net.probes import Probes
from blizzard.net.secure import HandshakeWatch, connect_curve
from blizzard.wire import protocol
from blizzard.wire.errors import (
    AuthenticationFailed,
    ClientClosed,
    InvalidArgument,
    VersionMismatch,
    from_code,
)

log = logging.getLogger(__name__)
undecodable = Throttled(log)  # a peer's garbage makes a line per 10 s, not one per frame
untrusted = Throttled(log)  # answers on a data-node connection the master did not sign

_request_ids = itertools.count(1)
# Frames this process sent and received, on every Endpoint and server socket (a server's ROUTER
# adds its own): what a benchmark divides by the items moved (``bench/workers.py``).
FRAMES = {"sent": 0, "received": 0}

# ZMTP heartbeats: a peer that answers no PING within the timeout is disconnected, so idle or
# half-open connections do not hold a server's memory forever; TCP keepalive as a backstop.
HEARTBEAT_IVL_MS = 5_000
HEARTBEAT_TIMEOUT_MS = 20_000
HANDSHAKE_IVL_MS = 10_000  # a connection that has not finished the ZMTP greeting by then is cut
MAX_UNCLAIMED = 4096  # replies an endpoint keeps for requests not yet collected
_EVENTS, _POLLIN = int(zmq.EVENTS), int(zmq.POLLIN)  # plain ints: enum operators cost a call


def harden(sock: zmq.Socket[bytes], max_frame_bytes: int) -> None:
    """Bounds and keepalives every Blizzard socket has, a client's or a server's."""
    sock.setsockopt(zmq.MAXMSGSIZE, max_frame_bytes)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_IVL_MS)
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
    sock.setsockopt(zmq.HANDSHAKE_IVL, HANDSHAKE_IVL_MS)
    sock.setsockopt(zmq.TCP_KEEPALIVE, 1)
    sock.setsockopt(zmq.TCP_KEEPALIVE_IDLE, 30)
    sock.setsockopt(zmq.TCP_KEEPALIVE_INTVL, 10)


class Endpoint:
    """A DEALER connection to one server; many requests may be in flight, matched by id.

    With ``keys`` the connection is CURVE-encrypted and talks only to the holder of
    ``server_key``; a refused handshake raises ``AuthenticationFailed`` from ``wait`` (and
    from ``call`` when its time is up), instead of a silent timeout.
    """

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], addr: str,
                 keys: ClientKeys | None = None, server_key: bytes | None = None,
                 routing_id: bytes | None = None) -> None:
        self.ctx = ctx
        self.addr = check_addr(addr)
        # the id the server knows this connection by (None: one it picks): a data node that
        # answers a lease on the master's order sends to it (``master/consume/pushes.py``)
        self.routing_id = routing_id
        if keys is not None and server_key is None:
            raise InvalidArgument(f"no server key for {addr}")
        self.keys = keys
        self.server_key = server_key
        self.sock: zmq.Socket[bytes] | None = None
        self.poller: zmq.Poller | None = None  # polls ``sock`` and its handshake watch
        self.watch: HandshakeWatch | None = None
        self._closer: weakref.finalize | None = None
        self._early: dict[int, Any] = {}
        self._forgotten: dict[int, None] = {}  # requests whose replies are dropped on arrival
        self.closed = False  # by ``close``: no socket is opened again
        self.answered = False  # a reply came at some time (a ``reset`` keeps this)
        # a server of another wire version refused a request it could not address (request
        # id 0): the answer to every request in flight, until the next ``reset``
        self.version_refused: Any | None = None

    def open_socket(self) -> zmq.Socket[bytes]:
        """The DEALER socket, opened and connected if it is not: what a caller polls in a poller
        of its own (a server's loop)."""
        if self.sock is None:
            if self.closed:
                raise ClientClosed(f"the connection to {self.addr} was closed: make a new client")
            sock = self.ctx.socket(zmq.DEALER)
            harden(sock, protocol.MAX_FRAME_BYTES)
            sock.setsockopt(zmq.RECONNECT_IVL, 50)
            sock.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
            if self.routing_id is not None:
                sock.setsockopt(zmq.ROUTING_ID, self.routing_id)
            if self.keys is not None:
                assert self.server_key is not None
                connect_curve(sock, self.keys, self.server_key)
            watch = HandshakeWatch(sock, self.addr, self.keys is not None)
            try:
                sock.connect(self.addr)
            except zmq.ZMQError as exc:  # e.g. a host name that does not resolve
                self._close(sock, watch)
                raise InvalidArgument(f"cannot connect to {self.addr}: {exc}") from None
            self.sock, self.watch = sock, watch
            # An endpoint dropped without ``close`` still closes in the safe order: left to the
            # garbage collector, the monitor's reading end may go first (see HandshakeWatch).
            self._closer = weakref.finalize(self, self._close, sock, watch)
            self.poller = zmq.Poller()
            self.poller.register(sock, zmq.POLLIN)
            self.poller.register(watch.monitor, zmq.POLLIN)
        return self.sock

    @staticmethod
    def _close(sock: zmq.Socket[bytes], watch: HandshakeWatch) -> None:
        watch.close()
        sock.close(linger=0)

    @property
    def refused(self) -> AuthenticationFailed | None:
        """The handshake refusal already seen (no new events read)."""
        return self.watch.failure if self.watch is not None else None

    def handshake_failure(self) -> AuthenticationFailed | None:
        """Why the server refused this connection's handshake, if it did (None: it did not)."""
        return self.watch.poll() if self.watch is not None else None

    def silence(self, why: str, refused_s: float = 0.0) -> TimeoutError:
        """The timeout of an unanswered request (``ConnectionRefused``: no connection was made,
        attempts refused for ``refused_s`` or more)."""
        return self.watch.silence(why, refused_s) if self.watch is not None else TimeoutError(why)

    def send(self, msg: Any) -> int:
        """Queue a request; raises ``TimeoutError`` if the socket's send queue is full."""
        rid = next(_request_ids)
        try:
            # Copied into libzmq's own buffer: a zero-copy frame would leave libzmq's I/O thread
            # reading a Python object that the interpreter may free first (at exit, a segfault).
            self.open_socket().send(protocol.encode(rid, msg), zmq.NOBLOCK, copy=True)
            FRAMES["sent"] += 1
        except zmq.Again:
            self.reset()
            raise TimeoutError(f"cannot send to {self.addr}: queue full") from None
        return rid

    def take(self, rid: int) -> Any | None:
        reply = self._early.pop(rid, None)
        return reply if reply is not None else self.version_refused

    def take_early(self, rid: int) -> Any | None:
        """The reply to ``rid`` if it came (not a refusal of every request, as ``take``)."""
        return self._early.pop(rid, None)

    def has(self, rid: int) -> bool:
        """The reply to ``rid`` has arrived and not been taken."""
        return rid in self._early or self.version_refused is not None

    def received(self) -> list[int]:
        """Request ids whose replies have arrived and not been taken."""
        return list(self._early)

    def discard_received(self) -> None:
        self._early.clear()

    def forget(self, rid: int) -> None:
        """Nobody waits for the reply to ``rid`` any more (a hedged read got its answer
        elsewhere): dropped now if it is here, else when it arrives, unread by anyone."""
        if self._early.pop(rid, None) is None:
            if len(self._forgotten) >= MAX_UNCLAIMED:
                self._forgotten.pop(next(iter(self._forgotten)))
            self._forgotten[rid] = None

    def wait(self, timeout_ms: int) -> bool:
        """Wait up to ``timeout_ms`` for a reply to arrive; True if one is there to read.

        Handshake events seen meanwhile are noted (``handshake_failure``).
        """
        sock = self.open_socket()
        assert self.poller is not None
        ready = self.poller.poll(timeout_ms)
        if len(ready) == 1 and ready[0][0] is sock:
            return True
        if ready:
            self.handshake_failure()
            return cast(int, sock.get(_EVENTS)) & _POLLIN != 0
        return False

    def read_ready(self, want: int = 0) -> None:
        """Read every reply waiting now into the early-reply table, without blocking; stop
        early once the reply to request ``want`` is in (the rest wait for the next read).

        A caller reads after a poll said a reply is there, so the first ``recv`` goes
        unchecked. ``EVENTS`` then says whether another frame is there: each check is a
        system call, but cheaper than a ``recv`` that raises ``zmq.Again``.
        """
        sock = self.open_socket()
        try:
            while self.sock is sock:
                self._keep(sock.recv(zmq.NOBLOCK, copy=True))
                if (want and want in self._early) or not cast(int, sock.get(_EVENTS)) & _POLLIN:
                    return
        except zmq.Again:  # nothing was there after all
            return

    def _keep(self, body: bytes) -> None:
        FRAMES["received"] += 1
        try:
            rid, reply = protocol.decode(body)
        except Exception as exc:  # ProtocolError; anything else is a codec bug: never the caller's
            undecodable("reply", "undecodable reply from %s: %s: %s", self.addr,
                        type(exc).__name__, str(exc)[:300])
            return
        self.answered = True
        if self.watch is not None:  # the server answers: turned away no more (``silence``)
            self.watch.turned_away = 0
        if not rid and isinstance(reply, protocol.Error):  # a refusal it could not address
            if reply.code == VersionMismatch.code:  # (request ids start at 1): a server of
                self.version_refused = reply  # another wire version; fails every call now
            log.warning("%s refused a request: %s", self.addr, reply.message)
            return
        if self._forgotten and self._forgotten.pop(rid, 0) is None:
            return  # a reply nobody waits for any more (``forget``)
        if len(self._early) >= MAX_UNCLAIMED:  # replies nobody waits for must not pile up
            self._early.pop(next(iter(self._early)))
        self._early[rid] = reply

    def reset(self) -> None:
        """Drop the socket (and every request queued on it) after a timeout."""
        if self._closer is not None:
            self._closer()  # closes the socket and its watch
            self._closer = self.sock = self.watch = self.poller = None
        self._early.clear()
        self._forgotten.clear()
        self.version_refused = None

    def close(self) -> None:
        """Drop the socket for good: a later request raises ``ClientClosed`` rather than
        connecting again (``reset`` is the one that lets the next request reconnect)."""
        self.reset()
        self.closed = True


def raise_if_error(reply: Any) -> Any:
    if isinstance(reply, protocol.Error):
        raise from_code(reply.code, reply.message)
    return reply


class Replies:
    """Waits for replies on several endpoints at once and reads them into each one's table."""

    def __init__(self, endpoints: Iterable[Endpoint]) -> None:
        self.endpoints = list(endpoints)
        self.poller: zmq.Poller | None = None
        if len(self.endpoints) > 1:  # the common case, one socket, uses the endpoint's poller
            self.poller = zmq.Poller()
            for ep in self.endpoints:
                self.poller.register(ep.open_socket(), zmq.POLLIN)
                assert ep.watch is not None
                self.poller.register(ep.watch.monitor, zmq.POLLIN)

    def read(self, timeout_ms: int, want: int = 0) -> None:
        """Wait up to ``timeout_ms`` for a reply on any endpoint, then read all that are there
        (``want``: the request awaited, where only one is: see ``Endpoint.read_ready``)."""
        if self.poller is None:
            for ep in self.endpoints:
                if ep.wait(timeout_ms):
                    ep.read_ready(want)
            return
        ready = {sock for sock, _ in self.poller.poll(timeout_ms)}
        for ep in self.endpoints:
            if ep.watch is not None and ep.watch.monitor in ready:
                ep.handshake_failure()
            if ep.sock in ready:
                ep.read_ready()


def call_many(calls: Iterable[tuple[Endpoint, Any]], timeout_s: float,
              probe_s: float | None = None, also: Iterable[Endpoint] = (),
              genuine: Callable[[int, Any], bool] | None = None) -> list[Any]:
    """Send every request at once, wait for all replies; a reply is a message, a
    ``TimeoutError``, or an ``AuthenticationFailed`` (the server refused our handshake).

    With ``probe_s``, a server that may rightly hold a reply long (a master parking an
    enqueue) is sent a ``Hello`` every ``probe_s`` meanwhile: one left unanswered for two
    periods counts as a timeout of every request to that server, so a dead one is noticed soon.

    Error replies are returned as messages (``protocol.Error``); the caller decides what they mean.
    Endpoints that timed out or were refused are reset so late replies cannot be mistaken for
    new ones. ``also``: endpoints a reply may come on as well (a lease a data node answers,
    ``master/consume/pushes.py``), taken only if ``genuine(request id, reply)`` says so (a server
    there may send anything with any request id); the first reply to a request wins, a later
    one is dropped unread.
    """
    calls = list(calls)
    also = [ep for ep in also if ep.sock is not None] if genuine is not None else []
    results: list[Any] = [None] * len(calls)
    waiting: dict[int, tuple[Endpoint, int]] = {}
    for i, (ep, msg) in enumerate(calls):
        try:
            waiting[i] = (ep, ep.send(msg))
        except TimeoutError as exc:
            results[i] = exc
    deadline = time.monotonic() + timeout_s
    replies = Replies([*{ep for ep, _ in waiting.values()}, *also])
    probes = Probes(probe_s)
    while waiting:
        for i, (ep, rid) in list(waiting.items()):
            reply = ep.take(rid) or ep.refused
            if also:  # the first answer wins; the others drop theirs
                assert genuine is not None
                reply = _first_answer(reply, ep, also, rid, genuine)
            if reply is not None:
                results[i] = reply
                del waiting[i]
                if isinstance(reply, AuthenticationFailed):
                    ep.reset()
        for ep in probes.silent({ep for ep, _ in waiting.values()}):
            for i in [i for i, (e, _) in waiting.items() if e is ep]:
                results[i] = ep.silence(f"{ep.addr} stopped answering pings")
                del waiting[i]
            ep.reset()
        if not waiting:
            break
        left_ms = int((min(deadline, probes.next) - time.monotonic()) * 1000)
        if time.monotonic() >= deadline:
            break
        replies.read(max(left_ms, 1), next(iter(waiting.values()))[1] if len(waiting) == 1 else 0)
    for i, (ep, _) in waiting.items():
        results[i] = ep.handshake_failure() or \
            ep.silence(f"no reply from {ep.addr} within {timeout_s:g}s")
        ep.reset()
    return results


def _first_answer(reply: Any | None, ep: Endpoint, also: list[Endpoint], rid: int,
                  genuine: Callable[[int, Any], bool]) -> Any | None:
    """The reply to request ``rid`` (sent on ``ep``, or None if none came on it) or a
    ``genuine`` one that came on ``also`` (any other is dropped); once there is one, the
    other endpoints drop theirs when it comes."""
    source = ep if reply is not None else None
    for other in also if reply is None else ():
        candidate = other.take_early(rid)
        if candidate is None:
            continue
        if genuine(rid, candidate):
            reply, source = candidate, other
            break
        untrusted("untrusted", "dropped an answer to request %d from %s: not signed by the "
                  "master", rid, other.addr)
    if source is not None:
        for other in [ep, *also]:
            if other is not source:
                other.forget(rid)
    return reply


def call(ep: Endpoint, msg: Any, timeout_s: float) -> Any:
    """One request, one reply; raises ``TimeoutError`` or the reply's ``BlizzardError``."""
    (reply,) = call_many([(ep, msg)], timeout_s)
    if isinstance(reply, (TimeoutError, AuthenticationFailed)):
        raise reply
    return raise_if_error(reply)
