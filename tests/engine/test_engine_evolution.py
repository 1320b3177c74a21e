"""Tables altered by Paimon's engine (ADD, RENAME, type promotion, DROP
COLUMN, each followed by a write) read as the engine reads them, by the
Arrow reader without falling back: files of each older schema are mapped to
the table's fields by id (paimon_group/arrowread/evolution.py)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pyarrow as pa
import pytest

from paimon_group.reading.planner import ShardPlanner
from paimon_group.reading.table import ShardedTable
from tests.engine.engine import Engine

pytestmark = pytest.mark.engine


def _rows(table_schema: pa.Schema, keys: range, v: int) -> pa.Table:
    columns = {}
    for field in table_schema:
        if field.name == "k":
            columns["k"] = list(keys)
        elif pa.types.is_string(field.type):
            columns[field.name] = [f"{field.name}{k}-{v}" for k in keys]
        else:
            columns[field.name] = [k * 10 + v for k in keys]
    return pa.table(columns).cast(pa.schema(
        [pa.field(f.name, f.type) for f in table_schema]))


@pytest.mark.parametrize("file_format", ["parquet", "orc", "avro"])
@pytest.mark.parametrize("primary_key", [True, False], ids=["primary-key", "append"])
def test_an_evolved_engine_table_reads_as_the_engine_reads(
    engine: Engine, file_format: str, primary_key: bool
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        warehouse = str(Path(tmp) / "wh")
        schema = pa.schema([pa.field("k", pa.int64(), nullable=False),
                            pa.field("a", pa.string()), pa.field("n", pa.int32())])
        options = {"file.format": file_format,
                   "bucket": "2" if primary_key else "-1"}
        engine.create_table(warehouse, schema, primary_keys=["k"] if primary_key else [],
                            options=options)

        def write(keys: range, v: int) -> None:
            arrow = engine.catalog(warehouse).get_table("db.t")._arrow_schema
            engine.write(warehouse, _rows(arrow, keys, v))

        write(range(0, 20), 1)
        engine.alter(warehouse, ("add", "x", "BIGINT"))
        write(range(10, 30), 2)
        engine.alter(warehouse, ("rename", "a", "b"))
        write(range(20, 40), 3)
        engine.alter(warehouse, ("type", "n", "BIGINT"))
        write(range(30, 50), 4)
        engine.alter(warehouse, ("drop", "b"))
        write(range(0, 5), 5)
        expected = engine.read(warehouse)

        table = ShardedTable.open(warehouse, "db.t")
        latest = table.latest_snapshot_id()
        assert latest is not None and latest >= 5  # an append table may compact as well
        planner = ShardPlanner(table, 1, include_row_kind=False, batch_rows=7)
        splits = planner.plan_full([0], latest).splits[0]
        got = planner.read_arrow(splits)
        streamed = pa.Table.from_batches(list(planner.iter_batches(splits)),
                                         schema=planner.schema)
        assert planner._read_path is not None and planner._read_path.fallback_splits == 0
        keys = ["k", "x"] if not primary_key else ["k"]
        want = sorted(expected.cast(got.schema).to_pylist(),
                      key=lambda r: tuple(str(r[c]) for c in keys))
        for read in (got, streamed):
            rows = sorted(read.to_pylist(), key=lambda r: tuple(str(r[c]) for c in keys))
            assert rows == want
        assert got.column_names == ["k", "n", "x"]
