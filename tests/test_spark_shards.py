"""The Spark source and sink on a sharded queue: a drain reads every shard's items once, and a
batch write spreads its rows over the shards, each shard committing its own."""

from __future__ import annotations

import random

from pyspark.sql import functions as F

from blizzard.spark import drain
from blizzard.wire.shard_messages import shard_of

from support.spark_output import assert_exactly_once, output


def test_a_drain_of_a_sharded_queue_writes_every_shards_items_once(spark, sharded, tmp_path):
    rng = random.Random(3)
    expected: dict[int, bytes] = {}
    with sharded.client() as c:
        for _ in range(30):  # batches land on random shards
            blobs = [rng.randbytes(rng.randint(0, 300)) for _ in range(100)]
            expected.update(zip(c.enqueue_many("jobs", blobs), blobs, strict=True))
    assert {shard_of(i) for i in expected} == {0, 1, 2}
    spec = " ".join(sharded.addrs)

    summary = drain(spark, "jobs", str(tmp_path / "out"), master=spec, max_items_per_batch=1000)

    assert_exactly_once(output(spark, str(tmp_path / "out")), expected)
    assert (summary.written, summary.duplicates) == (3000, 0)
    with sharded.client() as c:
        assert c.stats("jobs")["ready"] == 0 and c.stats("jobs")["leased"] == 0


def test_a_batch_write_spreads_rows_over_the_shards(spark, sharded):
    spec = " ".join(sharded.addrs)
    df = spark.range(3000).select(
        F.concat(F.lit("row-"), F.col("id").cast("string")).alias("data")).repartition(12)
    # each task stages its rows from a random shard on: with 3 tasks all three chose the same
    # shard 1 run in 9; with 12, about 1 in 180,000
    df.write.format("blizzard").option("master", spec).option("queue", "bulk") \
        .mode("append").save()
    with sharded.client() as c:
        got = []
        while msgs := c.dequeue_many("bulk", 1000):
            got += msgs
            c.ack_many(msgs)
    assert sorted(m.data for m in got) == sorted(f"row-{i}".encode() for i in range(3000))
    assert len({shard_of(m.id) for m in got}) > 1
