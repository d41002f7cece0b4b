"""``python -m chaos``: run a chaos test, show a seed's schedule, or re-check a history.

Exit codes: 0 the checker passed, 1 it found a problem (or, with ``--max-stall-s``, a data-node
fault stalled the clients too long), 2 bad usage, 3 the run could not be carried out (e.g. the
cluster did not start).
"""

from __future__ import annotations

import logging
import os
import random
import signal
import sys
import tempfile
import time
from collections.abc import Callable

import click

from blizzard.cli.common import Finite, Seconds
from chaos import checker, history
from chaos.schedule import FaultPlan, Timing, make_schedule
from chaos.workload import WorkloadConfig

EXIT_PASS = 0
EXIT_FAIL = 1
EXIT_USAGE = 2
EXIT_ERROR = 3
PARTITION_DEFAULTS = {"node_cuts": 1, "client_cuts": 1, "link_flaps": 1, "master_cuts": 0}


def _run_options(f: Callable[..., None]) -> Callable[..., None]:
    """The options ``run`` and ``schedule`` share: what decides a run's schedule."""
    opts = [
        click.option("--seed", type=int, default=None,
                     help="Seed for the schedule and the payloads (default: random, printed)."),
        click.option("--duration-s", default=60.0, show_default=True,
                     type=Seconds(10), help="Workload time under faults; healing, "
                     "draining and checking come after."),
        click.option("--datanodes", default=5, show_default=True, type=click.IntRange(4, 32),
                     help="Data nodes to start (at most two are down at once: one by a fault, one "
                     "by churn)."),
        click.option("--consumers", default=2, show_default=True, type=click.IntRange(1, 16),
                     help="Consumer threads."),
        click.option("--node-kills", default=2, show_default=True, type=click.IntRange(0),
                     help="kill -9 of a data node, restarted with its disk."),
        click.option("--node-wipes", default=1, show_default=True, type=click.IntRange(0),
                     help="kill -9 of a data node, restarted with an empty disk."),
        click.option("--master-kills", default=2, show_default=True, type=click.IntRange(0),
                     help="kill -9 of the master, restarted on its WAL."),
        click.option("--node-pauses", default=2, show_default=True, type=click.IntRange(0),
                     help="SIGSTOP of a data node for longer than the dead timeout."),
        click.option("--master-pauses", default=1, show_default=True, type=click.IntRange(0),
                     help="SIGSTOP of the master for longer than a lease."),
        click.option("--consumer-stalls", default=2, show_default=True, type=click.IntRange(0),
                     help="A consumer holds a batch past its lease before acking."),
        click.option("--scale-faults/--no-scale-faults", default=False, show_default=True,
                     help="Multiply the fault counts above by duration/60 s (for long runs)."),
        click.option("--churn-per-min", default=0.0, show_default=True,
                     type=Finite(0), help="Churn: kills and restarts of random data "
                     "nodes per minute, for the whole run (0: off)."),
        click.option("--standby/--no-standby", default=False, show_default=True,
                     help="Also run a hot standby master: master kills, pauses and cuts make it "
                          "take over, and the old master comes back as its standby."),
        click.option("--masters", default=1, show_default=True, type=click.IntRange(1, 16),
                     help="Shards: masters each with --datanodes data nodes of their own; "
                          "master faults hit one shard at a time, the others serving on."),
        click.option("--hosts/--no-hosts", default=False, show_default=True,
                     help="Run every server and client host in its own network namespace on "
                          "a bridge (needs root), and add partition faults."),
        click.option("--clients", default=2, show_default=True, type=click.IntRange(1, 16),
                     help="With --hosts: client hosts the producers and consumers share."),
        click.option("--node-cuts", type=click.IntRange(0), default=None,
                     help="With --hosts: a data node cut off from the master, not from clients "
                          f"[default: {PARTITION_DEFAULTS['node_cuts']} with --hosts]."),
        click.option("--client-cuts", type=click.IntRange(0), default=None,
                     help="With --hosts: a client host cut off from every host "
                          f"[default: {PARTITION_DEFAULTS['client_cuts']} with --hosts]."),
        click.option("--link-flaps", type=click.IntRange(0), default=None,
                     help="With --hosts: a data node's link down and up, again and again "
                          f"[default: {PARTITION_DEFAULTS['link_flaps']} with --hosts]."),
        click.option("--master-cuts", type=click.IntRange(0), default=None,
                     help="With --hosts and --standby: the primary cut off from every host "
                          "[default: 1 with both]."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def _plan(node_kills: int, node_wipes: int, master_kills: int, node_pauses: int,
          master_pauses: int, consumer_stalls: int, churn_per_min: float, scale_faults: bool,
          duration_s: float, hosts: bool, standby: bool = False,
          **partitions: int | None) -> FaultPlan:
    """The faults asked for; partition counts not given default to ``PARTITION_DEFAULTS``
    with hosts, to none without (where asking for one is a usage error)."""
    given = {k: n for k, n in partitions.items() if n is not None}
    if not hosts and any(given.values()):
        raise click.UsageError(f"--{next(k for k, n in given.items() if n).replace('_', '-')} "
                               "needs --hosts")
    defaults = {**PARTITION_DEFAULTS, "master_cuts": int(standby)} if hosts else \
        dict.fromkeys(PARTITION_DEFAULTS, 0)
    counts = {**defaults, **given}
    plan = FaultPlan(node_kills=node_kills, node_wipes=node_wipes, master_kills=master_kills,
                     node_pauses=node_pauses, master_pauses=master_pauses,
                     consumer_stalls=consumer_stalls, churn_per_min=churn_per_min, **counts)
    return plan.scaled(duration_s / 60.0) if scale_faults else plan


def _check_masters(masters: int, hosts: bool, standby: bool) -> None:
    if masters > 1 and (hosts or standby):
        raise click.UsageError("--masters runs shards of one master each on this host: "
                               "drop --hosts and --standby")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """Fault injection against a real local Blizzard cluster, with a total-queue checker."""


@cli.command()
@_run_options
@click.option("--producers", default=2, show_default=True, type=click.IntRange(1, 16),
              help="Producer threads.")
@click.option("--rate", default=150.0, show_default=True, type=Finite(1),
              help="Items per second each producer enqueues at most.")
@click.option("--batch-min", default=10, show_default=True, type=click.IntRange(1, 1000),
              help="Smallest enqueue/dequeue batch.")
@click.option("--batch-max", default=50, show_default=True, type=click.IntRange(1, 1000),
              help="Largest enqueue/dequeue batch.")
@click.option("--max-backlog", default=5000, show_default=True, type=click.IntRange(1),
              help="Producers wait while this many acknowledged items are not yet dequeued.")
@click.option("--standing-backlog", default=2000, show_default=True, type=click.IntRange(0),
              help="Consumers leave this many items queued until the drain, so faults hit "
                   "items at rest.")
@click.option("--run-dir", type=click.Path(file_okay=False), default=None,
              help="Where history, report and cluster logs go (default: a new temp dir).")
@click.option("--drain-timeout-s", default=60.0, show_default=True, type=Seconds(1),
              help="Give up draining the queue after this long.")
@click.option("--keep-data/--no-keep-data", default=False, show_default=True,
              help="Keep the WAL and LevelDB directories after a passing run "
                   "(a failing run always keeps them).")
@click.option("--max-stall-s", default=None, type=Seconds(0),
              help="Fail the run if a data-node fault (kill, wipe, pause, cut, link flap, "
                   "churn) left the clients longer than this without an acknowledged enqueue "
                   "or dequeue while they asked for one [default: no limit].")
@click.option("--replication", default=3, show_default=True, type=click.IntRange(1, 9),
              help="Copies of each item, all needed to acknowledge an enqueue; as many as "
                   "--datanodes makes any data-node fault stop enqueues (a run made to stall).")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]),
              help="Logging verbosity (also written to chaos.log in the run dir).")
def run(seed: int | None, duration_s: float, datanodes: int, consumers: int, producers: int,
        rate: float, batch_min: int, batch_max: int, max_backlog: int,
        standing_backlog: int, run_dir: str | None, drain_timeout_s: float, keep_data: bool,
        max_stall_s: float | None, replication: int, log_level: str, hosts: bool,
        clients: int, standby: bool, masters: int, **faults: object) -> None:
    """Start a cluster, run producers and consumers under faults, heal, drain, check, report."""
    from chaos.run import RunOptions
    from chaos.run import run as run_chaos

    if batch_min > batch_max:
        raise click.UsageError("--batch-min is larger than --batch-max")
    if standing_backlog >= max_backlog:
        raise click.UsageError("--standing-backlog must be below --max-backlog")
    if replication > datanodes:
        raise click.UsageError("--replication is larger than --datanodes")
    _check_masters(masters, hosts, standby)
    seed = seed if seed is not None else random.randrange(1 << 31)
    run_dir = os.path.abspath(run_dir or tempfile.mkdtemp(prefix=f"blizzard-chaos-{seed}-"))
    os.makedirs(run_dir, exist_ok=True)
    _logging(log_level, os.path.join(run_dir, "chaos.log"))
    opts = RunOptions(
        seed=seed, run_dir=run_dir, duration_s=duration_s, datanodes=datanodes,
        replication=replication, max_stall_s=max_stall_s,
        plan=_plan(duration_s=duration_s, hosts=hosts, standby=standby,
                   **faults),  # type: ignore[arg-type]
        hosts=hosts, clients=clients, standby=standby, masters=masters,
        workload=WorkloadConfig(producers=producers, consumers=consumers, batch_min=batch_min,
                                batch_max=batch_max, rate_per_producer=rate,
                                max_backlog=max_backlog, standing_backlog=standing_backlog),
        drain_timeout_s=drain_timeout_s, keep_data=keep_data)
    try:
        opts.schedule()
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    click.echo(f"chaos run: seed {seed}, run dir {run_dir}", err=True)
    signal.signal(signal.SIGTERM, _unwind)
    started = time.monotonic()
    try:
        result = run_chaos(opts)
    except Exception as exc:  # the run itself broke: say so, distinctly from a checker failure
        logging.getLogger(__name__).exception("the run could not be carried out")
        click.echo(f"chaos run failed after {time.monotonic() - started:.0f}s: "
                   f"{type(exc).__name__}: {exc}\nlogs in {run_dir}", err=True)
        sys.exit(EXIT_ERROR)
    click.echo(result.summary, nl=False)
    sys.exit(EXIT_PASS if result.passed else EXIT_FAIL)


@cli.command()
@_run_options
def schedule(seed: int | None, duration_s: float, datanodes: int, consumers: int, hosts: bool,
             clients: int, standby: bool, masters: int, **faults: object) -> None:
    """Print the fault schedule a seed gives (the same seed always gives the same one)."""
    if seed is None:
        raise click.UsageError("--seed is required to show a schedule")
    _check_masters(masters, hosts, standby)
    try:
        plan = make_schedule(seed, duration_s, datanodes=datanodes * masters, consumers=consumers,
                             plan=_plan(duration_s=duration_s, hosts=hosts, standby=standby,
                                        **faults),  # type: ignore[arg-type]
                             timing=Timing(), clients=clients if hosts else 0, standby=standby)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    for fault in plan:
        click.echo(fault.describe())


@cli.command()
@click.argument("history_path", type=click.Path(exists=True, dir_okay=False))
def check(history_path: str) -> None:
    """Run the checker again on a recorded HISTORY_PATH (history.jsonl) and print its figures."""
    result = checker.check(history.read(history_path))
    for key, value in result.to_json().items():
        if key != "examples":
            click.echo(f"{key:>20}: {value}")
    for key, value in result.examples.items():
        click.echo(f"{key:>20}: e.g. {str(value)[:300]}")
    sys.exit(EXIT_PASS if result.valid else EXIT_FAIL)


def _unwind(signum: int, frame: object) -> None:
    """SIGTERM stops a run as Ctrl-C does: the cluster is stopped and its hosts removed."""
    raise SystemExit(128 + signum)


def _logging(level: str, path: str) -> None:
    fmt = logging.Formatter("%(asctime)s %(threadName)s %(name)s %(levelname)s %(message)s")
    root = logging.getLogger()
    root.setLevel(getattr(logging, level.upper()))
    for handler in (logging.StreamHandler(), logging.FileHandler(path)):
        handler.setFormatter(fmt)
        root.addHandler(handler)


def main() -> None:
    cli(prog_name="python -m chaos")
