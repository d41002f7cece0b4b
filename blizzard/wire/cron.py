"""Cron expressions and when they next fire: what a schedule's ticks are (master/jobs/schedules.py).

Five fields, ``minute hour day-of-month month day-of-week``, or six with ``second`` first
(``*/10 * * * * *``: every ten seconds). Each field is ``*``, a number, a range ``a-b``, a
step ``*/n`` or ``a-b/n``, or a comma-separated list of those; months and weekdays may be
named (``jan``, ``mon``); weekday 0 and 7 are Sunday. As in Vixie cron, when both
day-of-month and day-of-week are restricted, a day matching either fires.

Times are in ``timezone`` (an IANA name, default UTC). A local time a daylight-saving change
skips never fires; a local time it repeats fires once, at its first occurrence.
"""

from __future__ import annotations

import datetime as dt
import zoneinfo
from dataclasses import dataclass

from blizzard.wire.errors import InvalidArgument

MONTHS = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
DAYS = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"]
SEARCH_YEARS = 5  # a spec that fires in none of the next five years is refused
# (name, low, high, names whose index + offset is the value)
FIELDS = [("second", 0, 59, None, 0), ("minute", 0, 59, None, 0), ("hour", 0, 23, None, 0),
          ("day of month", 1, 31, None, 0), ("month", 1, 12, MONTHS, 1),
          ("day of week", 0, 7, DAYS, 0)]


@dataclass(frozen=True)
class Cron:
    """A parsed expression: the values each field allows, and whether the day fields were
    restricted (not ``*``)."""

    text: str
    seconds: frozenset[int]
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 is Sunday
    days_restricted: bool
    weekdays_restricted: bool

    def day_matches(self, day: dt.date) -> bool:
        in_month = day.day in self.days
        in_week = (day.isoweekday() % 7) in self.weekdays
        if self.days_restricted and self.weekdays_restricted:
            return in_month or in_week
        return in_month and in_week


def parse(text: str) -> Cron:
    """``text`` as a ``Cron``; ``InvalidArgument`` saying which field is wrong and why."""
    if not isinstance(text, str) or len(text) > 200:
        raise InvalidArgument("a cron expression is text of at most 200 characters")
    parts = text.split()
    if len(parts) == 5:
        parts = ["0", *parts]
    elif len(parts) != 6:
        raise InvalidArgument(f"cron expression {text!r} has {len(parts)} field"
                              f"{'' if len(parts) == 1 else 's'}: give five "
                              "(minute hour day-of-month month day-of-week) or six (a second "
                              "first)")
    values = [_field(part, *spec, text) for part, spec in zip(parts, FIELDS, strict=True)]
    weekdays = frozenset(d % 7 for d in values[5])
    seconds, minutes, hours, days, months = (frozenset(v) for v in values[:5])
    cron = Cron(text, seconds, minutes, hours, days, months, weekdays, parts[3] != "*",
                parts[5] != "*")
    start = dt.datetime(2000, 1, 1)
    if _next_local(cron, start, start + dt.timedelta(days=366 * 8)) is None:
        raise InvalidArgument(f"cron expression {text!r} never fires (no such day)")
    return cron


def _field(part: str, name: str, low: int, high: int, names: list[str] | None, offset: int,
           text: str) -> set[int]:
    out: set[int] = set()
    for piece in part.split(","):
        rng, _, step_text = piece.partition("/")
        step = 1
        if step_text:
            if not (step_text.isascii() and step_text.isdigit()) or int(step_text) == 0:
                raise InvalidArgument(f"cron expression {text!r}: the {name} step "
                                      f"{step_text!r} is not a positive number")
            step = int(step_text)
        if rng == "*":
            first, last = low, high
        elif "-" in rng:
            a, _, b = rng.partition("-")
            first, last = _value(a, name, low, high, names, offset, text), \
                _value(b, name, low, high, names, offset, text)
            if first > last:
                raise InvalidArgument(f"cron expression {text!r}: the {name} range {rng} "
                                      "runs backwards")
        else:
            first = _value(rng, name, low, high, names, offset, text)
            last = high if step_text else first
        out.update(range(first, last + 1, step))
    return out


def _value(text_value: str, name: str, low: int, high: int, names: list[str] | None,
           offset: int, text: str) -> int:
    lowered = text_value.lower()
    if names is not None and lowered in names:
        return names.index(lowered) + offset
    if not (lowered.isascii() and lowered.isdigit()) or not low <= int(lowered) <= high:
        raise InvalidArgument(f"cron expression {text!r}: the {name} {text_value!r} is not a "
                              f"number from {low} to {high}" +
                              (f" or a name ({', '.join(names)})" if names else ""))
    return int(lowered)


def timezone(name: str) -> zoneinfo.ZoneInfo:
    """The IANA timezone ``name``; ``InvalidArgument`` for an unknown one."""
    if not isinstance(name, str) or not name or len(name) > 64 or ".." in name \
            or name.startswith("/"):
        raise InvalidArgument(f"timezone {name!r} is not an IANA name such as UTC or "
                              "Europe/Berlin")
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):  # a folder: IsADirectoryError
        raise InvalidArgument(f"unknown timezone {name!r} (an IANA name such as UTC or "
                              "Europe/Berlin)") from None


def next_after(cron: Cron, after: float, zone: str = "UTC") -> float:
    """The first time (unix) strictly after ``after`` that ``cron`` fires in ``zone``."""
    tz = timezone(zone)
    local = dt.datetime.fromtimestamp(int(after) + 1, tz).replace(tzinfo=None)
    limit = local + dt.timedelta(days=366 * SEARCH_YEARS)
    while True:
        found = _next_local(cron, local, limit)
        if found is None:
            raise InvalidArgument(f"cron expression {cron.text!r} fires in none of the next "
                                  f"{SEARCH_YEARS} years")
        aware = found.replace(tzinfo=tz, fold=0)
        back = aware.astimezone(dt.UTC).astimezone(tz).replace(tzinfo=None)
        if back == found:  # not a time a daylight-saving change skips
            at = aware.timestamp()
            if at > after:
                return at
        local = found + dt.timedelta(seconds=1)


def _next_local(cron: Cron, t: dt.datetime, limit: dt.datetime) -> dt.datetime | None:
    """The first naive local time at or after ``t`` (whole seconds) that matches, before
    ``limit``; field by field, from the largest, so a yearly spec takes few steps."""
    t = t.replace(microsecond=0)
    while t < limit:
        if t.month not in cron.months:
            t = (t.replace(day=1, hour=0, minute=0, second=0) + dt.timedelta(days=32)
                 ).replace(day=1)
            continue
        if not cron.day_matches(t.date()):
            t = t.replace(hour=0, minute=0, second=0) + dt.timedelta(days=1)
            continue
        if t.hour not in cron.hours:
            t = t.replace(minute=0, second=0) + dt.timedelta(hours=1)
            continue
        if t.minute not in cron.minutes:
            t = t.replace(second=0) + dt.timedelta(minutes=1)
            continue
        if t.second not in cron.seconds:
            t += dt.timedelta(seconds=1)
            continue
        return t
    return None
