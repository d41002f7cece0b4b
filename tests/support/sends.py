"""Watching what a client sends: every request through ``Endpoint.send``, by message type."""

from __future__ import annotations

import collections
from typing import Any

import pytest

from blizzard.net.transport import Endpoint


def watch_sends(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    """From now on, each request any ``Endpoint`` of this process sends, as (the endpoint's
    address, the message), in order."""
    sent: list[tuple[str, Any]] = []
    send = Endpoint.send

    def recording(ep: Endpoint, msg: Any) -> int:
        sent.append((ep.addr, msg))
        return send(ep, msg)
    monkeypatch.setattr(Endpoint, "send", recording)
    return sent


def kinds(sent: list[tuple[str, Any]]) -> collections.Counter[str]:
    """How many requests of each message type ``sent`` holds."""
    return collections.Counter(type(msg).__name__ for _, msg in sent)
