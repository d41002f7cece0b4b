"""The batch write: executors stage payloads, the driver's job commit makes them visible at once.

``write`` (one task per partition, on executors) stores payloads durably but invisibly with
``Client.stage``; its commit message lists the staged ids. ``commit`` (on the driver, only when
every task succeeded) makes them visible with ``Client.commit``. A failed or aborted job commits
nothing, and the master drops the staged items after its pending timeout (P3: an enqueue that
failed does not appear later).
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Iterator, Optional

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import (BinaryType, ByteType, DataType, DoubleType, FloatType, IntegerType,
                               LongType, ShortType, StringType, StructType)

from blizzard.client import Client
from blizzard.errors import InvalidArgument, UnknownItem
from blizzard.pipeline import Staged
from blizzard.protocol import MAX_BATCH
from blizzard.spark.options import WriteOptions

log = logging.getLogger(__name__)

STAGE_ITEMS = 1000  # rows buffered per stage call
STAGE_BYTES = 16 * 1024 * 1024
PENDING_MARGIN_S = 5.0  # commit only if the oldest staged chunk is this far from expiring

INTEGRAL = (ByteType, ShortType, IntegerType, LongType)
COLUMNS: dict[str, tuple[type[DataType], ...]] = {
    "data": (BinaryType, StringType),  # required; text is stored as UTF-8
    "priority": INTEGRAL,  # lower is served first; null: 0
    "key": (StringType,),  # items sharing a key are never leased at the same time; null: none
    "delay_s": INTEGRAL + (FloatType, DoubleType),  # invisible this long after staging; null: 0
}


def check_write_schema(schema: StructType) -> None:
    """Refuse a DataFrame Blizzard cannot enqueue, before any task runs."""
    names = schema.fieldNames()
    if "data" not in names:
        raise InvalidArgument("writing to blizzard needs a 'data' column (binary or string)")
    for f in schema.fields:
        allowed = COLUMNS.get(f.name)
        if allowed is None:
            raise InvalidArgument(f"column {f.name!r} cannot be written to blizzard; "
                                  f"columns: {', '.join(COLUMNS)}")
        if not isinstance(f.dataType, allowed):
            raise InvalidArgument(f"column {f.name!r} has type {f.dataType.simpleString()}; "
                                  f"allowed: {', '.join(t.typeName() for t in allowed)}")


@dataclass
class StagedChunks(WriterCommitMessage):
    """What one task staged: the ids to commit, and when its first stage began (wall clock)."""

    staged: Staged = field(default_factory=list)
    rows: int = 0
    started_at: float = 0.0


class BlizzardWriter(DataSourceArrowWriter):
    """Enqueue a DataFrame's rows: all of them, or none if the job fails."""

    def __init__(self, opts: WriteOptions, schema: StructType) -> None:
        self.opts = opts
        self.columns = schema.fieldNames()

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagedChunks:
        out = StagedChunks()
        # Client.stage takes one priority, delay and key per call, so rows are grouped by them.
        buffers: dict[tuple[int, float, str | None], list[bytes]] = defaultdict(list)
        buffered = 0
        with Client(self.opts.master, timeout_s=self.opts.timeout_s) as client:
            def flush() -> None:
                nonlocal buffered
                if buffers and not out.started_at:  # the master's pending clock starts now
                    out.started_at = time.time()
                for (priority, delay_s, key), blobs in buffers.items():
                    out.staged += client.stage(self.opts.queue, blobs, priority=priority,
                                               delay_s=delay_s, key=key)
                buffers.clear()
                buffered = 0

            for batch in iterator:
                n = batch.num_rows
                data = batch.column("data").to_pylist()
                priorities, delays, keys = (batch.column(c).to_pylist() if c in self.columns
                                            else [None] * n for c in ("priority", "delay_s", "key"))
                for blob, priority, delay_s, key in zip(data, priorities, delays, keys):
                    if blob is None:
                        raise InvalidArgument(f"row {out.rows} has a null 'data' value")
                    if isinstance(blob, str):
                        blob = blob.encode()
                    group = (0 if priority is None else int(priority),
                             0.0 if delay_s is None else float(delay_s), key)
                    buffers[group].append(blob)
                    buffered += len(blob)
                    out.rows += 1
                    if out.rows % STAGE_ITEMS == 0 or buffered >= STAGE_BYTES:
                        flush()
            flush()
        return out

    def commit(self, messages: list[Optional[WriterCommitMessage]]) -> None:
        chunks = [m for m in messages if isinstance(m, StagedChunks)]
        staged = [c for m in chunks for c in m.staged]
        if not staged:
            return
        oldest_s = time.time() - min(m.started_at for m in chunks if m.staged)
        if oldest_s > self.opts.pending_timeout_s - PENDING_MARGIN_S:
            raise UnknownItem(f"the write staged items {oldest_s:.0f}s ago, too close to the "
                              f"master's pending timeout ({self.opts.pending_timeout_s:g}s) to "
                              "commit them all; nothing was committed (write smaller jobs or "
                              "raise the master's --pending-timeout-s and pendingTimeoutSeconds)")
        with Client(self.opts.master, timeout_s=self.opts.timeout_s) as client:
            plan = commit_plan(staged, client.status().replication)
            client.commit(plan)
        log.info("committed %d rows to queue %r in %d request(s)",
                 sum(m.rows for m in chunks), self.opts.queue, len(plan))

    def abort(self, messages: list[Optional[WriterCommitMessage]]) -> None:
        staged = sum(len(ids) for m in messages if isinstance(m, StagedChunks)
                     for ids, _ in m.staged)
        log.warning("write to queue %r aborted: %d staged items stay invisible and are dropped "
                    "after the master's pending timeout", self.opts.queue, staged)


def commit_plan(staged: Staged, replication: int) -> Staged:
    """Regroup staged chunks into as few Commit requests as stay exact (one if <= MAX_BATCH ids).

    A Commit names one set of nodes for all its ids, and the master keeps, for each item, those
    nodes of its placement that are in the set. A chunk stored on ``replication`` nodes was
    stored on its whole placement, so all such chunks can share the union of their node sets;
    a chunk stored on fewer nodes keeps its own set, so no replica is claimed that was not made.
    """
    groups: dict[tuple[str, ...], list[int]] = defaultdict(list)
    full: list[int] = []
    union: set[str] = set()
    for ids, nodes in staged:
        if len(set(nodes)) >= replication:
            full += ids
            union.update(nodes)
        else:
            groups[tuple(sorted(set(nodes)))] += ids
    if full:
        groups[tuple(sorted(union))] += full
    return [(ids[i:i + MAX_BATCH], list(nodes))
            for nodes, ids in groups.items() for i in range(0, len(ids), MAX_BATCH)]
