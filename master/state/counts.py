"""Per-queue event totals since the master started: enqueued, leased, acked, nacked, expired,
dead-lettered (the counters of the master's metrics).

Counted where the live events happen (the enqueue and lease handlers and the expiry timer),
never when WAL records are applied: a replay at start-up re-applies old records, and counting
those would count the same event again after every restart. Soft state, like Prometheus
counters: a restart starts them from zero. One dictionary addition per batch or item.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

KINDS = ("enqueued", "leased", "acked", "nacked", "expired", "dead_lettered")


class QueueCounts:
    """Totals per event kind and queue; read (copied) by the metrics collector."""

    def __init__(self) -> None:
        self.by_kind: dict[str, dict[str, int]] = {kind: {} for kind in KINDS}
        self.refused_acks: dict[int, int] = {}  # quiet acks refused, by reason (``p.LOST_*``)

    def add(self, kind: str, queue: str, n: int = 1) -> None:
        if n:
            totals = self.by_kind[kind]
            totals[queue] = totals.get(queue, 0) + n

    def add_each(self, kind: str, queues: Iterable[str]) -> None:
        """One event per entry (the queue of each item of a batch), counted in C."""
        totals = self.by_kind[kind]
        for queue, n in Counter(queues).items():
            totals[queue] = totals.get(queue, 0) + n

    def refuse_acks(self, reasons: Iterable[int]) -> None:
        """Quiet acks the master could not apply (no one hears of them otherwise)."""
        for why, n in Counter(reasons).items():
            self.refused_acks[why] = self.refused_acks.get(why, 0) + n

    def get(self, kind: str, queue: str) -> int:
        return self.by_kind[kind].get(queue, 0)
