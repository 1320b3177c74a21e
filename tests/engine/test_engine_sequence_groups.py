"""Partial-update sequence groups read as the engine reads them (issue 22,
item 4; paimon_group/arrowread/fieldmerge.py): each group's fields, nulls
included, come from the key's record with the greatest non-null group
sequence (ties and nulls drawn; all null without one; a key's lone record
kept whole), the others are the latest non-null; compacted at some
commits, with and without lookup changelogs, no split falling back.
pypaimon's reader refuses such tables.
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

SCHEMA = pa.schema([pa.field("k", pa.int64(), nullable=False), pa.field("g1", pa.int64()),
                    pa.field("a", pa.string()), pa.field("b", pa.int64()),
                    pa.field("g2", pa.int64()), pa.field("c", pa.string()),
                    pa.field("d", pa.string())])
OPTIONS = {"merge-engine": "partial-update", "fields.g1.sequence-group": "a,b",
           "fields.g2.sequence-group": "c"}


def _rows(rnd: random.Random, keys: list[int], v: int) -> pa.Table:
    def maybe(value: object) -> object:
        return None if rnd.random() < 0.3 else value

    return pa.table({
        "k": keys, "g1": [maybe(rnd.randint(0, 3)) for _ in keys],
        "a": [maybe(f"a{k}-{v}") for k in keys], "b": [maybe(k * 10 + v) for k in keys],
        "g2": [maybe(rnd.randint(0, 3)) for _ in keys], "c": [maybe(f"c{v}") for _ in keys],
        "d": [maybe(f"d{v}") for _ in keys]}, schema=SCHEMA)


@pytest.mark.parametrize("producer", ["none", "lookup"])
@pytest.mark.parametrize("seed", range(1, 7))
def test_sequence_groups_read_as_the_engine_reads(
    engine: Engine, producer: str, seed: int
) -> None:
    rnd = random.Random(seed)
    with tempfile.TemporaryDirectory() as tmp:
        warehouse = str(Path(tmp) / "wh")
        engine.create_table(warehouse, SCHEMA, primary_keys=["k"], options={
            **OPTIONS, "bucket": "1", "changelog-producer": producer})
        for v in range(6):
            keys = sorted(rnd.sample(range(12), rnd.randint(3, 10)))
            engine.write(warehouse, _rows(rnd, keys, v), compact_buckets=int(v == 2))
        expected = engine.read(warehouse).sort_by("k")

        table = ShardedTable.open(warehouse, "db.t")
        latest = table.latest_snapshot_id()
        assert latest is not None
        for columns in (None, ["k", "a", "c", "d"]):  # a projection without g1, g2
            planner = ShardPlanner(table, 1, include_row_kind=False, batch_rows=4,
                                   projection=columns)
            splits = planner.plan_full([0], latest).splits[0]
            got = planner.read_arrow(splits).sort_by("k")
            streamed = pa.Table.from_batches(list(planner.iter_batches(splits)),
                                             schema=planner.schema).sort_by("k")
            assert planner._read_path is not None
            assert planner._read_path.fallback_splits == 0
            want = expected.select(got.column_names).to_pylist()
            assert got.to_pylist() == want
            assert streamed.to_pylist() == want
