"""Which of several master addresses to talk to: the primary, found by trying.

Clients and data nodes are given every master's address (``tcp://a:5555,tcp://b:5555``) and
follow the primary on their own: a master that does not answer is left for the next one; a
standby answers ``NotPrimary``, and is left too, unless the next one was just found silent
(the standby is about to take over from it: waiting on the standby is the quicker way).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from blizzard.net.addrs import check_addr

QUIET_S = 2.5  # a master silent this recently is not gone back to on a standby's word (about
# the time a standby takes to take over; a primary that merely stalled is back to soon after)


def split_masters(masters: str | Sequence[str]) -> list[str]:
    """The addresses of ``"tcp://a:1,tcp://b:2"`` or of a list, each checked, none twice."""
    parts = masters.split(",") if isinstance(masters, str) else list(masters)
    addrs = list(dict.fromkeys(check_addr(a.strip()) for a in parts if a.strip()))
    if not addrs:
        check_addr("")  # raises: no address at all
    return addrs


class MasterChoice:
    """The address in use now, moved on when it fails."""

    def __init__(self, masters: str | Sequence[str]) -> None:
        self.addrs = split_masters(masters)
        self.index = 0
        self.silent: dict[str, float] = {}  # address -> monotonic time it last timed out

    @property
    def current(self) -> str:
        return self.addrs[self.index]

    def timed_out(self) -> bool:
        """The current master did not answer: try the next. True if the address changed."""
        self.silent[self.current] = time.monotonic()
        return self._next()

    def not_primary(self) -> bool:
        """The current master is a standby (or fenced): try the next, unless that one was just
        silent. True if the address changed."""
        following = self.addrs[(self.index + 1) % len(self.addrs)]
        if time.monotonic() - self.silent.get(following, -QUIET_S) < QUIET_S:
            return False
        return self._next()

    def _next(self) -> bool:
        if len(self.addrs) == 1:
            return False
        self.index = (self.index + 1) % len(self.addrs)
        return True
