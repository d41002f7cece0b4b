"""Hedge delays: how long to wait on one replica before asking another as well.

A read or a write that waits on one data node is only as live as that node. Instead of waiting
out a timeout, the reader (``blizzard/client/datanodes.py``) and the master, for a write's
reports (``master/produce/enqueue.py``), give a node about as long as its recent slow answers took,
then ask another replica too; the first good answer wins. The delay is twice the recent p99 of
that node's answers, but never more than twice the p99 of the typical node (the median of the
nodes' p99s): a node that turns slow must not teach the hedge to wait for it (its own samples
would raise its delay to the cap). Between a floor and a cap, plus a transfer allowance for
large payloads:

- ``FLOOR_S`` (20 ms): a healthy answer on a LAN takes 0.2-5 ms (a loopback ``Get`` of one
  item about 0.3 ms, a synced put of a batch a few ms); below 20 ms a busy machine's scheduling
  noise alone would send hedges. At 20 ms and twice the p99, fewer than 1% of healthy calls
  hedge, and a hedge costs one extra ``Get`` (or one extra copy of a write).
- ``CAP_S`` (250 ms): the longest a stopped or dead node can hold a call before another replica
  is asked. Liveness goal: under one second without progress per data-node fault; a cap of a
  quarter of that leaves room for the round trips that follow.
- ``BYTES_PER_S`` (200 MB/s): a large answer takes longer to send; this much is allowed per byte
  on top of the delay, so an 8 MiB read is not hedged before 40 ms more have passed.
"""

from __future__ import annotations

import bisect
from collections import deque

FLOOR_S = 0.020
CAP_S = 0.250
BYTES_PER_S = 200e6
SAMPLES = 256  # recent measurements kept per node
OWN_SAMPLES = 16  # a node with fewer of its own is judged by everyone's


class Latencies:
    """The recent durations of one kind of call, with their p99 (kept sorted, cheap to read)."""

    def __init__(self, size: int = SAMPLES) -> None:
        self.recent: deque[float] = deque(maxlen=size)
        self.ordered: list[float] = []

    def __len__(self) -> int:
        return len(self.recent)

    def add(self, seconds: float) -> None:
        if len(self.recent) == self.recent.maxlen:
            oldest = self.recent[0]
            del self.ordered[bisect.bisect_left(self.ordered, oldest)]
        self.recent.append(seconds)
        bisect.insort(self.ordered, seconds)

    def p99(self) -> float:
        if not self.ordered:
            return 0.0
        return self.ordered[min(len(self.ordered) - 1, int(len(self.ordered) * 0.99))]


class HedgeDelays:
    """Per-node hedge delays from the durations seen (see the module docstring)."""

    def __init__(self, floor_s: float = FLOOR_S, cap_s: float = CAP_S, warmup: int = 1) -> None:
        self.floor_s = floor_s
        self.cap_s = cap_s
        self.warmup = warmup  # answers measured before any delay below the cap
        self.by_node: dict[str, Latencies] = {}
        self.all = Latencies()
        self._typical: float | None = None  # the median node's p99 (None: too few samples)
        self._stale = 0  # observations since ``_typical`` was worked out

    def observe(self, node: str, seconds: float) -> None:
        """One call to ``node`` was answered after ``seconds``."""
        lat = self.by_node.get(node)
        if lat is None:
            if len(self.by_node) >= 1024:  # as many as the master knows; forget the rest
                self.by_node.clear()
            lat = self.by_node[node] = Latencies()
        lat.add(seconds)
        self.all.add(seconds)
        self._stale += 1

    def typical_p99(self) -> float | None:
        """The p99 of the median node, of those with ``OWN_SAMPLES`` or more (worked out again
        every 32 observations); None while none has that many."""
        if self._stale >= 32 or (self._typical is None and self._stale):
            p99s = sorted(lat.p99() for lat in self.by_node.values() if len(lat) >= OWN_SAMPLES)
            self._typical = p99s[(len(p99s) - 1) // 2] if p99s else None
            self._stale = 0
        return self._typical

    def delay_s(self, node: str = "", nbytes: int = 0) -> float:
        """How long to wait on ``node`` (""; any) for an answer of about ``nbytes`` before
        asking another. With fewer than ``warmup`` answers measured, the cap: no reason to
        hedge early. A reader's client waits for ``OWN_SAMPLES``: the slowest of a handful is
        no p99, and a busy machine's scheduling noise would hedge on it (a Spark task's new
        client hedged 6 of 500 reads of a drain, each then read again)."""
        typical = self.typical_p99()
        if typical is None:
            if len(self.all) < self.warmup:
                return self.cap_s + nbytes / BYTES_PER_S
            typical = self.all.p99()
        lat = self.by_node.get(node)
        p99 = typical if lat is None or len(lat) < OWN_SAMPLES else min(lat.p99(), typical)
        return min(self.cap_s, max(self.floor_s, 2 * p99)) + nbytes / BYTES_PER_S
