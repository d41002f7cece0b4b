"""When the master's loop must pass again: the soonest timer, and a ``stop`` that wakes it.

An idle pass costs about 20 µs with warm caches but about 300 µs after a sleep, so passing
every 50 ms cost an idle master about 6 ms of CPU a second (20 idle shards: an eighth of a
core). So an idle loop sleeps until the soonest of what a timer is due for (a lease, a staged
or parked enqueue or an id block running out, a head to publish), ``IDLE_S`` at most (less
with a short ``--dead-after-s``: a silent data node is noticed by a pass). While something
may change with time alone it passes every ``BUSY_S`` as it always did: a long poll waiting
(a scheduled item comes due, a rate limit lets one more through), repairs, safe mode, a
standby to serve, a checkpoint being written. A request wakes it at once, and so do ``stop``
(a byte on a pipe the router's poller watches) and a subscription to the heads feed (a new
subscriber is told at once).
"""

from __future__ import annotations

from typing import Any

import zmq

from blizzard.server.wake_pipe import WakePipe

BUSY_S = 0.05  # the longest sleep while something may change with time alone
IDLE_S = 0.5  # the longest sleep otherwise


class Wakes:
    """The loop's next pass (``next_pass``) and its alarm clock (``interrupt``)."""

    def __init__(self, server: Any) -> None:
        self.server = server
        self.pipe = WakePipe()
        poller = getattr(server.router, "poller", None)  # a test's stand-in router has none
        if poller is not None:
            self.pipe.watch_with(poller)
            if server.heads.sock is not None:  # a subscription wakes the loop too: a new
                poller.register(server.heads.sock, zmq.POLLIN)  # subscriber is told at once

    def next_pass(self, now: float, mono: float) -> float:
        """The monotonic time by which the loop must pass again."""
        s = self.server
        soon = [t for t in (s.leases.next_wake(), s.heads.wake(), s.heads.next_round(),
                            s.enqueues.next_wake(), s.jobs.next_wake(), s.pushes.next_wake())
                if t is not None]
        for heap in (s.enqueues.expiry, s.id_blocks.expiry):
            if heap:  # (monotonic deadline, ...): staged items, id blocks
                soon.append(heap[0][0])
        deadline = s.state.expiries.next_deadline()  # wall-clock time, as leases are given
        if deadline is not None:
            soon.append(mono + max(0.0, deadline - now))
        busy = s.leases.waiters or s.repair.scan or s.repair.in_flight or s.safe_mode.on \
            or s.replication.parked or s.replication.sync_name \
            or s.checkpoints.child is not None
        soon.append(mono + (BUSY_S if busy else min(IDLE_S, s.config.dead_after_s / 4)))
        return min(soon)

    def interrupt(self) -> None:
        """Wake the loop now (from a signal handler or another thread)."""
        self.pipe.wake()

    def close(self) -> None:
        self.pipe.close()
