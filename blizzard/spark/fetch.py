"""The executor side of the streaming read: fetch a partition's payloads from data nodes.

A partition holds the leased items that one data node serves first (``plan_partitions`` in
``reader.py`` decides). ``read_partition`` opens its own ``Client`` (clients are never pickled),
reads in chunks with replica failover and checksum checks (``Client.fetch``), and yields Arrow
record batches in ``SCHEMA``. An item no replica can serve is given back to the queue; if even
that fails, the task fails, so the batch is never acked without it.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Iterator

import pyarrow as pa
from pyspark.sql.datasource import InputPartition
from pyspark.sql.pandas.types import to_arrow_schema

from blizzard.client import Client
from blizzard.errors import LeaseExpired
from blizzard.message import LeasedItem
from blizzard.spark.options import ReadOptions
from blizzard.spark.schema import SCHEMA

log = logging.getLogger(__name__)

ARROW_SCHEMA = to_arrow_schema(SCHEMA, timezone="UTC")
FETCH_ITEMS = 1000  # items per data-node read
FETCH_BYTES = 8 * 1024 * 1024
UNREADABLE_DELAY_S = 1.0  # an item no replica could serve returns to the queue after this


class NodePartition(InputPartition):
    """The items of one micro-batch that one data node (``value``, its address) serves first."""

    def __init__(self, addr: str, items: list[LeasedItem]) -> None:
        super().__init__(addr)
        self.items = items

    def __repr__(self) -> str:
        return f"NodePartition({self.value!r}, {len(self.items)} items)"


def read_partition(opts: ReadOptions, part: NodePartition) -> Iterator[pa.RecordBatch]:
    """Fetch a partition's payloads in chunks and yield them as Arrow record batches."""
    client = Client(opts.master, timeout_s=opts.timeout_s, node_timeout_s=opts.node_timeout_s)
    slow = False  # once the partition's node timed out, try the other replicas first
    try:
        for chunk in _chunks(part.items):
            if slow:
                chunk = [_demoted(item, part.value) for item in chunk]
            started = time.monotonic()
            got, failed = client.fetch(chunk)
            if not slow and time.monotonic() - started >= 0.9 * client.node_timeout_s:
                log.warning("data node %s is slow or down; reading from other replicas", part.value)
                slow = True
            if failed:
                log.warning("no replica could serve %d items; giving them back", len(failed))
                try:  # if this fails, the task fails and the batch is not acked: nothing lost
                    client.nack_many(failed, delay_s=UNREADABLE_DELAY_S,
                                     error="no replica could be read")
                except LeaseExpired:
                    pass
            rows = [item for item in chunk if item.id in got]
            if rows:
                yield to_arrow(opts.queue, rows, got)
    finally:
        client.close()


def _chunks(items: list[LeasedItem]) -> Iterator[list[LeasedItem]]:
    chunk: list[LeasedItem] = []
    size = 0
    for item in items:
        if chunk and (len(chunk) >= FETCH_ITEMS or size + item.size > FETCH_BYTES):
            yield chunk
            chunk, size = [], 0
        chunk.append(item)
        size += item.size
    if chunk:
        yield chunk


def _demoted(item: LeasedItem, addr: str) -> LeasedItem:
    nodes = [n for n in item.nodes if n.addr != addr] + [n for n in item.nodes if n.addr == addr]
    return dataclasses.replace(item, nodes=nodes)


def to_arrow(queue: str, items: list[LeasedItem], payloads: dict[int, bytes]) -> pa.RecordBatch:
    """Rows in ``SCHEMA`` for items whose payloads were read."""
    n = len(items)
    return pa.RecordBatch.from_arrays([
        pa.array([i.id for i in items], pa.int64()),
        pa.array([queue] * n, pa.string()),
        pa.array([i.priority for i in items], pa.int32()),
        pa.array([i.attempts for i in items], pa.int32()),
        pa.array([round(i.enqueued_at * 1_000_000) for i in items], pa.timestamp("us", tz="UTC")),
        pa.array([i.key or None for i in items], pa.string()),
        pa.array([payloads[i.id] for i in items], pa.binary()),
    ], schema=ARROW_SCHEMA)
