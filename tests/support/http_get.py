"""One HTTP request from a test: its status, headers and body, whatever the status; and
whether a server closed a connection it never answered."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request


def get(url: str, method: str = "GET",
        headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    """``method url`` (GET by default); an error status is returned, not raised."""
    request = urllib.request.Request(url, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def closed(sock: socket.socket) -> bool:
    """Whether the server closed ``sock`` (it never sent anything on it)."""
    sock.setblocking(False)
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def cut(sock: socket.socket) -> bool:
    """Whether the server ended ``sock`` (EOF or a reset), reading what it sent; ``sock`` is
    non-blocking."""
    try:
        return sock.recv(4096) == b"" or cut(sock)
    except BlockingIOError:
        return False
    except OSError:
        return True
