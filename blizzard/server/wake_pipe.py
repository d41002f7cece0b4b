"""A pipe a server's poller watches, so that ``stop`` (from a signal handler or another
thread) wakes a loop that sleeps long when idle instead of waiting out its sleep."""

from __future__ import annotations

import os

import zmq


class WakePipe:
    def __init__(self) -> None:
        r, w = os.pipe()
        os.set_blocking(w, False)
        # file objects, not bare fds: closed when collected too (a test may drop a server)
        self._r, self._w = open(r, "rb", buffering=0), open(w, "wb", buffering=0)

    def watch_with(self, poller: zmq.Poller) -> None:
        """Make ``poller`` return when the pipe is written."""
        poller.register(self._r, zmq.POLLIN)

    def wake(self) -> None:
        """Wake the loop now. The byte is never read: it is written only to stop the loop."""
        try:
            self._w.write(b"!")
        except (OSError, ValueError):
            pass  # the pipe is full (it is awake anyway) or closed

    def close(self) -> None:
        self._r.close()
        self._w.close()
