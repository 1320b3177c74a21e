"""The Spark job of the example pipeline, run by every worker of the group.

Each worker runs ``paimon-group run ... --spark-handler pipeline:handle``;
:func:`handle` receives every batch of the shards the worker owns as a Spark
DataFrame of ``shop.orders`` rows (``order_id``, ``customer_id``,
``amount_cents``), joins it with the small ``customers`` dimension table
(``customer_id`` -> ``region``), and writes two outputs, each to a
:class:`~paimon_group.spark.sinks.ParquetBatchSink` under the batch's key:

* ``enriched_orders``: every order with its region (row level);
* ``region_totals``: per batch and region, the number of orders and their
  amount (an aggregation; the totals of the whole stream are the sum over
  batches, see ``run.py``).

A batch delivered again after a crash or a handoff replaces its earlier
output in both sinks, so each order counts exactly once. Orders are
immutable events (inserts only): summing increments is then exact. For a
table whose rows are updated, read the changelog with
``--include-row-kind`` and subtract ``-U``/``-D`` rows, or keep the latest
row per primary key instead (``docs/spark.md``).

Configuration comes from the environment (set by ``run.py``):
``PIPELINE_OUT`` (output directory) and ``PIPELINE_CUSTOMERS`` (the
dimension table, a Parquet file).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from paimon_group.spark.sinks import ParquetBatchSink

OUT = Path(os.environ.get("PIPELINE_OUT", "pipeline-out"))
enriched_sink = ParquetBatchSink(OUT / "enriched_orders")
totals_sink = ParquetBatchSink(OUT / "region_totals")

_customers: DataFrame | None = None
_lock = threading.Lock()


def customers(spark: SparkSession) -> DataFrame:
    """The dimension table, loaded once per worker.

    Read here and shipped to Spark as Arrow, so it works the same with a
    local master and with a Spark Connect server that cannot see this file.
    """
    global _customers
    with _lock:
        if _customers is None:
            _customers = spark.createDataFrame(pq.read_table(os.environ["PIPELINE_CUSTOMERS"]))
        return _customers


def transform(orders: DataFrame, customers: DataFrame) -> tuple[DataFrame, DataFrame]:
    """Orders enriched with the customer's region, and totals per region."""
    enriched = orders.join(F.broadcast(customers), "customer_id", "left").select(
        "order_id",
        "customer_id",
        F.coalesce("region", F.lit("unknown")).alias("region"),
        "amount_cents",
    )
    totals = enriched.groupBy("region").agg(
        F.count(F.lit(1)).alias("orders"),
        F.sum("amount_cents").alias("amount_cents"),
    )
    return enriched, totals


def handle(df: DataFrame, batch: Any) -> None:
    """The worker's handler: both writes finish before it returns (then the
    member commits the batch's position)."""
    enriched, totals = transform(df, customers(df.sparkSession))
    enriched_sink.write(enriched, batch)
    totals_sink.write(totals, batch)
