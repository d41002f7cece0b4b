"""``blizzard job`` and ``blizzard cancel``: a job by id, as ``JobHandle`` shows it."""

from __future__ import annotations

import base64
import json
from typing import Any

import click

from blizzard.cli.common import Seconds, keys_opt, master_opt, timeout_opt
from blizzard.cli.output import echo_json, json_opt
from blizzard.client.jobs import MAX_WAIT_S, JobStatus
from blizzard.wire.errors import ProtocolError
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
    with Client(master, timeout_s=timeout_s + min(wait_s, MAX_WAIT_S)) as c:
        seen = c.jobs(list(ids), wait_s=wait_s)
    if as_json:
        echo_json({"jobs": [_row(s) for s in seen]})
        return
    for s in seen:
        click.echo(f"job {s.id}: {s.state}" + (" (cancel requested)" if s.cancel_requested
                                                and s.state != "cancelled" else ""))
        if s.queue:
            click.echo(f"  queue: {s.queue}, attempts: {s.attempts}")
        if s.runs > 1:
            click.echo(f"  ran {s.runs} times (delivery is at least once): its last result "
                       "is kept")
        if s.progress is not None:
            click.echo(f"  progress: {s.progress:.0%}" + (f" ({s.note})" if s.note else ""))
        if s.error:
            click.echo(f"  last error: {s.error}")
        if s.result is not None:
            value, ok = _value(s)
            shown = repr(value) if ok else f"<{len(s.result)} bytes, not a result>"
            label = "error" if s.state == "dead" else "result"
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
    with Client(master, timeout_s=timeout_s) as c:
        done = set(c.cancel(list(ids)))
    for item_id in dict.fromkeys(ids):
        click.echo(f"job {item_id}: " + ("cancelled (a running one stops at its next check)"
                                        if item_id in done else
                                        "not cancelled: it had ended, or is unknown"))


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
