"""The ARRAY and MAP aggregate functions (issue 22): ``collect``, ``collect``
with ``distinct`` and ``merge_map``, read by the Arrow reader as the engine
reads them, with no split falling back, on tables compacted at some commits
and not at others, with and without lookup changelogs, in Parquet, ORC and Avro files.

The engine builds a distinct array in a Java ``HashSet`` and a merged map in
a ``HashMap``: their order is its hash order, so those two compare as
sorted elements and as dicts; a plain ``collect`` compares in order.
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

SCHEMA = pa.schema([pa.field("k", pa.int32(), nullable=False),
                    pa.field("c", pa.list_(pa.int32())), pa.field("d", pa.list_(pa.string())),
                    pa.field("m", pa.map_(pa.string(), pa.int32()))])
TYPES = {"c": "ARRAY<INT>", "d": "ARRAY<STRING>", "m": "MAP<STRING, INT>"}
OPTIONS = {"merge-engine": "aggregation", "fields.c.aggregate-function": "collect",
           "fields.d.aggregate-function": "collect", "fields.d.distinct": "true",
           "fields.m.aggregate-function": "merge_map"}


def _array(rnd: random.Random, pool: list[Any]) -> list[Any] | None:
    return None if rnd.random() < 0.2 else [rnd.choice(pool) for _ in range(rnd.randint(0, 3))]


def _map(rnd: random.Random) -> tuple[str, list[tuple[str, Any]]] | None:
    if rnd.random() < 0.2:
        return None
    keys = rnd.sample(["a", "b", "c", "d", ""], rnd.randint(0, 3))
    return ("map", [(key, rnd.choice([1, 2, None, -7])) for key in keys])


def _rows(rnd: random.Random, keys: list[int]) -> list[dict[str, Any]]:
    return [{"k": k, "c": _array(rnd, [1, 2, 3, None]), "d": _array(rnd, ["x", "y", "", None]),
             "m": _map(rnd)} for k in keys]


def _comparable(row: dict[str, Any]) -> tuple[Any, ...]:
    """A row with its distinct array sorted and its map as a dict."""
    def sort(values: list[Any] | None) -> list[Any] | None:
        return None if values is None else sorted(values, key=lambda v: (v is None, v or ""))
    return (row["k"], row["c"], sort(row["d"]),
            None if row["m"] is None else dict(row["m"]))


@pytest.mark.parametrize("file_format", ["parquet", "orc", "avro"])
@pytest.mark.parametrize("producer", ["none", "lookup"])
@pytest.mark.parametrize("seed", [1, 2])
def test_collect_and_merge_map_read_as_the_engine_reads(
    engine: Engine, producer: str, seed: int, file_format: str
) -> None:
    rnd = random.Random(seed)
    with tempfile.TemporaryDirectory() as tmp:
        warehouse = str(Path(tmp) / "wh")
        engine.create_table(warehouse, SCHEMA, primary_keys=["k"], types=TYPES, options={
            **OPTIONS, "bucket": "1", "changelog-producer": producer,
            "file.format": file_format})
        for commit in range(6):
            keys = sorted(rnd.sample(range(12), rnd.randint(3, 10)))
            engine.write_rows(warehouse, _rows(rnd, keys), compact_buckets=int(commit == 2))

        table = ShardedTable.open(warehouse, "db.t")
        latest = table.latest_snapshot_id()
        assert latest is not None
        expected = sorted(_comparable(dict(zip(("k", "c", "d", "m"), row[1:], strict=True)))
                          for _, row in engine.read_at(warehouse, latest))
        planner = ShardPlanner(table, 1, include_row_kind=False, batch_rows=4)
        splits = planner.plan_full([0], latest).splits[0]
        got = sorted(_comparable(r) for r in planner.read_arrow(splits).to_pylist())
        streamed = sorted(_comparable(r) for r in pa.Table.from_batches(
            list(planner.iter_batches(splits)), schema=planner.schema).to_pylist())
        assert planner._read_path is not None and planner._read_path.fallback_splits == 0
        assert got == expected
        assert streamed == expected
