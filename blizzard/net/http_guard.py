"""An HTTP server that slow, idle or many connections cannot exhaust, and that answers only to
its own Host names: what the status page and the servers' ``/metrics`` endpoints run on.

Python's own ``ThreadingHTTPServer`` serves each connection in a thread of its own and waits
on it forever. ``GuardedHTTPServer`` adds these bounds: at most ``max_connections`` are served
at once, and at most ``max_per_addr`` (a quarter of them, 4 at least) from one source address
(those above are closed unanswered at once, so idle or half-sent requests cannot pile up
threads and descriptors, and one address cannot take every place); a request's head (its
request line and headers) must have come ``HEAD_S`` after the connection was accepted (or
the previous reply sent), or the connection is cut: one trickling a byte at a time holds its
place that long, not for as long as it likes; a connection silent (or not reading) for the handler's
``timeout`` (``IDLE_TIMEOUT_S``) is closed; and one still open ``connection_s`` after it came
(``CONNECTION_S``: a slow reader of a long reply) is cut. Its connections also take their
places from the process's connection budget (``blizzard/host/fd_limits.py``), which the
server's ZeroMQ sockets share, so together they leave the descriptors kept for files.

A request whose Host header names another site is refused (``answers_to``, 421 by the
handler), so a web page whose name was made to resolve to this address (DNS rebinding)
cannot read what the server shows. Its own names are the bind address, localhost, 127.0.0.1
and those given; with ``any_ip`` an IP address literal is answered too (a browser sends the
page's host *name*, so an address literal is no rebinding; Prometheus scrapes by address).
"""

from __future__ import annotations

import collections
import ipaddress
import logging
import socket
import sys
import threading
import time
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from blizzard.host import fd_limits

log = logging.getLogger(__name__)

LOCAL_NAMES = ("localhost", "127.0.0.1")  # Host names always answered, besides the bind address
IDLE_TIMEOUT_S = 10.0  # a connection silent (or not reading) this long is closed
CONNECTION_S = 30.0  # a connection's whole life: reading the request and sending the reply
MAX_CONNECTIONS = 64  # served at once; more are closed unanswered
PER_ADDR_MIN = 4  # connections one address may hold, at least (of the cap: a quarter)
HEAD_S = 5.0  # a request's line and headers must have come this long after the connection


def respond(handler: BaseHTTPRequestHandler, code: int, body: bytes, kind: str,
            headers: dict[str, str] | None = None) -> None:
    """One whole response on ``handler``'s connection: status, type, length, no caching and
    ``headers``, then ``body``."""
    handler.send_response(code)
    handler.send_header("Content-Type", kind)
    handler.send_header("Content-Length", str(len(body)))
    handler.send_header("Cache-Control", "no-store")
    for name, value in (headers or {}).items():
        handler.send_header(name, value)
    handler.end_headers()
    handler.wfile.write(body)


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


def _timed(handler: type[BaseHTTPRequestHandler]) -> type[BaseHTTPRequestHandler]:
    """``handler`` telling its server when each request's head is in (``head_read``) and
    when it waits for the next one (``awaiting_head``): the server's head deadline."""

    class Timed(handler):  # type: ignore[valid-type, misc]
        _heads = 0

        def handle_one_request(self) -> None:
            if self._heads:  # a later request on a kept-alive connection: its own deadline
                self.server.awaiting_head(self.connection)
            super().handle_one_request()

        def parse_request(self) -> bool:  # reads the headers: the head is in after it
            ok = super().parse_request()
            self._heads += 1
            self.server.head_read(self.connection)
            return ok

    Timed.__name__ = Timed.__qualname__ = handler.__name__
    return Timed


class GuardedHTTPServer(ThreadingHTTPServer):
    """A ``ThreadingHTTPServer`` that answers only to its own Host names, serves at most
    ``max_connections`` connections at once (``max_per_addr`` of one address), cuts a
    connection whose request head is not in ``HEAD_S`` after it came, and each after
    ``connection_s``."""

    block_on_close = False  # read-only pages: Ctrl-C need not wait for idle connections
    request_queue_size = MAX_CONNECTIONS  # the listen backlog
    head_s = HEAD_S

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler],
                 allow_hosts: Iterable[str] = (), max_connections: int = MAX_CONNECTIONS,
                 connection_s: float = CONNECTION_S, *, any_ip: bool = False,
                 max_per_addr: int | None = None) -> None:
        self.max_connections, self.connection_s = max_connections, connection_s
        # a quarter of the places, 4 at least (a browser's parallel requests)
        self.max_per_addr = max_per_addr or max(min(PER_ADDR_MIN, max_connections),
                                                max_connections // 4)
        self.any_ip = any_ip
        self.slots = threading.BoundedSemaphore(max_connections)
        self.budget = fd_limits.process_connections()
        # open connections: (monotonic time they are cut, time the whole connection ends)
        self.deadlines: dict[socket.socket, tuple[float, float]] = {}
        self.from_addr: collections.Counter[str] = collections.Counter()
        self.deadlines_lock = threading.Lock()
        self.turned_away = 0  # connections closed unanswered, a cap reached
        super().__init__(address, _timed(handler))
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
        addr = client_address[0]
        why = self._admit(request, addr)
        if why is not None:
            self.turned_away += 1
            log.debug("%s: closing a connection from %s unanswered", why, addr)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._forget(request, addr)  # no thread started to do it
            raise

    def _admit(self, request: Any, addr: str) -> str | None:
        """Take a place for a new connection from ``addr``; None, or the cap it would pass."""
        with self.deadlines_lock:
            if self.from_addr[addr] >= self.max_per_addr:
                return f"{self.max_per_addr} connections open from that address"
            if not self.slots.acquire(blocking=False):
                return f"{self.max_connections} connections open"
            if not self.budget.take(fd_limits.connection_fds()):
                self.slots.release()
                return "the process's connections are at their cap"
            self.from_addr[addr] += 1
            now = time.monotonic()
            end = now + self.connection_s
            self.deadlines[request] = (min(now + self.head_s, end), end)
        return None

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._forget(request, client_address[0])

    def _forget(self, request: Any, addr: str) -> None:
        with self.deadlines_lock:
            del self.deadlines[request]
            self.from_addr[addr] -= 1
            if not self.from_addr[addr]:
                del self.from_addr[addr]
        self.slots.release()
        self.budget.give()

    def head_read(self, conn: socket.socket) -> None:
        """``conn``'s request head is in: it may stay till the connection's end."""
        with self.deadlines_lock:
            if conn in self.deadlines:
                end = self.deadlines[conn][1]
                self.deadlines[conn] = (end, end)

    def awaiting_head(self, conn: socket.socket) -> None:
        """``conn`` waits for the head of another request: ``HEAD_S`` from now."""
        with self.deadlines_lock:
            if conn in self.deadlines:
                end = self.deadlines[conn][1]
                self.deadlines[conn] = (min(time.monotonic() + self.head_s, end), end)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A connection the client or the deadline cut is routine; anything else a fault."""
        if isinstance(sys.exc_info()[1], OSError):
            log.debug("connection from %s ended early", client_address[0], exc_info=True)
        else:
            log.exception("serving %s failed", client_address[0])

    def service_actions(self) -> None:
        """Cut connections whose request head is late, or open past ``connection_s``
        (``serve_forever`` calls this at least every half second): their threads' reads and
        writes end at once."""
        now = time.monotonic()
        with self.deadlines_lock:
            overdue = [conn for conn, (cut, _) in self.deadlines.items() if cut < now]
        for conn in overdue:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:  # closed meanwhile
                pass
