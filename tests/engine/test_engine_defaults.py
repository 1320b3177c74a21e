"""``fields.<name>.default-value`` read as the engine reads it (issue 22,
item 4): every null of a defaulted field in a delivered row becomes the
default, in files of the current schema and in files written before the
field was added, on the full scan and on every delta / changelog step
(paimon_group/arrowread/defaults.py). pypaimon's reader leaves the nulls.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from paimon_group.reading.planner import ShardPlanner
from paimon_group.reading.table import ShardedTable
from tests.engine.engine import Engine

pytestmark = pytest.mark.engine

SCHEMA = pa.schema([pa.field("k", pa.int64(), nullable=False), pa.field("a", pa.string()),
                    pa.field("n", pa.int64()), pa.field("op", pa.string())])


def _rows(schema: pa.Schema, keys: range, v: int, op: str = "+I") -> pa.Table:
    data: dict[str, list[Any]] = {
        "k": list(keys), "a": [None if k % 3 == 0 else f"a{k}-{v}" for k in keys],
        "n": [None if k % 2 == 0 else k * 10 + v for k in keys], "op": [op] * len(keys),
        "z": [None if k % 4 == 0 else k + v for k in keys]}
    return pa.table({f.name: data[f.name] for f in schema}, schema=schema)


def _by_key(rows: list[tuple[Any, ...]]) -> dict[Any, list[tuple[Any, ...]]]:
    keyed: dict[Any, list[tuple[Any, ...]]] = {}
    for row in rows:
        keyed.setdefault(row[1], []).append(row)
    return keyed


@pytest.mark.parametrize("producer", ["none", "lookup"])
def test_default_values_read_as_the_engine_reads(engine: Engine, producer: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        warehouse = str(Path(tmp) / "wh")
        engine.create_table(warehouse, SCHEMA, primary_keys=["k"], options={
            "bucket": "2", "rowkind.field": "op", "changelog-producer": producer,
            "fields.a.default-value": "none given", "fields.n.default-value": "-1"})
        engine.write(warehouse, _rows(SCHEMA, range(0, 12), 1))
        engine.alter(warehouse, ("add", "z", "BIGINT"), ("set", "fields.z.default-value", "7"))
        later = engine.catalog(warehouse).get_table("db.t")._arrow_schema
        engine.write(warehouse, _rows(later, range(6, 18), 2))
        engine.write(warehouse, _rows(later, range(0, 3), 3, "-D"))
        expected = engine.read(warehouse).sort_by("k")
        # Through the latest schema: from snapshot 2 without it the engine
        # travels to snapshot 2's schema, where fields.z.default-value names
        # no field, and refuses to read.
        latest_schema = max(engine.schema_columns(warehouse).values())
        stream = [row for _, _, row in engine.stream_steps(warehouse, 2, latest_schema)]

        table = ShardedTable.open(warehouse, "db.t")
        latest = table.latest_snapshot_id()
        assert latest is not None
        planner = ShardPlanner(table, 1, include_row_kind=False, batch_rows=4)
        splits = planner.plan_full([0], latest).splits[0]
        got = planner.read_arrow(splits).sort_by("k")
        assert got.to_pylist() == expected.cast(got.schema).to_pylist()
        assert got.column("z").null_count == 0 and got.column("a").null_count == 0
        kinds = ShardPlanner(table, 1, include_row_kind=True, batch_rows=4)
        ours: list[tuple[Any, ...]] = []
        position = 2
        while (step := kinds.plan_next([0], position)) is not None:
            for part in step.splits.values():
                ours += [tuple(r.values()) for r in kinds.read_arrow(part).to_pylist()]
                for batch in kinds.iter_batches(part):
                    assert batch.column(batch.schema.get_field_index("z")).null_count == 0
            position = step.next_snapshot
        assert _by_key(ours) == _by_key(stream)
        for read in (planner, kinds):
            assert read.view.read_path is not None and read.view.read_path.fallback_splits == 0
