"""Schedules: a job that runs at each tick of a cron expression, or every so many seconds.

A schedule is one item, its call, that the master re-arms: it waits (delayed) until its
tick, is served and run like any job, and when its run ends (acked, or failed for good) the
master puts it back to wait for the next tick (``RearmItems``) instead of forgetting it. So:

- **Each tick is enqueued once.** The item's not-before time is its tick, kept on the WAL;
  a master restart or a standby's takeover replays the same item with the same tick, and
  nothing makes a second item. A run is at least once (a lease lost to a crash is leased
  again), as for any job; a tick is not enqueued twice.
- **Ticks never overlap.** A tick that comes while the previous run is queued or running is
  skipped: the next run is for the first tick after that run ends.
- **Missed ticks.** A tick missed while no master ran is run once when one is back (its item
  is simply due) with ``catch_up``; without, it is skipped at the master's start (and
  at a standby's takeover): the item is re-armed for the next tick after now.
- **One schedule per name.** Workers that declare the same schedule send the same spec and
  call: the master keeps the one it has and drops the new item (``SetSchedule``); a
  different spec or call replaces it.
- **The task learns its tick**: a lease of a schedule's item tells the tick it was armed for
  (``Leased.ticks``, ``blizzard.current_tick()``).

The payload (the call) is on the data nodes like any item's; the master never sees it. A
schedule costs the master its item's record plus about 500 bytes; at most ``MAX_SCHEDULES``.
``ScheduleBook`` (``master/state/schedule_book.py``) is the state's part, changed only by
records; ``ScheduleDesk`` here serves the requests; ``master/consume/schedule_runs.py``
re-arms items as their runs end.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Sequence
from typing import Any

from blizzard.wire import cron as cronexpr
from blizzard.wire import protocol as p
from blizzard.wire.errors import Forbidden, InvalidArgument, TooManyItems, UnknownItem
from blizzard.wire.limits import MAX_EVERY_S, MIN_EVERY_S
from master.consume.schedule_runs import next_tick_or_later
from master.nodes.blob_deletes import Deletes
from master.rules import arguments
from master.state.item import LEASED
from master.state.records import AddSchedule, DropSchedule, RearmItems
from master.state.schedule_book import Schedule, next_tick

log = logging.getLogger(__name__)

MAX_SCHEDULES = 10_000
NAME = re.compile(r"[A-Za-z0-9._:-]{1,200}")


class ScheduleDesk:
    """``SetSchedule``, ``ListSchedules``, ``RemoveSchedule``; re-arming items as their runs
    end (``rearm``, from the ack, nack and bury handlers); skipping the ticks missed while no
    master ran, for schedules without ``catch_up`` (``skip_missed``, once, at the start)."""

    def __init__(self, state: Any, log_record: Callable[[Any], None], deletes: Deletes,
                 describe_job: Callable[[int, float], str], enqueues: Any) -> None:
        self.state = state
        self.log = log_record
        self.deletes = deletes
        self.describe_job = describe_job
        self.enqueues = enqueues  # commits the staged call (master/produce/enqueue.py)
        self.started_at = time.time()
        self.skipped_missed = False

    def set(self, msg: p.SetSchedule, now: float, *_: Any,
            may_replace: bool = True) -> p.ScheduleList:
        """The staged call is committed (the grants checked by the server first) only when
        it makes or changes the schedule; else it is left to expire, as a staged item does.
        Changing a schedule that exists needs ``may_replace`` (an admin key, with security
        on): a client key may declare a schedule, not change or end another's."""
        spec = self._check(msg.spec)
        state, book = self.state, self.state.schedules
        staged = self.enqueues.pending.get(msg.item)
        if staged is None or staged.queue != spec.queue:
            raise UnknownItem(f"item {msg.item} is not staged for queue {spec.queue} (staged "
                              "items expire): stage the schedule's call again")
        old = book.by_name.get(spec.name)
        size, crc = self.enqueues.size_and_crc(msg.item)
        old_item = state.items.get(old.item) if old is not None else None
        if old is not None and old_item is not None and self._same(old, spec) \
                and (old_item.size, old_item.crc) == (size, crc):
            return self.listing([old], now)  # one schedule: the new call is not committed
        if old is not None and not may_replace:
            raise Forbidden(f"schedule {spec.name} exists with another spec or call; changing "
                            "it needs an admin key (or `blizzard schedule remove "
                            f"{spec.name}` first, an admin's)")
        if old is None and len(book.by_name) >= MAX_SCHEDULES:
            raise TooManyItems(f"the master holds {MAX_SCHEDULES} schedules, at most")
        self.enqueues.commit(p.Commit([msg.item], msg.stored_on, "", msg.grants), now)
        first = next_tick(spec, now)
        self.log(AddSchedule(name=spec.name, queue=spec.queue, item=msg.item, cron=spec.cron,
                             every_s=spec.every_s, timezone=spec.timezone,
                             catch_up=spec.catch_up, next_at=first))
        if old_item is not None and old_item.id not in state.items:  # replaced, forgotten
            self.deletes.drop_blobs(old_item.id, old_item.nodes)
        return self.listing([book.by_name[spec.name]], now)

    def list(self, msg: p.ListSchedules, now: float, *_: Any) -> p.ScheduleList:
        if len(msg.names) > MAX_SCHEDULES:
            raise TooManyItems(f"at most {MAX_SCHEDULES} names")
        book = self.state.schedules
        found = [book.by_name[n] for n in msg.names if n in book.by_name] if msg.names \
            else sorted(book.by_name.values(), key=lambda s: s.name)
        return self.listing(found, now)

    def remove(self, msg: p.RemoveSchedule, now: float, *_: Any) -> p.ScheduleList:
        book, state = self.state.schedules, self.state
        old = book.by_name.get(msg.name)
        if old is None:
            return p.ScheduleList([])
        shown = self.listing([old], now)
        item = state.items.get(old.item)
        self.log(DropSchedule(name=msg.name))
        if item is not None and old.item not in state.items:
            self.deletes.drop_blobs(item.id, item.nodes)
        return shown

    # Sequence, not list: in this class's body ``list`` is the handler above
    def listing(self, schedules: Sequence[Schedule], now: float) -> p.ScheduleList:
        items, errors = self.state.items, self.state.errors
        cut = arguments.error_cut(len(schedules))
        rows = []
        for s in schedules:
            item = items.get(s.item)
            rows.append(p.ScheduleInfo(p.ScheduleSpec(s.name, s.queue, s.cron, s.every_s,
                                                      s.timezone, s.catch_up),
                                       s.item, s.next_at, self.state.schedules.runs[s.name],
                                       item.size if item else 0, item.crc if item else 0,
                                       self.describe_job(s.item, now),
                                       errors.get(s.item, "")[:cut]))
        return p.ScheduleList(rows)

    # -- re-arming ---------------------------------------------------------------------------

    def skip_missed(self, now: float) -> None:
        """Once: the items of schedules without ``catch_up`` whose tick passed before this
        master started wait for their next tick instead."""
        if self.skipped_missed:
            return
        self.skipped_missed = True
        items = self.state.items
        missed = [s for s in self.state.schedules.by_name.values()
                  if not s.catch_up and s.next_at < self.started_at and s.item in items
                  and items[s.item].status != LEASED and not items[s.item].attempts]
        if missed:
            log.info("skipping the ticks missed while no master ran of %d schedules without "
                     "catch_up", len(missed))
            self.log(RearmItems(ids=[s.item for s in missed],
                                not_befores=[next_tick_or_later(s, now) for s in missed],
                                error="", ran=False))

    # -- checks ------------------------------------------------------------------------------

    def _check(self, msg: p.ScheduleSpec) -> p.ScheduleSpec:
        if not NAME.fullmatch(msg.name):
            raise InvalidArgument(f"a schedule's name is 1-200 of A-Z a-z 0-9 . _ : -, not "
                                  f"{msg.name[:50]!r}")
        arguments.queue_name(msg.queue)
        if bool(msg.cron) == bool(msg.every_s):
            raise InvalidArgument("a schedule has a cron expression or every_s, one of them")
        if msg.cron:
            cronexpr.parse(msg.cron)
        else:
            arguments.seconds(msg.every_s, "every_s", low=MIN_EVERY_S, high=MAX_EVERY_S)
        cronexpr.timezone(msg.timezone)
        return msg

    @staticmethod
    def _same(old: Schedule, msg: p.ScheduleSpec) -> bool:
        """Whether ``msg`` declares ``old``'s spec again."""
        return (old.queue, old.cron, old.every_s, old.timezone, old.catch_up) == \
            (msg.queue, msg.cron, msg.every_s, msg.timezone, msg.catch_up)
