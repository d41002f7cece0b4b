"""Item ids: the one place that hands them out and reserves them in the WAL ahead of use."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from master.state.machine import State
from master.state.records import Reserve


class ItemIds:
    """Hands out ids in order; a ``Reserve`` record keeps a block ahead, so most placements log
    nothing.

    ``state.id_hi`` is the high-water mark the WAL knows; ``durable_hi`` is the part of it
    already fsynced (set by the server after each pass's flush).
    """

    def __init__(self, state: State, log: Callable[[Any], None], block: int) -> None:
        self.state = state
        self.log = log
        self.block = block
        self.next = state.id_hi
        self.durable_hi = state.id_hi

    def take(self, n: int) -> int:
        """Hand out ``n`` consecutive ids; return the first."""
        first = self.next
        if first + n > self.state.id_hi:
            self.log(Reserve(id_hi=first + n + self.block))
        self.next = first + n
        return first

    def all_durable(self) -> bool:
        """True if every id handed out lies below a reservation already on disk."""
        return self.next <= self.durable_hi

    def synced(self, id_hi: int | None = None) -> None:
        """What the WAL reserved (up to ``id_hi``, by default all of it) is durable: on disk,
        and on a synchronous standby if there is one (``master/ha/wal_shipping.py``)."""
        self.durable_hi = max(self.durable_hi, self.state.id_hi if id_hi is None else id_hi)
