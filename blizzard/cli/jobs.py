"""``blizzard job``, ``blizzard cancel`` (a job by id, as ``JobHandle`` shows it) and
``blizzard schedule add|list|remove``."""

from __future__ import annotations

import base64
import dataclasses
import datetime
import json
from typing import Any

import click

from blizzard.cli.common import EXIT_ERROR, Seconds, keys_opt, master_opt, timeout_opt
from blizzard.cli.output import echo_json, json_opt
from blizzard.client.jobs import JobStatus
from blizzard.wire.errors import ProtocolError
from blizzard.wire.limits import MAX_EVERY_S, MAX_JOBS_WAIT_S, MIN_EVERY_S
from blizzard.worker.results import decode_result

IDS = click.argument("ids", nargs=-1, required=True, type=click.IntRange(0, 2**63 - 1))
RESULT_CHARS = 2000  # of a result's repr shown as text


@click.command()
@IDS
@click.option("--wait-s", default=0.0, show_default=True, type=Seconds(0, 3600),
              help="Wait until every job is final (done, dead, cancelled or unknown), up to "
                   "this long.")
@master_opt
@keys_opt
@timeout_opt
@json_opt
def job(ids: tuple[int, ...], wait_s: float, master: str, timeout_s: float,
        as_json: bool) -> None:
    """Show jobs by ID (what `enqueue` of a @task returned as `handle.id`): status,
    attempts, progress, and the result its worker stored.

    Status: queued, delayed, running, failed (its last run failed; a retry is due), done,
    dead (its last attempt failed), cancelled, unknown (never made, or finished and its
    result ran out). --json: {"jobs": [{"id", "state", "queue", "attempts", "runs",
    "error", "cancel_requested", "progress", "note", "result", "result_b64"}]}; "result" is
    the return value (null if none is kept, or it is not JSON), "result_b64" the stored
    result's bytes.
    """
    from blizzard.client.core import Client

    if len(ids) > 10_000:
        raise click.UsageError("at most 10,000 ids at once")
    with Client(master, timeout_s=timeout_s + min(wait_s, MAX_JOBS_WAIT_S)) as c:
        seen = c.jobs(list(ids), wait_s=wait_s)
    if as_json:
        echo_json({"jobs": [_row(s) for s in seen]})
        return
    for s in seen:
        click.echo(f"job {s.id}: {s.state}" + (" (cancel requested)" if s.cancel_requested
                                                and s.state != "cancelled" else ""))
        if s.queue:
            click.echo(f"  queue: {s.queue}, attempts: {s.attempts}")
        if s.schedule:
            click.echo(f"  schedule {s.schedule}: {s.runs} runs, one a tick; the last one's "
                       "result is kept")
        elif s.runs > 1:
            click.echo(f"  ran {s.runs} times (delivery is at least once): its last result "
                       "is kept")
        if s.progress is not None:
            click.echo(f"  progress: {s.progress:.0%}" + (f" ({s.note})" if s.note else ""))
        if s.error:
            click.echo(f"  last error: {s.error}")
        if s.result is not None and s.state != "cancelled" and not (s.state == "dead"
                                                                    and s.error):
            value, ok = _value(s)
            shown = (str(value) if s.state == "dead" else repr(value)) if ok \
                else f"<{len(s.result)} bytes, not a result>"
            label = "last error" if s.state == "dead" else "result"
            click.echo(f"  {label}: {shown[:RESULT_CHARS]}")


@click.command()
@IDS
@master_opt
@keys_opt
@timeout_opt
def cancel(ids: tuple[int, ...], master: str, timeout_s: float) -> None:
    """Cancel jobs by ID: a queued or delayed one is removed now; a running one's worker is
    told at its next lease extension, and its task stops at its next safe point
    (`blizzard.cancelled()` or `blizzard.progress()`). Says which were final already."""
    from blizzard.client.core import Client

    if len(ids) > 10_000:
        raise click.UsageError("at most 10,000 ids at once")
    from blizzard.client.jobs import cancel_explained

    with Client(master, timeout_s=timeout_s) as c:
        outcome = cancel_explained(c, list(ids))
    for item_id, why in outcome.items():
        click.echo(f"job {item_id}: " + (f"not cancelled: {why}" if why else
                                        "cancelled (a running one stops at its next check)"))


def _value(s: JobStatus) -> tuple[Any, bool]:
    """The stored result's value, and whether it was one."""
    assert s.result is not None
    try:
        return decode_result(s.result).value, True
    except ProtocolError:
        return None, False


def _row(s: JobStatus) -> dict[str, Any]:
    value, ok = _value(s) if s.result is not None else (None, False)
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        value = None
    return {"id": s.id, "state": s.state, "queue": s.queue, "attempts": s.attempts,
            "runs": s.runs, "error": s.error, "cancel_requested": s.cancel_requested,
            "progress": s.progress, "note": s.note, "result": value if ok else None,
            "result_b64": base64.b64encode(s.result).decode() if s.result is not None else None}


# -- schedules ---------------------------------------------------------------------------------

@click.group()
def schedule() -> None:
    """Schedules: a job enqueued at each tick of a cron expression, or every N seconds, once
    per tick (also across master restarts and failover), never overlapping its last run.

    A @task(cron=...) or @task(every_s=...) is declared by `blizzard worker`; these commands
    are for jobs defined elsewhere, and to see and end schedules."""


@schedule.command("add")
@click.argument("name")
@click.option("--queue", required=True, help="The queue each tick's job goes to.")
@click.option("--cron", default="", help="When: minute hour day-of-month month day-of-week "
              "(or six fields, a second first), e.g. '*/5 * * * *'.")
@click.option("--every-s", default=None, type=Seconds(MIN_EVERY_S, MAX_EVERY_S),
              help="Or: every this many seconds.")
@click.option("--timezone", default="UTC", show_default=True,
              help="The cron expression's timezone (an IANA name).")
@click.option("--catch-up/--no-catch-up", default=True, show_default=True,
              help="A tick missed while no master ran runs once when one is back (or is "
                   "skipped).")
@click.option("--task", "task_name", default=None,
              help="The job is a call of this @task (run by `blizzard worker`), with "
                   "--args and --kwargs; without it, the job's payload is --data.")
@click.option("--args", "args_json", default="[]", help="The task's arguments, a JSON list.")
@click.option("--kwargs", "kwargs_json", default="{}",
              help="The task's keyword arguments, a JSON object.")
@click.option("--data", default=None, help="The job's payload (text), for a plain consumer.")
@master_opt
@keys_opt
@timeout_opt
def schedule_add(name: str, queue: str, cron: str, every_s: float | None, timezone: str,
                 catch_up: bool, task_name: str | None, args_json: str, kwargs_json: str,
                 data: str | None, master: str, timeout_s: float) -> None:
    """Make schedule NAME (or replace it; the same schedule again changes nothing)."""
    from blizzard.client.core import Client
    from blizzard.worker.task import encode_call

    if (task_name is None) == (data is None):
        raise click.UsageError("give --task (a @task's call) or --data (a payload), one")
    if task_name is not None:
        try:
            args, kwargs = json.loads(args_json), json.loads(kwargs_json)
        except ValueError as exc:
            raise click.UsageError(f"--args and --kwargs are JSON: {exc}") from None
        if not isinstance(args, list) or not isinstance(kwargs, dict):
            raise click.UsageError("--args is a JSON list and --kwargs a JSON object")
        payload = encode_call(task_name, args, kwargs)
    else:
        assert data is not None
        payload = data.encode()
    with Client(master, timeout_s=timeout_s) as c:
        made = c.schedule(name, queue, payload, cron=cron, every_s=every_s or 0.0,
                          timezone=timezone, catch_up=catch_up)
    click.echo(f"schedule {made.name}: job {made.job} on {made.queue}, next tick "
               f"{_when(made.next_at)}")


@schedule.command("list")
@master_opt
@keys_opt
@timeout_opt
@json_opt
def schedule_list(master: str, timeout_s: float, as_json: bool) -> None:
    """The schedules, with their next ticks and runs. --json: {"schedules": [{"name",
    "queue", "job", "cron", "every_s", "timezone", "catch_up", "next_at", "runs", "state",
    "error"}]}."""
    from blizzard.client.core import Client

    with Client(master, timeout_s=timeout_s) as c:
        found = c.schedules()
    if as_json:
        echo_json({"schedules": [dataclasses.asdict(s) for s in found]})
        return
    if not found:
        click.echo("no schedules")
    for s in found:
        when = s.cron + (f" ({s.timezone})" if s.timezone != "UTC" else "") if s.cron \
            else f"every {s.every_s:g} s"
        click.echo(f"{s.name}: {when} on {s.queue}, job {s.job}, {s.runs} runs, {s.state}, "
                   f"next tick {_when(s.next_at)}")
        if s.error:
            click.echo(f"  last error: {s.error}")


@schedule.command("remove")
@click.argument("name")
@master_opt
@keys_opt
@timeout_opt
def schedule_remove(name: str, master: str, timeout_s: float) -> None:
    """End schedule NAME (needs the admin key with security on); a run going on finishes."""
    from blizzard.client.core import Client
    from blizzard.net.keys import resolve

    admin = resolve(None, "admin") is not None
    with Client(master, timeout_s=timeout_s, admin=admin) as c:
        if not c.remove_schedule(name):
            click.echo(f"no schedule {name}", err=True)
            raise SystemExit(EXIT_ERROR)
    click.echo(f"schedule {name} removed")


def _when(at: float) -> str:
    return datetime.datetime.fromtimestamp(at, datetime.UTC).isoformat(
        sep=" ", timespec="seconds")
