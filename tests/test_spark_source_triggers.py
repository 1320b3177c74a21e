"""Triggers of the ``paimon-group`` Spark source: real local-mode queries.

``Trigger.AvailableNow`` run on a schedule with the default options (a new
member id each run, one checkpoint): every run reads what was written since
the last, and ends.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.support.requirements import require
from tests.support.tables import make_pk_table, write_rows

pytestmark = pytest.mark.spark

if not os.environ.get("CI"):
    require("pyspark", "pip install '.[spark]' (tests/run.sh does)")

from tests import test_spark_source as base  # noqa: E402

spark = base.spark  # the SparkSession fixture of the source's tests


def source(spark: Any, warehouse: Path) -> Any:
    """The source with the default options (no member id: a new one each query)."""
    return (spark.readStream.format("paimon-group").option("group", "g")
            .option("warehouse", str(warehouse)).option("table", "db.t").load())


def collector() -> tuple[list[int], Any]:
    ids: list[int] = []

    def collect(df: Any, batch_id: int) -> None:
        ids.extend(r["id"] for r in df.select("id").collect())

    return ids, collect


def test_scheduled_available_now_runs_each_read_the_rows_written_since_the_last(
    spark: Any, tmp_path: Path
) -> None:
    """Before, every run after the first ended with no batch: its new member,
    in no published assignment yet, counted as ready with no shard, so the
    run's only offset was its start."""
    warehouse, checkpoint = tmp_path / "wh", tmp_path / "ckpt"
    make_pk_table(warehouse, "db.t", buckets=4)
    for run in range(3):
        written = range(10 * run, 10 * run + 10)
        write_rows(warehouse, "db.t", written)
        ids, collect = collector()
        query = (source(spark, warehouse).writeStream.foreachBatch(collect)
                 .option("checkpointLocation", str(checkpoint))
                 .trigger(availableNow=True).start())
        assert query.awaitTermination(180)
        assert query.exception() is None
        assert sorted(ids) == list(written), f"run {run + 1}"

