"""Pings to servers that may rightly hold a reply long (a master parking an enqueue), so one
that died is noticed soon: what ``transport.call_many`` does with ``probe_s``. The ping is a
``Hello``, which a master answers at once (a ``Ping`` waits for durability, which a sync
standby may hold up)."""

from __future__ import annotations

import time
from typing import Any

from blizzard.wire import protocol


class Probes:
    """The pings of ``call_many``'s ``probe_s``: which servers stopped answering them."""

    def __init__(self, every_s: float | None) -> None:
        self.every_s = every_s
        self.next = time.monotonic() + every_s if every_s else float("inf")
        self.sent: dict[Any, tuple[int, float]] = {}  # endpoint -> (ping's request id, sent at)

    def silent(self, endpoints: set[Any]) -> list[Any]:
        """Servers that left a ping unanswered for two periods (one slow pass is no death);
        the others are pinged again, once per ``every_s``."""
        now = time.monotonic()
        if self.every_s is None or now < self.next:
            return []
        self.next = now + self.every_s
        dead = []
        for ep in endpoints:
            rid, sent = self.sent.get(ep, (None, now))
            if rid is not None and not ep.has(rid):
                if now - sent >= 2 * self.every_s:
                    dead.append(ep)
                continue
            if rid is not None:
                ep.take(rid)
            try:
                self.sent[ep] = (ep.send(protocol.Hello()), now)
            except TimeoutError:
                dead.append(ep)
        return dead
