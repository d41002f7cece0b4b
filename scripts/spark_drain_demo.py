"""Drain a queue to Parquet with Spark and check the output; prints drain throughput.

Starts its own cluster under a temp dir (or uses --master), enqueues ITEMS payloads of SIZE
bytes, drains them with ``blizzard.spark.drain`` on a local SparkSession (127.0.0.1 only), then
checks that every id is in the output exactly once with its exact payload. The JVM's own
notices (incubator modules, log4j, native-hadoop) go to a log in the temp dir, shown only if
the drain fails; the cluster's keys are made there too, and removed with it.

    .venv/bin/python scripts/spark_drain_demo.py --items 20000 --size 256
    .venv/bin/python scripts/spark_drain_demo.py --items 2000 --size 65536
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import click

from blizzard import Client
from blizzard.local.harness import LocalCluster
from blizzard.net.keys import ENV as KEYS_ENV

LOG_LINES_SHOWN = 20  # of the JVM's log, when Spark fails


def payload(seq: int, size: int) -> bytes:
    seed = hashlib.sha256(seq.to_bytes(8, "big")).digest()
    return (seed * (size // len(seed) + 1))[:size]


@contextlib.contextmanager
def jvm_stderr_to(log: str) -> Iterator[None]:
    """Start Spark's JVM inside this block to give it ``log`` as its stderr.

    The JVM inherits file descriptor 2 when pyspark launches it and keeps it; its start-up
    notices there (``Using incubator modules``, log4j's profile, native-hadoop) are not for a
    demo's reader. Ours is restored on leaving the block.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.dup2(fd, 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(fd)


def with_spark(log: str, spark_master: str, app_name: str, work: Callable[[Any], Any]) -> Any:
    """``work(spark)`` on a local SparkSession whose JVM logs to ``log``; a Spark failure is
    one error with the log's last lines."""
    from pyspark.errors import PySparkException

    from blizzard.spark import local_session

    try:
        with jvm_stderr_to(log):
            spark = local_session(spark_master, app_name=app_name)
    except Exception as exc:  # no Java, a JVM that died: the reason is in its log
        raise click.ClickException(f"Spark did not start: {_first_line(exc)}\n{_tail(log)}") \
            from None
    try:
        return work(spark)
    except PySparkException as exc:
        raise click.ClickException(f"Spark failed: {_first_line(exc)}\n{_tail(log)}") from None
    finally:
        spark.stop()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _tail(log: str) -> str:
    with open(log, errors="replace") as f:
        return "the last lines of its log:\n" + "".join(f.readlines()[-LOG_LINES_SHOWN:])


def run(master: str, out_dir: str, items: int, size: int, batch: int, spark_master: str,
        log: str, queue: str = "spark-demo") -> dict:
    from blizzard.spark import drain

    with Client(master) as c:
        started = time.monotonic()
        ids: dict[int, int] = {}
        for start in range(0, items, 1000):
            seqs = range(start, min(items, start + 1000))
            made = c.enqueue_many(queue, [payload(s, size) for s in seqs])
            ids.update(zip(made, seqs, strict=True))
        enqueue_s = time.monotonic() - started
    click.echo(f"enqueued {items:,} items of {size:,} B in {enqueue_s:.1f}s")
    spark_started = time.monotonic()
    marks: list = []  # (seconds, items, bytes) after each batch, for the steady-state rate

    def work(spark: Any) -> tuple[Any, list]:
        click.echo(f"SparkSession ({spark_master}) up in {time.monotonic() - spark_started:.1f}s")
        summary = drain(spark, queue, out_dir, "parquet", master=master, max_items_per_batch=batch,
                        on_batch=lambda p: marks.append((p.elapsed_s, p.written, p.bytes)))
        return summary, spark.read.parquet(out_dir).select("id", "data").collect()
    summary, rows = with_spark(log, spark_master, "blizzard", work)
    got = {r.id: bytes(r.data) for r in rows}
    bad = sum(1 for i, s in ids.items() if got.get(i) != payload(s, size))
    click.echo(f"output: {len(rows):,} rows, {len(got):,} distinct ids, {bad} missing or damaged")
    if bad or len(rows) != items or summary.ready_after or summary.leased_after:
        raise click.ClickException("the output does not match the queue")
    result = {"payload_bytes": size, "items": items, "batch": batch, "spark_master": spark_master,
              "batches": summary.batches, "drain_s": round(summary.elapsed_s, 2),
              "items_per_s": round(summary.items_per_s), "mb_per_s": round(summary.mb_per_s, 2)}
    if len(marks) >= 2:  # after the first batch, which carries the query's start-up
        (t0, n0, b0), (t1, n1, b1) = marks[0], marks[-1]
        result["steady_items_per_s"] = round((n1 - n0) / (t1 - t0))
        result["steady_mb_per_s"] = round((b1 - b0) / 1e6 / (t1 - t0), 2)
    return result


def spark_step(master: str, queue: str, payloads: list[bytes], out_dir: str, log: str,
               spark_master: str = "local[2]") -> int:
    """The demo's Spark step: enqueue ``payloads``, drain ``queue`` to Parquet, count the rows
    (the JVM's stderr in ``log``)."""
    from blizzard.spark import drain

    with Client(master) as c:
        for start in range(0, len(payloads), 1000):
            c.enqueue_many(queue, payloads[start:start + 1000])

    def work(spark: Any) -> int:
        drain(spark, queue, out_dir, "parquet", master=master)
        return spark.read.parquet(out_dir).count()
    rows = with_spark(log, spark_master, "blizzard-demo", work)
    if rows != len(payloads):
        raise click.ClickException(f"{len(payloads)} items enqueued but {rows} rows written")
    return rows


@click.command()
@click.option("--items", default=10_000, show_default=True, type=click.IntRange(1),
              help="Items to enqueue and drain.")
@click.option("--size", default=256, show_default=True, type=click.IntRange(1, 8 << 20),
              help="Payload bytes per item.")
@click.option("--batch", default=100_000, show_default=True, type=click.IntRange(1, 1_000_000),
              help="maxItemsPerBatch of the drain.")
@click.option("--master", default=None, help="Use this cluster instead of starting one.")
@click.option("--spark-master", default="local[2]", show_default=True, help="Spark master URL.")
def main(items: int, size: int, batch: int, master: str | None, spark_master: str) -> None:
    """Enqueue ITEMS payloads, drain them to Parquet with Spark, verify, print throughput."""
    with tempfile.TemporaryDirectory(prefix="blizzard-spark-demo-") as base:
        out_dir = os.path.join(base, "out")
        log = os.path.join(base, "spark.log")
        if master:
            result = run(master, out_dir, items, size, batch, spark_master, log)
        else:
            keys = os.path.join(base, "keys")  # removed with base, unlike a process-wide one
            os.environ[KEYS_ENV] = keys
            with LocalCluster(os.path.join(base, "cluster"), datanodes=3, replication=2,
                              keys=keys) as cluster:
                result = run(cluster.master_addr, out_dir, items, size, batch, spark_master, log)
        click.echo(json.dumps(result))


if __name__ == "__main__":
    main()
