"""The ``blizzard`` command: start servers, enqueue and dequeue, inspect a cluster.

Commands parse, call the library and format; ``BlizzardError`` becomes a one-line error
and exit code 1 in one place (``main``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import Any

import click

from blizzard.cli import dispatch as cli_dispatch
from blizzard.cli import gateways as cli_gateways
from blizzard.cli import items as cli_items
from blizzard.cli import jobs as cli_jobs
from blizzard.cli import queue as cli_queue
from blizzard.cli import removal as cli_removal
from blizzard.cli.common import (
    EXIT_ERROR,
    EXIT_USAGE,
    error_line,
    keys_opt,
    master_opt,
    stop_on_signals,
    timeout_opt,
)
from blizzard.cli.config import name_env_vars
from blizzard.cli.dashboard import STATUS_PAGE_HINT, dashboard
from blizzard.cli.keys import keys_group
from blizzard.cli.output import echo_json, json_opt
from blizzard.cli.worker import worker as worker_command
from blizzard.host.file_modes import private_process
from blizzard.net.defaults import DATANODE_PORT, LOOPBACK, MASTER_PORT
from blizzard.server import logs
from blizzard.wire.errors import BlizzardError
from blizzard.wire.release import RELEASE
from datanode.cli import datanode_command
from master.cli import master_command


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(RELEASE, prog_name="blizzard")
def cli() -> None:
    """Blizzard: a distributed, durable work queue.

    Start a master and data nodes (or `blizzard cluster` for all of it locally), then
    enqueue and dequeue from the CLI or the Python client.

    \b
    Work on items safely from a shell (nothing is lost if the work fails):
      blizzard enqueue jobs "some work"        # or: - (stdin), --file PATH
      blizzard dequeue jobs --json             # leases: id, token, attempts, data
      blizzard ack jobs ID TOKEN               # when done; or nack, or extend

    Every option can also be set by an environment variable named after the command
    and the option, shown in each --help: BLIZZARD_QUEUE_STATS_JSON=1, BLIZZARD_MASTER_DATA_DIR,
    BLIZZARD_DEQUEUE_LEASE_S. Shared by all commands: BLIZZARD_MASTER, BLIZZARD_KEYS and
    BLIZZARD_TIMEOUT_S.
    """


@cli.command()
@click.option("--data-dir", default=".blizzard", show_default=True,
              type=click.Path(file_okay=False),
              help="Directory holding the master's and every data node's data.")
@click.option("--datanodes", default=3, show_default=True, type=click.IntRange(1, 64),
              help="How many data nodes to start.")
@click.option("--replication", default=None, type=click.IntRange(1, 9),
              help="Copies of each item (R): at most --datanodes. Default: 2, or 1 with one "
                   "data node.")
@click.option("--port", default=MASTER_PORT, show_default=True, type=click.IntRange(1, 65535),
              help=f"Master port on {LOOPBACK}.")
@click.option("--node-port", default=DATANODE_PORT, show_default=True,
              type=click.IntRange(1, 65535),
              help=f"First data node port on {LOOPBACK}; the others follow "
                   f"({DATANODE_PORT + 1}, ...).")
@click.option("--insecure", is_flag=True, help="Run without keys (no encryption, no "
              "authentication).")
@click.option("--metrics/--no-metrics", default=True, show_default=True,
              help=f"Serve Prometheus metrics from every process on a free port of {LOOPBACK}.")
@click.option("--log-format", default="text", show_default=True, type=click.Choice(logs.FORMATS),
              help="Format of the processes' logs in DATA_DIR/*.log (json: one object a line).")
@click.option("--standby", is_flag=True, help="Also run a hot standby master (on a free port): "
              "it takes over when the master dies, which then comes back as its standby.")
@click.option("--beanstalkd", "beanstalkd_port", default=None, type=click.IntRange(1, 65535),
              metavar="PORT", help="Also serve beanstalkd's protocol on 127.0.0.1:PORT "
              "(`blizzard beanstalkd`, with the admin key, so kick works; docs/beanstalkd.md).")
@click.option("--sqs", "sqs_port", default=None, type=click.IntRange(1, 65535),
              metavar="PORT", help="Also serve Amazon SQS's API on http://127.0.0.1:PORT "
              "(`blizzard sqs`, with the admin key and no --credentials: anyone on this "
              "machine may use it; docs/sqs.md).")
@click.option("--masters", default=1, show_default=True, type=click.IntRange(1, 64),
              help="Shards: masters each with --datanodes data nodes of their own (ports "
                   "PORT, PORT+1, ...; heads published on the ports after them). Queues spread "
                   "over them; a dead shard master is restarted on its WAL.")
def cluster(data_dir: str, datanodes: int, replication: int | None, port: int, node_port: int,
            insecure: bool, metrics: bool, log_format: str, standby: bool,
            beanstalkd_port: int | None, sqs_port: int | None, masters: int) -> None:
    """Run a master and data nodes on 127.0.0.1 in the foreground; Ctrl-C stops them all.

    A data node that exits (or is killed) is left out: the others serve its items (see the
    liveness promise, docs/design.md); a master that exits stops the cluster, unless the
    standby takes over.

    Secure by default: the key pairs are made in DATA_DIR/keys on first start. Once it
    serves, `blizzard dashboard` (in another shell, with the exports it prints) serves a
    status page.
    """
    from blizzard.local.harness import LocalCluster

    private_process()  # its data directory, logs and keys are this user's alone (0700/0600)
    if replication is None:
        replication = min(2, datanodes)
    elif replication > datanodes:  # no enqueue could ever be placed
        raise click.BadParameter(f"{replication} copies of each item need at least {replication} "
                                 f"data nodes; --datanodes is {datanodes}",
                                 param_hint="'--replication'")
    keys = None if insecure else os.path.join(os.path.abspath(data_dir), "keys")
    if masters > 1:
        if beanstalkd_port is not None or sqs_port is not None:
            raise click.UsageError("--beanstalkd and --sqs run with one master; drop them or "
                                   "--masters")
        if standby:
            raise click.UsageError("--standby runs with one master; drop it or --masters")
        from blizzard.cli.shards import run_sharded
        run_sharded(data_dir, masters, datanodes, replication, port, node_port, keys, metrics,
                    log_format, _start)
        return
    local = LocalCluster(os.path.abspath(data_dir), datanodes=datanodes, replication=replication,
                         master_port=port, node_base_port=node_port, keys=keys, metrics=metrics,
                         log_format=log_format, standby=standby)
    stopping = stop_on_signals()
    _start(local, data_dir)
    gone: set[str] = set()  # data nodes that exited (announced once)
    gateways: dict[str, subprocess.Popen[bytes]] = {}
    try:
        click.echo(f"master {local.masters}, {datanodes} data node{'s' * (datanodes != 1)}, "
                   f"data in {data_dir}; "
                   "Ctrl-C stops")
        click.echo(f"export BLIZZARD_MASTER={local.masters}")
        if keys is not None:
            click.echo(f"export BLIZZARD_KEYS={keys}")
        for name in local.metrics_ports:
            click.echo(f"metrics of {name}: {local.metrics_url(name)}")
        if beanstalkd_port is not None:
            gateways["beanstalkd"] = _start_gateway("beanstalkd", local.masters,
                                                    beanstalkd_port, keys, data_dir)
            click.echo(f"beanstalkd protocol on 127.0.0.1:{beanstalkd_port} (log: "
                       f"{data_dir}/beanstalkd.log)")
        if sqs_port is not None:
            gateways["sqs"] = _start_gateway("sqs", local.masters, sqs_port, keys, data_dir)
            click.echo(f"SQS API on http://127.0.0.1:{sqs_port} (any access key; log: "
                       f"{data_dir}/sqs.log)")
        click.echo(STATUS_PAGE_HINT)
        while not stopping.wait(0.2):
            master, second = local.master, local.second
            if standby and master is not None and not master.alive \
                    and second is not None and second.alive:
                click.echo(f"the master {master.addr} stopped; the standby "
                           f"{second.addr} takes over, and it comes back as its standby")
                local.follow_new_primary()
            for node in local.nodes:  # the cluster goes on without it, as a real one would
                if not node.alive and node.name not in gone:
                    gone.add(node.name)
                    click.echo(f"{node.name} ({node.addr}) exited; the cluster goes on with the "
                               f"other data nodes, which re-make its replicas (its log: "
                               f"{data_dir}/{node.name}.log)")
            dead = [p.name for p in [local.master, local.second] if p is not None and not p.alive]
            dead += [f"the {kind} gateway" for kind, proc in gateways.items()
                     if proc.poll() is not None]
            if dead:
                raise click.ClickException(f"{', '.join(dead)} exited; see logs in {data_dir}")
    finally:
        for proc in gateways.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        for proc in gateways.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        local.stop()
        click.echo("stopped")


def _start_gateway(kind: str, master: str, port: int, keys: str | None,
                   data_dir: str) -> subprocess.Popen[bytes]:
    """``blizzard beanstalkd`` or ``blizzard sqs`` (``kind``) for the local cluster, with its
    admin key, its output in DATA_DIR/KIND.log."""
    env = dict(os.environ, BLIZZARD_MASTER=master)
    env.pop("BLIZZARD_KEYS", None)
    args = [sys.executable, "-m", "blizzard.cli", kind, "--listen", f"127.0.0.1:{port}"]
    if keys is not None:
        env["BLIZZARD_KEYS"] = keys
        args.append("--admin")
    with open(os.path.join(data_dir, f"{kind}.log"), "ab") as log_file:
        return subprocess.Popen(args, env=env, stdout=log_file, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _start(local: Any, data_dir: str) -> None:
    """Start ``local``; a port that is taken, or a process that exits or hangs while starting,
    is one line: the harness's summary with the last line of that process's log (its own
    one-line error). No data node starts before the master serves: none joins another cluster.
    On failure whatever had started is stopped (and nothing printed: it never ran)."""
    from blizzard.local.harness import StartFailed

    try:
        local.start()
    except BaseException as exc:
        local.stop()
        if isinstance(exc, StartFailed):
            raise click.ClickException(f"{exc.reason} (logs in {data_dir})") from None
        if isinstance(exc, (RuntimeError, TimeoutError)):
            lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
            last = lines[-1].removeprefix("Error: ")
            raise click.ClickException(f"{lines[0]} {last} (logs in {data_dir})") from None
        raise


@cli.command()
@click.argument("queue")
@click.option("--to", "path", required=True, type=click.Path(),
              help="Directory to write into (created if missing; appended to if it exists).")
@click.option("--format", "fmt", default="parquet", show_default=True,
              type=click.Choice(["parquet", "json"]), help="Output file format.")
@master_opt
@keys_opt
@timeout_opt
@click.option("--batch", default=250_000, show_default=True, type=click.IntRange(1, 1_000_000),
              help="Items per Spark micro-batch at most (batches also stop near 1 GiB).")
@click.option("--spark-master", default="local[*]", show_default=True,
              help="Spark master URL: local[N] or a cluster (spark://HOST:PORT), whose "
                   "workers need blizzard installed and the --keys directory (README: Spark).")
def drain(queue: str, path: str, fmt: str, master: str, timeout_s: float, batch: int,
          spark_master: str) -> None:
    """Copy QUEUE into Parquet or JSON files under PATH with Spark until it is empty.

    Each item is written once (ids already under PATH are left out) and acked only after
    the batch holding it is written. On a terminal a progress line shows items and MB
    written, items/s, MB/s and what is left in the queue. Needs the spark extra (pyspark,
    pyarrow) and Java 17+.
    """
    try:
        from pyspark.errors import PySparkException

        from blizzard.spark import drain as spark_drain
        from blizzard.spark import local_session
    except ImportError as exc:
        raise click.ClickException(f"drain needs pyspark and pyarrow: pip install "
                                   f"'blizzard[spark]' ({exc})") from None
    spark = local_session(spark_master, app_name=f"blizzard-drain-{queue}")
    try:
        spark_drain(spark, queue, path, fmt, master=master, max_items_per_batch=batch,
                    timeout_s=timeout_s)
    except PySparkException as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise click.ClickException(f"the drain failed; items not written stay in the queue "
                                   f"or come back when their leases end: {first}") from None
    finally:
        spark.stop()


@cli.group()
def wal() -> None:
    """Inspect a master's write-ahead log."""


@wal.command("check")
@click.argument("data_dir", type=click.Path(exists=True, file_okay=False))
@json_opt
def wal_check(data_dir: str, as_json: bool) -> None:
    """Report what a master started on DATA_DIR would find, changing nothing.

    Exit 0 when the log is whole or only has a torn tail (a start repairs it), 1 when it is
    damaged and the master would refuse to start. --json: {"verdict", "checkpoint" (null:
    none), "segments": [{"name", "records", "bytes"}], "problems", "items", "id_hi",
    "queues": {NAME: {"ready", "delayed", "leased"}}}.
    """
    from master.log.inspect import check

    report = check(data_dir)
    if as_json:
        echo_json({"verdict": report.verdict, "checkpoint": report.checkpoint or None,
                   "segments": [{"name": name, "records": records, "bytes": size}
                                for name, records, size in report.segments],
                   "problems": list(report.problems), "items": report.items,
                   "id_hi": report.id_hi,
                   "queues": {name: {"ready": r, "delayed": d, "leased": le}
                              for name, (r, d, le) in sorted(report.queues.items())}})
        if report.verdict == "corrupt":
            sys.exit(EXIT_ERROR)
        return
    click.echo(f"verdict: {report.verdict}")
    click.echo(f"checkpoint: {report.checkpoint or 'none'}")
    for name, records, size in report.segments:
        click.echo(f"segment {name}: {records} records, {size} bytes")
    for problem in report.problems:
        click.echo(f"problem: {problem}")
    click.echo(f"items: {report.items}, id high-water: {report.id_hi}")
    for name, (ready, delayed, leased) in sorted(report.queues.items()):
        click.echo(f"queue {name}: ready {ready}, delayed {delayed}, leased {leased}")
    if report.verdict == "corrupt":
        sys.exit(EXIT_ERROR)


for _command in (master_command, datanode_command, cli_items.enqueue, cli_items.dequeue,
                 cli_items.ack, cli_items.nack, cli_items.extend, cli_queue.status,
                 cli_queue.queue, keys_group, cli_removal.delete, cli_removal.node):
    cli.add_command(_command)
cli.add_command(dashboard)
cli.add_command(cli_dispatch.dispatch)
cli.add_command(cli_dispatch.task)
cli.add_command(worker_command)
cli.add_command(cli_jobs.job)
cli.add_command(cli_jobs.cancel)
cli.add_command(cli_jobs.schedule)
cli.add_command(cli_gateways.beanstalkd)
cli.add_command(cli_gateways.sqs)


def main() -> None:
    name_env_vars(cli)  # here, so commands added by any module get their variables too
    try:
        cli.main(prog_name="blizzard", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(EXIT_ERROR)
    except click.UsageError as exc:
        exc.show()
        sys.exit(EXIT_USAGE)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)  # EXIT_ERROR, or EXIT_USAGE for a bad config file
    except BlizzardError as exc:
        click.echo(f"error: {error_line(exc, sys.argv[1:], dict(os.environ))}", err=True)
        sys.exit(EXIT_ERROR)
    except SystemExit:
        raise


if __name__ == "__main__":
    main()
