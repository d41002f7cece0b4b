"""The ``blizzard`` PySpark data source: a streaming reader and a batch writer of queue items."""

from __future__ import annotations

import weakref

from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, DataSourceWriter
from pyspark.sql.types import StructType

from blizzard.spark.options import ReadOptions, WriteOptions
from blizzard.spark.schema import SCHEMA
from blizzard.wire.errors import InvalidArgument


class BlizzardDataSource(DataSource):
    """Items of one Blizzard queue as rows (read: streaming; write: batch, all or nothing)."""

    @classmethod
    def name(cls) -> str:
        return "blizzard"

    def schema(self) -> StructType:
        return SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from blizzard.spark.reader import BlizzardStreamReader

        if schema != SCHEMA:
            raise InvalidArgument("the blizzard source has a fixed schema: "
                                  f"{SCHEMA.simpleString()}")
        return BlizzardStreamReader(ReadOptions.parse(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from blizzard.spark.writer import BlizzardWriter, check_write_schema

        if overwrite:
            raise InvalidArgument("a queue cannot be overwritten; use mode('append')")
        check_write_schema(schema)
        return BlizzardWriter(WriteOptions.parse(self.options), schema)


_registered: weakref.WeakSet[SparkSession] = weakref.WeakSet()


def register(spark: SparkSession) -> SparkSession:
    """Make ``format("blizzard")`` available in ``spark`` (again is a no-op, not a warning)."""
    if spark not in _registered:
        spark.dataSource.register(BlizzardDataSource)
        _registered.add(spark)
    return spark
