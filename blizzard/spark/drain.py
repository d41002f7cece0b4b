"""Drain a queue into Parquet or JSON files with Spark until it is empty, each item written once.

A streaming query with ``trigger(availableNow=True)`` reads the queue; ``foreachBatch`` appends
each micro-batch to the output, leaving out ids the output already holds (a batch delivered again
after a failure or a killed run). The source acks a batch once this function has returned for
it, the last batch included, so the queue ends empty.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from blizzard.client import Client
from blizzard.defaults import DEFAULT_MASTER
from blizzard.errors import InvalidArgument
from blizzard.spark.schema import SCHEMA
from blizzard.spark.source import register

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
          master: str = DEFAULT_MASTER, *, max_items_per_batch: int = 100_000,
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
    seen = existing_ids(spark, path, format)
    reader = (spark.readStream.format("blizzard").option("master", master).option("queue", queue)
              .option("maxItemsPerBatch", max_items_per_batch).option("leaseSeconds", lease_s)
              .option("timeoutSeconds", timeout_s))
    for key, value in (options or {}).items():
        reader = reader.option(key, str(value))
    counts = {"written": 0, "duplicates": 0, "bytes": 0, "batches": 0}
    started = time.monotonic()

    def write_batch(df: DataFrame, batch_id: int) -> None:
        df.persist(StorageLevel.MEMORY_AND_DISK)  # read the data nodes once, not per action
        try:
            rows = df.select("id", F.length("data")).collect()
            dups = {item_id for item_id, _ in rows if item_id in seen}
            if len(dups) < len(rows):
                out = df.filter(~F.col("id").isin(sorted(dups))) if dups else df
                out.write.mode("append").format(format).save(path)
        finally:
            df.unpersist()
        seen.update(item_id for item_id, _ in rows)
        counts["written"] += len(rows) - len(dups)
        counts["duplicates"] += len(dups)
        counts["bytes"] += sum(size for item_id, size in rows if item_id not in dups)
        counts["batches"] += 1
        now = DrainProgress(batch_id, counts["written"], counts["duplicates"], counts["bytes"],
                            total, time.monotonic() - started)
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


def existing_ids(spark: SparkSession, path: str, format: str) -> set[int]:
    """Ids already written under ``path`` (none if it does not exist yet)."""
    jvm_path = spark._jvm.org.apache.hadoop.fs.Path(path)  # any Hadoop file system, not just local
    if not jvm_path.getFileSystem(spark._jsc.hadoopConfiguration()).exists(jvm_path):
        return set()
    df = spark.read.schema(SCHEMA).format(format).load(path)
    return {row[0] for row in df.select("id").collect()}


def _show(p: DrainProgress) -> None:
    rate = p.written / p.elapsed_s if p.elapsed_s > 0 else 0.0
    line = (f"drained {p.written:,} of {p.total:,} items, {p.bytes / MB:,.1f} MB "
            f"({rate:,.0f} items/s), batch {p.batch}")
    if p.duplicates:
        line += f", {p.duplicates:,} duplicates left out"
    sys.stderr.write(("\r" + line) if sys.stderr.isatty() else line + "\n")
    sys.stderr.flush()
