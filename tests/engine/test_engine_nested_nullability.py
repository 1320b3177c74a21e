"""Fields inside a ROW made NOT NULL (issue 37, D6), read against Paimon's
engine.

The engine alters a ROW's field by a path of ROW names (``r.q``, a ROW in
a ROW ``o.i`` and its field ``o.i.q``); this engine version neither
descends into an ARRAY's elements or a MAP's values nor guards the change
(Paimon's later engines refuse it unless the table sets
``alter-column-null-to-not-null.disabled = false``, set here as there).

* Files written before the ALTER: this engine cannot read them through
  the new schema (``Only support column type evolution in atomic data
  type``: its schema evolution casts top-level atomic types only); Paimon's
  later engines read them with their nulls (a ROW cast field by field, each
  value read by the file's type), and so do pypaimon's reader and ours
  (tests/test_arrowread_nested_nullability.py). So our read through the
  latest schema is compared with the engine's read through the files' own
  schema: the same values, row for row, nulls included.
* Files written after it, in ORC too, which pypaimon's reader cannot read:
  equal to the engine's read.

Parquet, ORC and Avro, a primary-key and an append table, every full
scan, no split falling back.
"""

from __future__ import annotations

import random
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from paimon_group.reading.planner import ShardPlanner
from paimon_group.reading.table import ShardedTable
from tests.engine.engine import Engine

pytestmark = pytest.mark.engine

INNER = pa.struct([pa.field("p", pa.int32()), pa.field("q", pa.string())])
SCHEMA = pa.schema([pa.field("k", pa.int32(), nullable=False), pa.field("r", INNER),
                    pa.field("o", pa.struct([pa.field("a", pa.int32()), pa.field("i", INNER)]))])
TYPES = {"r": "ROW<p INT, q STRING>", "o": "ROW<a INT, i ROW<p INT, q STRING>>"}
PATHS = ["r.q", "o.i.q", "o.i"]


def _row(rnd: random.Random, k: int, not_null: set[str]) -> dict[str, Any]:
    def maybe(path: str, value: Any) -> Any:
        return None if path not in not_null and rnd.random() < 0.3 else value

    def inner(path: str) -> tuple[str, list[Any]]:
        return ("row", [rnd.randint(0, 9), maybe(f"{path}.q", rnd.choice("xyz"))])

    # ``o`` is never null, nor are both of its fields: the engine's Parquet
    # reader cannot read a null ROW holding a ROW (docs/design.md).
    return {"k": k, "r": maybe("r", inner("r")),
            "o": ("row", [rnd.randint(0, 9), maybe("o.i", inner("o.i"))])}


def _plain(value: Any) -> Any:
    """Our values (dicts) and the engine's (tuples) alike."""
    if isinstance(value, dict):
        return tuple(_plain(v) for v in value.values())
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    return value


def _ours(table: pa.Table) -> list[Any]:
    return sorted((tuple(_plain(r[c]) for c in SCHEMA.names) for r in table.to_pylist()),
                  key=repr)


def _create(engine: Engine, warehouse: str, file_format: str, kind: str) -> None:
    options = {"bucket": "1", "file.format": file_format,
               "alter-column-null-to-not-null.disabled": "false"}
    if kind == "append":
        options["bucket-key"] = "k"
    engine.create_table(warehouse, SCHEMA, primary_keys=["k"] if kind == "primary-key" else [],
                        types=TYPES, options=options)


def _write(engine: Engine, warehouse: str, rnd: random.Random, not_null: set[str]) -> None:
    keys = sorted(rnd.sample(range(16), 10))
    engine.write_rows(warehouse, [_row(rnd, k, not_null) for k in keys])


def _compare(engine: Engine, warehouse: str, schema_id: int | None) -> int:
    """Every full scan, ours through the latest schema and the engine's
    through ``schema_id`` (None: the latest); the rows whose ``r.q`` is null."""
    table = ShardedTable.open(warehouse, "db.t")
    latest = table.latest_snapshot_id()
    assert latest is not None
    planner = ShardPlanner(table, 1, include_row_kind=False, batch_rows=4)
    assert planner.schema.field("o").type.field("i").nullable is False
    assert planner.schema.field("r").type.field("q").nullable is False
    nulls = 0
    for snapshot in range(1, latest + 1):
        expected = sorted((row[1:] for _, row in engine.read_at(warehouse, snapshot, schema_id)),
                          key=repr)
        splits = planner.plan_full([0], snapshot).splits[0]
        streamed = pa.Table.from_batches(list(planner.iter_batches(splits)),
                                         schema=planner.schema)
        assert _ours(planner.read_arrow(splits)) == expected, snapshot
        assert _ours(streamed) == expected, snapshot
        nulls += sum(r is not None and r[1] is None for _, r, _ in expected)
    assert planner.view.read_path is not None and planner.view.read_path.fallback_splits == 0
    return nulls


@pytest.mark.parametrize("file_format", ["parquet", "orc", "avro"])
@pytest.mark.parametrize("kind", ["primary-key", "append"])
def test_files_written_before_row_fields_became_not_null_keep_their_nulls(
    engine: Engine, file_format: str, kind: str
) -> None:
    rnd = random.Random(f"before-{file_format}-{kind}")
    with tempfile.TemporaryDirectory() as tmp:
        warehouse = str(Path(tmp) / "wh")
        _create(engine, warehouse, file_format, kind)
        _write(engine, warehouse, rnd, set())
        _write(engine, warehouse, rnd, set())
        for path in PATHS:
            engine.alter(warehouse, ("not null", path))
        latest_schema = int(engine.java_table(warehouse).schema().id())
        assert latest_schema == len(PATHS)
        with pytest.raises(Exception, match="Only support column type evolution in atomic"):
            engine.read_at(warehouse, 2, latest_schema)  # this engine, through the new schema
        assert _compare(engine, warehouse, schema_id=0) > 0


@pytest.mark.parametrize("file_format", ["parquet", "orc", "avro"])
@pytest.mark.parametrize("kind", ["primary-key", "append"])
def test_files_written_after_row_fields_became_not_null_read_as_the_engine_reads_them(
    engine: Engine, file_format: str, kind: str
) -> None:
    rnd = random.Random(f"after-{file_format}-{kind}")
    with tempfile.TemporaryDirectory() as tmp:
        warehouse = str(Path(tmp) / "wh")
        _create(engine, warehouse, file_format, kind)
        for path in PATHS:
            engine.alter(warehouse, ("not null", path))
        for _ in range(3):
            _write(engine, warehouse, rnd, set(PATHS))
        assert _compare(engine, warehouse, schema_id=None) == 0
