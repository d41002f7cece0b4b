"""A local SparkSession bound to loopback only, for the CLI, the demo and the tests."""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

from blizzard.defaults import LOOPBACK
from blizzard.spark.source import register


def local_session(master: str = "local[*]", *, app_name: str = "blizzard",
                  shuffle_partitions: int = 4, log_level: str = "ERROR") -> SparkSession:
    """Start (or reuse) a local SparkSession that listens on 127.0.0.1 only, with ``blizzard``
    registered.

    Sets ``SPARK_LOCAL_IP`` (read by the JVM at launch) and, unless already set,
    ``PYSPARK_PYTHON`` to this interpreter, so Python workers can import blizzard. Needs Java 17+.
    The web UI is off: it would be one more listening port. ``log_level`` quiets Spark's own
    logging once the JVM is up (its start-up banner still shows).
    """
    os.environ["SPARK_LOCAL_IP"] = LOOPBACK
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (SparkSession.builder.master(master).appName(app_name)
             .config("spark.driver.bindAddress", LOOPBACK)
             .config("spark.driver.host", LOOPBACK)
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
             .getOrCreate())
    spark.sparkContext.setLogLevel(log_level)
    return register(spark)
