"""Shard batches as Spark DataFrames, and sinks fed from Spark: real PySpark, local master.

One SparkSession for the test process (``spark`` fixture, tests/support/spark_session.py, built by
:func:`paimon_group.spark.handler.build_spark_session`, so its settings are the ones
a member process gets). Batches are real :class:`ShardBatch` objects planned
from real Paimon tables.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from paimon_group.errors import StaleEpoch
from paimon_group.reading.batch import ShardBatch
from paimon_group.reading.planner import BatchKind
from paimon_group.reading.table import ShardedTable
from tests.support.requirements import require
from tests.support.tables import delete_rows, make_pk_table, write_rows

pytestmark = pytest.mark.spark

if not os.environ.get("CI"):
    require("pyspark", "pip install '.[spark]' (tests/run.sh does)")

from paimon_group.spark.handler import ARROW_CONF, SparkBatchHandler  # noqa: E402
from paimon_group.spark.sinks import (  # noqa: E402
    ParquetBatchSink,
    StaleSinkWrite,
    batch_key_condition,
    with_batch_key,
)


def _sorted(table: pa.Table) -> pa.Table:
    return table.sort_by([(name, "ascending") for name in table.column_names])


def _batches(
    warehouse: Path,
    name: str,
    num_shards: int,
    *,
    include_row_kind: bool,
    full_scan: int | None = None,
    next_snapshot: int | None = None,
    epoch: int = 1,
    group: str = "g",
) -> list[ShardBatch]:
    """The non-empty batches of one step, as a member would build them."""
    table = ShardedTable.open(str(warehouse), name)
    planner = table.planner(num_shards, include_row_kind=include_row_kind)
    shards = range(num_shards)
    if full_scan is not None:
        step = planner.plan_full(shards, full_scan)
    else:
        assert next_snapshot is not None
        planned = planner.plan_next(shards, next_snapshot)
        assert planned is not None
        step = planned
    return [
        ShardBatch(group=group, member_id="m1", shard=k, num_shards=num_shards, epoch=epoch,
                   plan=step, planner=planner)
        for k, splits in step.splits.items() if splits
    ]


@pytest.fixture(scope="module")
def table_with_history(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[int]]:
    """db.t (4 buckets, row kinds written): inserts, updates, deletes in 3 snapshots."""
    warehouse = tmp_path_factory.mktemp("wh")
    make_pk_table(warehouse, "db.t", buckets=4, row_kind_field=True)
    snapshots = [
        write_rows(warehouse, "db.t", range(200)),
        write_rows(warehouse, "db.t", range(150, 260), v=1),
        delete_rows(warehouse, "db.t", range(0, 30)),
    ]
    return warehouse, snapshots


def _spark_type_names(df: Any) -> list[tuple[str, str, bool]]:
    return [(f.name, f.dataType.simpleString(), f.nullable) for f in df.schema.fields]


@pytest.mark.parametrize("include_row_kind", [True, False])
@pytest.mark.parametrize("kind", ["initial", "delta"])
def test_dataframe_holds_exactly_the_batch_rows_and_schema(
    spark: Any, table_with_history: tuple[Path, list[int]], include_row_kind: bool, kind: str
) -> None:
    warehouse, snapshots = table_with_history
    if kind == "initial":
        batches = _batches(warehouse, "db.t", 3, include_row_kind=include_row_kind,
                           full_scan=snapshots[-1])
    else:  # the delete snapshot: -D rows
        batches = _batches(warehouse, "db.t", 3, include_row_kind=include_row_kind,
                           next_snapshot=snapshots[-1])
    assert batches and all(b.kind.value == kind for b in batches)
    handler = SparkBatchHandler(lambda df, batch: df, spark)
    expected_names = ["id", "v", "payload", "op"]
    if include_row_kind:
        expected_names = ["_row_kind", *expected_names]
    for batch in batches:
        expected = batch.to_arrow()
        assert expected.num_rows > 0
        df = handler(batch)
        assert df.columns == expected_names
        assert _spark_type_names(df) == [
            (name, {"string": "string", "int64": "bigint"}[str(expected.schema.field(name).type)],
             expected.schema.field(name).nullable)
            for name in expected_names
        ]
        got = df.toArrow()
        assert _sorted(got).to_pylist() == _sorted(expected).to_pylist()
        if include_row_kind:
            kinds = {"+I"} if kind == "initial" else {"-D"}
            assert set(got.column("_row_kind").to_pylist()) == kinds


def test_the_arrow_path_never_converts_row_by_row(
    spark: Any, table_with_history: tuple[Path, list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The conversion goes through ``_create_from_arrow_table``; the row-by-row paths
    (``_create_dataframe`` for Python rows, ``_convert_from_pandas``) are never entered,
    even with Arrow disabled for pandas conversions (that setting is not consulted)."""
    from pyspark.sql import SparkSession
    from pyspark.sql.pandas.conversion import SparkConversionMixin

    for key, value in ARROW_CONF.items():  # what every session we build has
        assert spark.conf.get(key) == value

    def refuse(*_args: Any, **_kwargs: Any) -> Any:
        raise AssertionError("row-by-row conversion used")

    arrow_calls: list[int] = []
    real = SparkConversionMixin._create_from_arrow_table

    def spy(self: Any, table: pa.Table, *args: Any, **kwargs: Any) -> Any:
        arrow_calls.append(table.num_rows)
        return real(self, table, *args, **kwargs)

    monkeypatch.setattr(SparkSession, "_create_dataframe", refuse)
    monkeypatch.setattr(SparkConversionMixin, "_convert_from_pandas", refuse)
    monkeypatch.setattr(SparkConversionMixin, "_create_from_arrow_table", spy)
    warehouse, snapshots = table_with_history
    batches = _batches(warehouse, "db.t", 2, include_row_kind=True, full_scan=snapshots[-1])
    handler = SparkBatchHandler(lambda df, batch: df.count(), spark)
    previous = spark.conf.get("spark.sql.execution.arrow.pyspark.enabled")
    spark.conf.set("spark.sql.execution.arrow.pyspark.enabled", "false")
    try:
        counts = [handler(b) for b in batches]
    finally:
        spark.conf.set("spark.sql.execution.arrow.pyspark.enabled", previous)
    assert counts == [b.to_arrow().num_rows for b in batches]
    assert arrow_calls == counts


def test_handler_calls_the_function_with_df_and_batch_and_keeps_a_user_session(
    spark: Any, table_with_history: tuple[Path, list[int]]
) -> None:
    warehouse, snapshots = table_with_history
    (batch, *_rest) = _batches(warehouse, "db.t", 1, include_row_kind=False,
                               next_snapshot=snapshots[0])
    seen: list[tuple[int, ShardBatch]] = []
    handler = SparkBatchHandler(lambda df, b: seen.append((df.count(), b)) or "result", spark)
    assert handler(batch) == "result"
    assert seen == [(200, batch)]
    handler.close()  # the user's session: not stopped
    assert spark.range(3).count() == 3


def test_stale_epoch_from_the_sink_is_not_retried(
    spark: Any, table_with_history: tuple[Path, list[int]]
) -> None:
    warehouse, snapshots = table_with_history
    (batch, *_rest) = _batches(warehouse, "db.t", 1, include_row_kind=False,
                               next_snapshot=snapshots[0])

    def refuse(df: Any, b: ShardBatch) -> None:
        raise StaleSinkWrite("a newer owner wrote")

    # Returns normally: the member's fenced commit is what drops the shard.
    assert SparkBatchHandler(refuse, spark)(batch) is None
    with pytest.raises(ValueError):
        SparkBatchHandler(lambda df, b: int("x"), spark)(batch)
    assert issubclass(StaleSinkWrite, StaleEpoch)


def test_parquet_sink_replay_replaces_and_stale_epoch_is_refused(
    spark: Any, tmp_path: Path
) -> None:
    warehouse = tmp_path / "wh"
    make_pk_table(warehouse, "db.s", buckets=2)
    first = write_rows(warehouse, "db.s", range(100))
    second = write_rows(warehouse, "db.s", range(100, 160))
    sink = ParquetBatchSink(tmp_path / "out")
    handler = SparkBatchHandler(lambda df, b: sink.write(df, b), spark)

    def batches(epoch: int, **step: int) -> list[ShardBatch]:
        return _batches(warehouse, "db.s", 2, include_row_kind=False, epoch=epoch, **step)

    # Owner A (epoch 3) writes the delta of `first`, crashes before committing.
    for b in batches(3, next_snapshot=first):
        assert handler(b).replaced is False
    # Owner B (epoch 4) replays the same step: replaced, not added.
    replays = [handler(b) for b in batches(4, next_snapshot=first)]
    assert all(p.replaced for p in replays)
    assert sorted(sink.read_arrow().column("id").to_pylist()) == list(range(100))
    # A wakes up and writes its next batch: refused, nothing written.
    with pytest.raises(StaleSinkWrite):
        sink.write(spark.range(1), batches(3, next_snapshot=second)[0])
    assert handler(batches(3, next_snapshot=second)[0]) is None
    for b in batches(4, next_snapshot=second):
        handler(b)
    read_back = spark.read.parquet(str(sink.root))
    assert read_back.count() == 160
    assert read_back.select("id").distinct().count() == 160
    assert {r.pg_snapshot for r in read_back.select("pg_snapshot").distinct().collect()} == {
        first, second}
    assert {p["epoch"] for p in sink.publications()} == {3, 4}


def test_initial_batch_supersedes_an_earlier_initial_attempt(
    spark: Any, tmp_path: Path
) -> None:
    """A crashed initial scan is planned again at a later snapshot: different key."""
    warehouse = tmp_path / "wh"
    make_pk_table(warehouse, "db.i", buckets=2)
    early = write_rows(warehouse, "db.i", range(50))
    late = write_rows(warehouse, "db.i", range(40, 90), v=1)
    sink = ParquetBatchSink(tmp_path / "out")
    for b in _batches(warehouse, "db.i", 1, include_row_kind=False, full_scan=early, epoch=1):
        sink.write(spark.createDataFrame(b.to_arrow()), b)
    (b2,) = _batches(warehouse, "db.i", 1, include_row_kind=False, full_scan=late, epoch=2)
    assert b2.kind is BatchKind.INITIAL
    publication = sink.write(spark.createDataFrame(b2.to_arrow()), b2)
    assert publication.superseded == (early,)
    rows = sink.read_arrow()
    assert sorted(rows.column("id").to_pylist()) == list(range(90))
    assert set(rows.column("pg_snapshot").to_pylist()) == {late}


def test_batch_key_columns_and_condition(spark: Any, table_with_history: tuple[Path, list[int]]
                                         ) -> None:
    warehouse, snapshots = table_with_history
    (delta, *_rest) = _batches(warehouse, "db.t", 1, include_row_kind=False,
                               next_snapshot=snapshots[1], epoch=9)
    (initial, *_rest) = _batches(warehouse, "db.t", 1, include_row_kind=False,
                                 full_scan=snapshots[1], epoch=9)
    keyed = with_batch_key(spark.range(2), delta, epoch_column=True)
    assert [(f.name, f.dataType.simpleString()) for f in keyed.schema.fields][1:] == [
        ("pg_group", "string"), ("pg_shard", "bigint"), ("pg_snapshot", "bigint"),
        ("pg_epoch", "bigint")]
    rows = spark.createDataFrame(
        [("g", 0, snapshots[1]), ("g", 0, snapshots[0]), ("h", 0, snapshots[1]),
         ("g", 1, snapshots[1])],
        "pg_group string, pg_shard bigint, pg_snapshot bigint",
    )
    assert rows.where(batch_key_condition(delta)).count() == 1
    assert rows.where(batch_key_condition(initial)).count() == 2  # every snapshot of the shard


def test_the_example_pipeline_job_is_exactly_once_under_a_replay(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/examples/spark_pipeline: its Spark job, fed real batches in-process, replayed
    once, passes the example's own final check (``run.py`` runs it with workers)."""
    import importlib.util
    import random

    example = Path(__file__).resolve().parents[1] / "docs" / "examples" / "spark_pipeline"

    def load(name: str) -> Any:
        spec = importlib.util.spec_from_file_location(f"spark_pipeline_{name}",
                                                      example / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    monkeypatch.setenv("PIPELINE_OUT", str(tmp_path / "out"))
    monkeypatch.setenv("PIPELINE_CUSTOMERS", str(tmp_path / "customers.parquet"))
    run = load("run")
    pipeline = load("pipeline")
    rng = random.Random(1)
    run.create_orders_table(tmp_path / "warehouse")
    regions = run.write_customers(tmp_path / "customers.parquet")
    run.write_orders(tmp_path / "warehouse", 0, 120, rng)
    run.write_orders(tmp_path / "warehouse", 120, 80, rng)
    handler = SparkBatchHandler(pipeline.handle, spark)
    for batch in _batches(tmp_path / "warehouse", "shop.orders", 2, include_row_kind=False,
                          full_scan=1, epoch=1):
        handler(batch)
    for epoch in (1, 2):  # the delta of snapshot 2, then its replay by a new owner
        for batch in _batches(tmp_path / "warehouse", "shop.orders", 2,
                              include_row_kind=False, next_snapshot=2, epoch=epoch):
            handler(batch)
    assert any(p["replaced"] for p in pipeline.totals_sink.publications())
    assert run.check(tmp_path, regions)
