"""The ``blizzard`` Spark data source and ``drain``: a local[2] SparkSession, real clusters.

pyspark and Java 17 are required: a missing pyspark fails this module instead of skipping it.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import functions as F

from blizzard import Client
from blizzard.spark import drain

from support.processes import LOOPBACK_HEX, listening_addresses
from support.spark_output import assert_exactly_once, output
from support.wait import wait_for

FAST = dict(datanodes=3, replication=2, heartbeat_s=0.2, dead_after_s=1.5)


def fill(master: str, queue: str, n: int, *, seed: int = 0,
         max_size: int = 512) -> dict[int, bytes]:
    """Enqueue ``n`` random payloads (0..max_size bytes); returns id -> payload."""
    rng = random.Random(seed)
    blobs = [rng.randbytes(rng.randint(0, max_size)) for _ in range(n)]
    with Client(master) as c:
        ids = c.enqueue_many(queue, blobs)
    return dict(zip(ids, blobs, strict=True))


@contextlib.contextmanager
def watching(master: str, queue: str) -> Iterator[list[dict]]:
    """``queue``'s stats, polled in a thread as long as the block runs."""
    seen: list[dict] = []
    done = threading.Event()

    def watch() -> None:
        with Client(master) as c:
            while not done.is_set():
                seen.append(c.stats(queue))

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        yield seen
    finally:
        done.set()
        watcher.join()


def queue_empty(master: str, queue: str) -> bool:
    with Client(master) as c:
        s = c.stats(queue)
    return s["ready"] == 0 and s["leased"] == 0


def leases_ended(master: str, queue: str) -> bool:
    with Client(master) as c:
        return c.stats(queue)["leased"] == 0


# -- streaming read and drain ----------------------------------------------------------------


def test_drain_10000_items_writes_each_once_byte_identical_and_empties_the_queue(
        spark, cluster, tmp_path):
    expected = fill(cluster.master_addr, "jobs", 10_000)
    path = str(tmp_path / "out")

    summary = drain(spark, "jobs", path, master=cluster.master_addr, max_items_per_batch=4000)

    rows = output(spark, path)
    assert_exactly_once(rows, expected)
    assert (summary.written, summary.duplicates, summary.batches) == (10_000, 0, 3)
    assert summary.bytes == sum(map(len, expected.values()))
    assert (summary.ready_after, summary.leased_after) == (0, 0)
    assert queue_empty(cluster.master_addr, "jobs")  # the last batch was acked too
    row = rows[0]
    assert (row.queue, row.attempts, row.priority, row.key) == ("jobs", 0, 0, None)
    assert abs(row.enqueued_at.timestamp() - time.time()) < 600


def test_drain_to_json_appends_and_leaves_out_ids_already_written(spark, cluster, tmp_path):
    path = str(tmp_path / "out")
    first = fill(cluster.master_addr, "jobs", 300, seed=1)
    drain(spark, "jobs", path, "json", master=cluster.master_addr, progress=False)
    second = fill(cluster.master_addr, "jobs", 200, seed=2)

    summary = drain(spark, "jobs", path, "json", master=cluster.master_addr, progress=False)

    assert (summary.written, summary.duplicates) == (200, 0)
    assert_exactly_once(output(spark, path, "json"), first | second)


def test_a_failed_batch_loses_nothing_and_a_rerun_writes_each_id_once(spark, cluster, tmp_path):
    """Batch 1 is written but fails before its ack: its leases run out, the rerun skips it."""
    expected = fill(cluster.master_addr, "jobs", 5000)
    path = str(tmp_path / "out")

    def fail_second_batch(p):
        if p.batch == 1:
            raise RuntimeError("injected failure after the write")

    # leases long enough for a batch's two reads (the second reads its redeliveries), short
    # enough to wait out
    with pytest.raises(PySparkException, match="injected failure"):
        drain(spark, "jobs", path, master=cluster.master_addr, max_items_per_batch=1000,
              lease_s=6, on_batch=fail_second_batch, progress=False)
    wait_for(lambda: leases_ended(cluster.master_addr, "jobs"), timeout_s=20,
             what="the failed run's leases to end")

    summary = drain(spark, "jobs", path, master=cluster.master_addr, max_items_per_batch=1000,
                    lease_s=6, progress=False)

    assert summary.duplicates == 1000  # batch 1 came back and was left out
    rows = output(spark, path)
    assert_exactly_once(rows, expected)
    assert queue_empty(cluster.master_addr, "jobs")
    assert max(r.attempts for r in rows) == 0  # the copies kept are the first deliveries


def test_a_query_stopped_in_the_middle_loses_nothing(spark, cluster, tmp_path):
    expected = fill(cluster.master_addr, "jobs", 5000)
    path = str(tmp_path / "out")
    in_batch = threading.Event()
    result: list = []

    def slow_second_batch(p):
        if p.batch == 1:
            in_batch.set()
            time.sleep(3)

    def run() -> None:
        try:
            result.append(drain(spark, "jobs", path, master=cluster.master_addr,
                                max_items_per_batch=1000, lease_s=2, on_batch=slow_second_batch,
                                progress=False))
        except Exception as exc:  # a stop may surface as an error of the batch in flight
            result.append(exc)

    runner = threading.Thread(target=run)
    runner.start()
    assert in_batch.wait(120)
    for query in spark.streams.active:
        query.stop()
    runner.join(60)
    assert not runner.is_alive() and result
    assert len({r.id for r in output(spark, path)}) < 5000  # it did stop in the middle
    wait_for(lambda: leases_ended(cluster.master_addr, "jobs"), timeout_s=15,
             what="the stopped run's leases to end")

    drain(spark, "jobs", path, master=cluster.master_addr, progress=False)

    assert_exactly_once(output(spark, path), expected)
    assert queue_empty(cluster.master_addr, "jobs")


KILLED_DRAIN = """
import sys, time
from blizzard.spark import drain, local_session
master, path = sys.argv[1:3]
def hang_in_second_batch(p):
    if p.batch == 1:
        print("in batch 1", flush=True)
        time.sleep(600)
drain(local_session("local[1]"), "jobs", path, master=master, max_items_per_batch=1000,
      lease_s=6, on_batch=hang_in_second_batch, progress=False)
"""


def test_a_killed_drain_loses_nothing_its_items_return_when_the_leases_end(
        spark, cluster, tmp_path):
    """SIGKILL the whole Spark driver (JVM, Python workers) while a batch is in flight."""
    expected = fill(cluster.master_addr, "jobs", 4000)
    path = str(tmp_path / "out")
    scratch = tmp_path / "killed"  # what a SIGKILL leaves behind stays out of /tmp
    scratch.mkdir()
    env = dict(os.environ, TMPDIR=str(scratch), SPARK_LOCAL_DIRS=str(scratch),
               _JAVA_OPTIONS=f"-Djava.io.tmpdir={scratch}")
    proc = subprocess.Popen([sys.executable, "-c", KILLED_DRAIN, cluster.master_addr, path],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env=env, start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == "in batch 1"
        with Client(cluster.master_addr) as c:
            assert c.stats("jobs")["leased"] == 1000  # batch 0 acked, batch 1 in flight
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    wait_for(lambda: leases_ended(cluster.master_addr, "jobs"), timeout_s=30,
             what="the killed run's leases to end")

    summary = drain(spark, "jobs", path, master=cluster.master_addr, progress=False)

    assert summary.duplicates == 1000  # batch 1 was written, never acked, delivered again
    assert_exactly_once(output(spark, path), expected)
    assert queue_empty(cluster.master_addr, "jobs")


def test_a_data_node_killed_during_a_drain_loses_nothing(spark, cluster, tmp_path):
    expected = fill(cluster.master_addr, "jobs", 6000)
    path = str(tmp_path / "out")

    def kill_a_node(p):
        if p.batch == 0:
            cluster.nodes[0].kill()

    summary = drain(spark, "jobs", path, master=cluster.master_addr, max_items_per_batch=1000,
                    on_batch=kill_a_node, options={"nodeTimeoutSeconds": 1}, progress=False)

    assert summary.written == 6000
    assert_exactly_once(output(spark, path), expected)
    assert queue_empty(cluster.master_addr, "jobs")


def test_leases_are_extended_while_a_batch_is_in_flight(spark, cluster, tmp_path):
    expected = fill(cluster.master_addr, "jobs", 2000)
    path = str(tmp_path / "out")

    def slow_sink(p):
        if p.batch == 0:
            time.sleep(5)  # more than twice the lease

    summary = drain(spark, "jobs", path, master=cluster.master_addr, max_items_per_batch=1000,
                    lease_s=2, on_batch=slow_sink, progress=False)

    rows = output(spark, path)
    assert_exactly_once(rows, expected)
    assert summary.duplicates == 0 and {r.attempts for r in rows} == {0}  # never redelivered


def test_a_running_stream_acks_each_batch_once_the_sink_has_it(spark, cluster):
    """No availableNow: the last batch must not wait for another one to be acked."""
    seen: list[int] = []
    lock = threading.Lock()

    def sink(df, batch_id):
        ids = [r.id for r in df.select("id").collect()]
        with lock:
            seen.extend(ids)

    stream = (spark.readStream.format("blizzard").option("master", cluster.master_addr)
              .option("queue", "live").option("maxItemsPerBatch", 300)
              .option("waitSeconds", 0.2).load())
    query = stream.writeStream.foreachBatch(sink).start()
    try:
        expected = fill(cluster.master_addr, "live", 1000)
        wait_for(lambda: len(seen) >= 1000, timeout_s=90, what="1000 rows in the sink")
        wait_for(lambda: queue_empty(cluster.master_addr, "live"), timeout_s=15,
                 what="every batch to be acked while the query idles")
        more = fill(cluster.master_addr, "live", 50, seed=9)
        wait_for(lambda: len(seen) >= 1050 and queue_empty(cluster.master_addr, "live"),
                 timeout_s=30, what="a later item to be streamed and acked")
    finally:
        query.stop()
    assert sorted(seen) == sorted(expected.keys() | more.keys())


def test_unknown_options_and_a_missing_queue_are_refused(spark, cluster):
    with pytest.raises(PySparkException, match="(?i)unknown option.*maxitemperbatch"):
        (spark.readStream.format("blizzard").option("queue", "q")
         .option("maxItemPerBatch", 5).load().writeStream.foreachBatch(lambda d, i: None)
         .start().awaitTermination(30))
    with pytest.raises(PySparkException, match="needs .option..queue"):
        (spark.readStream.format("blizzard").load().writeStream
         .foreachBatch(lambda d, i: None).start().awaitTermination(30))


# -- batch write -----------------------------------------------------------------------------


def test_a_batch_write_of_10000_rows_becomes_visible_all_at_once(spark, cluster):
    df = spark.range(10_000).select(
        F.concat(F.lit("row-"), F.col("id").cast("string")).alias("data"),
        (F.col("id") % 3).cast("int").alias("priority"),
        F.lit(None).cast("string").alias("key"),
        F.lit(0.0).alias("delay_s")).repartition(4)
    with watching(cluster.master_addr, "bulk") as seen:
        (df.write.format("blizzard").option("master", cluster.master_addr)
         .option("queue", "bulk").mode("append").save())

    observed = {s["ready"] for s in seen}
    assert observed <= {0, 10_000} and 10_000 in observed
    with Client(cluster.master_addr) as c:
        got = []
        while msgs := c.dequeue_many("bulk", 5000):
            got += msgs
            c.ack_many(msgs)
    assert sorted(m.data for m in got) == sorted(f"row-{i}".encode() for i in range(10_000))
    assert [m.priority for m in got] == sorted(m.priority for m in got)  # lowest first
    assert {int(m.data[4:]) % 3 for m in got if m.priority == 2} == {2}


def test_a_batch_write_passes_priority_delay_and_key_on(spark, cluster):
    rows = ([(f"later-{i}", 0, 60.0, None) for i in range(5)]
            + [(f"keyed-{i}", 1, None, "k") for i in range(5)]
            + [(f"first-{i}", -1, 0.0, None) for i in range(5)])
    df = spark.createDataFrame(rows, "data string, priority int, delay_s double, key string")

    df.write.format("blizzard").option("master", cluster.master_addr).option("queue", "opts") \
        .mode("append").save()

    with Client(cluster.master_addr) as c:
        assert (c.stats("opts")["ready"], c.stats("opts")["delayed"]) == (10, 5)
        got = c.dequeue_many("opts", 100)
    # priority -1 first; of the five items keyed "k" only one may be leased at a time
    assert len(got) == 6 and {m.priority for m in got[:5]} == {-1}
    assert sorted(m.data for m in got[:5]) == [f"first-{i}".encode() for i in range(5)]
    assert got[5].data.startswith(b"keyed-") and got[5].priority == 1


def test_a_write_job_that_fails_halfway_leaves_the_queue_unchanged(spark, cluster_factory):
    """One task stages 25,000 rows (chunks in flight, through its window), then fails."""
    cluster = cluster_factory(master_args=["--pending-timeout-s", "3"], **FAST)
    fill(cluster.master_addr, "bulk", 10, max_size=16)
    bad = F.when(F.col("id") == 25_000, F.lit(None)).otherwise(F.col("id").cast("string"))
    df = spark.range(0, 30_000, 1, 1).select(bad.cast("binary").alias("data"))

    with pytest.raises(PySparkException, match="null 'data'"), \
            watching(cluster.master_addr, "bulk") as seen:
        (df.write.format("blizzard").option("master", cluster.master_addr)
         .option("queue", "bulk").mode("append").save())

    assert max(s["pending"] for s in seen) > 0  # it did stage rows before failing
    assert {s["ready"] for s in seen} == {10}
    with Client(cluster.master_addr) as c:
        wait_for(lambda: c.stats("bulk")["pending"] == 0, timeout_s=15,
                 what="staged items of the failed job to be dropped")
        wait_for(lambda: sum(n.items for n in c.status().nodes) == 20, timeout_s=15,
                 what="their blobs to be deleted")
        assert c.stats("bulk")["ready"] == 10


def test_the_write_bench_measures_a_small_write(spark, cluster):
    from bench.spark_write import measure_write

    line = measure_write(spark, cluster.master_addr, "bench", 3000, 64, warmup_rows=0)
    assert (line["mode"], line["rows"], line["size"]) == ("write", 3000, 64)
    assert line["items_per_s"] > 0 and line["tasks"] == line["partitions"] == 2
    assert line["stage_s"] > 0 and line["commit_s"] > 0 and line["cpu_us_per_item"]["spark"] > 0


def test_a_write_refuses_unknown_columns_and_overwrite(spark, cluster):
    writer = spark.range(3).select(F.col("id").cast("string").alias("data"),
                                   F.lit(1).alias("colour")).write.format("blizzard")
    with pytest.raises(PySparkException, match="colour"):
        writer.option("master", cluster.master_addr).option("queue", "q").mode("append").save()
    ok = spark.range(3).select(F.col("id").cast("string").alias("data")).write.format("blizzard")
    with pytest.raises(PySparkException, match="cannot be overwritten"):
        ok.option("master", cluster.master_addr).option("queue", "q").mode("overwrite").save()


def test_spark_listens_on_loopback_only(spark):
    listening = listening_addresses([spark._jvm.java.lang.ProcessHandle.current().pid()])
    assert listening, "the JVM should listen somewhere (block manager, driver)"
    assert set(listening) <= LOOPBACK_HEX, listening


# -- pure parts (no Spark job, no processes) -------------------------------------------------
