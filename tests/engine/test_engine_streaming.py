"""Delta and changelog steps of tables written by the engine, read by the
planner as the engine's own streaming read gives them: per key, the same
changes in the same order, row kinds included (deletes written through
``rowkind.field``)."""

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

SCHEMA = pa.schema(
    [pa.field("k", pa.int64(), nullable=False), pa.field("v", pa.int64()),
     pa.field("op", pa.string())]
)
AGG = {"merge-engine": "aggregation", "fields.v.aggregate-function": "sum"}
CASES: dict[str, dict[str, str]] = {
    "no-changelog": {},
    "changelog-input": {"changelog-producer": "input"},
    "changelog-lookup": {"changelog-producer": "lookup"},
    "deletion-vectors": {"deletion-vectors.enabled": "true"},
    "aggregation-lookup": {**AGG, "changelog-producer": "lookup"},
    "partial-update-lookup": {"merge-engine": "partial-update", "changelog-producer": "lookup"},
    "dynamic-bucket-lookup": {"bucket": "-1", "dynamic-bucket.target-row-num": "4",
                              "changelog-producer": "lookup"},
}


def _rows(keys: range, v: int, op: str = "+I") -> pa.Table:
    return pa.table({"k": list(keys), "v": [v] * len(keys), "op": [op] * len(keys)},
                    schema=SCHEMA)


def _by_key(rows: list[tuple[Any, ...]]) -> dict[int, list[tuple[Any, ...]]]:
    """Changes per key, in order: the order the engine promises (a key's
    changes are in one bucket, in commit order; buckets interleave freely)."""
    keyed: dict[int, list[tuple[Any, ...]]] = {}
    for row in rows:
        keyed.setdefault(row[1], []).append(row)
    return keyed


@pytest.mark.parametrize("case", sorted(CASES))
def test_steps_read_as_the_engine_streams(engine: Engine, case: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        warehouse = str(Path(tmp) / "wh")
        options = {"bucket": "2", "rowkind.field": "op", **CASES[case]}  # case's bucket wins
        engine.create_table(warehouse, SCHEMA, primary_keys=["k"], options=options)
        engine.write(warehouse, _rows(range(0, 12), 1))
        engine.write(warehouse, _rows(range(6, 18), 2))
        if not case.startswith(("aggregation", "partial-update")):  # they reject deletes
            engine.write(warehouse, _rows(range(0, 4), 0, "-D"))
        engine.write(warehouse, _rows(range(2, 8), 3))
        expected = engine.stream(warehouse, 2, SCHEMA)
        assert expected

        table = ShardedTable.open(warehouse, "db.t")
        for batch_rows in (3, 1000):
            planner = ShardPlanner(table, 2, include_row_kind=True, batch_rows=batch_rows)
            ours: list[tuple[Any, ...]] = []
            streamed: list[tuple[Any, ...]] = []
            position = 2
            while (step := planner.plan_next([0, 1], position)) is not None:
                for splits in step.splits.values():
                    ours += [tuple(r.values()) for r in planner.read_arrow(splits).to_pylist()]
                    for batch in planner.iter_batches(splits):
                        streamed += [tuple(r.values()) for r in batch.to_pylist()]
                position = step.next_snapshot
            assert _by_key(ours) == _by_key(expected), case
            assert _by_key(streamed) == _by_key(expected), case
