"""The Spark source's process-free parts: partition plans, commit plans, options, schemas."""

from __future__ import annotations

import time

import pytest

from blizzard.client import LeasedItem
from blizzard.errors import InvalidArgument, UnknownItem
from blizzard.protocol import NodeRef
from blizzard.spark import ReadOptions, WriteOptions
from blizzard.spark.fetch import ARROW_SCHEMA, to_arrow
from blizzard.spark.reader import plan_partitions
from blizzard.spark.writer import BlizzardWriter, StagedChunks, check_write_schema, commit_plan


def item(item_id: int, *node_ids: str, size: int = 10) -> LeasedItem:
    return LeasedItem(id=item_id, lease=1, size=size, crc=0, attempts=0, priority=0,
                      enqueued_at=0.0,
                      nodes=[NodeRef(n, f"tcp://127.0.0.1:{6000 + ord(n[-1])}") for n in node_ids])


def test_partitions_spread_items_over_their_live_replicas():
    items = [item(i, "a", "b") for i in range(100)] + [item(100 + i, "c", "a") for i in range(50)]
    parts = plan_partitions(items, alive={"a", "b", "c"})
    sizes = sorted(len(p.items) for p in parts)
    assert len(parts) == 3 and sum(sizes) == 150 and sizes[-1] - sizes[0] <= 2
    for p in parts:
        assert all(i.nodes[0].addr == p.value for i in p.items)


def test_partitions_put_dead_replicas_last():
    parts = plan_partitions([item(1, "a", "b"), item(2, "a", "b")], alive={"b"})
    assert len(parts) == 1
    assert [[n.node_id for n in i.nodes] for i in parts[0].items] == [["b", "a"], ["b", "a"]]


def test_commit_plan_merges_fully_replicated_chunks_only():
    staged = [([1, 2], ["a", "b"]), ([3], ["b", "c"]), ([4], ["a"]), ([5], ["a"])]
    plan = commit_plan(staged, replication=2)
    assert sorted((sorted(ids), sorted(nodes)) for ids, nodes in plan) == [
        ([1, 2, 3], ["a", "b", "c"]), ([4, 5], ["a"])]
    big = commit_plan([(list(range(i, i + 1000)), ["a", "b"]) for i in range(0, 25_000, 1000)], 2)
    assert [len(ids) for ids, _ in big] == [10_000, 10_000, 5000]


def test_a_job_commit_too_close_to_the_pending_timeout_commits_nothing():
    from pyspark.sql.types import BinaryType, StructField, StructType

    writer = BlizzardWriter(WriteOptions(master="tcp://127.0.0.1:1", queue="q",
                                         pending_timeout_s=10),
                            StructType([StructField("data", BinaryType())]))
    late = StagedChunks(staged=[([1, 2], ["a", "b"])], rows=2, started_at=time.time() - 6)
    with pytest.raises(UnknownItem, match="nothing was committed"):
        writer.commit([late, None])  # refused before any request: there is no master at :1
    writer.commit([StagedChunks(), None])  # a job that staged nothing has nothing to commit


def test_options_are_parsed_and_checked():
    opts = ReadOptions.parse({"queue": "q", "MAXITEMSPERBATCH": "7", "leaseSeconds": "2.5"})
    assert (opts.queue, opts.max_items_per_batch, opts.lease_s) == ("q", 7, 2.5)
    with pytest.raises(InvalidArgument, match="positive"):
        ReadOptions.parse({"queue": "q", "maxItemsPerBatch": "0"})
    with pytest.raises(InvalidArgument, match="unknown option"):
        WriteOptions.parse({"queue": "q", "leaseSeconds": "1"})
    with pytest.raises(InvalidArgument, match="queue"):
        WriteOptions.parse({"master": "tcp://127.0.0.1:1"})


def test_write_schema_check():
    from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType

    check_write_schema(StructType([StructField("data", BinaryType()),
                                   StructField("priority", LongType())]))
    with pytest.raises(InvalidArgument, match="'data' column"):
        check_write_schema(StructType([StructField("payload", BinaryType())]))
    with pytest.raises(InvalidArgument, match="priority"):
        check_write_schema(StructType([StructField("data", BinaryType()),
                                       StructField("priority", StringType())]))


def test_rows_are_built_in_the_declared_arrow_schema():
    batch = to_arrow("q", [item(7, "a")], {7: b"\x00\xff"})
    assert batch.schema.equals(ARROW_SCHEMA)
    assert batch.to_pylist()[0]["data"] == b"\x00\xff"
