"""``blizzard worker``: run the ``@task`` functions of Python modules on jobs from queues."""

from __future__ import annotations

import importlib
import logging
import os
import signal
import sys
import time
from types import ModuleType
from typing import Any

import click

from blizzard.cli.common import KEYS_ENV, Seconds, keys_opt, master_opt, timeout_opt
from blizzard.client.core import Client
from blizzard.server import logs
from blizzard.wire.errors import InvalidArgument
from blizzard.wire.limits import MAX_LEASE_S, MIN_LEASE_S
from blizzard.wire.queue_settings import check_queue_name
from blizzard.worker.loop import Worker, WorkerConfig, brief_ids, counted
from blizzard.worker.task import configure, tasks_in

__all__ = ["worker"]

log = logging.getLogger(__name__)

def _import(names: tuple[str, ...]) -> list[ModuleType]:
    """Import the modules named (from the current directory too, as ``python -m`` would)."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    modules = []
    for name in names:
        _check_module_name(name)
        try:
            modules.append(importlib.import_module(name))
        except Exception as exc:  # whatever a user's module raises while it loads
            raise click.BadParameter(f"cannot import {name}: {type(exc).__name__}: {exc}",
                                     param_hint="MODULES") from None
    return modules


def _check_module_name(name: str) -> None:
    """A usage error for a file name given as a module (``myjobs.py``): saying the module
    name to give is clearer than importing ``myjobs`` and then failing on ``.py``."""
    if not name.endswith(".py") and "/" not in name and os.sep not in name:
        return
    path = os.path.normpath(name[:-3] if name.endswith(".py") else name)
    where, module = os.path.split(path)
    if os.path.isabs(path) or path.startswith(".."):
        instead = f"`blizzard worker {module}` in {where} (or with {where} on PYTHONPATH)"
    else:
        instead = f"`blizzard worker {path.replace(os.sep, '.')}`"
    raise click.BadParameter(f"{name} is a file; MODULES are module names, as for python -m: "
                             f"{instead}", param_hint="MODULES")


def _queue_list(ctx: Any, param: Any, value: str | None) -> tuple[str, ...]:
    if value is None:
        return ()
    try:
        return tuple(check_queue_name(q.strip()) for q in value.split(",") if q.strip())
    except InvalidArgument as exc:
        raise click.BadParameter(exc.message, ctx, param) from None


def _stop_on_signals(worker: Worker) -> None:
    """First SIGTERM/SIGINT: stop gracefully, saying how many jobs are being finished.
    Second: say which jobs are left leased and exit at once (128 + signal number); the
    leases of those jobs run out and they come back."""
    def on_signal(signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if worker.stopping:
            log.warning("%s again: quitting now; %s", name, _left_leased(worker))
            os._exit(128 + signum)  # no cleanup: a job thread may never end
        worker.stop()
        jobs = len(worker.unsettled())
        log.info("%s: %s; %s", name,
                 f"finishing {counted(jobs, 'job')}" if jobs else "no job to finish, exiting",
                 "Ctrl-C again to quit now" if signum == signal.SIGINT
                 else "another SIGTERM (or Ctrl-C) quits now")
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)


def _left_leased(worker: Worker) -> str:
    """What a hard stop leaves behind: the jobs still leased, and when they come back."""
    left = worker.unsettled()
    if not left:
        return "no job was left leased"
    # a lease in doubt may have been extended once more than its deadline says
    back_s = max(0.0, max(h.deadline + h.lease_s * h.doubtful for h in left) - time.monotonic())
    back = "it goes back to its queue when its lease ends (within {:.0f} s) and runs again" \
        if len(left) == 1 else \
        "they go back to their queues when their leases end (within {:.0f} s) and run again"
    return (f"{counted(len(left), 'job')} left leased {brief_ids([h.msg for h in left])}: "
            + back.format(back_s))


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
@click.option("--lease-s", type=Seconds(MIN_LEASE_S, MAX_LEASE_S), default=None,
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
    The first SIGTERM/SIGINT finishes the jobs taken (saying how many), acks them and exits
    0; a second one exits at once with 128 + the signal number, saying which jobs were left
    leased (they come back when their leases run out).
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
        serving = {name: t for name, t in tasks.items() if t.queue in queues}  # of --queues
        log.info("worker: %s (%s) on %s, %s%s", counted(len(serving), "task"),
                 ", ".join(sorted(serving)), ", ".join(queues), counted(concurrency, "thread"),
                 ", burst" if burst else "")
        runner.run()
