"""A SparkSession for the CLI, the demo and the tests: local, or on a Spark cluster.

Local Spark (``local[*]``) and a cluster on this machine (``spark://127.0.0.1:7077``) get a
driver that listens on 127.0.0.1 only. On any other cluster the driver listens where Spark's
own settings say (``SPARK_LOCAL_IP``, ``spark.driver.host``): its executors must reach it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from pyspark.sql import SparkSession

from blizzard.net.defaults import LOOPBACK
from blizzard.net.keys import ENV as KEYS_ENV
from blizzard.spark.source import register

LOOPBACK_HOSTS = (LOOPBACK, "localhost")
LOCAL_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1"  # local Spark's JVM (``conf`` may say otherwise)


def local_session(master: str = "local[*]", *, app_name: str = "blizzard",
                  shuffle_partitions: int = 4, log_level: str = "ERROR",
                  conf: Mapping[str, str] | None = None) -> SparkSession:
    """Start (or reuse) a SparkSession on ``master`` with ``blizzard`` registered.

    Unless already set, ``PYSPARK_PYTHON`` is this interpreter: Spark runs Python workers with
    the driver's choice, so on a cluster that path must exist on the workers too. On a cluster
    the executors get the driver's ``BLIZZARD_KEYS`` (the key directory must be at that path
    on the workers; ``conf`` may set ``spark.executorEnv.BLIZZARD_KEYS`` to another). ``conf``
    is applied last. Local Spark's JVM compiles with the JIT's first tier only
    (``LOCAL_JAVA_OPTIONS``). Needs Java 17+. The web UI is off: it would be one more listening
    port. ``log_level`` quiets Spark's own logging once the JVM is up (its start-up banner still
    shows).
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (SparkSession.builder.master(master).appName(app_name)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", str(shuffle_partitions)))
    if master.startswith("local"):
        # The JIT's first tier only: the optimizing compiler's work on Spark's generated code
        # cost more CPU than it saved in a drain of 1M items on 2 cores (C2 threads: 15-20 s of
        # CPU; the drain took 27-30 s with this, 31-37 s without, measured)
        builder = builder.config("spark.driver.extraJavaOptions", LOCAL_JAVA_OPTIONS)
    if on_loopback(master):
        os.environ["SPARK_LOCAL_IP"] = LOOPBACK  # read by the JVM at launch
        builder = (builder.config("spark.driver.bindAddress", LOOPBACK)
                   .config("spark.driver.host", LOOPBACK))
    if not master.startswith("local") and os.environ.get(KEYS_ENV):
        builder = builder.config(f"spark.executorEnv.{KEYS_ENV}", os.environ[KEYS_ENV])
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    return register(spark)


def on_loopback(master: str) -> bool:
    """Whether Spark master URL ``master`` runs on this machine: ``local``, ``local[4]``,
    ``spark://127.0.0.1:7077``, ``spark://localhost:7077`` (several masters: all of them)."""
    if master.startswith("local"):
        return True
    _, sep, rest = master.partition("://")
    hosts = [h.rsplit(":", 1)[0] for h in rest.split(",")] if sep else []
    return bool(hosts) and all(h in LOOPBACK_HOSTS for h in hosts)
