"""The status page's HTTP side: ``/`` (the page), its script and style, and ``/api/state``.

Python's own ``ThreadingHTTPServer``: the page is read-only, has three files and one JSON
route, and is looked at by a handful of people, so a web framework would be a dependency
that buys nothing. The page's files ship inside the package (``dashboard_assets/``) and are
read once at start; nothing is fetched from elsewhere, so the page works without internet,
and the Content-Security-Policy header lets the browser load nothing but this server's files.
"""

from __future__ import annotations

import json
import logging
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any, Callable
from urllib.parse import urlsplit

from blizzard.dashboard import History, state_doc

log = logging.getLogger(__name__)

ASSETS = {  # URL path -> (file in blizzard/dashboard_assets, content type)
    "/": ("index.html", "text/html; charset=utf-8"),
    "/dashboard.js": ("dashboard.js", "text/javascript; charset=utf-8"),
    "/dashboard.css": ("dashboard.css", "text/css; charset=utf-8"),
}
STATE_PATH = "/api/state"
POLICY = "default-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'"


def load_assets() -> dict[str, tuple[bytes, str]]:
    """The page's files by URL path, read from the installed package."""
    folder = resources.files("blizzard") / "dashboard_assets"
    return {path: ((folder / name).read_bytes(), kind) for path, (name, kind) in ASSETS.items()}


def make_handler(state: Callable[[], dict[str, Any]],
                 assets: dict[str, tuple[bytes, str]]) -> type[BaseHTTPRequestHandler]:
    """A request handler class answering GETs from ``assets`` and ``state()``; anything else
    is 404 (unknown path) or 501 (any other method, by the base class)."""

    class Handler(BaseHTTPRequestHandler):
        server_version = "blizzard-dashboard"

        def do_GET(self) -> None:
            path = urlsplit(self.path).path
            if path == STATE_PATH:
                self._send(HTTPStatus.OK, json.dumps(state()).encode(),
                           "application/json")
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


def make_server(bind: str, port: int, history: History, master: str) -> ThreadingHTTPServer:
    """A server listening on ``bind``:``port`` now (``OSError`` if it cannot); call
    ``serve_forever`` to answer."""
    handler = make_handler(lambda: state_doc(history, master, time.time()), load_assets())
    return ThreadingHTTPServer((bind, port), handler)
