"""The rows the ``blizzard`` data source reads: one definition for the source, the executors'
Arrow batches and the drain's output."""

from __future__ import annotations

from pyspark.sql.types import (
                               BinaryType,
                               IntegerType,
                               LongType,
                               StringType,
                               StructField,
                               StructType,
                               TimestampType,
)

SCHEMA = StructType([  # built by hand: parsing DDL needs a JVM, and Python workers have none
    StructField("id", LongType()),
    StructField("queue", StringType()),
    StructField("priority", IntegerType()),
    StructField("attempts", IntegerType()),
    StructField("enqueued_at", TimestampType()),
    StructField("key", StringType()),  # null for an item enqueued without a key
    StructField("data", BinaryType()),
])
