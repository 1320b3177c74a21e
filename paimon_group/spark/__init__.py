"""Spark: the handler path, the sinks, the streaming source.

* :mod:`paimon_group.spark.handler`: ``paimon-group run --spark-handler
  MODULE:CALLABLE``, each shard batch as a Spark DataFrame (PySpark >= 4.0).
* :mod:`paimon_group.spark.sinks`: sinks that make a replayed batch replace
  its earlier attempt (Parquet; the batch key for transactional formats).
* :mod:`paimon_group.spark.source`: the Structured Streaming source,
  ``format("paimon-group")`` (PySpark >= 4.2).

The handler's names and the source's data source are public here, as they
were when ``paimon_group.spark`` was one module::

    from paimon_group.spark import PaimonGroupDataSource, SparkBatchHandler

Nothing here imports PySpark: the names are loaded on first use, and
``PaimonGroupDataSource`` is the one that needs PySpark (>= 4.2) to load.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "ARROW_CONF": "paimon_group.spark.handler",
    "SparkBatchHandler": "paimon_group.spark.handler",
    "SparkFunction": "paimon_group.spark.handler",
    "arrow_to_dataframe": "paimon_group.spark.handler",
    "build_spark_session": "paimon_group.spark.handler",
    "spark_handler_from_spec": "paimon_group.spark.handler",
    "PaimonGroupDataSource": "paimon_group.spark.source",
}

__all__ = [
    "ARROW_CONF",
    "PaimonGroupDataSource",
    "SparkBatchHandler",
    "SparkFunction",
    "arrow_to_dataframe",
    "build_spark_session",
    "spark_handler_from_spec",
]

if TYPE_CHECKING:
    from paimon_group.spark.handler import (
        ARROW_CONF,
        SparkBatchHandler,
        SparkFunction,
        arrow_to_dataframe,
        build_spark_session,
        spark_handler_from_spec,
    )
    from paimon_group.spark.source import PaimonGroupDataSource


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
