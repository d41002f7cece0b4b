"""The servers' side of ZeroMQ: a ROUTER socket bound and bounded, drained in batches, each
request with the role and key its connection authenticated with; replies sent back on it.

On TCP its guard caps the connections it accepts (``blizzard/server/conn_guard.py``).
"""

from __future__ import annotations

import logging
from typing import Any, Protocol, cast

import zmq

from blizzard.host.log_limit import Throttled
from blizzard.net.keys import ServerKeys
from blizzard.net.secure import guard, serve_curve
from blizzard.net.transport import FRAMES, harden
from blizzard.server.conn_guard import ConnectionGuard, GuardDepartures, Limits
from blizzard.server.departures import Departures, source_fd
from blizzard.wire import protocol
from blizzard.wire.errors import AuthenticationFailed, BlizzardError, ProtocolError, VersionMismatch

log = logging.getLogger(__name__)
decode_bugs = Throttled(log, level=logging.ERROR)  # anyone can send the frame: a line per 10 s

REVOKED = "revoked:"  # the User-Id noted for a connection whose key is no longer admitted
# A server cuts sooner: a connection still greeting holds one of its descriptors (and, while
# young, a place among the pending ones: blizzard/server/conn_guard.py); a real client greets in ms.
SERVER_HANDSHAKE_IVL_MS = 5_000
RECEIVE_HWM = 256  # frames queued per peer before ZeroMQ stops reading its socket
# Replies queued per peer before ZeroMQ drops more (a peer that never reads): libzmq's default.
# A count, not bytes: fewer would bound a data node's payload replies, but a pass answers up to
# 512 requests of one peer faster than ZeroMQ sends them, and the excess would be dropped.
SEND_HWM = 1000
PASS_BYTES = 64 * 1024 * 1024  # request bytes a server takes in one loop pass
_EVENTS, _POLLIN = int(zmq.EVENTS), int(zmq.POLLIN)  # plain ints: enum operators cost a call
_RCVMORE = int(zmq.RCVMORE)


def bind_router(ctx: zmq.Context[zmq.Socket[bytes]], addr: str,
                max_frame_bytes: int = protocol.MAX_FRAME_BYTES, keys: ServerKeys | None = None,
                send_hwm: int = SEND_HWM, pushes: bool = False) -> zmq.Socket[bytes]:
    """A server's ROUTER socket, bounded in message size and queues, bound to ``addr``;
    a CURVE server admitting only the keys of ``keys.directory`` when ``keys`` is given.
    ``pushes``: it also sends messages nobody asked it for on this connection (a data node's
    ``Pushed``), so a send to a peer not connected fails instead of vanishing, and a
    client's reconnection takes over the routing id it chose (``Endpoint``'s
    ``routing_id``) from its old connection, which may linger.

    The bounds are per frame and per message: libzmq holds a message of many frames whole
    until its last frame has come, and no socket option caps that (see ``receive``).
    """
    sock = ctx.socket(zmq.ROUTER)
    harden(sock, max_frame_bytes)
    sock.setsockopt(zmq.HANDSHAKE_IVL, SERVER_HANDSHAKE_IVL_MS)
    if keys is not None:
        serve_curve(sock, keys)
    sock.setsockopt(zmq.RCVHWM, RECEIVE_HWM)
    sock.setsockopt(zmq.SNDHWM, send_hwm)
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1 if pushes else 0)
    if pushes:
        sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
    sock.bind(addr)
    return sock


def error_reply(exc: BlizzardError) -> protocol.Error:
    return protocol.Error(code=exc.code, message=exc.message)


class KeyDirectory(Protocol):
    """The admitted keys, asked per message (``blizzard/net/secure.py``)."""

    def current(self, user_id: str) -> bool: ...


class ConnectionEnds(Protocol):
    """Which connections ended since last asked (``Departures``, ``GuardDepartures``)."""

    def read(self) -> set[int]: ...

    def close(self) -> None: ...


class Router(Protocol):
    """What a server's loop uses of its socket: ``RouterServer``, or a test's stand-in
    (``tests/support/in_process_master.py``), which implements all of it."""

    @property
    def admitted(self) -> KeyDirectory | None:
        """The admitted keys; None: security off."""

    @property
    def poller(self) -> zmq.Poller | None:
        """What the loop's wake pipe joins; None: nothing to poll."""

    def receive(self, timeout_ms: int, ready: bool = False) -> list[tuple[bytes, int, Any]]: ...

    def reply(self, peer: bytes, rid: int, msg: Any) -> None: ...

    def role_of(self, peer: bytes) -> str | None: ...

    def key_of(self, peer: bytes) -> str: ...

    def fd_of(self, peer: bytes) -> int: ...

    def departures(self) -> ConnectionEnds | None: ...

    def close(self) -> None: ...


class RouterServer:
    """The receive side of a server: drains a ROUTER socket in batches and sends replies.

    On TCP its ``guard`` caps the connections it accepts (``blizzard/server/conn_guard.py``).
    """

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], addr: str, max_batch: int = 512,
                 max_frame_bytes: int = protocol.MAX_FRAME_BYTES,
                 keys: ServerKeys | None = None, send_hwm: int = SEND_HWM,
                 pushes: bool = False) -> None:
        self.sock = bind_router(ctx, addr, max_frame_bytes, keys, send_hwm, pushes)
        self.secure = keys is not None
        # the key directory's current keys: a revoked key's open connection stops working
        self.admitted = guard(ctx, keys.directory).keys if keys is not None else None
        self.guard = ConnectionGuard(self.sock, Limits.for_process(
            SERVER_HANDSHAKE_IVL_MS / 1000)) if addr.startswith("tcp://") else None
        self.proven: set[int] = set()  # without keys: this batch's descriptors, for the guard
        self.roles: dict[bytes, str] = {}  # this batch's connections -> "ROLE:KEY" (User-Id)
        # ... -> their descriptors (``blizzard/server/departures.py``)
        self.fds: dict[bytes, int] = {}
        self.poller = zmq.Poller()  # made once: ``Socket.poll`` would build one per call
        self.poller.register(self.sock, zmq.POLLIN)
        self.max_batch = max_batch

    def receive(self, timeout_ms: int, ready: bool = False) -> list[tuple[bytes, int, Any]]:
        """Up to ``max_batch`` decoded requests (``PASS_BYTES`` at most) as (peer, rid, message).
        ``ready``: the caller's own poll just said a request is waiting (no check first).

        A request that fails to decode is answered with an error at once and not returned;
        so is a message of more than one body frame, whose extra frames are dropped as they
        are read, never kept.
        """
        out: list[tuple[bytes, int, Any]] = []
        self.roles = {}
        self.fds = {}
        sock = self.sock
        if not ready and not cast(int, sock.get(_EVENTS)) & _POLLIN \
                and not self.poller.poll(timeout_ms):
            return out
        taken = 0
        # Each ``EVENTS`` is a system call: the first message goes unchecked (one is there),
        # one check says whether a second is; past it, ``Again`` (an exception, dearer than
        # one check, cheaper than many) ends the pass
        read = 0
        while len(out) < self.max_batch and taken < PASS_BYTES:
            if read == 1 and not cast(int, sock.get(_EVENTS)) & _POLLIN:
                break
            try:
                peer, body, extra = self._frames()
            except zmq.Again:
                break
            read += 1
            if extra or body is None:
                if extra:
                    self.reply(peer, 0, protocol.Error(
                        "protocol", f"expected one body frame, got {extra + 1}"))
                continue
            taken += len(body)
            if self.roles.get(peer) == REVOKED:  # its key was removed, retired or expired
                self.reply(peer, protocol.peek_request_id(body) or 0, protocol.Error(
                    AuthenticationFailed.code, "this connection's key was revoked (removed, "
                    "retired or past its grace period): connect with a current key"))
                continue
            try:
                rid, msg = protocol.decode(body)
            except VersionMismatch as exc:  # answered in the layout that peer's version reads
                self._send(peer, protocol.refusal(body, exc))
                continue
            except ProtocolError as exc:
                self.reply(peer, protocol.peek_request_id(body) or 0, error_reply(exc))
                continue
            except Exception as exc:  # a decoder bug must cost one request, never the server
                decode_bugs("decode", "internal error decoding a request: %s: %s",
                            type(exc).__name__, str(exc)[:300])
                self.reply(peer, protocol.peek_request_id(body) or 0,
                           protocol.Error("internal",
                                          f"internal error decoding: {type(exc).__name__}"))
                continue
            out.append((peer, rid, msg))
        FRAMES["received"] += len(out)
        if self.guard is not None:  # a message read proves its connection (conn_guard.py)
            self.guard.established(self.fds.values() if self.secure else self.proven)
            self.proven = set()
        return out

    def _frames(self) -> tuple[bytes, bytes | None, int]:
        """One message: (peer, its first body frame, how many more it had), noting the role
        its connection authenticated with. Frames past the first body are read and dropped.

        The role is read from every message, never remembered across batches: a peer may
        choose its routing id, so an id is no proof of the connection it once named. Two
        connections with one id and different roles in one batch both count as unknown.
        Raises ``zmq.Again`` when no message is waiting.
        """
        sock = self.sock
        if self.secure:  # the role is a property of the frame: take it as a Frame
            first = sock.recv(zmq.NOBLOCK, copy=False)
            peer = first.bytes
            role = cast(str, first.get("User-Id"))  # a property ZMQ sets: text
            self.fds[peer] = source_fd(first)
            if self.roles.setdefault(peer, role) != role:
                self.roles[peer] = ""
            if self.admitted is not None and not self.admitted.current(role):
                self.roles[peer] = REVOKED
        elif self.guard is not None:  # its descriptor, for the guard
            first = sock.recv(zmq.NOBLOCK, copy=False)
            peer = first.bytes
            self.proven.add(source_fd(first))
        else:
            peer = sock.recv(zmq.NOBLOCK)
        body, extra = None, 0
        if sock.get(_RCVMORE):
            body = sock.recv(zmq.NOBLOCK)
        while sock.get(_RCVMORE):
            self.sock.recv(zmq.NOBLOCK, copy=False)
            extra += 1
        return peer, body, extra

    def role_of(self, peer: bytes) -> str | None:
        """The role (``node``, ``client``, ``admin``; "" unknown) of the key ``peer``
        authenticated with, for a request of the batch ``receive`` returned last; None when
        the server runs without security (every peer may do everything)."""
        return self.roles.get(peer, "").partition(":")[0] if self.secure else None

    def key_of(self, peer: bytes) -> str:
        """The public key (z85) ``peer`` authenticated with, like ``role_of`` ("" unknown or
        security off): a data node's key is bound to its node id."""
        return self.roles.get(peer, "").partition(":")[2]

    def fd_of(self, peer: bytes) -> int:
        """The descriptor of ``peer``'s connection, like ``role_of`` (-1: unknown or security
        off), which a ``Departures`` of this socket names when the connection ends."""
        return self.fds.get(peer, -1)

    def reply(self, peer: bytes, rid: int, msg: Any) -> None:
        try:
            body = protocol.encode(rid, msg)
        except Exception:  # a reply we cannot encode is a bug; the client times out and retries
            log.exception("cannot encode a %s reply", protocol.op_name(msg))
            return
        self._send(peer, body)

    def push(self, peer: bytes, rid: int, msg: Any) -> bool:
        """Send ``msg`` as the answer to request ``rid`` of ``peer``, which it did not send
        here (a data node's ``Pushed``): False if it cannot go (``peer`` is not connected, or
        its queue is full), so whoever ordered it answers another way."""
        return self._send(peer, protocol.encode(rid, msg))

    def _send(self, peer: bytes, body: bytes) -> bool:
        """Whether it went: a peer gone or whose queue is full times out and retries."""
        try:
            self.sock.send_multipart([peer, body], zmq.NOBLOCK, copy=True)  # see Endpoint.send
        except zmq.ZMQError as exc:
            log.debug("reply to a departed peer dropped: %s", exc)
            return False
        FRAMES["sent"] += 1
        return True

    def departures(self) -> Departures | GuardDepartures:
        """What tells which of this socket's connections ended (``read``, ``close``): on TCP
        the guard's, which holds the socket's one monitor (a second would replace it)."""
        return Departures(self.sock) if self.guard is None else GuardDepartures(self.guard)

    def close(self) -> None:
        if self.guard is not None:
            self.guard.close()  # first: its monitor must not outlive the socket's events
        self.sock.close(linger=0)
