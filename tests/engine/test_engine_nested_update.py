"""``nested_update`` (issue 22): an ``ARRAY<ROW>`` column updated as a nested
table, with and without ``nested-key``, read by the Arrow reader as the
engine reads it, with no split falling back, on tables compacted at some
commits and not at others, with and without lookup changelogs, in Parquet, ORC and Avro files.

With a nested key the engine keeps the rows in a Java ``HashMap`` (hash
order): those arrays compare as sorted rows; without one, in order.
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

ROW = pa.struct([pa.field("id", pa.int32()), pa.field("s", pa.string())])
SCHEMA = pa.schema([pa.field("k", pa.int32(), nullable=False),
                    pa.field("n", pa.list_(ROW)), pa.field("u", pa.list_(ROW))])
TYPES = {"n": "ARRAY<ROW<id INT, s STRING>>", "u": "ARRAY<ROW<id INT, s STRING>>"}
OPTIONS = {"merge-engine": "aggregation", "fields.n.aggregate-function": "nested_update",
           "fields.n.nested-key": "id", "fields.u.aggregate-function": "nested_update"}


def _array(rnd: random.Random) -> list[Any] | None:
    if rnd.random() < 0.2:
        return None
    # Rows whose fields are all null too: the engine's Parquet reader reads
    # them as null rows, which its merge drops (docs/design.md).
    return [None if rnd.random() < 0.15 else
            ("row", [rnd.choice([1, 2, 3, None]), rnd.choice(["x", "y", None])])
            for _ in range(rnd.randint(0, 3))]


def _plain(values: list[Any] | None) -> list[tuple[Any, ...] | None] | None:
    """Our rows (dicts) and the engine's (tuples) alike."""
    if values is None:
        return None
    return [None if v is None else tuple(v.values()) if isinstance(v, dict) else tuple(v)
            for v in values]


def _comparable(k: int, n: Any, u: Any) -> tuple[Any, ...]:
    rows = _plain(n)
    keyed = None if rows is None else sorted(rows, key=repr)
    return (k, keyed, _plain(u))


@pytest.mark.parametrize("file_format", ["parquet", "orc", "avro"])
@pytest.mark.parametrize("producer", ["none", "lookup"])
@pytest.mark.parametrize("seed", [1, 2])
def test_nested_update_reads_as_the_engine_reads(
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
            engine.write_rows(warehouse, [{"k": k, "n": _array(rnd), "u": _array(rnd)}
                                          for k in keys], compact_buckets=int(commit == 2))

        table = ShardedTable.open(warehouse, "db.t")
        latest = table.latest_snapshot_id()
        assert latest is not None
        expected = sorted(_comparable(*row[1:]) for _, row in engine.read_at(warehouse, latest))
        planner = ShardPlanner(table, 1, include_row_kind=False, batch_rows=4)
        splits = planner.plan_full([0], latest).splits[0]
        got = sorted(_comparable(r["k"], r["n"], r["u"])
                     for r in planner.read_arrow(splits).to_pylist())
        assert planner.view.read_path is not None and planner.view.read_path.fallback_splits == 0
        assert got == expected
