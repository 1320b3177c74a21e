"""Files written before a nested field became NOT NULL (issue 37, D6),
read by the Arrow reader as pypaimon reads them.

pypaimon's own scenario (``test_null_to_not_null_disabled_by_default``):
the ALTER is refused unless the table sets
``alter-column-null-to-not-null.disabled = false``; once it is, files
written while the field was nullable keep their nulls, and are read with
them under the latest schema, as Paimon's later engines read them
(docs/design.md; the engine of tests/engine reads them only through their
own schema: ``tests/engine/test_engine_nested_nullability.py``). One test
per nested shape: a ROW's field and a ROW in a ROW, a ROW in an ARRAY, a
MAP's value; each field made NOT NULL by its own ALTER with a write after
each, then a field added beside them (the ROW then converted by field id),
on a primary-key and an append table in Parquet, ORC and Avro (no MAP and
no null ARRAY element in Avro: pypaimon's Avro writer writes neither).
Every full scan and every step equals pypaimon's read, Arrow schema
included (fields marked not null that hold the old files' nulls), with no
split falling back. These reads raised ``ArrowTypeError: cannot cast
nullable field to non-nullable field`` before (arrowread/nullability.py).
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
OPT_IN = "alter-column-null-to-not-null.disabled"


def _value(data_type: pa.DataType, path: str, not_null: set[str], i: int, salt: int,
           *, nullable: bool = True, avro: bool = False) -> Any:
    """A value for ``path``: null now and then unless ``path`` is NOT NULL."""
    if nullable and path not in not_null and (i + salt) % 3 == 0:
        return None
    if pa.types.is_struct(data_type):
        return {f.name: _value(f.type, f"{path}.{f.name}", not_null, i, salt + k * k + 1,
                               avro=avro)
                for k, f in enumerate(data_type)}
    if pa.types.is_map(data_type):
        return [(f"k{j}", _value(data_type.item_type, f"{path}.value", not_null, i + j, salt + 5))
                for j in range(i % 3)]
    if pa.types.is_list(data_type):
        return [_value(data_type.value_type, f"{path}.element", not_null, i + j, salt + 7,
                       nullable=not avro) for j in range(i % 3)]
    if pa.types.is_string(data_type):
        return f"{path}-{i}-{salt}"
    return i * 10 + salt


def _rows(table: Any, ids: range, v: int, not_null: set[str], avro: bool) -> pa.Table:
    from pypaimon.schema.data_types import PyarrowFieldParser

    schema = PyarrowFieldParser.from_paimon_schema(table.fields)
    columns = {f.name: list(ids) if f.name == "id" else
               [_value(f.type, f.name, not_null, i, v, avro=avro) for i in ids] for f in schema}
    return pa.table(columns, schema=schema)


def _evolve_and_compare(tmp_path: Path, column: pa.Field, paths: list[str], file_format: str,
                        primary_key: bool) -> tuple[str, ShardPlanner, list[Any]]:
    """Write twice, make each of ``paths`` NOT NULL (a write after each),
    compare every path of the reader with pypaimon's; add a field ``z``
    inside the ROW holding the last path (the ROW is then converted by field
    id), write, compare again; the warehouse, the last planner and its
    steps. ORC: no write after the first ALTER (pypaimon's reader cannot
    read an ORC file of a table with a NOT NULL field in a ROW:
    ``test_an_orc_file_with_a_not_null_row_field_reads``)."""
    from pypaimon.schema.data_types import AtomicType
    from pypaimon.schema.schema_change import SchemaChange

    warehouse = str(tmp_path / "wh")
    avro, writes_after = file_format == "avro", file_format != "orc"
    _create(warehouse, "db.t", pa.schema([pa.field("id", pa.int64(), nullable=False), column]),
            primary_keys=["id"] if primary_key else [],
            options={"bucket": "2" if primary_key else "-1", "file.format": file_format,
                     **({"bucket-key": "id"} if not primary_key else {})})
    not_null: set[str] = set()

    def write(ids: range, v: int) -> None:
        table = open_table(warehouse, "db.t")
        write_table(table, _rows(table, ids, v, not_null, avro))

    write(range(0, 24), 0)
    write(range(12, 30), 9)
    with pytest.raises(Exception, match="nullable to non nullable"):  # disabled by default
        catalog(warehouse).alter_table(
            "db.t", [SchemaChange.update_column_nullability(paths[0].split("."), False)])
    catalog(warehouse).alter_table("db.t", [SchemaChange.set_option(OPT_IN, "false")])
    for v, path in enumerate(paths, start=1):
        catalog(warehouse).alter_table(
            "db.t", [SchemaChange.update_column_nullability(path.split("."), False)])
        not_null.add(path)
        if writes_after:
            write(range(v * 4, v * 4 + 12), v)
    _compare(warehouse, column.name, paths, file_format)
    row_path = paths[-1].split(".")[:-1]
    catalog(warehouse).alter_table(
        "db.t", [SchemaChange.add_column([*row_path, "z"], AtomicType("BIGINT"))])
    if writes_after:
        write(range(30, 36), len(paths) + 1)
    planner, steps = _compare(warehouse, column.name, paths, file_format)
    assert max(s.snapshot_id for s in steps) == (len(paths) + 3 if writes_after else 2)
    return warehouse, planner, steps


def _compare(warehouse: str, column: str, paths: list[str], what: str
             ) -> tuple[ShardPlanner, list[Any]]:
    """Every path of the reader compared with pypaimon's; the newest full
    scan holds the first files' nulls in every field of ``paths``."""
    table = ShardedTable.open(warehouse, "db.t")
    latest = table.latest_snapshot_id()
    assert latest is not None
    planner = ShardPlanner(table, 2, include_row_kind=True, batch_rows=5)
    steps, compared = compare_every_path(planner, latest, what)
    assert compared > 50
    assert planner.view.read_path is not None and planner.view.read_path.fallback_splits == 0
    assert _nulls_under(_newest(planner, steps).column(column).to_pylist(), paths, column)
    return planner, steps


def _newest(planner: ShardPlanner, steps: list[Any]) -> pa.Table:
    latest = max(s.snapshot_id for s in steps)
    newest = next(s for s in steps if s.snapshot_id == latest and s.kind.value == "initial")
    return planner.read_arrow([s for sp in newest.splits.values() for s in sp])


def _nulls_under(values: list[Any], paths: list[str], name: str) -> set[str]:
    """Which of ``paths`` hold a null in ``values`` (under a non-null parent)."""
    found: set[str] = set()

    def walk(value: Any, path: str) -> None:
        if value is None:
            if path in paths:
                found.add(path)
            return
        if isinstance(value, dict):
            for key, item in value.items():
                walk(item, f"{path}.{key}")
        elif isinstance(value, list):
            for item in value:
                if isinstance(item, tuple):  # a MAP entry
                    walk(item[1], f"{path}.value")
                else:
                    walk(item, f"{path}.element")

    for value in values:
        if value is not None:
            walk(value, name)
    assert found == set(paths), f"nulls under {sorted(found)}, not under all of {paths}"
    return found


FORMATS = ["parquet", "orc", "avro"]
KINDS = pytest.mark.parametrize("primary_key", [True, False], ids=["primary-key", "append"])


@pytest.mark.parametrize("file_format", FORMATS)
@KINDS
def test_row_fields_made_not_null_read_as_pypaimon_reads_them(
    tmp_path: Path, file_format: str, primary_key: bool
) -> None:
    """ROW in ROW: ``o.i.q`` (a field of the ROW in the ROW), ``o.i`` (that
    ROW) and ``o.q`` (a field of the top-level ROW, the upstream scenario's
    ``mv.latest_value``); ``z`` then goes into ``o``, so ``o`` is converted
    by field id and ``i`` inside it only made NOT NULL."""
    outer = pa.struct([pa.field("a", pa.int32()), pa.field("q", pa.string()),
                       pa.field("i", INNER)])
    _evolve_and_compare(tmp_path, pa.field("o", outer), ["o.i.q", "o.i", "o.q"], file_format,
                        primary_key)


@pytest.mark.parametrize("file_format", FORMATS)
@KINDS
def test_array_row_fields_made_not_null_read_as_pypaimon_reads_them(
    tmp_path: Path, file_format: str, primary_key: bool
) -> None:
    """ROW in ARRAY: ``l.element.q`` (the ROW's field), then ``l.element``
    (the element; pypaimon's reader cannot read the old files then: it
    casts with pyarrow, which refuses the nulls of ``q`` in a not null
    element, so our read is compared with its read before this ALTER)."""
    from pypaimon.schema.schema_change import SchemaChange

    warehouse, planner, steps = _evolve_and_compare(
        tmp_path, pa.field("l", pa.list_(INNER)), ["l.element.q"], file_format, primary_key)
    before = _newest(planner, steps)
    catalog(warehouse).alter_table(
        "db.t", [SchemaChange.update_column_nullability(["l", "element"], False)])
    planner = ShardPlanner(ShardedTable.open(warehouse, "db.t"), 2, include_row_kind=True,
                           batch_rows=5)
    after = _newest(planner, [planner.plan_full([0, 1], max(s.snapshot_id for s in steps))])
    assert after.schema.field("l").type.value_field.nullable is False
    assert after.to_pylist() == before.to_pylist()
    assert planner.view.read_path is not None and planner.view.read_path.fallback_splits == 0


@pytest.mark.parametrize("file_format", ["parquet", "orc"])
@KINDS
def test_map_values_made_not_null_read_as_pypaimon_reads_them(
    tmp_path: Path, file_format: str, primary_key: bool
) -> None:
    """MAP value: ``m.value`` (the value) and ``m.value.q`` (its field)."""
    _evolve_and_compare(tmp_path, pa.field("m", pa.map_(pa.string(), INNER)),
                        ["m.value", "m.value.q"], file_format, primary_key)


@pytest.mark.parametrize("primary_key", [True, False], ids=["primary-key", "append"])
def test_an_orc_file_with_a_not_null_row_field_reads(tmp_path: Path, primary_key: bool) -> None:
    """A table whose ROW field is NOT NULL from the start, in ORC: ORC
    never marks a field not null, and the file's ROWs did not read at all
    (the same ``ArrowTypeError``). pypaimon's reader still cannot read it,
    so the rows are compared with those written, in the table's types."""
    row = pa.struct([pa.field("p", pa.int32()), pa.field("q", pa.string(), nullable=False)])
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("r", row),
                        pa.field("l", pa.list_(row)), pa.field("m", pa.map_(pa.string(), row))])
    warehouse = str(tmp_path / "wh")
    _create(warehouse, "db.t", schema, primary_keys=["id"] if primary_key else [],
            options={"bucket": "1", "file.format": "orc",
                     **({"bucket-key": "id"} if not primary_key else {})})
    rows = [{"id": i, "r": None if i % 3 == 0 else {"p": i, "q": f"q{i}"},
             "l": None if i % 4 == 0 else [{"p": i, "q": "x"}, None][: i % 3],
             "m": None if i % 5 == 0 else [("a", {"p": i, "q": "y"}), ("b", None)][: i % 3]}
            for i in range(12)]
    write_table(open_table(warehouse, "db.t"), pa.Table.from_pylist(rows, schema=schema))
    table = ShardedTable.open(warehouse, "db.t")
    planner = ShardPlanner(table, 1, include_row_kind=False, batch_rows=5)
    latest = table.latest_snapshot_id()
    assert latest is not None
    splits = planner.plan_full([0], latest).splits[0]
    streamed = pa.Table.from_batches(list(planner.iter_batches(splits)), schema=planner.schema)
    for read in (planner.read_arrow(splits), streamed):
        assert read.schema.field("r").type == row
        assert sorted(read.to_pylist(), key=lambda r: r["id"]) == rows
    assert planner.view.read_path is not None and planner.view.read_path.fallback_splits == 0


def test_cast_column_keeps_nulls_of_not_null_fields_in_slices_and_chunks() -> None:
    """The cast alone: a struct, a list and a map of ROWs, a ROW in a ROW,
    sliced and chunked, with a leaf type changed on the way (int32 -> int64)."""
    from paimon_group.arrowread.nullability import cast_column, relaxed

    loose = pa.struct([pa.field("p", pa.int32()), pa.field("q", pa.string())])
    strict = pa.struct([pa.field("p", pa.int64()), pa.field("q", pa.string(), nullable=False)])
    cases = [
        (pa.array([{"p": 1, "q": None}, None, {"p": 2, "q": "x"}, {"p": 3, "q": None}], loose),
         strict),
        (pa.array([[{"p": 1, "q": None}], None, [], [None, {"p": 5, "q": "y"}]], pa.list_(loose)),
         pa.list_(pa.field("item", strict, nullable=False))),
        (pa.array([[("a", {"p": 1, "q": None})], None, [("b", None)], []],
                  pa.map_(pa.string(), loose)), pa.map_(pa.string(), strict)),
        (pa.array([{"a": 1, "i": {"p": 1, "q": None}}, {"a": 2, "i": None}, None, {"a": 4}],
                  pa.struct([pa.field("a", pa.int32()), pa.field("i", loose)])),
         pa.struct([pa.field("a", pa.int32()), pa.field("i", strict, nullable=False)])),
    ]
    for array, target in cases:
        for column in (array, array.slice(1), array.slice(1, 2),
                       pa.chunked_array([array, array.slice(2)])):
            out = cast_column(column, target)
            assert out.type == target
            assert out.to_pylist() == column.cast(relaxed(target)).to_pylist()
            out.validate(full=True)
