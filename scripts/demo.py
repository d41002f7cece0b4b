"""The demo: a producer and a consumer move N items through a local cluster; nothing is lost.

Everything it makes (data, keys, Spark's output and log) lives in one temporary directory,
removed when it ends; the Spark JVM's own notices go to a log there, not to the terminal.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import tempfile
import threading
import time
from collections.abc import Iterator

import click

from blizzard import Client
from blizzard.local.harness import LocalCluster, StartFailed
from blizzard.net.keys import ENV as KEYS_ENV


def payload(seq: int) -> bytes:
    body = f"item {seq:08d} ".encode() * 8
    return hashlib.sha256(body).digest() + body


def verify(data: bytes) -> int:
    digest, body = data[:32], data[32:]
    if hashlib.sha256(body).digest() != digest:
        raise click.ClickException("a payload came back damaged")
    return int(body[5:13])


@click.command()
@click.option("--items", default=10_000, show_default=True, type=click.IntRange(1, 10_000_000))
@click.option("--batch", default=100, show_default=True, type=click.IntRange(1, 10_000))
@click.option("--datanodes", default=3, show_default=True, type=click.IntRange(1, 16))
@click.option("--replication", default=2, show_default=True, type=click.IntRange(1, 9))
@click.option("--jobs", default=1000, show_default=True, type=click.IntRange(1, 100_000),
              help="Jobs run through `blizzard worker`.")
@click.option("--spark/--no-spark", default=True, show_default=True,
              help="Also drain ITEMS items to Parquet with Spark (needs Java 17+).")
def main(items: int, batch: int, datanodes: int, replication: int, jobs: int,
         spark: bool) -> None:
    """Start a cluster under a temp dir, produce and consume ITEMS items, run JOBS jobs
    through a worker, drain ITEMS more to Parquet with Spark, report, stop, remove the dir."""
    with tempfile.TemporaryDirectory(prefix="blizzard-demo-") as base:
        click.echo(f"starting 1 master + {datanodes} data nodes (R={replication}) under {base}")
        keys = os.path.join(base, "keys")  # not a process-wide one in /tmp: removed with base
        os.environ[KEYS_ENV] = keys  # for the clients here, the worker and Spark
        with running(LocalCluster(base, datanodes=datanodes, replication=replication,
                                  keys=keys)) as cluster:
            click.echo(f"master at {cluster.master_addr}; security on (CURVE keys in "
                       f"{cluster.keys})")
            produced: list[int] = []
            errors: list[BaseException] = []

            def produce() -> None:
                try:
                    with Client(cluster.master_addr) as c:
                        for start in range(0, items, batch):
                            stop = min(items, start + batch)
                            batch_data = [payload(i) for i in range(start, stop)]
                            produced.extend(c.enqueue_many("demo", batch_data))
                except BaseException as exc:
                    errors.append(exc)

            started = time.monotonic()
            producer = threading.Thread(target=produce, daemon=True)
            producer.start()
            seen: set[int] = set()
            duplicates = 0
            with Client(cluster.master_addr) as c, \
                    click.progressbar(length=items, label="consumed", show_pos=True) as bar:
                while len(seen) < items and not errors:
                    msgs = c.dequeue_many("demo", batch, lease_s=60, wait_s=1.0)
                    for m in msgs:
                        seq = verify(m.data)
                        duplicates += seq in seen
                        seen.add(seq)
                    c.ack_many(msgs)
                    bar.update(len(msgs))
                producer.join()
                if errors:
                    raise click.ClickException(f"producer failed: {errors[0]!r}")
                elapsed = time.monotonic() - started
                stats = c.stats("demo")
            lost = items - len(seen & set(range(items)))
            click.echo(f"items: {items}  produced: {len(produced)}  consumed: {len(seen)}  "
                       f"duplicates: {duplicates}  lost: {lost}")
            click.echo(f"time: {elapsed:.2f}s  throughput: {items / elapsed:,.0f} items/s "
                       f"(produced and consumed concurrently, batch {batch})")
            click.echo(f"queue after: ready {stats['ready']}, leased {stats['leased']}")
            if lost or stats["ready"] or stats["leased"]:
                raise click.ClickException("items were lost or left behind")
            click.echo("nothing lost")
            from worker_demo import worker_step  # scripts/ is on sys.path
            click.echo(worker_step(cluster.master_addr, jobs))
            if spark:
                from spark_drain_demo import spark_step  # scripts/ is on sys.path
                click.echo("spark: enqueueing the items again and draining them to Parquet")
                out = os.path.join(base, "parquet")
                rows = spark_step(cluster.master_addr, "demo", [payload(i) for i in range(items)],
                                  out, log=os.path.join(base, "spark.log"))
                click.echo(f"spark: {rows:,} rows in {out}")
            click.echo("stopping the cluster")
    click.echo(f"stopped; {base} (data, keys, output) removed")
    click.echo(next_steps())


@contextlib.contextmanager
def running(cluster: LocalCluster) -> Iterator[LocalCluster]:
    """``cluster`` started, stopped on leaving; a start that fails is one line, not a traceback."""
    try:
        cluster.start()
    except (StartFailed, RuntimeError, TimeoutError) as exc:
        cluster.stop()
        raise click.ClickException(f"the cluster did not start: {exc}") from None
    try:
        yield cluster
    finally:
        cluster.stop()


def next_steps() -> str:
    """What to try next by hand, with how to get the ``blizzard`` command in one's shell."""
    activate = os.path.join(sys.prefix, "bin", "activate")
    if os.path.exists(activate):
        get_cli = (f"source {os.path.relpath(activate)}   # puts `blizzard` on your PATH "
                   "(or: pip install -e . in your own environment)")
    else:
        get_cli = "pip install -e .   # from the repository: puts `blizzard` on your PATH"
    return "\n".join([
        "",
        "Next, by hand:",
        f"  {get_cli}",
        "  blizzard cluster --data-dir /tmp/bz   # a cluster in the foreground; prints two "
        "exports",
        "  # in another shell, after those two exports:",
        "  blizzard enqueue jobs 'hello'         # prints the new item's id",
        "  blizzard dequeue jobs                 # leases it: prints id, token and data",
        "  blizzard ack jobs ID TOKEN            # done: the item is deleted",
        "  blizzard dashboard                    # the status page: http://127.0.0.1:8080/",
    ])


if __name__ == "__main__":
    main(prog_name="scripts/demo")
