"""The status page's HTTP side: ``/`` (the page), its script and style, and ``/api/state``.

Python's own ``ThreadingHTTPServer``: the page is read-only, has three files and one JSON
route, and is looked at by a handful of people, so a web framework would be a dependency
that buys nothing. The page's files ship inside the package (``dashboard_assets/``) and are
read once at start; nothing is fetched from elsewhere, so the page works without internet,
and the Content-Security-Policy header lets the browser load nothing but this server's files.

Defences of a page without a login: a request whose Host header names another site is
refused (421), so a page of that site whose name was made to resolve to this address (DNS
rebinding) cannot read ``/api/state``; a connection that sends nothing for
``IDLE_TIMEOUT_S``, or is still open after ``CONNECTION_S`` (one trickling a byte at a
time), is closed; and at most ``MAX_CONNECTIONS`` are served at once (a thread each), those
above it are closed at once, so slow or idle connections cannot pile up threads.
"""

from __future__ import annotations

import logging
import socket
import sys
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any, Callable, Iterable
from urllib.parse import urlsplit

from blizzard.dashboard import History, StateCache

log = logging.getLogger(__name__)

ASSETS = {  # URL path -> (file in blizzard/dashboard_assets, content type)
    "/": ("index.html", "text/html; charset=utf-8"),
    "/dashboard.js": ("dashboard.js", "text/javascript; charset=utf-8"),
    "/dashboard.css": ("dashboard.css", "text/css; charset=utf-8"),
}
STATE_PATH = "/api/state"
POLICY = "default-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'"
LOCAL_NAMES = ("localhost", "127.0.0.1")  # Host names always answered, besides the bind address
IDLE_TIMEOUT_S = 10.0  # a connection silent (or not reading) this long is closed
CONNECTION_S = 30.0  # a connection's whole life: reading the request and sending the reply
MAX_CONNECTIONS = 64  # served at once; more are closed unanswered


def load_assets() -> dict[str, tuple[bytes, str]]:
    """The page's files by URL path, read from the installed package."""
    folder = resources.files("blizzard") / "dashboard_assets"
    return {path: ((folder / name).read_bytes(), kind) for path, (name, kind) in ASSETS.items()}


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


class PageServer(ThreadingHTTPServer):
    """A ``ThreadingHTTPServer`` that answers only to its own Host names and serves at most
    ``max_connections`` connections at once."""

    block_on_close = False  # a read-only page: Ctrl-C need not wait for idle connections
    request_queue_size = MAX_CONNECTIONS

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler],
                 allow_hosts: Iterable[str] = (), max_connections: int = MAX_CONNECTIONS,
                 connection_s: float = CONNECTION_S) -> None:
        self.max_connections, self.connection_s = max_connections, connection_s
        self.slots = threading.BoundedSemaphore(max_connections)
        self.deadlines: dict[socket.socket, float] = {}  # open connections: monotonic ends
        self.deadlines_lock = threading.Lock()
        super().__init__(address, handler)
        self.names = frozenset(n.lower().rstrip(".")
                               for n in (address[0], *LOCAL_NAMES, *allow_hosts))

    def answers_to(self, host: str | None) -> bool:
        """Whether a request with this Host header is for this page."""
        parsed = host_and_port(host) if host else None
        if parsed is None:
            return False
        name, port = parsed
        return name in self.names and port in (None, self.server_port)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            log.info("%d connections open: closing one from %s unanswered",
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


def make_handler(state: Callable[[], bytes], assets: dict[str, tuple[bytes, str]],
                 idle_timeout_s: float = IDLE_TIMEOUT_S) -> type[BaseHTTPRequestHandler]:
    """A request handler class answering GETs from ``assets`` and ``state()`` (JSON); a
    Host the ``PageServer`` does not answer to is 421, anything else 404 (unknown path) or
    501 (any other method, by the base class)."""

    class Handler(BaseHTTPRequestHandler):
        server_version = "blizzard-dashboard"
        timeout = idle_timeout_s  # of each read and write on the connection
        server: PageServer

        def do_GET(self) -> None:
            path = urlsplit(self.path).path
            if not self.server.answers_to(self.headers.get("Host")):
                log.info("refused a request for Host %r", self.headers.get("Host", "")[:100])
                self._send(HTTPStatus.MISDIRECTED_REQUEST,
                           b"this page answers only to its own address, localhost or a name "
                           b"given with blizzard dashboard --allow-host\n",
                           "text/plain; charset=utf-8")
            elif path == STATE_PATH:
                self._send(HTTPStatus.OK, state(), "application/json")
            elif path in assets:
                self._send(HTTPStatus.OK, *assets[path])
            else:
                self._send(HTTPStatus.NOT_FOUND, b"not found: the page is at /\n",
                           "text/plain; charset=utf-8")

        def _send(self, code: HTTPStatus, body: bytes, kind: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.send_header("Content-Security-Policy", POLICY)
            self.send_header("X-Content-Type-Options", "nosniff")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("%s " + format, self.address_string(), *args)

    return Handler


def make_server(bind: str, port: int, history: History, master: str, *,
                allow_hosts: Iterable[str] = (), idle_timeout_s: float = IDLE_TIMEOUT_S,
                connection_s: float = CONNECTION_S,
                max_connections: int = MAX_CONNECTIONS) -> PageServer:
    """A server listening on ``bind``:``port`` now (``OSError`` if it cannot), answering to
    Host names ``bind``, localhost, 127.0.0.1 and ``allow_hosts``; call ``serve_forever``."""
    cache = StateCache(history, master)
    handler = make_handler(lambda: cache.body(time.time()), load_assets(), idle_timeout_s)
    return PageServer((bind, port), handler, allow_hosts, max_connections, connection_s)
