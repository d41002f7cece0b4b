"""When a schedule's run ends (acked, failed for good, buried): its item waits for the next tick.

A schedule is one item re-armed rather than forgotten (``master/jobs/schedules.py``), so the
handlers that end leases (``master/consume/leases.py``, HTTP delivery's ``Bury``) split the
items they end into schedules' items, re-armed here with a ``RearmItems`` record, and the
others, settled as usual.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from blizzard.wire.errors import InvalidArgument
from master.state.machine import State
from master.state.records import RearmItems
from master.state.schedule_book import Schedule, next_tick

log = logging.getLogger(__name__)

FALLBACK_S = 3600.0  # a schedule whose next tick cannot be computed here waits this long


def next_tick_or_later(s: Schedule, after: float) -> float:
    """``next_tick``, or (its timezone unknown on this machine, say: a standby's tz database
    older than the primary's) an hour later, logged, so the master's loop never fails."""
    try:
        return next_tick(s, after, s.next_at)
    except InvalidArgument as exc:
        log.error("schedule %s: its next tick cannot be computed (%s); trying again in an "
                  "hour", s.name, exc.message)
        return after + FALLBACK_S


class ScheduleRuns:
    """Re-arms the items of schedules whose runs ended."""

    def __init__(self, state: State, log_record: Callable[[Any], None]) -> None:
        self.state = state
        self.log = log_record

    def split(self, ids: list[int]) -> tuple[list[int], list[int]]:
        """``ids`` as (schedules' items, the others)."""
        by_item = self.state.schedules.by_item
        if not by_item:
            return [], ids
        return [i for i in ids if i in by_item], [i for i in ids if i not in by_item]

    def rearm(self, ids: list[int], now: float, error: str = "") -> None:
        """The runs of these schedules' items ended: each waits for its first tick after now."""
        if not ids:
            return
        book = self.state.schedules
        nexts = []
        for item_id in ids:
            s = book.of_item(item_id)
            assert s is not None
            nexts.append(next_tick_or_later(s, max(now, s.next_at)))  # a run before its tick
            # (leased by id, woken) does not make that tick run again
        self.log(RearmItems(ids=ids, not_befores=nexts, error=error, ran=True))
