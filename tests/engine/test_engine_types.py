"""Values whose reading differs between pypaimon's reader and the engine:
ORC CHAR(n) (stored padded, trimmed by the engine's ORC reader) and
TIMESTAMP(9) (nanoseconds, kept by the engine). A table written by the
engine reads, on every path and by both of our readers (the Arrow reader and
pypaimon's, which partial-update tables fall back to), the engine's values."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pyarrow as pa
import pytest

from paimon_group.reading.planner import ShardPlanner
from paimon_group.reading.table import ShardedTable
from tests.engine.engine import Engine

pytestmark = pytest.mark.engine

SCHEMA = pa.schema(
    [pa.field("k", pa.int64(), nullable=False), pa.field("c", pa.string()),
     pa.field("t", pa.timestamp("ns"))]
)
TYPES = {"c": "CHAR(5)", "t": "TIMESTAMP(9)"}


def _rows(keys: list[int], nanos: int) -> pa.Table:
    return pa.table(
        {"k": keys, "c": [f"c{k}"[:5] if k % 3 else None for k in keys],
         "t": pa.array([nanos + k for k in keys], pa.int64()).cast(pa.timestamp("ns"))},
        schema=SCHEMA,
    )


@pytest.mark.parametrize("file_format", ["orc", "parquet"])
@pytest.mark.parametrize("merge_engine", ["deduplicate", "partial-update"])
def test_char_and_nanoseconds_as_the_engine_reads_them(
    engine: Engine, file_format: str, merge_engine: str
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        warehouse = str(Path(tmp) / "wh")
        engine.create_table(
            warehouse, SCHEMA, primary_keys=["k"], types=TYPES,
            options={"bucket": "1", "file.format": file_format, "merge-engine": merge_engine},
        )
        first, second = _rows(list(range(0, 8)), 1_000_000_001), _rows(list(range(4, 12)), 7)
        engine.write(warehouse, first)
        engine.write(warehouse, second)
        expected = engine.read(warehouse).sort_by("k")
        if merge_engine == "deduplicate":
            assert expected.to_pylist() == pa.concat_tables(
                [first.slice(0, 4), second]).to_pylist()
        table = ShardedTable.open(warehouse, "db.t")
        planner = ShardPlanner(table, 1, include_row_kind=False, batch_rows=3)
        full = planner.plan_full([0], 2).splits[0]
        delta_step = planner.plan_next([0], 2)
        assert delta_step is not None
        delta = delta_step.splits[0]
        for read in (planner.read_arrow, planner.pypaimon_read_arrow):
            assert read(full).sort_by("k").to_pylist() == expected.to_pylist()
            assert read(delta).to_pylist() == second.to_pylist()
        for batches in (planner.iter_batches, planner.pypaimon_iter_batches):
            streamed = pa.Table.from_batches(list(batches(full)), planner.schema)
            assert streamed.sort_by("k").to_pylist() == expected.to_pylist()
