"""When leases run out: one heap entry per lease record, not one per item.

A lease (or extension) record covers up to a batch of items with one deadline, so its entry
is ``[deadline, seq, ids, leases, start]``: one heap push per record, where an entry per item
cost a push and later a pop each (about 2 us apiece on a heap of a million). Lazy deletion as
in the state's other heaps: an item settled, re-leased or extended since no longer matches its
``held`` (lease, deadline) pair. Such items are skipped off the front of the first entry at
every look, due or not (``start`` moves past them), so the entries of acked leases go at once
and hold no memory until their deadline.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Any


class Expiries:
    """Lease deadlines, grouped as the records that set them."""

    __slots__ = ("_heap", "_seq")

    def __init__(self) -> None:
        # [deadline, seq, ids, leases, start]; (deadline, seq) unique
        self._heap: list[list[Any]] = []
        self._seq = itertools.count()  # orders one deadline's entries; never compares the lists

    def __len__(self) -> int:
        """Entries held (one per record)."""
        return len(self._heap)

    def add(self, deadline: float, ids: list[int], leases: list[int]) -> None:
        """These items' leases (tokens in ``leases``) run out at ``deadline``."""
        if ids:
            heapq.heappush(self._heap, [deadline, next(self._seq), ids, leases, 0])

    def next_deadline(self) -> float | None:
        """The soonest deadline held (an entry's items may all be settled since: then it is
        dropped at the next ``due``), or None."""
        return self._heap[0][0] if self._heap else None

    def due(self, now: float, held: dict[int, tuple[int, float]], limit: int) -> list[int]:
        """Ids whose lease has run out by ``now`` and that ``held`` (id -> (lease, deadline))
        still holds under it: at most ``limit``, by deadline, then id.

        An id extended twice to the same deadline is in two entries and is reported once.
        """
        found: list[tuple[float, int]] = []
        heap = self._heap
        while heap:
            entry = heap[0]
            deadline, _, ids, leases, k = entry
            while k < len(ids) and held.get(ids[k]) != (leases[k], deadline):
                k += 1  # settled, re-leased or extended since
            if k == len(ids):
                heapq.heappop(heap)
                continue
            entry[4] = k
            if deadline > now or len(found) == limit:
                break
            heapq.heappop(heap)
            for j in range(k, len(ids)):
                if len(found) == limit:  # the rest waits for the next call
                    entry[4] = j
                    heapq.heappush(heap, entry)
                    break
                if held.get(ids[j]) == (leases[j], deadline):
                    found.append((deadline, ids[j]))
        found.sort()
        return [item_id for k, (_, item_id) in enumerate(found)
                if not k or found[k - 1][1] != item_id]
