"""Drain a queue into Parquet or JSON files with Spark until it is empty, each item written once.

A streaming query with ``trigger(availableNow=True)`` reads the queue; ``foreachBatch`` appends
each micro-batch to the output, leaving out ids the output already holds (a batch delivered again
after a failure or a killed run). Only a redelivered item (``attempts > 0``) can already be
there, so a batch of first deliveries is written in one pass, counted on the way
(``Observation``), with nothing collected to the driver; redeliveries are checked against the
output's ids. The source acks a batch once this function has returned for it, the last batch
included, so the queue ends empty.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

from blizzard.client.core import Client
from blizzard.net.defaults import DEFAULT_MASTER
from blizzard.spark.schema import SCHEMA
from blizzard.spark.source import register
from blizzard.wire.errors import InvalidArgument

FORMATS = ("parquet", "json")
MB = 1_000_000


@dataclass(frozen=True)
class DrainProgress:
    """Where a drain stands after a micro-batch was written."""

    batch: int  # Spark's batch id
    written: int  # items written by this drain so far
    duplicates: int  # items left out because the output already held them
    bytes: int  # payload bytes written so far
    total: int  # items ready when the drain started
    elapsed_s: float
    left: int = 0  # of the items ready at the start, those not taken yet


@dataclass(frozen=True)
class DrainSummary:
    """What a finished drain did, and what it left in the queue."""

    queue: str
    path: str
    format: str
    written: int
    duplicates: int
    batches: int
    bytes: int
    elapsed_s: float
    ready_after: int
    leased_after: int

    @property
    def items_per_s(self) -> float:
        return self.written / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.bytes / MB / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def __str__(self) -> str:
        left = ""
        if self.ready_after or self.leased_after:
            left = (" (ready items arrived during the drain; leased ones are held by other "
                    "consumers or a stopped run and come back when their leases end)")
        return (f"drained {self.written:,} items ({self.bytes / MB:,.1f} MB) from queue "
                f"{self.queue!r} to {self.path} ({self.format}) in {self.elapsed_s:.1f}s: "
                f"{self.items_per_s:,.0f} items/s, {self.mb_per_s:,.1f} MB/s; "
                f"{self.batches} batch{'es' if self.batches != 1 else ''}, "
                f"{self.duplicates:,} duplicates left out\n"
                f"queue {self.queue!r} now: ready {self.ready_after:,}, "
                f"leased {self.leased_after:,}{left}")


def drain(spark: SparkSession, queue: str, path: str, format: str = "parquet",
          master: str = DEFAULT_MASTER, *, max_items_per_batch: int = 250_000,
          lease_s: float = 60.0, options: Mapping[str, Any] | None = None,
          progress: bool = True, on_batch: Callable[[DrainProgress], None] | None = None,
          timeout_s: float = 30.0) -> DrainSummary:
    """Copy ``queue`` into files under ``path`` until it is empty; returns a summary.

    The output is appended to; ids already in it are not written again. ``options`` go to the
    ``blizzard`` source as they are (e.g. ``{"nodeTimeoutSeconds": 1}``); ``timeout_s`` bounds
    each call to the master. ``progress`` shows a progress line on stderr and prints the
    summary at the end. ``on_batch`` is called after each batch is written, before it is
    acked; if it raises, the drain fails there (tests use it to inject faults).
    """
    if format not in FORMATS:
        raise InvalidArgument(f"format must be one of {', '.join(FORMATS)}, not {format!r}")
    register(spark)
    with Client(master, timeout_s=timeout_s) as client:
        total = client.stats(queue)["ready"]
    reader = (spark.readStream.format("blizzard").option("master", master).option("queue", queue)
              .option("maxItemsPerBatch", max_items_per_batch).option("leaseSeconds", lease_s)
              .option("timeoutSeconds", timeout_s))
    for key, value in (options or {}).items():
        reader = reader.option(key, str(value))
    counts = {"written": 0, "duplicates": 0, "bytes": 0, "batches": 0}
    started = time.monotonic()

    def write_batch(df: DataFrame, batch_id: int) -> None:
        written, nbytes, again = _write_new(df, path, format)
        if again:
            kept, kept_bytes, duplicates = _write_redelivered(df, path, format)
            written, nbytes = written + kept, nbytes + kept_bytes
            counts["duplicates"] += duplicates
        counts["written"] += written
        counts["bytes"] += nbytes
        counts["batches"] += 1
        left = max(0, total - counts["written"] - counts["duplicates"])
        now = DrainProgress(batch_id, counts["written"], counts["duplicates"], counts["bytes"],
                            total, time.monotonic() - started, left)
        if progress:
            _show(now)
        if on_batch is not None:
            on_batch(now)

    checkpoint = tempfile.mkdtemp(prefix="blizzard-drain-")  # nothing in it is worth resuming
    try:
        query = (reader.load().writeStream.foreachBatch(write_batch)
                 .trigger(availableNow=True).option("checkpointLocation", checkpoint).start())
        query.awaitTermination()
    finally:
        shutil.rmtree(checkpoint, ignore_errors=True)
        if progress and counts["batches"] and sys.stderr.isatty():
            sys.stderr.write("\n")
    elapsed_s = time.monotonic() - started
    with Client(master, timeout_s=timeout_s) as client:
        after = client.stats(queue)
    summary = DrainSummary(queue, path, format, counts["written"], counts["duplicates"],
                           counts["batches"], counts["bytes"], elapsed_s, after["ready"],
                           after["leased"])
    if progress:
        print(summary)
    return summary


def _write_new(df: DataFrame, path: str, format: str) -> tuple[int, int, int]:
    """Append the batch's first deliveries (``attempts == 0``: no copy can be in the output
    yet), in one pass over the batch; returns rows and bytes written, and how many rows were
    redeliveries (left for ``_write_redelivered``)."""
    seen, kept = Observation(), Observation()
    new = (df.observe(seen, F.count_if(F.col("attempts") > 0).alias("again"))
           .filter(F.col("attempts") == 0).observe(kept, *_rows_and_bytes()))
    new.write.mode("append").format(format).save(path)
    return kept.get["rows"], kept.get["bytes"], seen.get["again"]


def _write_redelivered(df: DataFrame, path: str, format: str) -> tuple[int, int, int]:
    """Append the batch's redeliveries whose ids the output does not hold yet (a batch written
    but not acked before a failure comes back); a second read of the batch, only when it has
    redeliveries. Returns rows and bytes written, and how many were left out as duplicates."""
    read, kept = Observation(), Observation()
    again = (df.filter(F.col("attempts") > 0)
             .observe(read, F.count(F.lit(1)).alias("rows")).dropDuplicates(["id"]))
    if _exists(df.sparkSession, path):
        done = df.sparkSession.read.schema(SCHEMA).format(format).load(path).select("id")
        again = again.join(done, "id", "left_anti").select(*SCHEMA.fieldNames())
    again.observe(kept, *_rows_and_bytes()).write.mode("append").format(format).save(path)
    return kept.get["rows"], kept.get["bytes"], read.get["rows"] - kept.get["rows"]


def _rows_and_bytes() -> tuple[Column, Column]:
    """What a write counts on the way (``Observation``): its rows and their payload bytes."""
    return (F.count(F.lit(1)).alias("rows"),
            F.coalesce(F.sum(F.length("data")), F.lit(0)).alias("bytes"))


def _exists(spark: SparkSession, path: str) -> bool:
    """Whether ``path`` exists, on any Hadoop file system (not just local)."""
    assert spark._jvm is not None  # a live session's gateway
    jvm_path = spark._jvm.org.apache.hadoop.fs.Path(path)
    return jvm_path.getFileSystem(spark._jsc.hadoopConfiguration()).exists(jvm_path)


def _show(p: DrainProgress) -> None:
    rate = p.written / p.elapsed_s if p.elapsed_s > 0 else 0.0
    mb_s = p.bytes / MB / p.elapsed_s if p.elapsed_s > 0 else 0.0
    line = (f"drained {p.written:,} of {p.total:,} items, {p.bytes / MB:,.1f} MB, "
            f"{rate:,.0f} items/s, {mb_s:,.1f} MB/s; queue left {p.left:,}; "
            f"Spark batch id {p.batch}")
    if p.duplicates:
        line += f", {p.duplicates:,} duplicates left out"
    sys.stderr.write(("\r" + line) if sys.stderr.isatty() else line + "\n")
    sys.stderr.flush()
