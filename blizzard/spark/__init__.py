"""Spark integration: a PySpark data source named ``blizzard`` and a queue-to-files drain.

``register(spark)`` once per session, then

- ``spark.readStream.format("blizzard").option("master", URL).option("queue", Q).load()``
  streams items; each is acked only after the sink has durably written its micro-batch;
- ``df.write.format("blizzard").option("master", URL).option("queue", Q).save()`` enqueues a
  DataFrame all or nothing;
- ``drain(spark, queue, path)`` copies a queue into Parquet or JSON files until it is empty.

Needs pyspark >= 4.2, pyarrow and Java 17+ (``pip install 'blizzard[spark]'``). Sockets are
opened only where the work happens (driver: the master; executors: data nodes), never pickled.
Uses ``blizzard.client`` and what it uses.
"""

from __future__ import annotations

from blizzard.spark.drain import DrainProgress, DrainSummary, drain
from blizzard.spark.options import ReadOptions, WriteOptions
from blizzard.spark.schema import SCHEMA
from blizzard.spark.session import local_session
from blizzard.spark.source import BlizzardDataSource, register

__all__ = ["SCHEMA", "BlizzardDataSource", "DrainProgress", "DrainSummary", "ReadOptions",
           "WriteOptions", "drain", "local_session", "register"]
