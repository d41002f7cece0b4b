"""The Spark source on a real Spark standalone cluster: a master and two workers, each its own
JVM started from the installed pyspark, executors started by the workers.

The workers know nothing of the test: no key directory, only ``blizzard`` on their
``PYTHONPATH``, as a user would install it. Each Spark driver runs in a process of its own
(the command, or a script), since a process holds one SparkContext and test_spark.py's is local.
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from blizzard import Client
from blizzard.local.spark_standalone import StandaloneSpark
from blizzard.spark.session import on_loopback

from support.processes import LOOPBACK_HEX, listening_addresses, pids_with
from support.wait import wait_for

ITEMS = 5000
DRIVER_TIMEOUT_S = 240


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory):
    """One Spark master and two workers (1 core, 1 GiB each) for this module's tests."""
    spark = StandaloneSpark(str(tmp_path_factory.mktemp("spark-standalone")))
    spark.start()
    try:
        yield spark
    finally:
        spark.stop()
    wait_for(lambda: not _left_behind(spark.base_dir), timeout_s=15,
             what="executors and their Python workers to end with the cluster")


def _left_behind(base_dir: str) -> list[int]:
    """Processes still running whose environment names ``base_dir`` (every process the
    daemons started: their scratch directory is in it)."""
    return pids_with(base_dir, "environ")


def run_driver(argv: list[str], spark_cluster: StandaloneSpark) -> subprocess.CompletedProcess:
    """Run a Spark driver process; fail with its output and the cluster's logs if it fails."""
    env = dict(os.environ, SPARK_EXECUTOR_MEMORY="512m")  # the command has no --conf; small JVMs
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=DRIVER_TIMEOUT_S, env=env)
    assert proc.returncode == 0, (proc.stdout[-3000:] + proc.stderr[-3000:]
                                  + spark_cluster.logs())
    return proc


def payloads(path: str) -> list[tuple[int, bytes]]:
    table = pq.read_table(path, columns=["id", "data"])
    return list(zip(table.column("id").to_pylist(), table.column("data").to_pylist(), strict=True))


def assert_each_once(rows: list[tuple[int, bytes]], expected: dict[int, bytes]) -> None:
    ids = [item_id for item_id, _ in rows]
    assert len(ids) == len(set(ids)), f"{len(ids) - len(set(ids))} items written twice"
    assert set(ids) == expected.keys(), f"{len(expected.keys() - set(ids))} items missing"
    assert dict(rows) == expected, "payloads differ"


def assert_queue_empty(master: str, queue: str) -> None:
    with Client(master) as c:
        stats = c.stats(queue)
    assert (stats["ready"], stats["leased"], stats["pending"]) == (0, 0, 0)


def test_the_drain_command_on_a_standalone_cluster_writes_each_item_once(
        cluster, spark_cluster, tmp_path):
    """The command is ``local_session(URL)`` then ``drain(...)``: the read as users run it."""
    rng = random.Random(16)
    blobs = [rng.randbytes(rng.randint(0, 300)) for _ in range(ITEMS)]
    with Client(cluster.master_addr) as c:
        expected = dict(zip(c.enqueue_many("jobs", blobs), blobs, strict=True))
    out = str(tmp_path / "out")

    proc = run_driver([sys.executable, "-m", "blizzard.cli", "drain", "jobs", "--to", out,
                       "--master", cluster.master_addr, "--batch", "2500",
                       "--spark-master", spark_cluster.url], spark_cluster)

    assert f"drained {ITEMS:,} items" in proc.stdout
    # the progress (a line per batch into a pipe): items, MB, rates, what is left in the queue
    progress = [line for line in proc.stderr.splitlines() if line.startswith("drained ")]
    assert len(progress) == 2, proc.stderr[-3000:]
    assert re.fullmatch(r"drained 2,500 of 5,000 items, [0-9.]+ MB, [0-9,]+ items/s, [0-9.,]+ "
                        r"MB/s; queue left 2,500; Spark batch id 0", progress[0]), progress[0]
    assert progress[1].startswith("drained 5,000 of 5,000 items") and "queue left 0;" in progress[1]
    assert_each_once(payloads(out), expected)
    assert_queue_empty(cluster.master_addr, "jobs")
    assert _executor_runs(spark_cluster.base_dir) == 2  # the reads ran on both workers


BATCH_WRITE = """
import json, sys
from pyspark.sql import functions as F
from blizzard.spark import local_session
spark_url, master, n, conf = sys.argv[1], sys.argv[2], int(sys.argv[3]), \
    json.loads(sys.argv[4])
spark = local_session(spark_url, app_name="blizzard-standalone-write", conf=conf)
df = spark.range(n).repartition(4).select(
    F.concat(F.lit("row-"), F.col("id").cast("string")).alias("data"))
df.write.format("blizzard").option("master", master).option("queue", "rows").mode("append").save()
print("executors", spark._jsc.sc().getExecutorIds().size())
spark.stop()
"""


def test_a_batch_write_through_a_session_on_a_standalone_cluster_enqueues_every_row(
        cluster, spark_cluster):
    proc = run_driver([sys.executable, "-c", BATCH_WRITE, spark_cluster.url,
                       cluster.master_addr, str(ITEMS), json.dumps(spark_cluster.session_conf())],
                      spark_cluster)

    assert proc.stdout.strip().splitlines()[-1] == "executors 2"
    got = []
    with Client(cluster.master_addr) as c:
        assert c.stats("rows")["ready"] == ITEMS
        for _ in range(ITEMS // 1000 + 1):  # bounded: 1,000 a round
            msgs = c.dequeue_many("rows", 1000)
            if not msgs:
                break
            got += msgs
            c.ack_many(msgs)
    assert sorted(m.data for m in got) == sorted(f"row-{i}".encode() for i in range(ITEMS))
    assert_queue_empty(cluster.master_addr, "rows")


def _executor_runs(base_dir: str) -> int:
    """Workers that ran an executor of the last application (work dirs hold one per run)."""
    workers = [d for d in os.listdir(base_dir) if d.startswith("worker") and
               os.path.isdir(os.path.join(base_dir, d))]
    apps = sorted(a for w in workers for a in os.listdir(os.path.join(base_dir, w)))
    return sum(1 for w in workers if apps and apps[-1] in os.listdir(os.path.join(base_dir, w)))


def test_the_spark_daemons_listen_on_loopback_only(spark_cluster):
    listening = listening_addresses([proc.pid for proc in spark_cluster.procs])
    assert len(listening) >= 5  # master: RPC and web UI; each worker: the same
    assert set(listening) <= LOOPBACK_HEX, listening


def test_the_workers_have_no_key_directory_of_their_own(spark_cluster):
    """So the drains above pass only because the driver's session hands executors its keys."""
    for proc in spark_cluster.procs:
        with open(f"/proc/{proc.pid}/environ", "rb") as f:
            names = {entry.split(b"=", 1)[0] for entry in f.read().split(b"\0")}
        assert b"BLIZZARD_KEYS" not in names and b"PYTHONPATH" in names


def test_a_session_binds_to_loopback_only_when_spark_runs_on_this_machine():
    assert on_loopback("local[2]") and on_loopback("spark://127.0.0.1:7077")
    assert on_loopback("spark://localhost:7077,127.0.0.1:7078")
    assert not on_loopback("spark://10.0.0.5:7077")
    assert not on_loopback("spark://127.0.0.1:7077,spark-2:7077")
    assert not on_loopback("yarn") and not on_loopback("k8s://https://127.0.0.1:6443")
