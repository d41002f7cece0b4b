"""The Spark batch writer's throughput: ``df.write.format("blizzard")`` of many small rows.

Run as ``python -m bench.spark_write [--rows N] [--size B] [--spark-master URL]`` (or through
``scripts/bench --spark``): it starts a local cluster (1 master, 2 data nodes, replication 2,
security on) in a scratch dir and a SparkSession, writes ``--rows`` rows of ``--size`` bytes
into a fresh queue (after a warm-up write of ``--warmup-rows`` to another queue), checks
the queue then holds exactly that many more ready items, and prints one JSON line (one per
write with ``--repeat``).

Where the time goes comes from Spark's own status store (the write's one stage): ``job_start_s``
from the ``save()`` call to the stage's submission, ``stage_s`` from there to its last task's
end (the executors' staging), ``commit_s`` from then until ``save()`` returned (the driver's
job commit, which makes every row visible at once), and ``task_s`` the tasks' summed run time.
``cpu_us_per_item``: CPU per row of Spark (its JVM and Python workers, the writer's clients
among them), the master and the data nodes; ``machine_busy``: all cores' busy share meanwhile
(above what those add up to: other programs shared the machine).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import sys
import time
from typing import Any

from bench.common import on_clusters, parser, start
from bench.throughput import CpuMeter, machine_cpu, tree_cpu_s
from blizzard.client.core import Client
from blizzard.local.harness import LocalCluster

log = logging.getLogger(__name__)

WARMUP_ROWS = 20_000
ID_DIGITS = 12  # each payload starts with its row number: no two payloads alike


def payloads(spark: Any, rows: int, size: int, partitions: int) -> Any:
    """``rows`` rows of one ``data`` column of ``size`` bytes: the row number, then a fixed
    random blob (built by Spark's JVM, so making them costs the measurement nothing)."""
    from pyspark.sql import functions as F

    blob = secrets.token_bytes(max(size, ID_DIGITS))
    data = F.concat(F.lpad(F.col("id").cast("string"), ID_DIGITS, "0").cast("binary"),
                    F.lit(blob))
    return spark.range(0, rows, 1, partitions).select(F.substring(data, 1, size).alias("data"))


def measure_write(spark: Any, master_addr: str, queue: str, rows: int, size: int, *,
                  partitions: int | None = None, cluster: LocalCluster | None = None,
                  warmup_rows: int = WARMUP_ROWS) -> dict[str, Any]:
    """Write ``rows`` rows of ``size`` bytes to ``queue`` through the data source, check that
    exactly that many more items are ready, and return the rates and where the time went
    (CPU too: Spark's JVM with its Python workers, and ``cluster``'s processes if given).

    First, unless ``warmup_rows`` is 0, that many rows go to ``<queue>.warmup`` (left there):
    a session's first write also starts Spark's Python workers and warms its JVM, seconds
    that a long-running session pays once and that are not the writer's rate.
    """
    partitions = partitions or spark.sparkContext.defaultParallelism
    if warmup_rows:
        (payloads(spark, warmup_rows, size, partitions).write.format("blizzard")
         .option("master", master_addr).option("queue", f"{queue}.warmup").mode("append").save())
    df = payloads(spark, rows, size, partitions)
    with Client(master_addr) as c:
        before = c.stats(queue)["ready"]
    group = f"blizzard-bench-write-{secrets.token_hex(4)}"
    spark.sparkContext.setJobGroup(group, "bench write")
    jvm_pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
    meter = CpuMeter(cluster) if cluster is not None else None
    spark_cpu0, machine0 = tree_cpu_s(jvm_pid), machine_cpu()
    try:
        t0 = time.time()
        (df.write.format("blizzard").option("master", master_addr).option("queue", queue)
         .mode("append").save())
        t1 = time.time()
        spark_cpu1, machine1 = tree_cpu_s(jvm_pid), machine_cpu()
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
    with Client(master_addr) as c:
        added = c.stats(queue)["ready"] - before
    if added != rows:
        raise RuntimeError(f"the write of {rows} rows left {added} more ready items in {queue!r}")
    elapsed = t1 - t0
    out: dict[str, Any] = {"mode": "write", "rows": rows, "size": size, "partitions": partitions,
                           "warmup_rows": warmup_rows,
                           "items_per_s": round(rows / elapsed),
                           "mb_per_s": round(rows * size / elapsed / 1e6, 2),
                           "elapsed_s": round(elapsed, 3)}
    out.update(stage_times(spark, group, t0, t1))
    cpu = meter.report(rows, {}).get("cpu_us_per_item", {}) if meter is not None else {}
    cpu["spark"] = round((spark_cpu1 - spark_cpu0) / rows * 1e6, 1)
    out["cpu_us_per_item"] = cpu
    if machine0 and machine1 and machine1[1] > machine0[1]:
        out["machine_busy"] = round((machine1[0] - machine0[0]) / (machine1[1] - machine0[1]), 2)
    return out


def stage_times(spark: Any, group: str, t0: float, t1: float) -> dict[str, float]:
    """The write stage's timings from Spark's status store (empty if it cannot be read)."""
    try:
        tracker = spark.sparkContext.statusTracker()
        stage_ids = [s for j in tracker.getJobIdsForGroup(group)
                     for s in tracker.getJobInfo(j).stageIds]
        store = spark.sparkContext._jsc.sc().statusStore()
        stages = [store.lastStageAttempt(s) for s in stage_ids]
    except Exception as exc:  # the numbers are a courtesy; the rate above is the measurement
        log.warning("could not read Spark's stage timings: %s", exc)
        return {}
    if not stages:
        return {}
    submitted = min(s.submissionTime().get().getTime() for s in stages) / 1000
    completed = max(s.completionTime().get().getTime() for s in stages) / 1000
    run_ms = sum(s.executorRunTime() for s in stages)
    return {"job_start_s": round(submitted - t0, 3), "stage_s": round(completed - submitted, 3),
            "commit_s": round(t1 - completed, 3), "task_s": round(run_ms / 1000, 3),
            "tasks": sum(s.numTasks() for s in stages)}


def main(argv: list[str] | None = None) -> int:
    ap = parser("python -m bench.spark_write", __doc__)
    ap.add_argument("--rows", type=int, default=1_000_000, help="rows to write")
    ap.add_argument("--size", type=int, default=256, help="bytes per row")
    ap.add_argument("--spark-master", default="local[*]", help="Spark master URL")
    ap.add_argument("--partitions", type=int, default=None,
                    help="partitions (tasks) of the write; default: Spark's default parallelism")
    ap.add_argument("--repeat", type=int, default=1,
                    help="writes in one Spark session, each to a fresh queue")
    ap.add_argument("--warmup-rows", type=int, default=WARMUP_ROWS,
                    help="rows written to another queue before each measured write (0: none, "
                         "so the first write also pays for starting Spark's Python workers)")
    args = ap.parse_args(argv)
    base = start("spark-write")
    cluster = LocalCluster(os.path.join(base, "cluster"), datanodes=2, replication=2)

    def body() -> int:
        from blizzard.spark import local_session

        os.environ["BLIZZARD_KEYS"] = cluster.keys or ""  # executors' clients find them here
        spark = local_session(args.spark_master, app_name="blizzard-bench-write")
        try:
            for run in range(args.repeat):
                result = measure_write(spark, cluster.master_addr, f"bench-write-{run}",
                                       args.rows, args.size, partitions=args.partitions,
                                       cluster=cluster, warmup_rows=args.warmup_rows)
                print(json.dumps(dict(result, run=run)), flush=True)
        finally:
            spark.stop()
        return 0

    return on_clusters(base, [cluster], body)


if __name__ == "__main__":
    sys.exit(main())
