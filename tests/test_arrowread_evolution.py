"""The Arrow reader reads files written with older schemas (issue 22, item 5).

Files keep the schema they were written with; a table altered since holds
files of several schemas. Paimon maps a file's columns to the table's by
field id: a column added later is null in older files, a renamed one is read
under its old name, a dropped one is not read, and a promoted type is cast.
Such splits used to go to pypaimon's row reader (30-40x slower); now the
Arrow reader reads them, and every path (full scans of each snapshot, the
steps after) gives exactly what pypaimon's reader gives, with no split
falling back.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from paimon_group.reading.planner import ShardPlanner
from paimon_group.reading.table import ShardedTable
from tests.support.tables import catalog, make_append_table, make_pk_table, open_table, write_table
from tests.test_arrowread import compare_every_path


def _rows(table: Any, ids: range, v: int) -> pa.Table:
    """Rows for every field of the table's current schema."""
    from pypaimon.schema.data_types import PyarrowFieldParser

    schema = PyarrowFieldParser.from_paimon_schema(table.fields)
    columns: dict[str, list[Any]] = {}
    for field in schema:
        if field.name == "id":
            columns["id"] = list(ids)
        elif field.name == "v":
            columns["v"] = [v] * len(ids)
        elif pa.types.is_string(field.type):
            columns[field.name] = [f"{field.name}-{i}-{v}" for i in ids]
        else:
            columns[field.name] = [i * 10 + v for i in ids]
    return pa.table(columns, schema=schema)


def _evolve(warehouse: str) -> None:
    """Five schemas: add an INT, rename a column, promote the INT to BIGINT,
    drop a column, each followed by a write under the new schema."""
    from pypaimon.schema.data_types import AtomicType
    from pypaimon.schema.schema_change import SchemaChange

    def write(ids: range, v: int) -> None:
        table = open_table(warehouse, "db.t")
        write_table(table, _rows(table, ids, v))

    def alter(change: Any) -> None:
        catalog(warehouse).alter_table("db.t", [change])

    write(range(0, 20), 1)
    alter(SchemaChange.add_column("extra", AtomicType("INT")))
    write(range(10, 30), 2)
    alter(SchemaChange.rename_column("payload", "body"))
    write(range(20, 40), 3)
    alter(SchemaChange.update_column_type("extra", AtomicType("BIGINT")))
    write(range(30, 50), 4)
    alter(SchemaChange.drop_column("body"))
    write(range(0, 5), 5)


@pytest.mark.parametrize("kind", ["primary-key", "append"])
def test_files_of_older_schemas_read_as_pypaimon_reads_them(kind: str, tmp_path: Path) -> None:
    warehouse = str(tmp_path / "wh")
    if kind == "primary-key":
        make_pk_table(warehouse, "db.t", buckets=2)
    else:
        make_append_table(warehouse, "db.t", buckets=-1)
    _evolve(warehouse)
    table = ShardedTable.open(warehouse, "db.t")
    latest = table.latest_snapshot_id()
    assert latest == 5
    planner = ShardPlanner(table, 2, include_row_kind=True, batch_rows=7)
    steps, compared = compare_every_path(planner, latest, kind)
    assert compared > 100
    assert planner.view.read_path is not None
    assert planner.view.read_path.fallback_splits == 0
    # The newest full scan holds the renamed-then-dropped column nowhere, and
    # the added column as null in the rows of the first schema only.
    newest = planner.read_arrow([s for sp in steps[latest - 1].splits.values() for s in sp])
    assert "body" not in newest.column_names and "payload" not in newest.column_names
    by_id = dict(zip(newest.column("id").to_pylist(), newest.column("extra").to_pylist(),
                     strict=True))
    if kind == "primary-key":
        assert by_id[0] == 5 and by_id[5] is None and by_id[45] == 454
        assert newest.schema.field("extra").type == pa.int64()
