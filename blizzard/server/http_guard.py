"""An HTTP server that slow, idle or many connections cannot exhaust, and that answers only to
its own Host names: what the status page and the servers' ``/metrics`` endpoints run on.

Python's own ``ThreadingHTTPServer`` serves each connection in a thread of its own and waits
on it forever. ``GuardedHTTPServer`` adds three bounds: at most ``max_connections`` are served
at once (those above it are closed unanswered at once, so idle or half-sent requests cannot
pile up threads and descriptors); a connection silent (or not reading) for the handler's
``timeout`` (``IDLE_TIMEOUT_S``) is closed; and one still open ``connection_s`` after it came
(``CONNECTION_S``: one trickling a byte at a time) is cut.

A request whose Host header names another site is refused (``answers_to``, 421 by the
handler), so a web page whose name was made to resolve to this address (DNS rebinding)
cannot read what the server shows. Its own names are the bind address, localhost, 127.0.0.1
and those given; with ``any_ip`` an IP address literal is answered too (a browser sends the
page's host *name*, so an address literal is no rebinding; Prometheus scrapes by address).
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterable

log = logging.getLogger(__name__)

LOCAL_NAMES = ("localhost", "127.0.0.1")  # Host names always answered, besides the bind address
IDLE_TIMEOUT_S = 10.0  # a connection silent (or not reading) this long is closed
CONNECTION_S = 30.0  # a connection's whole life: reading the request and sending the reply
MAX_CONNECTIONS = 64  # served at once; more are closed unanswered


def host_and_port(header: str) -> tuple[str, int | None] | None:
    """The lower-case name and the port (None: not given) of a Host header; None if the
    header is not a name with an optional port."""
    name, colon, port = header.rpartition(":")
    if not colon or header.endswith("]"):  # no port, or a bare [IPv6] address
        name, port = header, ""
    if port and not (port.isascii() and port.isdigit()):
        return None
    if not name or any(c in name for c in "@/\\?# "):
        return None
    return name.lower().rstrip("."), int(port) if port else None


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        return False
    return True


class GuardedHTTPServer(ThreadingHTTPServer):
    """A ``ThreadingHTTPServer`` that answers only to its own Host names, serves at most
    ``max_connections`` connections at once and cuts each after ``connection_s``."""

    block_on_close = False  # read-only pages: Ctrl-C need not wait for idle connections
    request_queue_size = MAX_CONNECTIONS  # the listen backlog

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler],
                 allow_hosts: Iterable[str] = (), max_connections: int = MAX_CONNECTIONS,
                 connection_s: float = CONNECTION_S, *, any_ip: bool = False) -> None:
        self.max_connections, self.connection_s = max_connections, connection_s
        self.any_ip = any_ip
        self.slots = threading.BoundedSemaphore(max_connections)
        self.deadlines: dict[socket.socket, float] = {}  # open connections: monotonic ends
        self.deadlines_lock = threading.Lock()
        self.turned_away = 0  # connections closed unanswered, the cap reached
        super().__init__(address, handler)
        self.names = frozenset(n.lower().rstrip(".")
                               for n in (address[0], *LOCAL_NAMES, *allow_hosts))

    def answers_to(self, host: str | None) -> bool:
        """Whether a request with this Host header is for this server."""
        parsed = host_and_port(host) if host else None
        if parsed is None:
            return False
        name, port = parsed
        return (name in self.names or self.any_ip and _is_ip(name)) \
            and port in (None, self.server_port)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            self.turned_away += 1
            log.debug("%d connections open: closing one from %s unanswered",
                      self.max_connections, client_address[0])
            self.shutdown_request(request)
            return
        with self.deadlines_lock:
            self.deadlines[request] = time.monotonic() + self.connection_s
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._forget(request)  # no thread started to do it
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._forget(request)

    def _forget(self, request: Any) -> None:
        with self.deadlines_lock:
            del self.deadlines[request]
        self.slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A connection the client or the deadline cut is routine; anything else a fault."""
        if isinstance(sys.exc_info()[1], OSError):
            log.debug("connection from %s ended early", client_address[0], exc_info=True)
        else:
            log.exception("serving %s failed", client_address[0])

    def service_actions(self) -> None:
        """Cut connections open past ``connection_s`` (``serve_forever`` calls this at least
        every half second): their threads' reads and writes end at once."""
        now = time.monotonic()
        with self.deadlines_lock:
            overdue = [conn for conn, end in self.deadlines.items() if end < now]
        for conn in overdue:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:  # closed meanwhile
                pass
