"""When a server holds a pass's sync open for a moment: group commit across callers.

A server's pass takes the requests that came, handles them, makes their changes durable with
one sync (the master's WAL fsync, a data node's ``WriteBatch(sync=True)``) and answers. Under
many concurrent callers, the requests of the next pass are often already on their way: holding
the sync for a short, bounded window lets one sync, one pass and (at a data node) one report
to the master serve them too. With few callers it would only add latency, so a pass holds
only when at least ``min_others`` peers other than the ones in the pass itself sent requests
within the last ``recent_s``: they are the ones likely to send during the hold. (A caller in
the pass waits for this pass's answer before it sends again.)

The rule of PostgreSQL's ``commit_delay`` with ``commit_siblings``, per pass.
"""

from __future__ import annotations

from collections.abc import Iterable

WINDOW_S = 0.001  # the longest hold: added to a pass's latency, at most, while busy
MIN_OTHERS = 2  # recently active peers, beyond the pass's own, before a pass holds
RECENT_S = 0.02  # how recently a peer must have sent to count as active
MAX_PEERS = 4096  # peers remembered at most (the oldest are forgotten first)


class SyncHold:
    """Tracks which peers sent recently and says whether the current pass should hold.

    ``window_s`` 0 turns holding off.
    """

    def __init__(self, window_s: float = WINDOW_S, min_others: int = MIN_OTHERS,
                 recent_s: float = RECENT_S) -> None:
        self.window_s = window_s
        self.min_others = min_others
        self.recent_s = recent_s
        self.last: dict[bytes, float] = {}  # peer -> when it last sent (monotonic), oldest first
        self.holds = 0  # passes held so far (for tests and metrics)

    def saw(self, peers: Iterable[bytes], now: float) -> None:
        """Note that ``peers`` sent requests at ``now``."""
        last = self.last
        for peer in peers:
            last.pop(peer, None)  # moved to the end: the dict stays oldest first
            last[peer] = now
        while len(last) > MAX_PEERS:
            del last[next(iter(last))]

    def should_hold(self, in_pass: set[bytes], now: float) -> bool:
        """Whether a pass whose requests came from ``in_pass`` should wait for more."""
        if self.window_s <= 0:
            return False
        last, since = self.last, now - self.recent_s
        while last:  # forget peers not seen recently (oldest first)
            peer = next(iter(last))
            if last[peer] >= since:
                break
            del last[peer]
        others = len(last) - sum(1 for peer in in_pass if peer in last)
        if others >= self.min_others:
            self.holds += 1
            return True
        return False
