"""CURVE on sockets: a server's side with its ZAP handler, a client's side with its pinned key,
and turning a failed handshake into ``AuthenticationFailed``.

Every server socket encrypts and authenticates with CURVE. ZeroMQ asks the context's ZAP
handler (``Gatekeeper``, pyzmq's authenticator running in a thread) about each new
connection; it lets in only public keys from the key directory and names the peer's role,
which arrives with every message as the frame property ``User-Id``.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from typing import Any

import zmq
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils.monitor import parse_monitor_message

from blizzard import keys as k
from blizzard.errors import AuthenticationFailed

log = logging.getLogger(__name__)

HANDSHAKE_FAILED = (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                    | zmq.EVENT_HANDSHAKE_FAILED_AUTH)


class _Directory:
    """The ZAP handler's view of the key directory, re-read when the directory changes."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.stamp: tuple[int, int] | None = None
        self.roles: dict[bytes, str] = {}
        self.lock = threading.Lock()

    def role(self, public: bytes) -> str | None:
        st = os.stat(self.directory)
        with self.lock:
            if (st.st_mtime_ns, st.st_ino) != self.stamp:
                self.roles = k.authorized(self.directory)
                self.stamp = (st.st_mtime_ns, st.st_ino)
                log.info("%d keys allowed from %s", len(self.roles), self.directory)
            return self.roles.get(public)

    def callback(self, domain: str, public: bytes) -> bool:  # pyzmq's credentials provider
        allowed = self.role(public) is not None
        if not allowed:
            log.warning("refused a connection with an unknown key %s", public[:8].decode())
        return allowed


class Gatekeeper(ThreadAuthenticator):
    """The ZAP handler of one context: known keys only, each peer's User-Id is its role."""

    def __init__(self, ctx: zmq.Context, directory: str) -> None:
        super().__init__(ctx, log=logging.getLogger("blizzard.zap"))
        self.keys = _Directory(directory)

    def curve_user_id(self, client_public_key: bytes) -> str:
        from zmq.utils import z85
        return self.keys.role(z85.encode(client_public_key)) or ""


_gatekeepers: "weakref.WeakKeyDictionary[zmq.Context, Gatekeeper]" = weakref.WeakKeyDictionary()


def guard(ctx: zmq.Context, directory: str) -> Gatekeeper:
    """Start (once per context) the ZAP handler that admits the keys in ``directory``."""
    gate = _gatekeepers.get(ctx)
    if gate is not None:
        if os.path.realpath(gate.keys.directory) != os.path.realpath(directory):
            raise AuthenticationFailed("two key directories in one ZeroMQ context")
        return gate
    gate = Gatekeeper(ctx, directory)
    gate.start()
    gate.configure_curve_callback(k.ZAP_DOMAIN, credentials_provider=gate.keys)
    _gatekeepers[ctx] = gate
    return gate


def serve_curve(sock: zmq.Socket, server: k.ServerKeys) -> None:
    """Make ``sock`` a CURVE server admitting the keys in ``server.directory`` (before bind)."""
    guard(sock.context, server.directory)
    sock.setsockopt(zmq.CURVE_SERVER, 1)
    sock.setsockopt(zmq.CURVE_PUBLICKEY, server.public)
    sock.setsockopt(zmq.CURVE_SECRETKEY, server.secret)
    sock.setsockopt(zmq.ZAP_DOMAIN, k.ZAP_DOMAIN.encode())


def connect_curve(sock: zmq.Socket, mine: k.ClientKeys, server_public: bytes) -> None:
    """Make ``sock`` a CURVE client that talks only to the holder of ``server_public``."""
    sock.setsockopt(zmq.CURVE_PUBLICKEY, mine.public)
    sock.setsockopt(zmq.CURVE_SECRETKEY, mine.secret)
    sock.setsockopt(zmq.CURVE_SERVERKEY, server_public)


class HandshakeWatch:
    """Watches one client socket for refused handshakes (a monitor socket, polled with it)."""

    def __init__(self, sock: zmq.Socket, addr: str, secure: bool) -> None:
        self.monitor = sock.get_monitor_socket(HANDSHAKE_FAILED)
        self.addr = addr
        self.secure = secure
        self.failure: AuthenticationFailed | None = None

    def check(self) -> None:
        """Read the events waiting; raise ``AuthenticationFailed`` if a handshake was refused."""
        while self.monitor.poll(0):
            event = parse_monitor_message(self.monitor.recv_multipart())
            if self.failure is None:  # the first says most; retries fail without detail
                self.failure = AuthenticationFailed(self._why(event))
        if self.failure is not None:
            raise self.failure

    def _why(self, event: dict[str, Any]) -> str:
        kind = event["event"]
        if not self.secure:  # any failed handshake: the server speaks CURVE and we do not
            return (f"{self.addr} requires keys (CURVE) and this process has none: pass "
                    f"keys=DIR or set {k.ENV}")
        if kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            return (f"{self.addr} refused this process's key (not in its key directory, or "
                    f"retired)")
        if kind == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
            return (f"{self.addr} does not speak CURVE (a server started with --insecure?) "
                    "but this process was given keys")
        return (f"handshake with {self.addr} failed: its public key is not the one this "
                "process was given (wrong master or data-node key?)")

    def close(self) -> None:
        self.monitor.close(linger=0)
