"""Log lines that an outsider can cause, at most one per interval per reason, with a count.

A refused handshake, a connection shut for being over a cap, a file that cannot be opened for
want of descriptors: each is worth a line, but one per event lets anyone who can reach a port
write the log as fast as they can knock (1,000 handshakes with random keys made 634 lines in
3 s). ``Throttled`` logs the first event of a reason at once; later ones within ``every_s``
are only counted, and the next line after the interval says how many there were.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

EVERY_S = 10.0


class Throttled:
    """One logger's lines for repeated events, at most one per ``every_s`` per reason.

    Safe to call from several threads (the ZAP handler's, a connection guard's, the loop's).
    """

    def __init__(self, logger: logging.Logger, every_s: float = EVERY_S,
                 level: int = logging.WARNING,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.logger = logger
        self.every_s = every_s
        self.level = level
        self.clock = clock
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}  # reason -> when its last line was written
        self._unlogged: dict[str, int] = {}  # reason -> events since that line
        self.total: dict[str, int] = {}  # reason -> every event since the start

    def __call__(self, reason: str, msg: str, *args: Any) -> bool:
        """Count one event of ``reason``; log ``msg % args`` if its interval has passed (the
        line then adds how many more came since the last one). True if a line was written."""
        now = self.clock()
        with self._lock:
            self.total[reason] = self.total.get(reason, 0) + 1
            last = self._last.get(reason)
            if last is not None and now - last < self.every_s:
                self._unlogged[reason] = self._unlogged.get(reason, 0) + 1
                return False
            more = self._unlogged.pop(reason, 0)
            self._last[reason] = now
        if more:  # some were not logged: a line was, at ``last``
            assert last is not None
            msg += " (and %d more since the last such line, %.0fs ago)"
            args = (*args, more, now - last)
        self.logger.log(self.level, msg, *args)
        return True
