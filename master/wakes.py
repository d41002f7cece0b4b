"""When the master's loop must pass again, and a ``stop`` that wakes it at once.

The loop sleeps until a long poll runs out or a head is due to be published, at most
``IDLE_S`` (its other timers are checked every pass). ``stop`` wakes a sleeping loop at once
(a byte on a pipe the router's poller watches), and a subscription to the heads feed wakes it
too, so a newcomer is told at once.

An idle pass costs about 20 µs with warm caches but about 300 µs after a sleep, so passing
every 50 ms costs an idle master about 6 ms of CPU a second (20 idle shards: an eighth of a
core). Sleeping up to 0.5 s (waking for lease deadlines, staged and parked enqueues and id
blocks, and every 50 ms while repairs, safe mode, a standby or a checkpoint are under way)
cut that to 1.5 ms, but is not on: with it, a test process's shared ZeroMQ context now and
then stopped reaching a master just started (a fresh context still did; not understood yet).
"""

from __future__ import annotations

import os
from typing import Any

import zmq

IDLE_S = 0.05  # the longest sleep (0.5 would save CPU: see above)


class Wakes:
    """The loop's next pass (``next_pass``) and its alarm clock (``interrupt``)."""

    def __init__(self, server: Any) -> None:
        self.server = server
        r, w = os.pipe()
        os.set_blocking(w, False)
        # file objects, not bare fds: closed when collected too (a test may drop a server)
        self._r, self._w = open(r, "rb", buffering=0), open(w, "wb", buffering=0)
        poller = getattr(server.router, "poller", None)  # a test's stand-in router has none
        if poller is not None:
            poller.register(self._r, zmq.POLLIN)
            if server.heads.sock is not None:  # a subscription wakes the loop too: a new
                poller.register(server.heads.sock, zmq.POLLIN)  # subscriber is told at once

    def next_pass(self, mono: float) -> float:
        """The monotonic time by which the loop must pass again: a long poll running out, a
        head to publish, or ``IDLE_S`` from now."""
        s = self.server
        return min([t for t in (s.leases.next_wake(), s.heads.wake()) if t is not None]
                   + [mono + IDLE_S])

    def interrupt(self) -> None:
        """Wake the loop now (from a signal handler or another thread)."""
        try:
            self._w.write(b"!")
        except (OSError, ValueError):
            pass  # the pipe is full (it is awake anyway) or closed

    def close(self) -> None:
        self._r.close()
        self._w.close()
