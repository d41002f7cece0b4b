"""The Spark source's process-free parts: partition plans, commit plans, options, schemas."""

from __future__ import annotations

import time

import pytest

from blizzard.spark import ReadOptions, WriteOptions
from blizzard.spark.fetch import ARROW_SCHEMA, to_arrow
from blizzard.spark.plan import Batch, plan_partitions
from blizzard.spark.writer import BlizzardWriter, StagedChunks, check_write_schema, commit_plan
from blizzard.wire.errors import InvalidArgument, UnknownItem
from blizzard.wire.protocol import Leased, NodeRef, ReplicaSet


def node(name: str) -> NodeRef:
    return NodeRef(name, f"tcp://127.0.0.1:{6000 + ord(name[-1])}")


def reply(first: int, n: int, *replica_sets: tuple[str, ...], keys: list[str] | None = None
          ) -> Leased:
    """A lease reply of ids first.. ; item k is in replica set k % len(replica_sets)."""
    ids = list(range(first, first + n))
    return Leased("q", ids, [1] * n, [10] * n, [0] * n, [0] * n, [0] * n, [1.5] * n,
                  keys or [""] * n, [k % len(replica_sets) for k in range(n)],
                  [ReplicaSet([node(x) for x in nodes]) for nodes in replica_sets], [], None,
                  [""] * n)


def test_partitions_spread_items_over_their_live_replicas():
    batch = Batch([reply(0, 100, ("a", "b")), reply(100, 50, ("c", "a"))])
    parts = plan_partitions(batch, alive={"a", "b", "c"})
    sizes = sorted(len(p) for p in parts)
    assert len(parts) == 3 and sum(sizes) == 150 and sizes[-1] - sizes[0] <= 1
    assert sorted(i for p in parts for r in p.runs for i in r.ids) == list(range(150))
    for p in parts:
        assert all(r.nodes[0].addr == p.value for r in p.runs)


def test_partitions_split_mixed_replica_sets_and_keep_each_items_columns():
    batch = Batch([reply(0, 9, ("a", "b"), ("b", "c"), ("c", "a"))])
    parts = plan_partitions(batch, alive={"a", "b", "c"})
    for p in parts:
        for r in p.runs:
            homes = {k % 3 for k in r.ids}
            assert len(homes) == 1  # one replica set per run
            assert len(r.ids) == len(r.leases) == len(r.sizes) == len(r.keys)
    assert sorted(i for p in parts for r in p.runs for i in r.ids) == list(range(9))


def test_partitions_put_dead_replicas_last():
    parts = plan_partitions(Batch([reply(1, 2, ("a", "b"))]), alive={"b"})
    assert len(parts) == 1
    assert [n.node_id for n in parts[0].runs[0].nodes] == ["b", "a"]
    run = parts[0].runs[0]
    assert [run.item(k).nodes for k in range(len(run))] == [run.nodes] * 2


def test_commit_plan_merges_fully_replicated_chunks_only():
    staged = [([1, 2], ["a", "b"], []), ([3], ["b", "c"], []), ([4], ["a"], []),
              ([5], ["a"], [])]
    plan = commit_plan(staged, replication=2)
    assert sorted((sorted(ids), sorted(nodes)) for ids, nodes, _ in plan) == [
        ([1, 2, 3], ["a", "b", "c"]), ([4, 5], ["a"])]
    big = commit_plan([(list(range(i, i + 1000)), ["a", "b"], [])
                       for i in range(0, 25_000, 1000)], 2)
    assert [len(ids) for ids, _, _ in big] == [10_000, 10_000, 5000]


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
    (part,) = plan_partitions(Batch([reply(7, 3, ("a",), keys=["k", "", "m"])]), alive={"a"})
    run = part.runs[0]
    rows = to_arrow("q", run, 0, 3, {7: b"\x00\xff", 8: b"", 9: b"z"})
    assert rows.schema.equals(ARROW_SCHEMA)
    assert [r["data"] for r in rows.to_pylist()] == [b"\x00\xff", b"", b"z"]
    assert [r["key"] for r in rows.to_pylist()] == ["k", None, "m"]
    assert rows.to_pylist()[0]["enqueued_at"].timestamp() == 1.5
    some = to_arrow("q", run, 1, 3, {9: b"z"})  # an item not read is left out
    assert [r["id"] for r in some.to_pylist()] == [9]


def test_items_this_run_handed_out_before_count_as_delivered():
    from blizzard.spark.reader import _mark_delivered

    batch = Batch([reply(1, 3, ("a",))])
    batch.plan = plan_partitions(batch, alive={"a"})
    _mark_delivered(batch, seen={2, 9})
    assert batch.replies[0].attempts == [0, 1, 0]  # drain checks item 2 against its output
    assert batch.plan is None  # planned again, with the new counts
