"""A Spark Structured Streaming source over a consumer group: ``format("paimon-group")``.

Each running query's driver is one member of the group; see
:mod:`paimon_group.spark.source.source` and docs/spark.md. Needs PySpark >= 4.2: the
source uses the admission control (``latestOffset(start, limit)``, read limits)
and ``Trigger.AvailableNow`` support that Python data sources gained in Spark
4.2. On an older PySpark, importing this package raises one ConfigError line.

Example::

    from paimon_group.spark.handler import PaimonGroupDataSource

    spark.dataSource.register(PaimonGroupDataSource)
    df = (spark.readStream.format("paimon-group")
          .option("group", "orders").option("warehouse", "/data/wh")
          .option("table", "db.orders").option("member_id", "q1").load())
"""

from __future__ import annotations

from coordinators.errors import ConfigError

MIN_PYSPARK = "4.2"


def _require_streaming_admission_control() -> None:
    """One clear line, instead of an ImportError deep in Spark, on PySpark < 4.2."""
    try:
        import pyspark
    except ImportError as err:
        raise ConfigError(
            "the paimon-group Spark source needs PySpark (>= 4.2); "
            "install the extra: pip install '.[spark]'"
        ) from err
    try:
        import pyspark.sql.streaming.datasource  # added in Spark 4.2
    except ImportError as err:
        raise ConfigError(
            f"the paimon-group Spark source needs PySpark >= {MIN_PYSPARK} (admission control "
            f"for Python streaming sources); this is PySpark {pyspark.__version__}: upgrade it, "
            "or use --spark-handler workers, which run on PySpark 4.0 and later"
        ) from err


_require_streaming_admission_control()

# Imported after the check: source.py imports pyspark.sql.streaming.datasource.
from paimon_group.spark.source.options import SourceOptions  # noqa: E402
from paimon_group.spark.source.source import (  # noqa: E402
    PaimonGroupDataSource,
    PaimonGroupStreamReader,
    ShardPartition,
)
from paimon_group.spark.source.to_paimon import PaimonBatchSink  # noqa: E402

__all__ = ["PaimonBatchSink", "PaimonGroupDataSource", "PaimonGroupStreamReader",
           "ShardPartition", "SourceOptions"]
