"""Queue configuration and the pure policies that use it: retry back-off and rate limits."""

from __future__ import annotations

import math
from dataclasses import dataclass

from blizzard.wire.queue_settings import DEAD_SUFFIX, Settings


@dataclass(frozen=True)
class QueueConfig(Settings):
    """How one named queue behaves, with the policies its settings imply.

    The settings themselves (names, types, defaults, bounds) are ``Settings``'s, in
    ``blizzard/wire/queue_settings.py``; this class adds only behaviour.
    """

    def dead_letter_queue(self, queue: str) -> str:
        return self.dead_letter or queue + DEAD_SUFFIX

    def backoff_s(self, attempts: int) -> float:
        """Delay before an item that has failed ``attempts`` times is visible again."""
        if self.backoff_base_s <= 0 or attempts <= 0:
            return 0.0
        factor: int = 2 ** min(attempts - 1, 60)  # an int: the exponent is never negative
        return min(self.backoff_cap_s, self.backoff_base_s * factor)


class TokenBucket:
    """A token bucket in monotonic time: ``rate`` tokens a second, holding at most ``burst``."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate = rate
        self.burst = float(burst or max(1, math.ceil(rate)))
        self.tokens = self.burst
        self.stamp: float | None = None

    def take(self, want: int, now: float) -> int:
        """Take up to ``want`` whole tokens; return how many were taken."""
        if self.rate <= 0:
            return want
        if self.stamp is not None:
            self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        got = min(want, int(self.tokens))
        self.tokens -= got
        return got
