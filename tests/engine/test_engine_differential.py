"""Random tables written by the engine, read by the planner as the engine
reads them: the latest snapshot's full scan against the engine's batch read,
and every delta / changelog step from snapshot 2 against the engine's
streaming read (per key, in order, row kinds included).

Each example draws a merge engine (deduplicate, with or without
``sequence.field``; partial-update; aggregation with several functions;
first-row), a changelog producer, deletion vectors, the file format and the
bucket count (only combinations the engine accepts), then 1 to 5 commits of
random keys (deletes through ``rowkind.field`` where the merge engine takes
them), some with a full compaction in the same commit. Examples per run:
``PAIMON_GROUP_ENGINE_EXAMPLES`` (default 12); a failing example is
reproduced by its seed.
"""

from __future__ import annotations

import os
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

EXAMPLES = int(os.environ.get("PAIMON_GROUP_ENGINE_EXAMPLES", "12"))
SCHEMA = pa.schema(
    [pa.field("k", pa.int64(), nullable=False), pa.field("v", pa.int64()),
     pa.field("s", pa.string()), pa.field("op", pa.string())]
)


def _options(rnd: random.Random) -> dict[str, str]:
    merge = rnd.choice(["deduplicate", "partial-update", "aggregation", "first-row"])
    options = {"bucket": str(rnd.choice([-1, 1, 2, 3])), "rowkind.field": "op",
               "merge-engine": merge, "file.format": rnd.choice(["parquet", "orc", "avro"]),
               "dynamic-bucket.target-row-num": "4"}
    producers = ["none", "lookup"] if merge == "first-row" else [
        "none", "input", "lookup", "full-compaction"]
    options["changelog-producer"] = rnd.choice(producers)
    if (merge != "first-row" and options["changelog-producer"] != "full-compaction"
            and rnd.random() < 0.3):
        options["deletion-vectors.enabled"] = "true"
    if merge == "aggregation":
        options["fields.v.aggregate-function"] = rnd.choice(
            ["sum", "max", "min", "product", "last_non_null_value", "first_non_null_value"])
        options["fields.s.aggregate-function"] = rnd.choice(
            ["last_value", "last_non_null_value", "first_value"])
    if merge in ("deduplicate", "partial-update") and rnd.random() < 0.3:
        options["sequence.field"] = "v"
    if merge == "first-row":
        options["ignore-delete"] = "true"
    return options


def _commit(rnd: random.Random, deletes: bool) -> pa.Table:
    keys = rnd.sample(range(15), rnd.randint(1, 10))
    return pa.table(
        {"k": keys,
         "v": [rnd.choice([None, rnd.randint(0, 9)]) for _ in keys],
         "s": [rnd.choice([None, f"s{rnd.randint(0, 9)}"]) for _ in keys],
         "op": ["-D" if deletes and rnd.random() < 0.2 else "+I" for _ in keys]},
        schema=SCHEMA,
    )


def _by_key(rows: list[tuple[Any, ...]]) -> dict[Any, list[tuple[Any, ...]]]:
    keyed: dict[Any, list[tuple[Any, ...]]] = {}
    for row in rows:
        keyed.setdefault(row[1], []).append(row)
    return keyed


def _steps(table: ShardedTable) -> list[tuple[Any, ...]]:
    planner = ShardPlanner(table, 2, include_row_kind=True, batch_rows=3)
    rows: list[tuple[Any, ...]] = []
    position = 2
    while (step := planner.plan_next([0, 1], position)) is not None:
        for splits in step.splits.values():
            rows += [tuple(r.values()) for r in planner.read_arrow(splits).to_pylist()]
            for batch in planner.iter_batches(splits):
                assert batch.num_rows <= 3
        position = step.next_snapshot
    return rows


@pytest.mark.parametrize("seed", range(EXAMPLES))
def test_random_engine_tables_read_as_the_engine_reads(engine: Engine, seed: int) -> None:
    rnd = random.Random(seed)
    options = _options(rnd)
    deletes = options["merge-engine"] == "deduplicate"
    with tempfile.TemporaryDirectory() as tmp:
        warehouse = str(Path(tmp) / "wh")
        engine.create_table(warehouse, SCHEMA, primary_keys=["k"], options=options)
        for _ in range(rnd.randint(1, 5)):
            full = rnd.random() < 0.2
            engine.write(warehouse, _commit(rnd, deletes),
                         compact_buckets=int(options["bucket"]) if full else 0)
        expected = engine.read(warehouse).sort_by("k")
        table = ShardedTable.open(warehouse, "db.t")
        latest = table.latest_snapshot_id()
        assert latest is not None
        planner = ShardPlanner(table, 2, include_row_kind=False, batch_rows=4)
        step = planner.plan_full([0, 1], latest)
        parts = [planner.read_arrow(s) for s in step.splits.values()]
        got = pa.concat_tables([planner.schema.empty_table(), *parts]).sort_by("k")
        assert got.to_pylist() == expected.to_pylist(), (seed, options)
        if latest >= 2:
            streamed = engine.stream(warehouse, 2, SCHEMA)
            assert _by_key(_steps(table)) == _by_key(streamed), (seed, options)
