"""Triggers of the ``paimon-group`` Spark source: real local-mode queries.

``Trigger.AvailableNow`` run on a schedule with the default options (a new
member id each run, one checkpoint): every run reads what was written since
the last, and ends. ``Trigger.Once``, after which Spark calls no source
method, so the group never learns its batch was written: refused with one
line naming ``availableNow``.
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

from paimon_group.spark.source.errors import error_line  # noqa: E402


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


def test_trigger_once_is_refused_with_one_line_naming_available_now(
    spark: Any, tmp_path: Path
) -> None:
    """Before, the Once query delivered its rows and left the group's positions
    at the pinned full scan: the next query read the same rows again."""
    warehouse, checkpoint = tmp_path / "wh", tmp_path / "ckpt"
    make_pk_table(warehouse, "db.t", buckets=2)
    write_rows(warehouse, "db.t", range(30))
    ids, collect = collector()
    query = (source(spark, warehouse).writeStream.foreachBatch(collect)
             .option("checkpointLocation", str(checkpoint)).trigger(once=True).start())
    with pytest.raises(Exception) as caught:
        query.awaitTermination(180)
        raise AssertionError("the Trigger.Once query ended without an error")
    line = error_line(caught.value)
    assert line is not None, f"no line of ours in: {caught.value}"
    assert line.startswith("Trigger.Once is not supported by the paimon-group source"), line
    assert ".trigger(availableNow=True)" in line
    assert ids == []
    # The checkpoint goes on under availableNow: every row once, then nothing again.
    for expected in (list(range(30)), []):
        ids, collect = collector()
        query = (source(spark, warehouse).writeStream.foreachBatch(collect)
                 .option("checkpointLocation", str(checkpoint))
                 .trigger(availableNow=True).start())
        assert query.awaitTermination(180)
        assert query.exception() is None
        assert sorted(ids) == expected


def test_available_now_whose_member_does_not_hold_its_shards_in_time_stops_with_one_line(
) -> None:
    """Without its shards the run would plan nothing and Spark end it as if
    nothing were new: it stops with the line instead (no Spark job here)."""
    from types import SimpleNamespace

    from paimon_group.spark.source.options import SourceOptions
    from paimon_group.spark.source.source import PaimonGroupStreamReader

    options = SourceOptions.parse({"group": "g", "warehouse": "/wh", "table": "db.t",
                                   "ready_timeout_s": "2"})
    reader = PaimonGroupStreamReader(options)
    reader._driver = SimpleNamespace(  # type: ignore[assignment]
        ready=False, group="g", member=SimpleNamespace(member_id="q-1"))
    with pytest.raises(Exception) as caught:
        reader.prepareForTriggerAvailableNow()
    assert error_line(caught.value) == (
        "Trigger.AvailableNow: member 'q-1' of group 'g' did not hold its assigned shards within "
        "ready_timeout_s=2 s, so it cannot read what is available; the group's other members "
        "may still hold them (paimon-group describe --group g ...): raise the option "
        "ready_timeout_s, or run the query again")
