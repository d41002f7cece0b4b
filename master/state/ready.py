"""A queue's ready line: its waiting item records in serving order, O(1) in the common case.

Within a queue, items mostly join in serving order (one priority, ids rising), so a new record
that sorts at or after the line's tail goes on the end of a deque. One that sorts before it (a
redelivery keeps its id, a coalesced item inherits an older place, a more urgent priority, a
new record for a waiting item) goes on a heap. The line's front is the smaller of the two
fronts. A lease walk pops records off the front and puts the live ones back in front: on the
deque that is O(1) each, where each pop of a heap of a million records costs about 2 us.

Lazy deletion, as in the state's other heaps: a record that is no longer its item's current
record (``items[entry.id] is not entry``) is stale and is dropped by whoever finds it at the
front.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable, Iterator
from itertools import islice
from typing import Any

Item = Any  # a ``master.state.item.Item`` (not imported: item.py builds queues from this file)


class ReadyLine:
    """Item records in serving order: a sorted deque for in-order arrivals, a heap for the rest."""

    __slots__ = ("_run", "_heap")

    def __init__(self, entries: Iterable[Item] = ()) -> None:
        self._run: deque[Item] = deque(sorted(entries))  # sorted; a checkpoint's rows mostly are
        self._heap: list[Item] = []

    def __len__(self) -> int:
        """Entries held, stale ones included."""
        return len(self._run) + len(self._heap)

    def __bool__(self) -> bool:
        return bool(self._run) or bool(self._heap)

    def push(self, item: Item) -> None:
        run = self._run
        if not run or item >= run[-1]:
            run.append(item)
        else:
            heapq.heappush(self._heap, item)

    def pop(self) -> Item:
        """The front entry, taken off (IndexError when the line is empty)."""
        run, heap = self._run, self._heap
        if heap and (not run or heap[0] < run[0]):
            return heapq.heappop(heap)
        return run.popleft()

    def popping(self) -> Iterator[Item]:
        """Entries popped off the front in order, one per step, while nothing else changes the
        line (a lease walk: a generator's step costs less than a method call per entry)."""
        run, heap = self._run, self._heap
        popleft, heappop = run.popleft, heapq.heappop
        while heap:
            yield heappop(heap) if not run or heap[0] < run[0] else popleft()
        while run:
            yield popleft()

    def put_back(self, popped: list[Item]) -> None:
        """Entries popped in order, with no push since, go back to the front in that order.

        Each was the front when popped, so all sort before what is left: the deque stays sorted.
        """
        self._run.extendleft(reversed(popped))

    def first_live(self, items: dict[int, Item]) -> Item | None:
        """The front's first current record (``items`` maps ids to them), stale ones before it
        dropped for good; None when no entry is current."""
        while self:
            front = self.pop()
            if items.get(front.id) is front:
                self._run.appendleft(front)
                return front
        return None

    def near_front(self, n: int) -> list[Item]:
        """Up to ``n`` entries from the front of each part, stale ones included, the smallest
        among them the line's front. Each copy is one C call, so another thread may take it
        while the loop changes the line (the metrics scrape does)."""
        return list(islice(self._run, n)) + self._heap[:n]
