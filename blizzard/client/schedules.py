"""Schedules as a client declares and reads them (master/jobs/schedules.py keeps them).

A schedule's call is one item: ``set_schedule`` stages it (payload on the data nodes, nothing
visible) and asks the master to make the schedule with it. If the master holds the same
schedule already (the same spec and call), the staged item is left to expire and the one
schedule stays: every worker that declares it at start sends the same thing.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

from blizzard.client.enqueue_options import EnqueueOptions
from blizzard.wire import cron as cronexpr
from blizzard.wire import protocol as p
from blizzard.wire.errors import InvalidArgument
from blizzard.wire.limits import MAX_DELAY_S, MAX_EVERY_S, MIN_EVERY_S
from blizzard.wire.queue_settings import check_queue_name

STAGED_DELAY_S = MAX_DELAY_S  # the call waits until the master arms it for its first tick


@dataclass(frozen=True)
class ScheduleStatus:
    """One schedule: ``job`` is its item's id (each run is that job: ``Client.jobs``),
    ``next_at`` its next tick (unix time), ``runs`` since it was made, ``state`` its job's
    (delayed between ticks, queued or running at one), ``error`` its last run's failure."""

    name: str
    queue: str
    job: int
    cron: str
    every_s: float
    timezone: str
    catch_up: bool
    next_at: float
    runs: int
    state: str
    error: str


def _status(info: p.ScheduleInfo) -> ScheduleStatus:
    spec = info.spec
    return ScheduleStatus(spec.name, spec.queue, info.job, spec.cron, spec.every_s,
                          spec.timezone, spec.catch_up, info.next_at, info.runs, info.state,
                          info.error)


def check_spec(cron: str, every_s: float, timezone: str, overlap: bool = False) -> None:
    """``InvalidArgument`` unless exactly one of ``cron`` and ``every_s`` is given, valid,
    ``timezone`` is a known IANA name, and ``overlap`` is False."""
    if overlap:
        raise InvalidArgument("overlap=True is not offered: a schedule's ticks never overlap (a "
                              "tick whose previous run is still queued or running is skipped); "
                              "for runs side by side, enqueue jobs from a scheduled task")
    if bool(cron) == bool(every_s):
        raise InvalidArgument("a schedule needs a cron expression or every_s, one of them")
    if cron:
        cronexpr.parse(cron)
    elif isinstance(every_s, bool) or not isinstance(every_s, (int, float)) \
            or not MIN_EVERY_S <= every_s <= MAX_EVERY_S:
        raise InvalidArgument(f"every_s must be {MIN_EVERY_S:.0f} to {MAX_EVERY_S:.0f} seconds, "
                              f"got {every_s!r}")
    cronexpr.timezone(timezone)


def set_schedule(client: Any, name: str, queue: str, payload: bytes, *, cron: str = "",
                 every_s: float = 0.0, timezone: str = "UTC", catch_up: bool = True,
                 overlap: bool = False) -> ScheduleStatus:
    """``Client.schedule``: make schedule ``name`` (or keep it, if the same)."""
    check_queue_name(queue)
    check_spec(cron, every_s, timezone, overlap)
    spec = p.ScheduleSpec(name, queue, cron, float(every_s), timezone, bool(catch_up))
    listed = client.master.call(p.ListSchedules([name])).schedules
    if listed and listed[0].spec == spec and (listed[0].size, listed[0].crc) == \
            (len(payload), zlib.crc32(payload)):
        return _status(listed[0])  # the same: nothing to do
    staged = client.pipeline.stage(queue, [payload], EnqueueOptions(delay_s=STAGED_DELAY_S))
    (ids, nodes, grants), = staged
    reply: p.ScheduleList = client.master.call(p.SetSchedule(spec, ids[0], nodes, grants))
    return _status(reply.schedules[0])


def list_schedules(client: Any, names: list[str] | None = None) -> list[ScheduleStatus]:
    reply: p.ScheduleList = client.master.call(p.ListSchedules(list(names or [])))
    return [_status(info) for info in reply.schedules]


def remove_schedule(client: Any, name: str) -> bool:
    reply: p.ScheduleList = client.master.call(p.RemoveSchedule(name))
    return bool(reply.schedules)
