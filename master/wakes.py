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

from collections.abc import Callable, Sequence

import zmq

from blizzard.server.wake_pipe import WakePipe

BUSY_S = 0.05  # the longest sleep while something may change with time alone
IDLE_S = 0.5  # the longest sleep otherwise

Timer = Callable[[], float | None]  # when something is due (None: nothing is)


class Wakes:
    """The loop's next pass (``next_pass``) and its alarm clock (``interrupt``).

    ``timers`` tell monotonic deadlines, ``wall_timers`` wall-clock ones (leases are given in
    wall-clock time); ``busy`` says whether something may change with time alone. The wake
    pipe joins ``poller`` (the router's; None: a test drives the loop), with ``also`` (the
    heads feed's socket: a subscription wakes the loop too, so a new subscriber is told at
    once)."""

    def __init__(self, timers: Sequence[Timer], wall_timers: Sequence[Timer],
                 busy: Callable[[], bool], idle_s: float, poller: zmq.Poller | None,
                 also: zmq.Socket[bytes] | None = None) -> None:
        self.timers = timers
        self.wall_timers = wall_timers
        self.busy = busy
        self.idle_s = min(IDLE_S, idle_s)
        self.pipe = WakePipe()
        if poller is not None:
            self.pipe.watch_with(poller)
            if also is not None:
                poller.register(also, zmq.POLLIN)

    def next_pass(self, now: float, mono: float) -> float:
        """The monotonic time by which the loop must pass again."""
        soon = [t for t in (timer() for timer in self.timers) if t is not None]
        for timer in self.wall_timers:
            deadline = timer()
            if deadline is not None:
                soon.append(mono + max(0.0, deadline - now))
        soon.append(mono + (BUSY_S if self.busy() else self.idle_s))
        return min(soon)

    def interrupt(self) -> None:
        """Wake the loop now (from a signal handler or another thread)."""
        self.pipe.wake()

    def close(self) -> None:
        self.pipe.close()
