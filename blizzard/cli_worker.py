"""``blizzard worker``: run the ``@task`` functions of Python modules on jobs from queues."""

from __future__ import annotations

import importlib
import logging
import os
import signal
import sys
from types import ModuleType
from typing import Any

import click

from blizzard import logs
from blizzard.cli_common import KEYS_ENV, keys_opt, master_opt, timeout_opt
from blizzard.client import Client
from blizzard.errors import InvalidArgument
from blizzard.queue_settings import check_queue_name
from blizzard.task import configure, tasks_in
from blizzard.worker import Worker, WorkerConfig

__all__ = ["worker"]

log = logging.getLogger(__name__)

def _import(names: tuple[str, ...]) -> list[ModuleType]:
    """Import the modules named (from the current directory too, as ``python -m`` would)."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    modules = []
    for name in names:
        try:
            modules.append(importlib.import_module(name))
        except Exception as exc:  # whatever a user's module raises while it loads
            raise click.BadParameter(f"cannot import {name}: {type(exc).__name__}: {exc}",
                                     param_hint="MODULE") from None
    return modules


def _queue_list(ctx: Any, param: Any, value: str | None) -> tuple[str, ...]:
    if value is None:
        return ()
    try:
        return tuple(check_queue_name(q.strip()) for q in value.split(",") if q.strip())
    except InvalidArgument as exc:
        raise click.BadParameter(exc.message, ctx, param) from None


def _stop_on_signals(worker: Worker) -> None:
    """First SIGTERM/SIGINT: stop gracefully. Second: exit at once (128 + signal number);
    the leases of unfinished jobs run out and those jobs come back."""
    def on_signal(signum: int, frame: Any) -> None:
        if worker.stopping:
            os._exit(128 + signum)  # no cleanup: a job thread may never end
        worker.stop()
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)


@click.command("worker")
@click.argument("modules", nargs=-1, required=True)
@click.option("--queues", callback=_queue_list, default=None,
              help="Comma-separated queues to serve, the first preferred when several have "
                   "jobs (default: every queue the modules' tasks use).")
@click.option("--concurrency", default=8, show_default=True, type=click.IntRange(1, 1024),
              help="Jobs run at once, each in a thread of this process (run one worker per "
                   "core for CPU-bound Python jobs).")
@click.option("--burst", is_flag=True, help="Exit once every queue is empty and the jobs "
              "taken are done.")
@click.option("--lease-s", type=click.FloatRange(0.001, 12 * 3600.0), default=None,
              help="Lease length for jobs (default: each queue's lease_s); leases of long "
                   "jobs are extended while they run.")
@master_opt
@keys_opt
@timeout_opt
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]),
              help="Logging verbosity (a failed job is a warning).")
@click.option("--log-format", default="text", show_default=True, type=click.Choice(logs.FORMATS),
              help="text for people; json: one object per line, as the servers write them "
                   "(role: worker, addr: the master).")
def worker(modules: tuple[str, ...], queues: tuple[str, ...], concurrency: int, burst: bool,
           lease_s: float | None, master: str, timeout_s: float, log_level: str,
           log_format: str) -> None:
    """Run the @task functions defined in MODULES (import paths such as jobs or app.tasks)
    on jobs from their queues, until SIGTERM or Ctrl-C.

    \b
    A job that returns is acked; one that raises is nacked with its error and retried after
    the queue's back-off, until its max_attempts move it to the dead-letter queue. A job
    naming an unknown task, or not a task call at all, goes to the dead-letter queue.
    The first SIGTERM/SIGINT finishes the jobs taken, acks them and exits 0; a second one
    exits at once with 128 + the signal number (unfinished jobs come back when their leases
    run out).
    """
    logs.setup(log_level, log_format, "worker", master)
    try:
        tasks = tasks_in(_import(modules))
    except InvalidArgument as exc:
        raise click.BadParameter(exc.message, param_hint="MODULES") from None
    if not tasks:
        raise click.BadParameter(f"no @task functions in {', '.join(modules)}",
                                 param_hint="MODULES")
    served = {t.queue for t in tasks.values()}
    if not queues:
        queues = tuple(sorted(served))
    unknown = [q for q in queues if q not in served]
    if unknown:
        raise click.BadParameter(f"no task of {', '.join(modules)} uses queue(s) "
                                 f"{', '.join(unknown)}; theirs: {', '.join(sorted(served))}",
                                 param_hint="--queues")
    keys = os.environ.get(KEYS_ENV)
    configure(master=master, keys=keys, timeout_s=timeout_s)  # jobs that enqueue
    with Client(master, timeout_s=timeout_s, keys=keys) as client:
        runner = Worker(client, tasks, WorkerConfig(queues, concurrency, burst, lease_s))
        _stop_on_signals(runner)
        log.info("worker: %d tasks (%s) on %s, %d threads%s", len(tasks),
                 ", ".join(sorted(tasks)), ", ".join(queues), concurrency,
                 ", burst" if burst else "")
        runner.run()
