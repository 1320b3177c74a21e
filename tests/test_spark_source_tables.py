"""A query of the ``paimon-group`` source over several tables: real PySpark, real tables.

``pattern`` (``shop.*``) or ``tables`` (a list) make one DataFrame of every
table the group reads: the union of their columns by name (a column a table
lacks is null in its rows), ``_pg_table`` naming each row's table, and with
``metadata_columns`` the table's own shard (``_pg_shard``) and the group's
(``_pg_group_shard``). Each group shard is planned by its table's planner
and committed as the group's position, so a second run from the same
checkpoint reads only what was written since. The same column name of two
types is refused at ``load()`` in one line; one plain ``table`` is the
single-table source as before.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from tests.support.requirements import require
from tests.support.tables import _create, make_pk_table, open_table, write_rows, write_table
from tests.support.waiting import wait_for

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[1]

if not os.environ.get("CI"):
    require("pyspark", "pip install '.[spark]' (tests/run.sh does)")

from coordinators.errors import ConfigError  # noqa: E402
from paimon_group.spark.source.errors import error_line  # noqa: E402
from paimon_group.spark.source.options import SourceOptions  # noqa: E402

ORDERS = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("amount", pa.int64()),
                    pa.field("note", pa.string())])
ITEMS = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("sku", pa.string()),
                   pa.field("qty", pa.int32())])
EVENTS = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("note", pa.string()),
                    pa.field("kind", pa.string())])


def make_table(warehouse: Path, name: str, schema: pa.Schema, buckets: int) -> None:
    _create(warehouse, name, schema, primary_keys=["id"],
            options={"bucket": str(buckets)})


def write(warehouse: Path, name: str, ids: Iterable[int]) -> None:
    """One snapshot of ``ids`` in ``name``, each column filled from the id."""
    table = open_table(warehouse, name)
    schema = {"shop.orders": ORDERS, "shop.items": ITEMS, "shop.events": EVENTS}[name]
    keys = list(ids)
    values = {"id": keys, "amount": [k * 10 for k in keys], "note": [f"n{k}" for k in keys],
              "sku": [f"s{k}" for k in keys], "qty": [k % 7 for k in keys],
              "kind": [f"k{k % 3}" for k in keys]}
    write_table(table, pa.table({f.name: pa.array(values[f.name], f.type) for f in schema},
                                schema=schema))


def shop(warehouse: Path) -> None:
    """Three tables of different columns in ``shop`` (and one in ``other``)."""
    make_table(warehouse, "shop.orders", ORDERS, 4)
    make_table(warehouse, "shop.items", ITEMS, 2)
    make_table(warehouse, "shop.events", EVENTS, 3)
    make_pk_table(warehouse, "other.t", buckets=2)
    write_rows(warehouse, "other.t", range(5))


def reader(spark: Any, warehouse: Path, **options: str) -> Any:
    out = (spark.readStream.format("paimon-group").option("group", "g")
           .option("warehouse", str(warehouse)).option("start", "earliest")
           .option("session_timeout_s", "4").option("forming_wait_s", "0"))
    for key, value in options.items():
        out = out.option(key, value)
    return out


def run_available_now(df: Any, checkpoint: Path) -> list[dict[str, Any]]:
    """Every row an availableNow query of ``df`` delivers, as dicts."""
    rows: list[dict[str, Any]] = []

    def collect(batch: Any, batch_id: int) -> None:
        rows.extend(r.asDict() for r in batch.collect())

    query = (df.writeStream.foreachBatch(collect).option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(180)
    assert query.exception() is None, query.exception()
    return rows


def by_table(rows: list[dict[str, Any]]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for row in rows:
        out.setdefault(row["_pg_table"], []).append(row["id"])
    return {name: sorted(ids) for name, ids in out.items()}


def test_a_pattern_reads_every_row_of_every_table_once_in_one_dataframe(
    spark: Any, tmp_path: Path
) -> None:
    warehouse, checkpoint = tmp_path / "wh", tmp_path / "ckpt"
    shop(warehouse)
    write(warehouse, "shop.orders", range(0, 40))
    write(warehouse, "shop.items", range(100, 120))
    write(warehouse, "shop.events", range(200, 230))
    write(warehouse, "shop.orders", range(40, 50))
    df = reader(spark, warehouse, pattern="shop.*", metadata_columns="true").load()
    # The union by name, the tables sorted (events, items, orders), then the added columns.
    assert df.columns == ["id", "note", "kind", "sku", "qty", "amount", "_pg_table",
                          "_pg_shard", "_pg_snapshot", "_pg_epoch", "_pg_group_shard"]
    rows = run_available_now(df, checkpoint)
    assert by_table(rows) == {"shop.orders": list(range(50)),
                              "shop.items": list(range(100, 120)),
                              "shop.events": list(range(200, 230))}
    firsts = {"shop.events": 0, "shop.items": 3, "shop.orders": 5}
    shards = {"shop.events": 3, "shop.items": 2, "shop.orders": 4}
    for row in rows:
        name, k = row["_pg_table"], row["id"]
        assert 0 <= row["_pg_shard"] < shards[name]
        assert row["_pg_group_shard"] == firsts[name] + row["_pg_shard"]
        expected = {"id": k, "note": f"n{k}" if name != "shop.items" else None,
                    "kind": f"k{k % 3}" if name == "shop.events" else None,
                    "sku": f"s{k}" if name == "shop.items" else None,
                    "qty": k % 7 if name == "shop.items" else None,
                    "amount": k * 10 if name == "shop.orders" else None}
        assert {c: row[c] for c in expected} == expected, row
    # The group's positions are per group shard: a second run from the same
    # checkpoint reads only what was written since, in each table.
    write(warehouse, "shop.items", range(120, 125))
    write(warehouse, "shop.events", range(230, 232))
    again = run_available_now(
        reader(spark, warehouse, pattern="shop.*", metadata_columns="true").load(), checkpoint)
    assert by_table(again) == {"shop.items": list(range(120, 125)),
                               "shop.events": [230, 231]}


def test_a_list_of_tables_reads_those_tables(spark: Any, tmp_path: Path) -> None:
    warehouse, checkpoint = tmp_path / "wh", tmp_path / "ckpt"
    shop(warehouse)
    write(warehouse, "shop.orders", range(10))
    write(warehouse, "shop.items", range(100, 105))
    write(warehouse, "shop.events", range(200, 203))
    df = reader(spark, warehouse, tables="shop.items, other.t").load()
    assert df.columns == ["id", "v", "payload", "sku", "qty", "_pg_table"]
    rows = run_available_now(df, checkpoint)
    assert by_table(rows) == {"shop.items": list(range(100, 105)), "other.t": list(range(5))}
    assert {(r["_pg_table"], r["sku"] is None, r["payload"] is None) for r in rows} == {
        ("shop.items", False, True), ("other.t", True, False)}


def test_a_column_of_two_types_is_refused_in_one_line_naming_both(
    spark: Any, tmp_path: Path
) -> None:
    warehouse = tmp_path / "wh"
    make_table(warehouse, "shop.a", pa.schema([pa.field("id", pa.int64(), nullable=False),
                                               pa.field("v", pa.int64())]), 2)
    make_table(warehouse, "shop.b", pa.schema([pa.field("id", pa.int64(), nullable=False),
                                               pa.field("v", pa.string())]), 2)
    with pytest.raises(Exception) as caught:
        reader(spark, warehouse, pattern="shop.*").load()
    assert error_line(caught.value) == (
        "column 'v' is BIGINT in table shop.a and STRING in table shop.b: a query over "
        "several tables has one column per name, of one type; read them in separate "
        "queries, or choose tables whose columns agree (docs/spark.md, a query over "
        "several tables)")
    assert not (warehouse / ".paimon-group").exists()


def test_one_plain_table_is_the_single_table_source(spark: Any, tmp_path: Path) -> None:
    warehouse = tmp_path / "wh"
    shop(warehouse)
    for options in ({"table": "shop.orders"}, {"tables": "shop.orders"}):
        df = reader(spark, warehouse, metadata_columns="true", **options).load()
        assert df.columns == ["id", "amount", "note", "_pg_shard", "_pg_snapshot", "_pg_epoch"]
    with pytest.raises(Exception) as caught:
        reader(spark, warehouse, pattern="nothing.*").load()
    assert "no table of warehouse" in str(error_line(caught.value))


@pytest.mark.parametrize(("options", "line"), [
    ({}, 'the paimon-group source needs option "table" (DATABASE.TABLE), "tables" '
         '(comma-separated names and patterns) or "pattern" (e.g. shop.*)'),
    ({"table": "db.t", "pattern": "db.*"},
     "options 'table' and 'pattern' of the paimon-group source: give one of \"table\", "
     '"tables" and "pattern"'),
    ({"tables": "db.a,orders"},
     "option tables: bad value 'orders': expected DATABASE.TABLE, e.g. shop.orders"),
    ({"pattern": "db.t"}, "option pattern='db.t' has no *, ? or [: give one table as option "
                          '"table", or a pattern such as shop.*'),
    ({"table": "db.*"}, "option table='db.*' is a pattern: give it as option \"pattern\" "
                        "(one table: DATABASE.TABLE)"),
], ids=["none", "two", "bad-name", "plain-pattern", "pattern-as-table"])
def test_the_tables_options_are_checked_in_one_line(options: dict[str, str], line: str) -> None:
    with pytest.raises(ConfigError) as caught:
        SourceOptions.parse({"group": "g", "warehouse": "/tmp/wh", **options})
    assert str(caught.value) == line


def test_the_tables_options_make_the_members_subscription() -> None:
    parsed = SourceOptions.parse({"group": "g", "warehouse": "/tmp/wh",
                                  "tables": "shop.a, shop.b,eu_*.events",
                                  "tables_refresh_s": "2"})
    config = parsed.member_config()
    assert (parsed.table, parsed.tables, parsed.single_table) == (
        "", ("shop.a", "shop.b", "eu_*.events"), False)
    assert config.subscription.plain_names == ("shop.a", "shop.b")
    assert config.subscription.patterns == ("eu_*.events",)
    assert not config.single_table and config.tables_refresh_s == 2.0
    one = SourceOptions.parse({"group": "g", "warehouse": "/tmp/wh", "tables": "shop.a"})
    assert (one.table, one.tables) == ("shop.a", ()) and one.member_config().single_table


def test_a_table_created_while_the_query_runs_joins_it_or_stops_it(
    spark: Any, tmp_path: Path
) -> None:
    """A table the pattern matches, created while the query runs, joins the
    group at the leader's next listing and its rows come in the query's
    columns (its own others not delivered, the query's it lacks null); one
    with a column of the query's names of another type stops the query
    with one line."""
    warehouse, checkpoint = tmp_path / "wh", tmp_path / "ckpt"
    make_table(warehouse, "shop.orders", ORDERS, 2)
    write(warehouse, "shop.orders", range(10))
    rows: list[dict[str, Any]] = []

    def collect(batch: Any, batch_id: int) -> None:
        rows.extend(r.asDict() for r in batch.collect())

    df = reader(spark, warehouse, pattern="shop.*", tables_refresh_s="0.5").load()
    query = (df.writeStream.foreachBatch(collect).option("checkpointLocation", str(checkpoint))
             .trigger(processingTime="300 milliseconds").start())
    try:
        wait_for("the first table's rows", lambda: len(rows) >= 10, query=query)
        make_table(warehouse, "shop.items", ITEMS, 2)
        write(warehouse, "shop.items", range(100, 104))
        wait_for("the new table's rows", lambda: len(rows) >= 14, query=query)
        # A table whose column of a query's name has another type stops it.
        bad = pa.schema([pa.field("id", pa.int64(), nullable=False),
                         pa.field("amount", pa.string())])
        make_table(warehouse, "shop.bad", bad, 2)
        write_table(open_table(warehouse, "shop.bad"),
                    pa.table({"id": [1], "amount": ["x"]}, schema=bad))
        wait_for("the query to stop", lambda: query.exception() is not None)
        line = error_line(query.exception())
    finally:
        query.stop()
    assert line == (
        "table shop.bad joined the query's tables, but column 'amount' is STRING there, "
        "BIGINT in the query: a query over several tables has one type per column name, "
        "fixed when it starts, so it stops; read that table in a query of its own, or narrow "
        "the query's tables (docs/spark.md, a query over several tables)")
    assert by_table(rows) == {"shop.orders": list(range(10)), "shop.items": list(range(100, 104))}
    assert df.columns == ["id", "amount", "note", "_pg_table"]
    assert {(r["amount"], r["note"]) for r in rows if r["_pg_table"] == "shop.items"} == {
        (None, None)}


def shop_example(warehouse: Path, out: Path, checkpoint: Path) -> str:
    """docs/spark.md's ``# shop_query.py`` block, its paths replaced by the test's."""
    text = (REPO / "docs" / "spark.md").read_text()
    blocks = re.findall(r"```python\n(# shop_query\.py.*?)```", text, flags=re.S)
    assert len(blocks) == 1, "docs/spark.md: one # shop_query.py block"
    return (blocks[0].replace('"/data/wh"', repr(str(warehouse)))
            .replace('"/data/out/shop"', repr(str(out)))
            .replace('"/ckpt/shop-q1"', repr(str(checkpoint))))


def test_the_docs_example_over_several_tables_runs_as_written(
    spark: Any, tmp_path: Path
) -> None:
    warehouse, out = tmp_path / "wh", tmp_path / "out"
    shop(warehouse)
    write(warehouse, "shop.orders", range(20))
    write(warehouse, "shop.items", range(100, 110))
    write(warehouse, "shop.events", range(200, 205))
    exec(shop_example(warehouse, out, tmp_path / "ckpt"), {})
    rows = [r.asDict() for r in spark.read.parquet(str(out)).collect()]
    assert by_table(rows) == {"shop.orders": list(range(20)),
                              "shop.items": list(range(100, 110)),
                              "shop.events": list(range(200, 205))}


def test_the_paimon_batch_sink_refuses_a_query_over_several_tables(tmp_path: Path) -> None:
    from paimon_group.spark.source import PaimonBatchSink
    from tests.support.tables import make_append_table

    warehouse = tmp_path / "wh"
    make_append_table(warehouse, "db.copy", buckets=2)
    sink = PaimonBatchSink(str(warehouse), "db.copy", str(tmp_path / "ckpt"))
    offset = {"v": 1, "shards": {"0": {"epoch": 1, "next": 1, "full": None, "to": 2}},
              "source": {"group": "g", "tables": True}}
    with pytest.raises(ConfigError, match="PaimonBatchSink writes a query of one table, and "
                                          "this one reads several"):
        sink.write(pa.table({"id": pa.array([1], pa.int64())}), offset, 0)
