"""Tables written by Paimon's engine, read by us as the engine reads them.

The engine (tests/engine/engine.py) writes a table, four commits with
updates of earlier keys; the engine's own batch read of the latest snapshot
is the reference. Read row for row the same by: the planner's full scan
over 2 shards on the Arrow path (``read_arrow`` and ``iter_batches``), and a
real group member (in process, in-memory coordinator). The engine writes
manifests in Paimon 0.9's layout, so every case also reads those.

Lookup tables (``changelog-producer = lookup``, deletion vectors) compact at
every commit: the older values of a key stay on higher levels, which the
engine's lookup merge leaves out (paimon_group/arrowread/levels.py).
"""

from __future__ import annotations

import asyncio
import tempfile
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pytest

from paimon_group import GroupMember, MemberConfig
from paimon_group.reading.planner import ShardPlanner
from paimon_group.reading.table import ShardedTable
from tests.engine.engine import Engine

pytestmark = pytest.mark.engine

SCHEMA = pa.schema(
    [pa.field("k", pa.int64(), nullable=False), pa.field("v", pa.int64()),
     pa.field("s", pa.string())]
)
AGG = {"merge-engine": "aggregation", "fields.v.aggregate-function": "sum"}
CASES: dict[str, dict[str, str]] = {
    "parquet": {},
    "orc": {"file.format": "orc"},
    "avro": {"file.format": "avro"},
    "deletion-vectors": {"deletion-vectors.enabled": "true"},
    "changelog-input": {"changelog-producer": "input"},
    "changelog-lookup": {"changelog-producer": "lookup"},
    "partial-update": {"merge-engine": "partial-update"},
    "partial-update-lookup": {"merge-engine": "partial-update", "changelog-producer": "lookup"},
    "aggregation": AGG,
    "aggregation-lookup": {**AGG, "changelog-producer": "lookup"},
    "aggregation-deletion-vectors": {**AGG, "deletion-vectors.enabled": "true"},
    "aggregation-full-compaction": {**AGG, "changelog-producer": "full-compaction"},
    "first-row": {"merge-engine": "first-row"},
    "dynamic-bucket": {"bucket": "-1", "dynamic-bucket.target-row-num": "6"},
    "dynamic-bucket-aggregation-lookup": {
        "bucket": "-1", "dynamic-bucket.target-row-num": "6", **AGG,
        "changelog-producer": "lookup"},
}


def _rows(keys: range, v: int) -> pa.Table:
    return pa.table(
        {"k": list(keys), "v": [v] * len(keys),
         "s": [None if (k + v) % 4 == 0 else f"s{k}-{v}" for k in keys]},
        schema=SCHEMA,
    )


def _write(engine: Engine, warehouse: str, options: dict[str, str]) -> pa.Table:
    """The table, written by the engine; returns the engine's read."""
    engine.create_table(warehouse, SCHEMA, primary_keys=["k"],
                        options={"bucket": "2", **options})
    for keys, v in ((range(0, 20), 1), (range(10, 30), 2), (range(5, 15), 3),
                    (range(25, 35), 4)):
        engine.write(warehouse, _rows(keys, v))
    return engine.read(warehouse).sort_by("k")


def _planner_rows(warehouse: str) -> tuple[pa.Table, pa.Table]:
    table = ShardedTable.open(warehouse, "db.t")
    latest = table.latest_snapshot_id()
    assert latest is not None
    planner = ShardPlanner(table, 2, include_row_kind=False, batch_rows=4)
    step = planner.plan_full([0, 1], latest)
    read = [planner.read_arrow(s) for s in step.splits.values()]
    streamed = [pa.Table.from_batches(list(planner.iter_batches(s)), planner.schema)
                for s in step.splits.values()]
    return pa.concat_tables(read).sort_by("k"), pa.concat_tables(streamed).sort_by("k")


@pytest.mark.parametrize("case", sorted(CASES))
def test_engine_written_table_reads_as_the_engine_reads(engine: Engine, case: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        warehouse = str(Path(tmp) / "wh")
        started = time.monotonic()
        expected = _write(engine, warehouse, CASES[case])
        written = time.monotonic() - started
        assert expected.num_rows == 35
        read, streamed = _planner_rows(warehouse)
        assert read.to_pylist() == expected.to_pylist(), case
        assert streamed.to_pylist() == expected.to_pylist(), case
        print(f"{case}: written and read by the engine in {written:.2f}s")


def _config(warehouse: str) -> MemberConfig:
    return MemberConfig(group="engine", warehouse=warehouse, table="db.t",
                        coordinator=f"memory://engine-{uuid.uuid4().hex}", member_id="m",
                        session_timeout_s=3, poll_interval_ms=50)


async def _group_rows(warehouse: str, count: int) -> pa.Table:
    rows: list[pa.Table] = []
    async with GroupMember(_config(warehouse)) as member:
        batches = member.batches()
        while sum(t.num_rows for t in rows) < count:
            batch = await asyncio.wait_for(batches.__anext__(), timeout=60)
            assert batch.kind.value == "initial"
            rows.append(batch.to_arrow())
    return pa.concat_tables(rows)


@pytest.mark.parametrize("case", ["parquet", "aggregation-lookup", "partial-update-lookup"])
def test_a_group_member_reads_an_engine_table_as_the_engine(engine: Engine, case: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        warehouse = str(Path(tmp) / "wh")
        expected = _write(engine, warehouse, CASES[case])
        got = asyncio.run(_group_rows(warehouse, expected.num_rows))
        got = got.select(expected.column_names).sort_by("k")
        assert got.to_pylist() == expected.to_pylist()


def test_partitioned_engine_table_reads_as_the_engine_reads(engine: Engine) -> None:
    schema = pa.schema([pa.field("k", pa.int64(), nullable=False),
                        pa.field("p", pa.string(), nullable=False), pa.field("v", pa.int64())])
    with tempfile.TemporaryDirectory() as tmp:
        warehouse = str(Path(tmp) / "wh")
        engine.create_table(warehouse, schema, primary_keys=["k", "p"], partition_keys=["p"],
                            options={"bucket": "2"})
        for keys, v in ((range(0, 20), 1), (range(10, 30), 2)):
            engine.write(warehouse, pa.table(
                {"k": list(keys), "p": [f"p{k % 3}" for k in keys], "v": [v] * len(keys)},
                schema=schema))
        expected = engine.read(warehouse).sort_by("k")
        read, streamed = _planner_rows(warehouse)
        assert read.to_pylist() == expected.to_pylist()
        assert streamed.to_pylist() == expected.to_pylist()
