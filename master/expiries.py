"""When leases run out: one heap entry per lease record, not one per item.

A lease (or extension) record covers up to a batch of items with one deadline, so its entry
is ``(deadline, seq, ids, leases)``: one heap push per record, where an entry per item cost a
push and later a pop each (about 2 us apiece on a heap of a million). Lazy deletion as in the
state's other heaps: an item settled, re-leased or extended since no longer matches its
``held`` (lease, deadline) pair and is skipped when its entry comes due.
"""

from __future__ import annotations

import heapq
import itertools


class Expiries:
    """Lease deadlines, grouped as the records that set them."""

    __slots__ = ("_heap", "_seq")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, list[int], list[int]]] = []
        self._seq = itertools.count()  # orders one deadline's entries; never compares the lists

    def __len__(self) -> int:
        """Entries held (one per record, stale ones included)."""
        return len(self._heap)

    def add(self, deadline: float, ids: list[int], leases: list[int]) -> None:
        """These items' leases (tokens in ``leases``) run out at ``deadline``."""
        if ids:
            heapq.heappush(self._heap, (deadline, next(self._seq), ids, leases))

    def due(self, now: float, held: dict[int, tuple[int, float]], limit: int) -> list[int]:
        """Ids whose lease has run out by ``now`` and that ``held`` (id -> (lease, deadline))
        still holds under it: at most ``limit``, by deadline, then id.

        An id extended twice to the same deadline is in two entries and is reported once.
        """
        found: list[tuple[float, int]] = []
        heap = self._heap
        while heap and heap[0][0] <= now and len(found) < limit:
            deadline, seq, ids, leases = heapq.heappop(heap)
            for k, item_id in enumerate(ids):
                if len(found) == limit:  # the rest waits for the next call
                    heapq.heappush(heap, (deadline, seq, ids[k:], leases[k:]))
                    break
                if held.get(item_id) == (leases[k], deadline):
                    found.append((deadline, item_id))
        found.sort()
        return [item_id for k, (_, item_id) in enumerate(found)
                if not k or found[k - 1][1] != item_id]
