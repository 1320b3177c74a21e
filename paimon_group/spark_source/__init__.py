"""A Spark Structured Streaming source over a consumer group: ``format("paimon-group")``.

Each running query's driver is one member of the group; see
:mod:`paimon_group.spark_source.source` and docs/spark.md. Needs PySpark >= 4.0.

Example::

    from paimon_group.spark import PaimonGroupDataSource

    spark.dataSource.register(PaimonGroupDataSource)
    df = (spark.readStream.format("paimon-group")
          .option("group", "orders").option("warehouse", "/data/wh")
          .option("table", "db.orders").option("member_id", "q1").load())
"""

from __future__ import annotations

from paimon_group.spark_source.options import SourceOptions
from paimon_group.spark_source.source import (
    PaimonGroupDataSource,
    PaimonGroupStreamReader,
    ShardPartition,
)

__all__ = ["PaimonGroupDataSource", "PaimonGroupStreamReader", "ShardPartition", "SourceOptions"]
