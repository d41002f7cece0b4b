"""The status page's HTTP side: ``/`` (the page), its script and style, and ``/api/state``.

Python's own ``ThreadingHTTPServer``: the page is read-only, has three files and one JSON
route, and is looked at by a handful of people, so a web framework would be a dependency
that buys nothing. The page's files ship inside the package (``assets/``) and are
read once at start; nothing is fetched from elsewhere, so the page works without internet,
and the Content-Security-Policy header lets the browser load nothing but this server's files.

Defences of a page without a login: a request whose Host header names another site is
refused (421), so a page of that site whose name was made to resolve to this address (DNS
rebinding) cannot read ``/api/state``; a connection that sends nothing for
``IDLE_TIMEOUT_S``, or is still open after ``CONNECTION_S`` (one trickling a byte at a
time), is closed; and at most ``MAX_CONNECTIONS`` are served at once (a thread each), those
above it are closed at once, so slow or idle connections cannot pile up threads. The server
that does this is ``blizzard/net/http_guard.py``'s, which the servers' ``/metrics`` use too.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from importlib import resources
from typing import Any
from urllib.parse import urlsplit

from blizzard.dashboard.sampler import History, StateCache
from blizzard.net.http_guard import (
    CONNECTION_S,
    IDLE_TIMEOUT_S,
    MAX_CONNECTIONS,
    GuardedHTTPServer,
    respond,
)

log = logging.getLogger(__name__)

ASSETS = {  # URL path -> (file in blizzard/dashboard/assets, content type)
    "/": ("index.html", "text/html; charset=utf-8"),
    "/dashboard.js": ("dashboard.js", "text/javascript; charset=utf-8"),
    "/dashboard.css": ("dashboard.css", "text/css; charset=utf-8"),
}
STATE_PATH = "/api/state"
POLICY = "default-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'"


def load_assets() -> dict[str, tuple[bytes, str]]:
    """The page's files by URL path, read from the installed package."""
    folder = resources.files("blizzard.dashboard") / "assets"
    return {path: ((folder / name).read_bytes(), kind) for path, (name, kind) in ASSETS.items()}


class PageServer(GuardedHTTPServer):
    """The status page's server: ``GuardedHTTPServer``'s bounds (``blizzard/net/http_guard.py``)."""


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
            respond(self, code, body, kind, {"Content-Security-Policy": POLICY,
                                             "X-Content-Type-Options": "nosniff"})

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
