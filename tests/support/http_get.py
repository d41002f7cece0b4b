"""One HTTP request from a test: its status, headers and body, whatever the status."""

from __future__ import annotations

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
