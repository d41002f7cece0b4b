"""Spark at pipeline speed: ``blizzard drain`` and the batch writer, on local and standalone Spark.

Run as ``scripts/bench --spark`` (or ``python -m bench.spark``). For each Spark (``local[*]``,
and a standalone cluster of a master and two workers started here from pyspark's own launch
classes, on loopback) and each ``--drain`` case ``ITEMS:SIZE``: a fresh cluster of one master
and two data nodes (R=2) is filled with ITEMS payloads of SIZE random bytes, then drained to
Parquet with ``blizzard.spark.drain``; after the first case, ``--write`` rows of
``--write-size`` bytes go through ``df.write.format("blizzard")`` (``bench/spark_write.py``).

Prints one JSON line per measurement: ``items_per_s`` and ``mb_per_s`` from the first
micro-batch's lease to the last ack (what the issue measures), ``spark_start_s`` (the
session), ``query_start_s`` (drain call to the first lease), and ``stages``: seconds per stage
summed over calls (driver lease, partition planning, executor fetch, Arrow, Spark consumes (its
conversion and Parquet write of each Arrow batch), acks, lease keep-alive; executor stages add
up over parallel tasks), from the source's ``timingsDir`` records; ``cpu_us_per_item`` of the
master, the data nodes and Spark (the driver's JVM with the Python processes it starts: on a
standalone cluster the executors are the workers', not counted).
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import tempfile
import time
from typing import Any

from bench.common import clusters_for, parser, security_of, security_option, start
from bench.throughput import CpuMeter, tree_cpu_s
from blizzard.client.core import Client
from blizzard.local.harness import LocalCluster
from blizzard.net.keys import ENV as KEYS_ENV
from blizzard.spark.timings import records, summarize

log = logging.getLogger(__name__)

QUEUE = "bench-spark"
MB = 1_000_000


def fill(cluster: LocalCluster, items: int, size: int) -> float:
    """Enqueue ``items`` payloads of ``size`` random bytes (a pool of distinct blobs, so
    Parquet cannot compress them away); returns items/s."""
    rng = random.Random(size)
    pool = [rng.randbytes(size) for _ in range(64)]
    chunk = max(1, min(1000, (4 << 20) // max(1, size)))
    started = time.monotonic()
    with Client(cluster.master_addr, timeout_s=60.0) as client:
        with client.producer(QUEUE, window=4) as producer:
            for at in range(0, items, chunk):
                producer.send([pool[(at + k) % len(pool)] for k in range(min(chunk, items - at))])
    return items / (time.monotonic() - started)


def driver_lease(base: str, items: int, security: str) -> dict[str, Any]:
    """The driver's part of a drain alone, no Spark: ``items`` of 256 B filled, then leased as
    the driver leases them (``lease_columns``, 10,000 a call); this process's CPU per item
    (the reply's decode) and the servers'."""
    cluster = clusters_for(os.path.join(base, f"lease-{items}"), security,
                           datanodes=2, replication=2)[0]
    try:
        cluster.start()
        if cluster.keys:
            os.environ[KEYS_ENV] = cluster.keys
        else:
            os.environ.pop(KEYS_ENV, None)
        fill(cluster, items, 256)
        with Client(cluster.master_addr, timeout_s=60.0) as client:
            meter = CpuMeter(cluster)
            wall, cpu = time.monotonic(), time.process_time()
            leased = calls = 0
            while leased < items:
                got = len(client.lease_columns(QUEUE, 10_000, lease_s=300.0).ids)
                leased, calls = leased + got, calls + 1
                if not got:
                    break
            wall, cpu = time.monotonic() - wall, time.process_time() - cpu
            servers = meter.report(leased, {}).get("cpu_us_per_item", {})
        return {"op": "driver_lease", "items": leased, "calls": calls,
                "us_per_item": round(wall / leased * 1e6, 2),
                "client_cpu_us_per_item": round(cpu / leased * 1e6, 2),
                "cpu_us_per_item": servers, "security": security}
    finally:
        cluster.stop()


def drain_once(spark: Any, cluster: LocalCluster, items: int, size: int, batch: int,
               base: str) -> dict[str, Any]:
    from blizzard.spark import drain
    timings = tempfile.mkdtemp(prefix="timings-", dir=base)
    out = os.path.join(tempfile.mkdtemp(prefix="out-", dir=base), "parquet")
    meter = CpuMeter(cluster)
    jvm_pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
    spark_cpu = tree_cpu_s(jvm_pid)
    called = time.time()
    summary = drain(spark, QUEUE, out, master=cluster.master_addr, max_items_per_batch=batch,
                    options={"timingsDir": timings}, progress=False, timeout_s=60.0)
    cpu = meter.report(items, {}).get("cpu_us_per_item", {})
    cpu["spark"] = round((tree_cpu_s(jvm_pid) - spark_cpu) / items * 1e6, 1)
    recs = records(timings)
    leases = [r for r in recs if r["stage"] == "driver lease" and r["items"]]
    acks = [r for r in recs if r["stage"] == "acks"]
    first = min(r["at"] - r["s"] for r in leases)
    seconds = max(r["at"] for r in acks) - first
    if summary.written != items or summary.ready_after or summary.leased_after:
        raise RuntimeError(f"the drain did not take every item: {summary}")
    return {"items_per_s": round(items / seconds, 1),
            "mb_per_s": round(summary.bytes / MB / seconds, 2), "elapsed_s": round(seconds, 3),
            "query_start_s": round(first - called, 3), "batches": summary.batches,
            "stages": summarize(timings), "cpu_us_per_item": cpu}


def session(spark_master: str, base: str, keys: str | None) -> tuple[Any, Any]:
    """A session on ``local[*]`` or (``standalone``) on a cluster started here; returns it with
    the cluster (or None) and the time it took."""
    from blizzard.local.spark_standalone import StandaloneSpark
    from blizzard.spark import local_session
    if keys:
        os.environ[KEYS_ENV] = keys
    else:
        os.environ.pop(KEYS_ENV, None)
    if spark_master == "standalone":
        cluster = StandaloneSpark(os.path.join(base, "spark")).start()
        return local_session(cluster.url, app_name="bench-spark",
                             conf=cluster.session_conf()), cluster
    return local_session(spark_master, app_name="bench-spark"), None


def measure(args: Any, base: str, spark_master: str, security: str) -> None:
    for case in args.drain:
        items, size = case
        cluster = clusters_for(os.path.join(base, f"drain-{items}-{size}"), security,
                               datanodes=2, replication=2)[0]
        spark = standalone = None
        try:
            cluster.start()
            log.info("filling %d items of %d B", items, size)
            enqueue_rate = fill(cluster, items, size)
            started = time.monotonic()
            spark, standalone = session(spark_master, base, cluster.keys)
            spark_start = time.monotonic() - started
            log.info("draining on %s (Spark started in %.1f s)", spark_master, spark_start)
            rec = drain_once(spark, cluster, items, size, args.batch, base)
            emit({"op": "drain", "items": items, "size": size, **rec,
                  "spark_start_s": round(spark_start, 2),
                  "enqueue_items_per_s": round(enqueue_rate, 1)}, spark_master, cluster)
            if args.write and case == args.drain[0]:  # once per Spark, on the first cluster
                from bench.spark_write import measure_write
                log.info("writing %d rows of %d B", args.write, args.write_size)
                emit({"op": "write", **measure_write(spark, cluster.master_addr, QUEUE + "-w",
                                                     args.write, args.write_size,
                                                     cluster=cluster)}, spark_master, cluster)
        finally:
            if spark is not None:
                spark.stop()
            if standalone is not None:
                standalone.stop()
            cluster.stop()


def emit(rec: dict[str, Any], spark_master: str, cluster: LocalCluster) -> None:
    print(json.dumps({"system": "blizzard", "bench": "spark", "spark": spark_master,
                      "replication": cluster.replication, "security": security_of(cluster),
                      **rec}), flush=True)


def case(text: str) -> tuple[int, int]:
    items, _, size = text.partition(":")
    return int(items), int(size or 256)


def main(argv: list[str] | None = None) -> int:
    ap = parser("scripts/bench --spark", __doc__)
    ap.add_argument("--spark", action="store_true", help="(how scripts/bench picks this one)")
    ap.add_argument("--drain", type=case, nargs="+", default=[(1_000_000, 256), (20_000, 65536)],
                    metavar="ITEMS:SIZE", help="drain cases (default 1000000:256 20000:65536)")
    ap.add_argument("--write", type=int, default=1_000_000,
                    help="rows for the batch-writer measurement, after the first drain (0: none)")
    ap.add_argument("--write-size", type=int, default=256, help="bytes per row written")
    ap.add_argument("--batch", type=int, default=250_000, help="drain's maxItemsPerBatch")
    ap.add_argument("--driver-lease", type=int, metavar="N", default=0,
                    help="instead: the driver's leases alone, no Spark (N items filled, then "
                         "leased 10,000 a call): the CPU per item of the lease replies' decode")
    ap.add_argument("--spark-master", choices=["local[*]", "standalone", "both"],
                    default="both", help="where Spark runs (both: local first)")
    security_option(ap)
    args = ap.parse_args(argv)
    if args.security == "both":
        ap.error("--security both is not supported here; run on and off in turn")
    base = start("bench-spark")
    if args.driver_lease:
        try:
            print(json.dumps({"system": "blizzard", "bench": "spark",
                              **driver_lease(base, args.driver_lease, args.security)}), flush=True)
        finally:
            shutil.rmtree(base, ignore_errors=True)
        return 0
    masters = ["local[*]", "standalone"] if args.spark_master == "both" else [args.spark_master]
    try:
        for spark_master in masters:
            measure(args, base, spark_master, args.security)
    finally:  # a million items' stores and their Parquet copy: not left in /tmp
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
