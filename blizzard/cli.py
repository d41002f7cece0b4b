"""The ``blizzard`` command: start servers, enqueue and dequeue, inspect a cluster.

Commands parse, call the library and format; ``BlizzardError`` becomes a one-line error
and exit code 1 in one place (``main``).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from typing import Any

import click

from blizzard.errors import BlizzardError

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2

MASTER_HELP = "Master address (env BLIZZARD_MASTER)."
DEFAULT_MASTER = "tcp://127.0.0.1:5555"


class Address(click.ParamType):
    """A ZeroMQ TCP address such as tcp://127.0.0.1:5555."""

    name = "tcp://HOST:PORT"

    def convert(self, value: Any, param: Any, ctx: Any) -> str:
        value = str(value)
        host, sep, port = value.removeprefix("tcp://").rpartition(":")
        if not value.startswith("tcp://") or not sep or not host or not port.isdigit() \
                or not 0 <= int(port) < 65536:
            self.fail(f"{value!r} is not an address like tcp://127.0.0.1:5555", param, ctx)
        return value


ADDRESS = Address()


def _logging(level: str) -> None:
    logging.basicConfig(level=getattr(logging, level.upper()),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")


def _serve(server: Any) -> None:
    """Run a server until SIGTERM/SIGINT, then close it cleanly."""
    def stop(signum: int, frame: Any) -> None:
        server.stop()
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        server.serve_forever()
    finally:
        server.close()


log_level = click.option("--log-level", default="info", show_default=True,
                         type=click.Choice(["debug", "info", "warning", "error"]),
                         help="Logging verbosity.")
master_opt = click.option("--master", "master", type=ADDRESS, envvar="BLIZZARD_MASTER",
                          default=DEFAULT_MASTER, show_default=True, help=MASTER_HELP)
timeout_opt = click.option("--timeout-s", default=10.0, show_default=True,
                           type=click.FloatRange(0.1), help="Give up on an unresponsive master "
                           "after this long (requests are retried meanwhile).")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="blizzard")
def cli() -> None:
    """Blizzard: a distributed, durable work queue.

    Start a master and data nodes (or `blizzard cluster` for all of it locally), then
    enqueue and dequeue from the CLI or the Python client.
    """


def master_options(f: Any) -> Any:
    opts = [
        click.option("--data-dir", required=True, type=click.Path(file_okay=False),
                     help="Directory for the master's WAL (created if missing)."),
        click.option("--bind", type=ADDRESS, default=DEFAULT_MASTER, show_default=True,
                     help="Address to listen on."),
        click.option("--replication", default=2, show_default=True, type=click.IntRange(1, 9),
                     help="Copies of each item (R)."),
        click.option("--min-replicas", default=None, type=click.IntRange(1, 9),
                     help="Copies that must be durable before an enqueue is acknowledged (W); default R."),
        click.option("--heartbeat-s", default=1.0, show_default=True, type=click.FloatRange(0.01),
                     help="How often data nodes should heartbeat."),
        click.option("--dead-after-s", default=5.0, show_default=True, type=click.FloatRange(0.05),
                     help="A data node silent this long is dead."),
        click.option("--pending-timeout-s", default=30.0, show_default=True,
                     type=click.FloatRange(0.1),
                     help="An enqueue not committed within this is dropped and its blobs deleted."),
        click.option("--max-item-bytes", default=8 * 1024 * 1024, show_default=True,
                     type=click.IntRange(1), help="Largest payload accepted."),
        click.option("--checkpoint-records", default=500_000, show_default=True,
                     type=click.IntRange(1), help="Write a checkpoint (in a forked child) after "
                     "this many WAL records; restarts replay at most about this many."),
        log_level,
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


@cli.command()
@master_options
def master(data_dir: str, bind: str, replication: int, min_replicas: int | None,
           heartbeat_s: float, dead_after_s: float, pending_timeout_s: float,
           max_item_bytes: int, checkpoint_records: int, log_level: str) -> None:
    """Run the master: queue metadata, ids, placement, leases, WAL."""
    from master.config import MasterConfig
    from master.server import MasterServer
    from master.wal import WalCorrupt

    _logging(log_level)
    config = MasterConfig(data_dir=data_dir, bind=bind, replication=replication,
                          min_replicas=min_replicas, heartbeat_s=heartbeat_s,
                          dead_after_s=dead_after_s, pending_timeout_s=pending_timeout_s,
                          max_item_bytes=max_item_bytes, checkpoint_records=checkpoint_records)
    try:
        server = MasterServer(config)
    except WalCorrupt as exc:
        raise click.ClickException(str(exc)) from None
    _serve(server)


@cli.command()
@click.option("--data-dir", required=True, type=click.Path(file_okay=False),
              help="Directory for this node's LevelDB and id (created if missing).")
@click.option("--bind", type=ADDRESS, default="tcp://127.0.0.1:5601", show_default=True,
              help="Address to listen on.")
@click.option("--advertise", type=ADDRESS, default=None,
              help="Address clients and peers use to reach this node; default: --bind.")
@master_opt
@click.option("--heartbeat-s", default=1.0, show_default=True, type=click.FloatRange(0.01),
              help="Seconds between heartbeats to the master.")
@click.option("--max-item-bytes", default=8 * 1024 * 1024, show_default=True,
              type=click.IntRange(1), help="Largest blob accepted.")
@log_level
def datanode(data_dir: str, bind: str, advertise: str | None, master: str, heartbeat_s: float,
             max_item_bytes: int, log_level: str) -> None:
    """Run a data node: stores payload blobs in LevelDB."""
    from datanode.server import DatanodeConfig, DatanodeServer

    _logging(log_level)
    config = DatanodeConfig(data_dir=data_dir, bind=bind, master=master, advertise=advertise,
                            heartbeat_s=heartbeat_s, max_item_bytes=max_item_bytes)
    _serve(DatanodeServer(config))


@cli.command()
@click.option("--data-dir", default=".blizzard", show_default=True, type=click.Path(file_okay=False),
              help="Directory holding the master's and every data node's data.")
@click.option("--datanodes", default=3, show_default=True, type=click.IntRange(1, 64),
              help="How many data nodes to start.")
@click.option("--replication", default=2, show_default=True, type=click.IntRange(1, 9),
              help="Copies of each item (R).")
@click.option("--port", default=5555, show_default=True, type=click.IntRange(1, 65535),
              help="Master port on 127.0.0.1.")
@click.option("--node-port", default=5601, show_default=True, type=click.IntRange(1, 65535),
              help="First data node port on 127.0.0.1; the others follow (5602, ...).")
def cluster(data_dir: str, datanodes: int, replication: int, port: int, node_port: int) -> None:
    """Run a master and data nodes on 127.0.0.1 in the foreground; Ctrl-C stops them all."""
    from blizzard.harness import LocalCluster

    local = LocalCluster(os.path.abspath(data_dir), datanodes=datanodes, replication=replication,
                         master_port=port, node_base_port=node_port)
    stopping = False

    def stop(signum: int, frame: Any) -> None:
        nonlocal stopping
        stopping = True
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        local.start()
        click.echo(f"master {local.master_addr}, {datanodes} data nodes, data in {data_dir}; "
                   "Ctrl-C stops")
        click.echo(f"export BLIZZARD_MASTER={local.master_addr}")
        while not stopping:
            time.sleep(0.2)
            dead = [p.name for p in [local.master, *local.nodes] if p is not None and not p.alive]
            if dead:
                raise click.ClickException(f"{', '.join(dead)} exited; see logs in {data_dir}")
    finally:
        local.stop()
        click.echo("stopped")


@cli.command()
@click.argument("queue")
@click.argument("data", nargs=-1, required=True)
@master_opt
@timeout_opt
@click.option("--priority", default=0, show_default=True, type=int,
              help="Lower is served first; equal priorities are FIFO.")
@click.option("--delay-s", default=0.0, show_default=True, type=click.FloatRange(0),
              help="Keep the items invisible this long (scheduled items).")
@click.option("--key", default=None, help="Items sharing a key are never leased at the same time.")
@click.option("--coalesce", is_flag=True,
              help="With --key: replace waiting items with the same key (latest data kept).")
def enqueue(queue: str, data: tuple[str, ...], master: str, timeout_s: float, priority: int,
            delay_s: float, key: str | None, coalesce: bool) -> None:
    """Add each DATA argument (UTF-8 text) to QUEUE as one item; prints the ids."""
    from blizzard.client import Client

    with Client(master, timeout_s=timeout_s) as c:
        for item_id in c.enqueue_many(queue, [d.encode() for d in data], priority=priority,
                                      delay_s=delay_s, key=key, coalesce=coalesce):
            click.echo(item_id)


@cli.command()
@click.argument("queue")
@master_opt
@timeout_opt
@click.option("--n", default=1, show_default=True, type=click.IntRange(1, 10000),
              help="How many items to take at most.")
@click.option("--ack/--no-ack", default=True, show_default=True,
              help="Acknowledge (delete) the items after printing them; --no-ack leaves them "
                   "leased until the lease ends.")
@click.option("--lease-s", default=None, type=click.FloatRange(0.001),
              help="Lease length; default: the queue's configured lease.")
@click.option("--wait-s", default=0.0, show_default=True, type=click.FloatRange(0, 300),
              help="Wait this long for an item if the queue is empty.")
def dequeue(queue: str, master: str, timeout_s: float, n: int, ack: bool, lease_s: float | None,
            wait_s: float) -> None:
    """Take items from QUEUE and print `id<TAB>data` lines (exit 3 if none)."""
    from blizzard.client import Client

    with Client(master, timeout_s=timeout_s) as c:
        msgs = c.dequeue_many(queue, n, lease_s=lease_s, wait_s=wait_s)
        for m in msgs:
            click.echo(f"{m.id}\t{m.data.decode(errors='backslashreplace')}")
        if msgs and ack:
            c.ack_many(msgs)
    if not msgs:
        click.echo(f"queue {queue!r} is empty", err=True)
        sys.exit(3)


@cli.command()
@master_opt
@timeout_opt
def status(master: str, timeout_s: float) -> None:
    """Show data nodes (alive, items, bytes) and queues (ready, leased)."""
    from blizzard.client import Client

    with Client(master, timeout_s=timeout_s) as c:
        st = c.status()
    click.echo(f"data nodes (replication {st.replication}, under-replicated items "
               f"{st.under_replicated}):")
    click.echo(f"  {'node':<16} {'address':<24} {'state':<6} {'hb age':>7} {'items':>9} "
               f"{'bytes':>12} {'free':>10}")
    for n in st.nodes:
        click.echo(f"  {n.node_id:<16} {n.addr:<24} {'alive' if n.alive else 'DEAD':<6} "
                   f"{n.heartbeat_age_s:>6.1f}s {n.items:>9} {n.bytes_used:>12} "
                   f"{n.free_bytes // (1 << 20):>8}Mi")
    click.echo("queues:")
    click.echo(f"  {'queue':<24} {'ready':>9} {'delayed':>9} {'leased':>9} {'pending':>9}")
    for q in st.queues:
        click.echo(f"  {q.queue:<24} {q.ready:>9} {q.delayed:>9} {q.leased:>9} {q.pending:>9}")


@cli.group()
def wal() -> None:
    """Inspect a master's write-ahead log."""


@wal.command("check")
@click.argument("data_dir", type=click.Path(exists=True, file_okay=False))
def wal_check(data_dir: str) -> None:
    """Report what a master started on DATA_DIR would find, changing nothing.

    Exit 0 when the log is whole or only has a torn tail (a start repairs it), 1 when it is
    damaged and the master would refuse to start.
    """
    from master.inspect import check

    report = check(data_dir)
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


def queue_options(f: Any) -> Any:
    opts = [
        click.option("--lease-s", type=click.FloatRange(0.001), help="Default lease length."),
        click.option("--max-attempts", type=click.IntRange(0),
                     help="Deliveries before an item is dead-lettered (0: unlimited; default 10)."),
        click.option("--dead-letter", help="Dead-letter queue name (default: QUEUE.dead)."),
        click.option("--backoff-base-s", type=click.FloatRange(0),
                     help="Retry delay after the first failure, doubling per attempt (0: none)."),
        click.option("--backoff-cap-s", type=click.FloatRange(0), help="Longest retry delay."),
        click.option("--rate-per-s", type=click.FloatRange(0),
                     help="Leases granted per second over all consumers (0: unlimited)."),
        click.option("--burst", type=click.IntRange(0), help="Leases granted at once after idling."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def _print_settings(settings: dict[str, Any]) -> None:
    for name, value in settings.items():
        click.echo(f"{name}: {value}")


@cli.group()
def queue() -> None:
    """Create, configure and inspect named queues."""


@queue.command("create")
@click.argument("name")
@master_opt
@timeout_opt
@queue_options
def queue_create(name: str, master: str, timeout_s: float, **options: Any) -> None:
    """Create queue NAME with the given settings (error if it exists)."""
    from blizzard.client import Client

    with Client(master, timeout_s=timeout_s) as c:
        _print_settings(c.create_queue(name, **{k: v for k, v in options.items() if v is not None}))


@queue.command("config")
@click.argument("name")
@master_opt
@timeout_opt
@queue_options
def queue_config(name: str, master: str, timeout_s: float, **options: Any) -> None:
    """Show queue NAME's settings, changing those given (the queue is created if new)."""
    from blizzard.client import Client

    changes = {k: v for k, v in options.items() if v is not None}
    with Client(master, timeout_s=timeout_s) as c:
        _print_settings(c.configure_queue(name, **changes) if changes else c.queue_config(name))


@queue.command("list")
@master_opt
@timeout_opt
def queue_list(master: str, timeout_s: float) -> None:
    """Every queue with its counters."""
    from blizzard.client import Client

    with Client(master, timeout_s=timeout_s) as c:
        rows = c.queues()
    click.echo(f"{'queue':<28} {'ready':>9} {'delayed':>9} {'leased':>9} {'dead':>7} {'oldest':>9}")
    for q in rows:
        click.echo(f"{q['queue']:<28} {q['ready']:>9} {q['delayed']:>9} {q['leased']:>9} "
                   f"{q['dead']:>7} {q['oldest_age_s']:>8.1f}s")


@queue.command("stats")
@click.argument("name")
@master_opt
@timeout_opt
def queue_stats(name: str, master: str, timeout_s: float) -> None:
    """Queue NAME's counters: ready, delayed, leased, pending, dead, oldest item age."""
    from blizzard.client import Client

    with Client(master, timeout_s=timeout_s) as c:
        _print_settings(c.stats(name))


@queue.command("purge")
@click.argument("name")
@master_opt
@timeout_opt
@click.confirmation_option(prompt="Drop every waiting item of this queue?",
                           help="Do not ask for confirmation.")
def queue_purge(name: str, master: str, timeout_s: float) -> None:
    """Drop every waiting (ready or delayed) item of queue NAME; leased items stay."""
    from blizzard.client import Client

    with Client(master, timeout_s=timeout_s) as c:
        click.echo(f"purged {c.purge(name)} items")


@queue.command("peek")
@click.argument("name")
@master_opt
@timeout_opt
@click.option("--n", default=1, show_default=True, type=click.IntRange(1, 10000),
              help="How many head items to show.")
def queue_peek(name: str, master: str, timeout_s: float, n: int) -> None:
    """Show the head items of queue NAME without leasing them."""
    from blizzard.client import Client

    with Client(master, timeout_s=timeout_s) as c:
        for m in c.peek(name, n):
            click.echo(f"{m.id}\tpriority={m.priority}\tattempts={m.attempts}\t"
                       f"{m.data.decode(errors='backslashreplace')}")


@queue.command("redrive")
@click.argument("name")
@master_opt
@timeout_opt
@click.option("--n", default=10000, show_default=True, type=click.IntRange(1, 10000),
              help="How many dead items to move back at most.")
def queue_redrive(name: str, master: str, timeout_s: float, n: int) -> None:
    """Move dead items of queue NAME (or of dead-letter queue NAME) back, attempts reset."""
    from blizzard.client import Client

    with Client(master, timeout_s=timeout_s) as c:
        click.echo(f"redrove {c.redrive(name, n)} items")


def main() -> None:
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(EXIT_ERROR)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except BlizzardError as exc:
        click.echo(f"error: {exc.message} ({type(exc).__name__})", err=True)
        sys.exit(EXIT_ERROR)
    except SystemExit:
        raise


if __name__ == "__main__":
    main()
