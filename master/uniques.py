"""Unique keys: an enqueue that names one already taken in its queue, within its window, gets
the first item's id instead of a new item (the SQS gateway's FIFO deduplication; a job that
must not be queued twice).

A key is taken by the ``CommitItems`` record that made its item, with the time it is taken
until, so a restart or a standby's takeover replays the same keys. Entries past their time
are dropped as records are applied (by the record's time, so a replay drops the same ones).
The master holds at most ``MAX_UNIQUES`` keys; an enqueue that would take more is refused
(``TooManyItems``) until some run out. Each costs about 200 bytes of the master's memory.
"""

from __future__ import annotations

import heapq
from typing import Any, Iterable

MAX_UNIQUES = 1_000_000
MAX_UNIQUE_S = 30 * 86400.0  # the longest window a key may be taken for


class Uniques:
    """(queue, key) -> (the id that took it, until when), with the times in a heap."""

    def __init__(self) -> None:
        self.entries: dict[tuple[str, str], tuple[int, float]] = {}
        self._heap: list[tuple[float, str, str]] = []

    def __len__(self) -> int:
        return len(self.entries)

    def holder(self, queue: str, key: str, now: float) -> int | None:
        """The id that holds ``key`` in ``queue`` at ``now``, or None."""
        hit = self.entries.get((queue, key))
        return hit[0] if hit is not None and hit[1] > now else None

    def live(self, now: float) -> int:
        """Keys still held at ``now`` (a count; the expired ones go as records apply)."""
        return sum(1 for _, until in self.entries.values() if until > now)

    def take(self, queue: str, key: str, item_id: int, until: float) -> None:
        self.entries[(queue, key)] = (item_id, until)
        heapq.heappush(self._heap, (until, queue, key))

    def expire(self, now: float) -> None:
        """Forget the keys whose time is up at ``now``."""
        heap, entries = self._heap, self.entries
        while heap and heap[0][0] <= now:
            until, queue, key = heapq.heappop(heap)
            hit = entries.get((queue, key))
            if hit is not None and hit[1] == until:
                del entries[(queue, key)]

    def drop_queue(self, queue: str) -> None:
        for pair in [pair for pair in self.entries if pair[0] == queue]:
            del self.entries[pair]

    def export(self) -> list[list[Any]]:
        return [[queue, key, item_id, until]
                for (queue, key), (item_id, until) in self.entries.items()]

    @classmethod
    def restore(cls, rows: Iterable[Any]) -> "Uniques":
        u = cls()
        for queue, key, item_id, until in rows:
            u.take(queue, key, item_id, until)
        return u
