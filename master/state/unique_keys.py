"""Unique keys: an enqueue that names one already taken in its queue, within its window, gets
the first item's id instead of a new item (the SQS gateway's FIFO deduplication; a job that
must not be queued twice).

A key is taken by the ``CommitItems`` record that made its item, with the time it is taken
until, so a restart or a standby's takeover replays the same keys. Entries past their time
are dropped as records are applied (by the record's time, so a replay drops the same ones),
and when a cap is reached (by the master's clock: they are past their time either way).
The master holds at most ``MAX_UNIQUES`` keys, and one queue at most ``MAX_PER_QUEUE`` of
them, so one queue's flood of keys cannot refuse the others' enqueues; an enqueue that would
take more is refused (``TooManyItems``) until some run out. A key costs about 300 bytes of
the master's memory plus its length (1,000,000 keys of 100 characters: about 400 MB).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from typing import Any

MAX_UNIQUES = 1_000_000
MAX_PER_QUEUE = 100_000


class Uniques:
    """(queue, key) -> (the id that took it, until when), with the times in a heap and a
    count per queue."""

    def __init__(self) -> None:
        self.entries: dict[tuple[str, str], tuple[int, float]] = {}
        self.per_queue: dict[str, int] = {}
        self._heap: list[tuple[float, str, str]] = []

    def __len__(self) -> int:
        return len(self.entries)

    def holder(self, queue: str, key: str, now: float) -> int | None:
        """The id that holds ``key`` in ``queue`` at ``now``, or None."""
        hit = self.entries.get((queue, key))
        return hit[0] if hit is not None and hit[1] > now else None

    def room(self, queue: str, n: int) -> str:
        """Why ``n`` more keys of ``queue`` do not fit ("": they do)."""
        if len(self.entries) + n > MAX_UNIQUES:
            return f"the master holds {len(self.entries)} unique keys, at most {MAX_UNIQUES}"
        held = self.per_queue.get(queue, 0)
        if held + n > MAX_PER_QUEUE:
            return f"queue {queue} holds {held} unique keys, at most {MAX_PER_QUEUE} a queue"
        return ""

    def take(self, queue: str, key: str, item_id: int, until: float) -> None:
        if (queue, key) not in self.entries:
            self.per_queue[queue] = self.per_queue.get(queue, 0) + 1
        self.entries[(queue, key)] = (item_id, until)
        heapq.heappush(self._heap, (until, queue, key))
        if len(self._heap) > 2 * len(self.entries) + 1024:  # keys taken again, queues gone
            self._heap = [(u, q, k) for (q, k), (_, u) in self.entries.items()]
            heapq.heapify(self._heap)

    def expire(self, now: float) -> None:
        """Forget the keys whose time is up at ``now``."""
        heap, entries = self._heap, self.entries
        while heap and heap[0][0] <= now:
            until, queue, key = heapq.heappop(heap)
            hit = entries.get((queue, key))
            if hit is not None and hit[1] == until:
                del entries[(queue, key)]
                self._count_out(queue)

    def _count_out(self, queue: str) -> None:
        left = self.per_queue[queue] - 1
        if left:
            self.per_queue[queue] = left
        else:
            del self.per_queue[queue]

    def drop_queue(self, queue: str) -> None:
        for pair in [pair for pair in self.entries if pair[0] == queue]:
            del self.entries[pair]
        self.per_queue.pop(queue, None)

    def export(self) -> list[list[Any]]:
        return [[queue, key, item_id, until]
                for (queue, key), (item_id, until) in self.entries.items()]

    @classmethod
    def restore(cls, rows: Iterable[Any]) -> Uniques:
        u = cls()
        for queue, key, item_id, until in rows:
            u.take(queue, key, item_id, until)
        return u
