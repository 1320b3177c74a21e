"""Aggregate functions folded in the engine's record order (issue 22, item
4; paimon_group/arrowread/folds.py): ``sum`` of DOUBLE and ``product`` of
FLOAT (left to right in the column's width) and ``listagg`` (nulls skipped,
empty and blank strings kept, a delimiter of the table's options), read by the Arrow reader as
the engine reads them, with no split falling back, on tables compacted at
some commits and not at others, with and without lookup changelogs.
"""

from __future__ import annotations

import random
import tempfile
from pathlib import Path

import pyarrow as pa
import pytest

from paimon_group.reading.planner import ShardPlanner
from paimon_group.reading.table import ShardedTable
from tests.engine.engine import Engine

pytestmark = pytest.mark.engine

SCHEMA = pa.schema([pa.field("k", pa.int64(), nullable=False), pa.field("f", pa.float64()),
                    pa.field("g", pa.float32()), pa.field("l", pa.string())])
OPTIONS = {"merge-engine": "aggregation", "fields.f.aggregate-function": "sum",
           "fields.g.aggregate-function": "product",
           "fields.l.aggregate-function": "listagg", "fields.l.list-agg-delimiter": "|"}
# Magnitudes far apart: a sum's result depends on its order.
FLOATS = [1e16, 1.0, -1e16, 0.1, 3.3, -2.5e15, 7e-3, None]
STRINGS = ["a", " ", "", None, "b c", "\t", "d"]


def _rows(rnd: random.Random, keys: list[int]) -> pa.Table:
    return pa.table({
        "k": keys,
        "f": [rnd.choice(FLOATS) for _ in keys],
        "g": [rnd.choice([1.1, -0.7, 3.0e10, None, 0.3]) for _ in keys],
        "l": [rnd.choice(STRINGS) for _ in keys]}, schema=SCHEMA)


@pytest.mark.parametrize("producer", ["none", "lookup"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_folded_aggregates_read_as_the_engine_reads(
    engine: Engine, producer: str, seed: int
) -> None:
    rnd = random.Random(seed)
    with tempfile.TemporaryDirectory() as tmp:
        warehouse = str(Path(tmp) / "wh")
        engine.create_table(warehouse, SCHEMA, primary_keys=["k"], options={
            **OPTIONS, "bucket": "1", "changelog-producer": producer})
        for commit in range(6):
            keys = sorted(rnd.sample(range(12), rnd.randint(3, 10)))
            engine.write(warehouse, _rows(rnd, keys), compact_buckets=int(commit == 2))
        expected = engine.read(warehouse).sort_by("k")

        table = ShardedTable.open(warehouse, "db.t")
        latest = table.latest_snapshot_id()
        assert latest is not None
        planner = ShardPlanner(table, 1, include_row_kind=False, batch_rows=4)
        splits = planner.plan_full([0], latest).splits[0]
        got = planner.read_arrow(splits).sort_by("k")
        streamed = pa.Table.from_batches(list(planner.iter_batches(splits)),
                                         schema=planner.schema).sort_by("k")
        assert planner._read_path is not None and planner._read_path.fallback_splits == 0
        want = expected.cast(got.schema).to_pylist()
        assert got.to_pylist() == want
        assert streamed.to_pylist() == want
