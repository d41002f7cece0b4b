"""``blizzard dispatch`` (deliver HTTP tasks) and ``blizzard task ID`` (what became of an item:
an HTTP task, an ``@task`` call or any other)."""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
import signal
import sys
from typing import Any, NoReturn

import click

from blizzard.cli.common import EXIT_ERROR, Seconds, keys_opt, master_opt, timeout_opt
from blizzard.cli.output import echo_json, escape, json_opt
from blizzard.server import logs
from blizzard.wire.errors import InvalidArgument
from blizzard.wire.limits import MAX_LEASE_S
from blizzard.wire.queue_settings import check_queue_name

log = logging.getLogger(__name__)
EXIT_OK = 0
STATE_WORDS = {"queued": "queued (ready to send)", "scheduled": "scheduled (waiting to be sent "
               "again, or delayed)", "in_flight": "in flight (leased by a dispatcher)",
               "succeeded": "succeeded (acked)", "failed": "failed (dead-lettered)",
               "unknown": "unknown (not waiting, in flight or dead, and not among the master's "
               "last 100,000 acks: acked earlier, purged, replaced, or never enqueued)"}


def _queue_list(ctx: Any, param: Any, value: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in value.split(",") if name.strip())
    if not names:
        raise click.BadParameter("name at least one queue", ctx, param)
    try:
        return tuple(check_queue_name(name) for name in names)
    except InvalidArgument as exc:
        raise click.BadParameter(exc.message, ctx, param) from None


def _host_list(ctx: Any, param: Any, value: str | None) -> tuple[str, ...]:
    from blizzard.dispatch.allow_hosts import HostPolicy  # yarl: loaded only by dispatch

    patterns = tuple(h.strip() for h in (value or "").split(",") if h.strip())
    if value is not None and not patterns:
        raise click.BadParameter("name at least one host", ctx, param)
    try:
        HostPolicy.parse(patterns)
    except InvalidArgument as exc:
        raise click.BadParameter(exc.message, ctx, param) from None
    return patterns


@click.command()
@master_opt
@keys_opt
@click.option("--queues", required=True, callback=_queue_list,
              help="Comma-separated queues whose tasks to deliver, e.g. emails,thumbnails.")
@click.option("--workers", default=16, show_default=True, type=click.IntRange(1, 10_000),
              help="Requests in flight at once (asyncio senders).")
@click.option("--lease-s", default=30.0, show_default=True, type=Seconds(1, MAX_LEASE_S),
              help="Lease length; extended every third of it while a task is held, so a "
                   "killed dispatcher's tasks come back this long after it died.")
@click.option("--batch", default=100, show_default=True, type=click.IntRange(1, 10_000),
              help="Tasks leased at once per queue, at most; up to two rounds of --workers "
                   "are held at a time.")
@click.option("--allow-hosts", callback=_host_list, metavar="HOST[,HOST...]",
              help="Send tasks only to these hosts: exact names or IP addresses, or *.suffix "
                   "patterns (*.example.com: any name below example.com); a task to another "
                   "host is dead-lettered unsent. Default: any host. Without it, anyone who "
                   "may enqueue can make this process request any URL it can reach, internal "
                   "services included (SSRF). Names are not resolved: an allowed name that "
                   "resolves to an internal address is still allowed.")
@timeout_opt
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]), help="Logging verbosity.")
@click.option("--log-format", default="text", show_default=True, type=click.Choice(logs.FORMATS),
              help="text for people; json: one object per line (role \"dispatch\").")
def dispatch(master: str, queues: tuple[str, ...], workers: int, lease_s: float, batch: int,
             allow_hosts: tuple[str, ...], timeout_s: float, log_level: str,
             log_format: str) -> None:
    """Deliver HTTP tasks (`Client.enqueue_task`) from QUEUES until stopped.

    A 2xx reply acks a task. Another status, no reply within the task's timeout, or a
    failed connection is retried after the task's back-off, up to its max attempts; then the
    task goes to the queue's dead-letter queue with the last error (`blizzard task ID`).
    Retries do not wait for the queue's rate limit (`queue config --rate-per-s`), which
    paces new tasks only. SIGTERM or Ctrl-C: lease no more, finish the requests in flight,
    settle them, exit; a second signal exits at once (those tasks come back after --lease-s).
    An internal error in the dispatcher is logged and stops it at once, exit 1.
    """
    from blizzard.dispatch.deliver import DispatchConfig, Dispatcher

    logs.setup(log_level, log_format, "dispatch", master)
    dispatcher = Dispatcher(DispatchConfig(master, queues, workers=workers, lease_s=lease_s,
                                           batch=batch, timeout_s=timeout_s,
                                           allow_hosts=allow_hosts))
    try:
        asyncio.run(_until_signalled(dispatcher))
    except Exception as exc:
        if not dispatcher.hard:
            raise  # a lease refused for good, the dispatcher stopped cleanly: main says why
        _exit_now(EXIT_ERROR, f"error: the dispatcher stopped at once: {type(exc).__name__}: "
                              f"{exc} (the traceback is in the log)")
    summary = "dispatched: " + ", ".join(f"{k} {dispatcher.totals[k]}" for k in
                                         ("leased", "succeeded", "retried", "dead"))
    if dispatcher.hard:
        _exit_now(EXIT_OK, summary)
    click.echo(summary)


async def _until_signalled(dispatcher: Any) -> Any:
    """Run the dispatcher; the first SIGTERM/SIGINT stops it gently, the second at once."""
    loop = asyncio.get_running_loop()
    signals = 0

    def on_signal() -> None:
        nonlocal signals
        signals += 1
        if signals == 1:
            log.info("stopping: sending and settling the tasks held; a second signal stops "
                     "at once")
        dispatcher.stop(hard=signals > 1)
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    return await dispatcher.run()


def _exit_now(code: int, line: str) -> NoReturn:
    """Say ``line``, flush the logs and exit without waiting for the client threads.

    After a hard stop a thread may be inside a master call that will not answer for
    ``--timeout-s``; the interpreter would join it before exiting.
    """
    click.echo(line, err=code != EXIT_OK)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


@click.command()
@click.argument("ids", nargs=-1, required=True, type=click.IntRange(0, 2**63 - 1))
@master_opt
@keys_opt
@timeout_opt
@json_opt
def task(ids: tuple[int, ...], master: str, timeout_s: float, as_json: bool) -> None:
    """Show what became of items by ID (HTTP tasks, @task calls or any other items): state,
    queue, attempts, last error.

    States: queued, scheduled (waiting for a retry's back-off, or delayed), in_flight
    (leased), succeeded (acked; the master remembers its last 100,000 acks), failed (in a
    dead-letter queue), unknown. --json: {"tasks": [{"id", "state", "queue", "attempts",
    "error", "until"}]}; "until" is when a scheduled task is due or an in-flight lease ends
    (unix time), else null.
    """
    from blizzard.client.core import Client
    from blizzard.client.http_delivery import lookup

    if len(ids) > 10_000:
        raise click.UsageError("at most 10,000 ids at once")
    with Client(master, timeout_s=timeout_s) as c:
        rows = lookup(c, list(ids))
    if as_json:
        echo_json({"tasks": rows})
        return
    for row in rows:
        click.echo(f"task {row['id']}: {STATE_WORDS[row['state']]}")
        if row["queue"]:
            click.echo(f"  queue: {row['queue']}, attempts: {row['attempts']}")
        if row["until"]:
            when = datetime.datetime.fromtimestamp(row["until"]).isoformat(sep=" ",
                                                                          timespec="seconds")
            label = "due" if row["state"] == "scheduled" else "lease ends"
            click.echo(f"  {label}: {when}")
        if row["error"]:
            click.echo(f"  last error: {escape(row['error'].encode())}")
