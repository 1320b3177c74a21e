"""A column of a running ``paimon-group`` query renamed, dropped or changed in type.

Real local-mode queries: the table is altered while the query runs and rows
are written under the new schema. The query stops with one line naming the
change (before: Spark's ``DATA_SOURCE_RETURN_SCHEMA_MISMATCH``, "Expected: 6
columns, Found: 5", or a type mismatch), and restarted from its checkpoint it
reads the new rows under the table's new schema. (A column added is followed
without a stop: tests/test_spark_source.py and docs/spark.md.)
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from tests.support.requirements import require
from tests.support.tables import catalog, make_pk_table, open_table, write_rows, write_table

pytestmark = pytest.mark.spark

if not os.environ.get("CI"):
    require("pyspark", "pip install '.[spark]' (tests/run.sh does)")

from paimon_group.spark.source.errors import error_line  # noqa: E402
from tests.support.waiting import wait_for  # noqa: E402


def change(kind: str) -> Any:
    from pypaimon.schema.data_types import AtomicType
    from pypaimon.schema.schema_change import SchemaChange

    return {"rename": SchemaChange.rename_column("payload", "note"),
            "drop": SchemaChange.drop_column("payload"),
            "type": SchemaChange.update_column_type("v", AtomicType("STRING"))}[kind]


def write_new_schema_rows(warehouse: Path, ids: range) -> None:
    """Rows under the table's current schema, whatever its columns are now."""
    from pypaimon.schema.data_types import PyarrowFieldParser

    table = open_table(warehouse, "db.t")
    schema = PyarrowFieldParser.from_paimon_schema(table.fields)
    columns = {f.name: pa.array([i if f.name == "id" else f"{f.name}{i}" for i in ids]
                                if f.name == "id" or pa.types.is_string(f.type)
                                else [7] * len(ids), f.type)
               for f in schema}
    write_table(table, pa.table(columns, schema=schema))


class Rows:
    """A foreachBatch function keeping every row as a dict, by id."""

    def __init__(self) -> None:
        self.rows: dict[int, dict[str, Any]] = {}
        self.lock = threading.Lock()

    def __call__(self, df: Any, batch_id: int) -> None:
        got = [r.asDict() for r in df.collect()]
        with self.lock:
            self.rows.update((r["id"], r) for r in got)

    def count(self) -> int:
        with self.lock:
            return len(self.rows)


def start(spark: Any, warehouse: Path, rows: Rows, checkpoint: Path) -> Any:
    return (spark.readStream.format("paimon-group").option("group", "g")
            .option("warehouse", str(warehouse)).option("table", "db.t")
            .option("member_id", "q1").option("session_timeout_s", "4")
            .option("metadata_columns", "true").load()
            .writeStream.foreachBatch(rows).option("checkpointLocation", str(checkpoint))
            .trigger(processingTime="300 milliseconds").start())


@pytest.mark.parametrize(("kind", "said", "columns", "after"), [
    ("rename", "column 'payload' renamed to 'note'", ["id", "v", "note"], {"note": "note12"}),
    ("drop", "column 'payload' dropped", ["id", "v"], {"v": 7}),
    ("type", "column 'v' changed type from BIGINT to STRING", ["id", "v", "payload"],
     {"v": "v12"}),
], ids=["rename", "drop", "type"])
def test_a_column_changed_while_the_query_runs_stops_it_with_one_line_and_a_restart_reads_on(
    spark: Any, tmp_path: Path, kind: str, said: str, columns: list[str], after: dict[str, Any]
) -> None:
    warehouse, checkpoint = tmp_path / "wh", tmp_path / "ckpt"
    make_pk_table(warehouse, "db.t", buckets=2)
    write_rows(warehouse, "db.t", range(10))
    rows = Rows()
    query = start(spark, warehouse, rows, checkpoint)
    try:
        wait_for("the first rows", lambda: rows.count() == 10, query=query)
        catalog(str(warehouse)).alter_table("db.t", [change(kind)])
        write_new_schema_rows(warehouse, range(10, 20))
        wait_for("the query to stop", lambda: query.exception() is not None, timeout=120)
    finally:
        query.stop()
    line = error_line(query.exception())
    assert line is not None, f"no line of ours in: {query.exception()}"
    assert line.startswith(f"table db.t: {said} (schema 0 -> 1) while the query ran"), line
    assert "restart it from its checkpoint" in line
    assert rows.count() == 10
    query = start(spark, warehouse, rows, checkpoint)
    try:
        wait_for("the rows of the new schema", lambda: rows.count() == 20, query=query)
    finally:
        query.stop()
    row = rows.rows[12]
    assert list(row) == [*columns, "_pg_shard", "_pg_snapshot", "_pg_epoch"]
    assert {k: row[k] for k in after} == after


def test_what_counts_as_a_change_of_the_querys_columns() -> None:
    """By field id and by Spark type: a rename, a drop and a type Spark tells
    apart are changes; a column added, a nullability change and a type that is
    the same to Spark (VARCHAR(10) to VARCHAR(20), TIMESTAMP(3) to (6)) are not."""
    from types import SimpleNamespace

    from pypaimon.schema.data_types import AtomicType, DataField

    from paimon_group.spark.source.schema import query_schema, schema_changes

    def schema(schema_id: int, *fields: tuple[int, str, str]) -> Any:
        return SimpleNamespace(id=schema_id, fields=[
            DataField(i, n, AtomicType(t.removesuffix(" NOT NULL"),
                                       nullable=not t.endswith(" NOT NULL")))
            for i, n, t in fields])

    defined = query_schema(schema(0, (0, "id", "BIGINT NOT NULL"), (1, "v", "BIGINT"),
                                  (2, "s", "VARCHAR(10)"), (3, "t", "TIMESTAMP(3)"),
                                  (4, "p", "STRING"), (5, "q", "INT")))
    same = schema(3, (0, "id", "BIGINT"), (1, "v", "BIGINT"), (2, "s", "VARCHAR(20)"),
                  (3, "t", "TIMESTAMP(6)"), (4, "p", "STRING"), (5, "q", "INT"),
                  (6, "added", "INT"))
    assert schema_changes(defined, same) == []
    changed = schema(4, (0, "id", "BIGINT"), (1, "v", "STRING"), (2, "s", "STRING"),
                     (3, "t", "TIMESTAMP(6)"), (4, "note", "STRING"), (7, "q", "INT"))
    assert schema_changes(defined, changed) == [
        "column 'v' changed type from BIGINT to STRING", "column 'p' renamed to 'note'",
        "column 'q' dropped"]  # a column of the same name added since is another column
    assert defined.only(["q", "id"]).columns == (defined.columns[5], defined.columns[0])
