"""Drain a queue to Parquet with Spark and check the output; prints drain throughput.

Starts its own cluster under a temp dir (or uses --master), enqueues ITEMS payloads of SIZE
bytes, drains them with ``blizzard.spark.drain`` on a local SparkSession (127.0.0.1 only), then
checks that every id is in the output exactly once with its exact payload.

    .venv/bin/python scripts/spark_drain_demo.py --items 20000 --size 256
    .venv/bin/python scripts/spark_drain_demo.py --items 2000 --size 65536
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time

import click

from blizzard import Client
from blizzard.harness import LocalCluster


def payload(seq: int, size: int) -> bytes:
    seed = hashlib.sha256(seq.to_bytes(8, "big")).digest()
    return (seed * (size // len(seed) + 1))[:size]


def run(master: str, out_dir: str, items: int, size: int, batch: int, spark_master: str,
        queue: str = "spark-demo") -> dict:
    from blizzard.spark import drain, local_session

    with Client(master) as c:
        started = time.monotonic()
        ids: dict[int, int] = {}
        for start in range(0, items, 1000):
            seqs = range(start, min(items, start + 1000))
            ids.update(zip(c.enqueue_many(queue, [payload(s, size) for s in seqs]), seqs))
        enqueue_s = time.monotonic() - started
    click.echo(f"enqueued {items:,} items of {size:,} B in {enqueue_s:.1f}s")
    spark_started = time.monotonic()
    spark = local_session(spark_master)
    click.echo(f"SparkSession ({spark_master}) up in {time.monotonic() - spark_started:.1f}s")
    marks: list = []  # (seconds, items, bytes) after each batch, for the steady-state rate
    try:
        summary = drain(spark, queue, out_dir, "parquet", master=master, max_items_per_batch=batch,
                        on_batch=lambda p: marks.append((p.elapsed_s, p.written, p.bytes)))
        rows = spark.read.parquet(out_dir).select("id", "data").collect()
    finally:
        spark.stop()
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


def spark_step(master: str, queue: str, payloads: list[bytes], out_dir: str,
               spark_master: str = "local[2]") -> int:
    """The demo's Spark step: enqueue ``payloads``, drain ``queue`` to Parquet, count the rows."""
    from blizzard.spark import drain, local_session

    with Client(master) as c:
        for start in range(0, len(payloads), 1000):
            c.enqueue_many(queue, payloads[start:start + 1000])
    spark = local_session(spark_master, app_name="blizzard-demo")
    try:
        drain(spark, queue, out_dir, "parquet", master=master)
        rows = spark.read.parquet(out_dir).count()
    finally:
        spark.stop()
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
        if master:
            result = run(master, out_dir, items, size, batch, spark_master)
        else:
            with LocalCluster(os.path.join(base, "cluster"), datanodes=3, replication=2) as cluster:
                result = run(cluster.master_addr, out_dir, items, size, batch, spark_master)
        click.echo(json.dumps(result))


if __name__ == "__main__":
    main()
