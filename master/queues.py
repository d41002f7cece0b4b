"""Queue configuration and the pure policies that use it: retry back-off and rate limits."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from blizzard.errors import InvalidArgument

MAX_ATTEMPTS_LIMIT = 1_000_000


@dataclass(frozen=True)
class QueueConfig:
    """How one named queue behaves; every queue starts with these defaults."""

    lease_s: float = 30.0  # lease length when a consumer does not name one
    max_attempts: int = 10  # deliveries before an item is dead-lettered; 0 = unlimited
    dead_letter: str = ""  # where dead items go; "" = "<queue>.dead"
    backoff_base_s: float = 0.0  # retry delay after attempt 1, doubling per attempt; 0 = none
    backoff_cap_s: float = 300.0  # the longest retry delay
    rate_per_s: float = 0.0  # leases granted per second across all consumers; 0 = unlimited
    burst: int = 0  # leases that may be granted at once after idling; 0 = max(1, rate)

    @classmethod
    def option_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    def dead_letter_queue(self, queue: str) -> str:
        return self.dead_letter or f"{queue}.dead"

    def validate(self) -> "QueueConfig":
        def finite(name: str, value: float, low: float, high: float) -> None:
            if not (isinstance(value, (int, float)) and not isinstance(value, bool)
                    and math.isfinite(value) and low <= value <= high):
                raise InvalidArgument(f"queue option {name} must be a number in [{low:g}, {high:g}], "
                                      f"got {value!r}")
        finite("lease_s", self.lease_s, 0.001, 12 * 3600.0)
        finite("backoff_base_s", self.backoff_base_s, 0.0, 86400.0)
        finite("backoff_cap_s", self.backoff_cap_s, 0.0, 7 * 86400.0)
        finite("rate_per_s", self.rate_per_s, 0.0, 1e7)
        for name in ("max_attempts", "burst"):
            value = getattr(self, name)
            if type(value) is not int or not 0 <= value <= MAX_ATTEMPTS_LIMIT:
                raise InvalidArgument(f"queue option {name} must be an integer in "
                                      f"[0, {MAX_ATTEMPTS_LIMIT}], got {value!r}")
        if not isinstance(self.dead_letter, str) or len(self.dead_letter) > 200:
            raise InvalidArgument("queue option dead_letter must be a queue name")
        return self

    def backoff_s(self, attempts: int) -> float:
        """Delay before an item that has failed ``attempts`` times is visible again."""
        if self.backoff_base_s <= 0 or attempts <= 0:
            return 0.0
        return min(self.backoff_cap_s, self.backoff_base_s * 2 ** min(attempts - 1, 60))


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
