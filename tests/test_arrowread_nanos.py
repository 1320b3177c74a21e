"""TIMESTAMP(7..9) values keep their nanoseconds on every read path, as the
engine reads them: the Arrow reader and pypaimon's row-by-row reader (merged
and streaming splits, and the partial-update / aggregation tables it reads
whole) give the same, exact values."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from paimon_group.reading.planner import ShardPlanner
from paimon_group.reading.table import ShardedTable
from tests.support.tables import catalog, write_table
from tests.test_arrowread import assert_same

SCHEMA = pa.schema(
    [
        pa.field("k", pa.int64(), nullable=False),
        pa.field("t", pa.timestamp("ns")),
        pa.field("tz", pa.timestamp("ns", tz="UTC")),
    ]
)
TABLES = {
    "deduplicate": {},
    "partial-update": {"merge-engine": "partial-update"},
    "aggregation": {"merge-engine": "aggregation", "fields.t.aggregate-function": "max",
                    "fields.tz.aggregate-function": "min"},
}


def _write(warehouse: str, keys: list[int], nanos: list[int]) -> None:
    data = pa.table(
        {
            "k": keys,
            "t": pa.array(nanos, pa.timestamp("ns")),
            "tz": pa.array([n + 7 for n in nanos], pa.timestamp("ns", tz="UTC")),
        },
        schema=SCHEMA,
    )
    write_table(catalog(warehouse).get_table("db.t"), data)


@pytest.mark.parametrize("file_format", ["parquet", "orc"])
@pytest.mark.parametrize("kind", sorted(TABLES))
def test_nanoseconds_on_every_path(tmp_path: Path, kind: str, file_format: str) -> None:
    from pypaimon import Schema

    warehouse = str(tmp_path / "wh")
    cat = catalog(warehouse)
    cat.create_database("db", True)
    options = {"bucket": "1", "file.format": file_format, **TABLES[kind]}
    cat.create_table(
        "db.t", Schema.from_pyarrow_schema(SCHEMA, primary_keys=["k"], options=options), False
    )
    _write(warehouse, [1, 2], [1_000_000_123, 2_000_000_456])
    _write(warehouse, [2, 3], [3_000_000_789, 4_000_000_001])
    table = ShardedTable.open(warehouse, "db.t")
    planner = ShardPlanner(table, 1, include_row_kind=True, batch_rows=2)
    full = planner.plan_full([0], 2)
    delta = planner.plan_next([0], 2)
    assert delta is not None
    for step, expected in (
        (full, [1_000_000_123, 3_000_000_789, 4_000_000_001]),
        (delta, [3_000_000_789, 4_000_000_001]),
    ):
        splits = step.splits[0]
        reference = planner.pypaimon_read_arrow(splits)
        what = f"{kind} {file_format} {step.kind.value}"
        assert reference.column("t").cast(pa.int64()).to_pylist() == expected, what
        tz = reference.column("tz").cast(pa.int64()).to_pylist()
        if kind == "aggregation" and step is full:
            assert tz == [1_000_000_130, 2_000_000_463, 4_000_000_008], what  # min
        else:
            assert tz == [n + 7 for n in expected], what
        assert_same(planner.read_arrow(splits), reference, what)
        streamed = pa.Table.from_batches(list(planner.iter_batches(splits)), planner.schema)
        assert_same(streamed, reference, what + " iter_batches")
        rows = pa.Table.from_batches(list(planner.pypaimon_iter_batches(splits)), planner.schema)
        assert_same(rows, reference, what + " pypaimon_iter_batches")
