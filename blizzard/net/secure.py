"""CURVE on sockets: a server's side with its ZAP handler, a client's side with its pinned key,
and turning a failed handshake into ``AuthenticationFailed``.

Every server socket encrypts and authenticates with CURVE. ZeroMQ asks the context's ZAP
handler (``Gatekeeper``, pyzmq's authenticator running in a thread) about each new
connection; it lets in only public keys from the key directory and names the peer's role,
which arrives with every message as the frame property ``User-Id``.
"""

from __future__ import annotations

import errno
import itertools
import logging
import os
import threading
import time
import weakref

import zmq
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils.monitor import parse_monitor_message

from blizzard.host.log_limit import Throttled
from blizzard.net import keys as k
from blizzard.wire.errors import AuthenticationFailed

log = logging.getLogger(__name__)

_watch_ids = itertools.count(1)
REFUSALS_LOG_EVERY_S = 10.0  # one line per reason this often, with how many were refused
HANDSHAKE_FAILED = (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                    | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
CONNECTING = zmq.EVENT_CONNECTED | zmq.EVENT_CONNECT_RETRIED


class ConnectionRefused(TimeoutError):
    """A request's time ran out without a connection ever being made: the server's host
    refused every attempt (nothing listens at that port) or could not be reached."""


class _Directory:
    """The ZAP handler's view of the key directory, re-read when it changes.

    It is re-read when its modification time changes and, at most once a second, when an
    unknown key knocks (a file system with coarse timestamps may not show a change). A
    reading that fails in any way (the directory or a key file cannot be opened: no
    descriptor left, no permission) keeps the last keys read, and is tried again at the next
    look: a key counts as gone only when the directory was read and its file was not there.
    (Taking a failed reading for "no keys" once revoked every open connection of a server
    out of descriptors.) The handler thread must never die, or no connection would be
    admitted again.
    """

    RETRY_S = 1.0
    RECHECK_S = 0.25  # open connections learn of a removed key this late at most

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.stamp: tuple[int, int] | None = None
        self.read_at = 0.0
        self.checked_at = 0.0
        self.verdicts: dict[str, bool] = {}  # User-Id -> still admitted, since the last check
        self.expires_at = float("inf")  # unix time the next rotated key's grace ends
        self.roles: dict[bytes, str] = {}
        self.lock = threading.Lock()
        # anyone who reaches a port can knock with a random key, as often as they like
        self.refusals = Throttled(log, REFUSALS_LOG_EVERY_S)
        # a failed reading is tried again at each look (4 a second): one line per interval
        self.failures = Throttled(log, REFUSALS_LOG_EVERY_S, logging.ERROR)

    def role(self, public: bytes) -> str | None:
        with self.lock:
            self._read(public not in self.roles)
            return self.roles.get(public)

    def _read(self, unknown: bool) -> None:
        """Read the directory again if it changed, an old key's grace ended, or (``unknown``)
        an unknown key knocks and the last read is ``RETRY_S`` old."""
        try:
            st = os.stat(self.directory)
            stamp = (st.st_mtime_ns, st.st_ino)
            now = time.monotonic()
            if stamp != self.stamp or time.time() >= self.expires_at or \
                    (unknown and now - self.read_at >= self.RETRY_S):
                roles = k.authorized(self.directory)
                expires_at = k.next_expiry(self.directory)
                # only a whole reading replaces the keys; a failed one leaves the stamp
                # as it was, so the next look reads again
                self.roles, self.expires_at = roles, expires_at
                self.stamp, self.read_at = stamp, now
                log.info("%d keys allowed from %s", len(self.roles), self.directory)
        except Exception as exc:  # keep serving with the keys read last
            self.failures("unreadable", "cannot read the key directory %s (%s: %s): the %d "
                          "keys read before stay allowed until it can be read", self.directory,
                          type(exc).__name__, exc, len(self.roles))

    def current(self, user_id: str) -> bool:
        """True while the key a connection authenticated with (its User-Id, ``ROLE:KEY``) is
        still in the directory with that role: a removed, retired or expired key's open
        connections stop working too. Called per message, so the directory is looked at
        (one ``stat``) at most every ``RECHECK_S``."""
        now = time.monotonic()
        if now - self.checked_at >= self.RECHECK_S:
            self.checked_at = now
            with self.lock:
                self._read(False)
            self.verdicts = {}
        verdict = self.verdicts.get(user_id)
        if verdict is None:
            role, _, key = user_id.partition(":")
            verdict = bool(role) and self.roles.get(key.encode()) == role
            if len(self.verdicts) < 10_000:  # one per key in use; a bound all the same
                self.verdicts[user_id] = verdict
        return verdict

    def callback(self, domain: str, public: bytes) -> bool:  # pyzmq's credentials provider
        """A known key; on a socket of domain ``blizzard:ROLE,...``, of one of those roles."""
        role = self.role(public)
        if role is None:
            self.refusals("unknown key", "refused a connection with an unknown key %s",
                          public[:8].decode())
            return False
        _, _, only = domain.partition(":")
        if only and role not in only.split(","):
            self.refusals(f"{role} key on {only}", "refused a connection with a %s key %s: "
                          "this socket serves %s keys only", role, public[:8].decode(),
                          only.replace(",", " and "))
            return False
        return True


class Gatekeeper(ThreadAuthenticator):
    """The ZAP handler of one context: known keys only, each peer's User-Id its role and key."""

    def __init__(self, ctx: zmq.Context, directory: str) -> None:
        super().__init__(ctx, log=logging.getLogger("blizzard.zap"))
        self.keys = _Directory(directory)

    def curve_user_id(self, client_public_key: bytes) -> str:
        """``ROLE:KEY`` (the z85 public key): the role says what a peer may do, the key who it
        is (a data node's key is bound to its node id)."""
        from zmq.utils import z85
        public = z85.encode(client_public_key)
        role = self.keys.role(public)
        return f"{role}:{public.decode()}" if role else ""


_gatekeepers: weakref.WeakKeyDictionary[zmq.Context, Gatekeeper] = weakref.WeakKeyDictionary()


def guard(ctx: zmq.Context, directory: str) -> Gatekeeper:
    """Start (once per context) the ZAP handler that admits the keys in ``directory``."""
    gate = _gatekeepers.get(ctx)
    if gate is not None:
        if os.path.realpath(gate.keys.directory) != os.path.realpath(directory):
            raise AuthenticationFailed("two key directories in one ZeroMQ context")
        return gate
    gate = Gatekeeper(ctx, directory)
    gate.keys.role(b"")  # read the keys now: a directory gone later keeps these
    gate.start()
    gate.configure_curve_callback(k.ZAP_DOMAIN, credentials_provider=gate.keys)
    _gatekeepers[ctx] = gate
    return gate


def serve_curve(sock: zmq.Socket, server: k.ServerKeys,
                roles: tuple[str, ...] = ()) -> None:
    """Make ``sock`` a CURVE server admitting the keys in ``server.directory`` (before bind);
    given ``roles``, only the keys of those roles."""
    gate = guard(sock.context, server.directory)
    domain = k.ZAP_DOMAIN + (":" + ",".join(sorted(roles)) if roles else "")
    if domain not in gate.credentials_providers:
        gate.configure_curve_callback(domain, credentials_provider=gate.keys)
    sock.setsockopt(zmq.CURVE_SERVER, 1)
    sock.setsockopt(zmq.CURVE_PUBLICKEY, server.public)
    sock.setsockopt(zmq.CURVE_SECRETKEY, server.secret)
    sock.setsockopt(zmq.ZAP_DOMAIN, domain.encode())


def connect_curve(sock: zmq.Socket, mine: k.ClientKeys, server_public: bytes) -> None:
    """Make ``sock`` a CURVE client that talks only to the holder of ``server_public``."""
    sock.setsockopt(zmq.CURVE_PUBLICKEY, mine.public)
    sock.setsockopt(zmq.CURVE_SECRETKEY, mine.secret)
    sock.setsockopt(zmq.CURVE_SERVERKEY, server_public)


class HandshakeWatch:
    """Watches one client socket for refused handshakes (a monitor socket, polled with it),
    and for connections refused outright, which ZeroMQ otherwise hides by retrying quietly.

    A server that refuses the key (``FAILED_AUTH``) or the mechanism (``FAILED_PROTOCOL``
    with a mechanism mismatch) says so; a handshake cut short without detail is also what a
    server that restarts mid-greeting looks like, so only ``UNEXPLAINED`` of those in a row,
    with no handshake succeeding in between, count as a wrong server key. A server's
    connection guard that turns a connection away (over a cap: busy, or flooded) resets it
    (``blizzard/server/conn_guard.py``), so that handshake fails with ECONNRESET, where a
    server whose key is not the one pinned closes it plainly (EPIPE): once one was reset
    since the last handshake that succeeded, failures without detail are taken for the
    server turning this process away, no refusal of its key; ZeroMQ connects again, and a
    request that gets no reply says why (``silence``).
    """

    UNEXPLAINED = 3
    UNEXPLAINED_S = 1.0  # ... and over this long at least: a busy server's resets may come
    # before this process writes, and then show as a plain close too (a third of them, flooded)

    def __init__(self, sock: zmq.Socket, addr: str, secure: bool) -> None:
        # ZeroMQ's I/O thread sends each event to the monitor with a blocking send: if the
        # reading end is full or gone while monitoring is on, that thread stops for good and
        # every socket of the context with it. So: a name never used before (pyzmq's default
        # names it by the socket's fd, which a new socket reuses before the old name is freed),
        # no limit on unread events (one per handshake), and ``close`` stops the monitoring
        # before it closes the reading end.
        inproc = f"inproc://blizzard.handshake-watch.{next(_watch_ids)}"
        sock.monitor(inproc, HANDSHAKE_FAILED | zmq.EVENT_HANDSHAKE_SUCCEEDED | CONNECTING)
        self.sock = sock
        self.monitor = sock.context.socket(zmq.PAIR)
        self.monitor.setsockopt(zmq.LINGER, 0)
        self.monitor.setsockopt(zmq.RCVHWM, 0)
        self.monitor.connect(inproc)
        self.addr = addr
        self.secure = secure
        self.unexplained = 0
        self.unexplained_since = 0.0  # monotonic time of the first of them
        # connections the server reset in the handshake since it last answered (``answered``):
        # a handshake that got through and was then cut unanswered does not clear them
        self.turned_away = 0
        self.failure: AuthenticationFailed | None = None
        self.connected = False  # a TCP connection was made at least once
        self.refusals = 0  # attempts that failed before any connection was made
        self.refused_at = 0.0  # when the first of them failed (monotonic)

    def poll(self) -> AuthenticationFailed | None:
        """Read the events waiting; the refusal seen, if any (the first says most)."""
        while self.monitor.poll(0):
            event = parse_monitor_message(self.monitor.recv_multipart())
            kind = event["event"]
            if kind == zmq.EVENT_CONNECTED:
                self.connected = True
                continue
            if kind == zmq.EVENT_CONNECT_RETRIED:
                if not self.connected:  # after a connection: a peer that left
                    self.refusals += 1
                    self.refused_at = self.refused_at or time.monotonic()
                continue
            if kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.unexplained, self.failure = 0, None
                continue
            if kind == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL and \
                    event["value"] == errno.ECONNRESET:
                self.turned_away += 1  # the server's guard: busy, or flooded
                continue
            if kind == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
                self.unexplained += 1
                now = time.monotonic()
                if self.unexplained == 1:
                    self.unexplained_since = now
                # a reset that comes before this process writes shows as EPIPE too (one in
                # ten on loopback, a third under a flood): once the server reset one, the
                # others are taken for that too
                if self.unexplained < self.UNEXPLAINED or self.turned_away or \
                        now - self.unexplained_since < self.UNEXPLAINED_S:
                    continue
            elif kind == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL \
                    and event["value"] != zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
                continue  # a garbled greeting, not a refusal
            if self.failure is None:
                self.failure = AuthenticationFailed(self._why(kind))
        return self.failure

    def silence(self, why: str, refused_s: float = 0.0) -> TimeoutError:
        """The timeout of a request that got no reply (``why``): ``ConnectionRefused`` if no
        connection was ever made and attempts were refused (for ``refused_s`` at least), so a
        caller may give up at once."""
        self.poll()
        if self.refusals and not self.connected \
                and time.monotonic() - self.refused_at >= refused_s:
            return ConnectionRefused(f"{why}: {self.addr} refused the connection (nothing "
                                     "listens there)")
        if self.turned_away:
            return TimeoutError(f"{why}: the server closed the connection before the "
                                f"handshake ({self.turned_away} times; busy or flooded?)")
        return TimeoutError(why)

    def _why(self, kind: int) -> str:
        if not self.secure:
            return (f"{self.addr} requires keys (CURVE) and this process has none: pass "
                    f"keys=DIR or set {k.ENV}" + ("" if kind == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                                                  else " (or it is no Blizzard server)"))
        if kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            return (f"{self.addr} refused this process's key (not in its key directory, or "
                    f"retired)")
        if kind == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
            return (f"{self.addr} does not speak CURVE (a server started with --insecure?) "
                    "but this process was given keys")
        return (f"handshake with {self.addr} failed {self.unexplained} times: its public key is "
                "not the one this process was given (wrong master or data-node key?)")

    def close(self) -> None:
        """Stop monitoring the socket, then close the reading end (in this order: see above)."""
        if not self.sock.closed:
            self.sock.monitor(None, 0)
        self.monitor.close(linger=0)
