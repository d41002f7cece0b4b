"""The schedules the state keeps (``State.schedules``): changed only by records.

A schedule is kept as the ``AddSchedule`` record that made it, its ``next_at`` moved on by
each ``RearmItems`` (a new record value, ``dataclasses.replace``), and the count of its runs.
``next_tick`` is the pure rule of when a schedule fires next; the requests and the clock are
``master/jobs/schedules.py``'s.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from blizzard.wire import cron as cronexpr
from blizzard.wire import protocol as p
from master.state.records import AddSchedule

Schedule = AddSchedule  # a schedule is the record that made it, its next tick moved on


class ScheduleBook:
    """The schedules by name, and by item, with each one's count of runs."""

    def __init__(self) -> None:
        self.by_name: dict[str, Schedule] = {}
        self.by_item: dict[int, str] = {}
        self.runs: dict[str, int] = {}

    def add(self, s: Schedule, runs: int = 0) -> int | None:
        """Keep ``s``; the item of the schedule it replaces, if another."""
        old = self.by_name.get(s.name)
        if old is not None:
            self.by_item.pop(old.item, None)
        self.by_name[s.name] = s
        self.by_item[s.item] = s.name
        self.runs[s.name] = runs
        return old.item if old is not None and old.item != s.item else None

    def drop(self, name: str) -> int | None:
        old = self.by_name.pop(name, None)
        if old is None:
            return None
        self.by_item.pop(old.item, None)
        self.runs.pop(name, None)
        return old.item

    def of_item(self, item: int) -> Schedule | None:
        name = self.by_item.get(item)
        return self.by_name[name] if name is not None else None

    def rearm(self, s: Schedule, next_at: float, ran: bool) -> None:
        """``s`` waits for ``next_at``; its run (``ran``) counted."""
        self.by_name[s.name] = dataclasses.replace(s, next_at=next_at)
        self.runs[s.name] += ran

    def export(self) -> list[list[Any]]:
        return [[s.name, s.queue, s.item, s.cron, s.every_s, s.timezone, s.catch_up, s.next_at,
                 self.runs[s.name]] for s in self.by_name.values()]

    @classmethod
    def restore(cls, rows: list[list[Any]] | None) -> ScheduleBook:
        book = cls()
        for row in rows or ():
            book.add(Schedule(*row[:8]), runs=row[8])
        return book


def next_tick(s: Schedule | p.ScheduleSpec, after: float, anchor: float | None = None) -> float:
    """The first tick of ``s`` strictly after ``after``; every-N-seconds ticks keep to the
    grid of ``anchor`` (a tick they had)."""
    if s.cron:
        return cronexpr.next_after(cronexpr.parse(s.cron), after, s.timezone)
    if anchor is None:
        return after + s.every_s
    return anchor + (math.floor((after - anchor) / s.every_s) + 1) * s.every_s
