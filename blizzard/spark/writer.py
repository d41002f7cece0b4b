"""The batch write: executors stage payloads, the driver's job commit makes them visible at once.

``write`` (one task per partition, on executors) stores payloads durably but invisibly with
``Client.stager`` (``Client.stage`` with several chunks in flight); its commit message lists the
staged ids. ``commit`` (on the driver, only when every task succeeded) makes them visible with
``Client.commit``. A failed or aborted job commits nothing, and the master drops the staged
items after its pending timeout (P3: an enqueue that failed does not appear later).

Rows are taken from Arrow column by column; only a DataFrame with ``priority``, ``delay_s`` or
``key`` columns is looked at row by row (one stage call shares them). The master keeps at most
200,000 staged items per connection and 1,000,000 in all: a task opens a new connection every
``PER_CONNECTION`` rows, and one job writes at most a million rows.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import (
    BinaryType,
    ByteType,
    DataType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructType,
)

from blizzard.client.core import Client
from blizzard.client.pipeline import Staged
from blizzard.client.producer import Stager
from blizzard.spark.options import WriteOptions
from blizzard.wire.errors import InvalidArgument, UnknownItem
from blizzard.wire.protocol import MAX_BATCH, PutGrant
from blizzard.wire.shard_messages import shard_of

log = logging.getLogger(__name__)

STAGE_ITEMS = 4000  # rows buffered before they are sent on (whole Arrow batches at a time)
STAGE_BYTES = 16 * 1024 * 1024
STAGE_CHUNK = 4000  # rows per stage request: per-message costs are most of the servers' work
STAGE_WINDOW = 4  # chunks one task has being stored at once
# rows one task stages through one connection: the master keeps at most 200,000 items staged
# and not committed per connection (MAX_PENDING_PER_PEER), so a big task opens another
PER_CONNECTION = 150_000
PENDING_MARGIN_S = 5.0  # commit only if the oldest staged chunk is this far from expiring

Group = tuple[int, float, str | None]  # priority, delay_s, key: what one stage call shares
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
        buffers: dict[Group, list[bytes]] = defaultdict(list)
        buffered = nbytes = 0
        with Staging(self.opts) as staging:
            for batch in iterator:
                for group, blobs in rows(batch, self.columns, out.rows):
                    buffers[group] += blobs
                    nbytes += sum(map(len, blobs))
                buffered += batch.num_rows
                out.rows += batch.num_rows
                if buffered >= STAGE_ITEMS or nbytes >= STAGE_BYTES:
                    staging.send(buffers)
                    buffered = nbytes = 0
            staging.send(buffers)
            out.staged, out.started_at = staging.finish(), staging.started_at
        return out

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
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
            replication = client.status().replication
            parts: dict[int, Staged] = defaultdict(list)  # sharded: each shard commits its own
            for chunk in staged:
                parts[shard_of(chunk[0][0]) if chunk[0] else 0].append(chunk)
            plan = [c for part in parts.values() for c in commit_plan(part, replication)]
            client.commit(plan)
        log.info("committed %d rows to queue %r in %d request(s)",
                 sum(m.rows for m in chunks), self.opts.queue, len(plan))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        staged = sum(len(chunk[0]) for m in messages if isinstance(m, StagedChunks)
                     for chunk in m.staged)
        log.warning("write to queue %r aborted: %d staged items stay invisible and are dropped "
                    "after the master's pending timeout", self.opts.queue, staged)


def rows(batch: pa.RecordBatch, columns: list[str],
         first_row: int) -> Iterator[tuple[Group, list[bytes]]]:
    """A batch's payloads, grouped by (priority, delay_s, key), taken column by column.

    Without those columns (the common case) the batch is one group, with no per-row Python.
    """
    data = batch.column("data")
    if data.null_count:
        at = data.is_null().index(True).as_py()
        raise InvalidArgument(f"row {first_row + at} has a null 'data' value")
    if pa.types.is_string(data.type) or pa.types.is_large_string(data.type):
        data = data.cast(pa.large_binary() if pa.types.is_large_string(data.type) else pa.binary())
    blobs = data.to_pylist()  # text is stored as its UTF-8 bytes
    extra = [c for c in ("priority", "delay_s", "key") if c in columns]
    if not extra:
        yield (0, 0.0, None), blobs
        return
    n = batch.num_rows
    priorities, delays, keys = (batch.column(c).to_pylist() if c in columns else [None] * n
                                for c in ("priority", "delay_s", "key"))
    groups: dict[Group, list[bytes]] = defaultdict(list)
    for blob, priority, delay_s, key in zip(blobs, priorities, delays, keys, strict=True):
        groups[(0 if priority is None else int(priority),
                0.0 if delay_s is None else float(delay_s), key)].append(blob)
    yield from groups.items()


class Staging:
    """One task's staging: chunks pipelined (``STAGE_WINDOW`` at once), through a new
    connection every ``per_connection`` rows, all collected for the job commit."""

    def __init__(self, opts: WriteOptions, per_connection: int = PER_CONNECTION) -> None:
        self.opts = opts
        self.per_connection = per_connection
        self.staged: Staged = []
        self.started_at = 0.0  # wall clock: the master's pending clock starts after this
        self.client: Client | None = None
        self.stager: Stager | None = None
        self.sent = 0  # rows sent through the current connection

    def __enter__(self) -> Staging:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.client is not None:  # on failure, what is in flight stays invisible
            self.client.close()

    def send(self, buffers: dict[Group, list[bytes]]) -> None:
        """Start staging every group's buffered rows (emptying ``buffers``)."""
        if buffers and not self.started_at:
            self.started_at = time.time()
        for (priority, delay_s, key), blobs in buffers.items():
            while blobs:
                if self.stager is None or self.sent >= self.per_connection:
                    self._connect()
                assert self.stager is not None
                room = self.per_connection - self.sent
                part, blobs = blobs[:room], blobs[room:]
                self.stager.send(part, priority=priority, delay_s=delay_s, key=key)
                self.sent += len(part)
        buffers.clear()

    def finish(self) -> Staged:
        """Wait until everything sent is stored; (ids, node ids) per chunk."""
        if self.stager is not None:
            self.staged += self.stager.flush()
        return self.staged

    def _connect(self) -> None:
        """A fresh connection (the old one's staged rows are collected first)."""
        if self.client is not None:
            self.finish()
            self.client.close()
        self.client = Client(self.opts.master, timeout_s=self.opts.timeout_s)
        self.stager = self.client.stager(self.opts.queue, window=STAGE_WINDOW,
                                         chunk_items=STAGE_CHUNK)
        self.sent = 0


def commit_plan(staged: Staged, replication: int) -> Staged:
    """Regroup staged chunks into as few Commit requests as stay exact (one if <= MAX_BATCH ids).

    A Commit names one set of nodes for all its ids, and the master keeps, for each item, those
    nodes of its placement that are in the set. A chunk stored on ``replication`` nodes was
    stored on its whole placement, so all such chunks can share the union of their node sets;
    a chunk stored on fewer nodes keeps its own set, so no replica is claimed that was not made.

    Chunks go in id order, which is the order the master handed the ids out in: the oldest
    staged items are committed first, so a long commit does not outlive them.
    """
    groups: dict[tuple[str, ...], list[int]] = defaultdict(list)
    full: list[int] = []
    union: set[str] = set()
    grants = []  # every chunk's: a commit shows those of its ids' placements
    by_first_id = sorted(staged, key=lambda chunk: chunk[0][0] if chunk[0] else 0)
    for ids, nodes, chunk_grants in by_first_id:
        grants += chunk_grants
        if len(set(nodes)) >= replication:
            full += ids
            union.update(nodes)
        else:
            groups[tuple(sorted(set(nodes)))] += ids
    if full:
        groups[tuple(sorted(union))] += full
    return [(part, list(nodes), covering(grants, part))
            for nodes, ids in groups.items() for part in
            (ids[i:i + MAX_BATCH] for i in range(0, len(ids), MAX_BATCH))]


def covering(grants: list[PutGrant], ids: list[int]) -> list[PutGrant]:
    """The grants among ``grants`` whose id ranges hold some of ``ids``."""
    ids = sorted(ids)
    return [g for g in grants if bisect.bisect_left(ids, g.first) < len(ids)
            and ids[bisect.bisect_left(ids, g.first)] < g.first + g.n]
