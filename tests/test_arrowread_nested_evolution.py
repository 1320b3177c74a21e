"""Nested fields of files written with older schemas (issue 22, item 2),
read by the Arrow reader by field id, against pypaimon's reader.

A ROW column, a ROW inside an ARRAY and a ROW as a MAP's value, altered
field by field (ADD, RENAME, DROP, type promotion of a nested field), with
writes between each, on a primary-key and an append table in Parquet, ORC
and Avro (without the MAP, and no null ARRAY element: pypaimon's Avro
writer cannot write a MAP of ROWs nor a null element): every full scan
and every step equals pypaimon's read (which maps nested fields by id as
the engine does), with no split falling back.

Paimon's engine bundled for tests/engine cannot take part: its bridge
cannot describe a ROW column at all (its Arrow schema conversion misses a
class), and that engine version alters only top-level columns.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from paimon_group.reading.planner import ShardPlanner
from paimon_group.reading.table import ShardedTable
from tests.support.tables import _create, catalog, open_table, write_table
from tests.test_arrowread import compare_every_path

INNER = pa.struct([pa.field("p", pa.int32()), pa.field("q", pa.string())])
SCHEMA = pa.schema([
    pa.field("id", pa.int64(), nullable=False),
    pa.field("r", INNER),
    pa.field("l", pa.list_(INNER)),
    pa.field("m", pa.map_(pa.string(), INNER)),
])


def _value(struct: pa.StructType, i: int, v: int, *, null: bool = True
           ) -> dict[str, Any] | None:
    if null and (i + v) % 7 == 0:
        return None
    out: dict[str, Any] = {}
    for field in struct:
        if pa.types.is_string(field.type):
            out[field.name] = None if (i + v) % 5 == 0 else f"{field.name}-{i}-{v}"
        else:
            out[field.name] = i * 10 + v
    return out


def _rows(table: Any, ids: range, v: int) -> pa.Table:
    from pypaimon.schema.data_types import PyarrowFieldParser

    schema = PyarrowFieldParser.from_paimon_schema(table.fields)
    row = schema.field("r").type
    columns = {
        "id": list(ids),
        "r": [_value(row, i, v) for i in ids],
        "l": [None if i % 6 == 0 else [_value(row, i, v, null=False),
                                         _value(row, i + 1, v, null=False)][: i % 3]
              for i in ids],
        "m": [None if i % 8 == 0 else [("a", _value(row, i, v)), ("b", _value(row, i + 2, v))]
              for i in ids],
    }
    return pa.table({f.name: columns[f.name] for f in schema}, schema=schema)


def _changes(columns: list[str]) -> list[Any]:
    from pypaimon.schema.data_types import AtomicType
    from pypaimon.schema.schema_change import SchemaChange

    changes: list[Any] = []
    for column in columns:
        path = column.split(".")
        changes += [
            SchemaChange.add_column([*path, "z"], AtomicType("BIGINT")),
            SchemaChange.rename_column([*path, "q"], "qq"),
            SchemaChange.update_column_type([*path, "p"], AtomicType("BIGINT")),
            SchemaChange.drop_column([*path, "z"]),
        ]
    return changes


@pytest.mark.parametrize("file_format", ["parquet", "orc", "avro"])
@pytest.mark.parametrize("primary_key", [True, False], ids=["primary-key", "append"])
def test_nested_fields_of_older_files_read_as_pypaimon_reads_them(
    tmp_path: Path, file_format: str, primary_key: bool
) -> None:
    warehouse = str(tmp_path / "wh")
    schema = SCHEMA if file_format != "avro" else SCHEMA.remove(SCHEMA.get_field_index("m"))
    nested = ["r", "l.element", "m.value"] if "m" in schema.names else ["r", "l.element"]
    _create(warehouse, "db.t", schema, primary_keys=["id"] if primary_key else [],
            options={"bucket": "2" if primary_key else "-1", "file.format": file_format,
                     **({"bucket-key": "id"} if not primary_key else {})})
    write_table(open_table(warehouse, "db.t"), _rows(open_table(warehouse, "db.t"), range(20), 0))
    for v, change in enumerate(_changes(nested), start=1):
        catalog(warehouse).alter_table("db.t", [change])
        table = open_table(warehouse, "db.t")
        write_table(table, _rows(table, range(v * 3, v * 3 + 12), v))
    table = ShardedTable.open(warehouse, "db.t")
    latest = table.latest_snapshot_id()
    assert latest == 1 + 4 * len(nested)
    planner = ShardPlanner(table, 2, include_row_kind=True, batch_rows=5)
    _, compared = compare_every_path(planner, latest, file_format)
    assert compared > 300
    assert planner.view.read_path is not None and planner.view.read_path.fallback_splits == 0
