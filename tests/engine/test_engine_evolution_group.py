"""A table written and altered by Paimon's engine mid-stream (ADD, RENAME,
DROP COLUMN, writes between each), read by a group of two real
``paimon-group run`` processes, compared batch by batch with the engine's
own read on every path:

* initial: the engine's batch read of the same snapshot, through the schema
  the members read with (files of two schemas);
* delta (``changelog-producer = none``) or changelog (``lookup``): each
  batch equals the engine's streaming read of the snapshots it covers, for
  the buckets of its shard, through the batch's schema (row kinds and the
  order of each key's changes included; a member reads a snapshot committed
  under a newer schema with that schema, planner._follow_schema);
* catch-up: the group stopped while 12 snapshots and two ALTERs were
  committed, then restarted: one step of every snapshot, read through the
  latest schema, equals the engine's stream of those snapshots read so.

Every engine row after the initial snapshot is in a batch of its shard, and
no member's log says a split was left to pypaimon's reader.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from tests.engine.engine import Engine
from tests.support.group_procs import GroupHarness

pytestmark = [pytest.mark.engine, pytest.mark.slow]

SHARDS = 2
MEMBERS = ("m0", "m1")
FELL_BACK = ("pypaimon's reader reads splits", "not as the engine")


def _rows(schema: pa.Schema, keys: range, v: int, op: str = "+I") -> pa.Table:
    columns: dict[str, list[Any]] = {}
    for field in schema:
        if field.name == "k":
            columns["k"] = list(keys)
        elif field.name == "op":
            columns["op"] = [op] * len(keys)
        elif pa.types.is_string(field.type):
            columns[field.name] = [None if (k + v) % 5 == 0 else f"{field.name}{k}-{v}"
                                   for k in keys]
        else:
            columns[field.name] = [k * 100 + v for k in keys]
    return pa.table(columns).cast(pa.schema([pa.field(f.name, f.type) for f in schema]))


class _Writer:
    """Commits to the engine's table ``db.t`` with its current schema."""

    def __init__(self, engine: Engine, warehouse: str) -> None:
        self.engine, self.warehouse, self.v = engine, warehouse, 0

    def __call__(self, keys: range, op: str = "+I") -> None:
        self.v += 1
        schema = self.engine.catalog(self.warehouse).get_table("db.t")._arrow_schema
        self.engine.write(self.warehouse, _rows(schema, keys, self.v, op))


def _batches(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for path in sorted(out.glob("rows-*.jsonl"))
            for line in path.read_text().splitlines()]


def _by_key(rows: list[tuple[Any, ...]]) -> dict[Any, list[tuple[Any, ...]]]:
    keyed: dict[Any, list[tuple[Any, ...]]] = {}
    for row in rows:
        keyed.setdefault(row[1], []).append(row)  # (row kind, k, ...)
    return keyed


def _schema_of(batch: dict[str, Any], schemas: dict[tuple[str, ...], int]) -> int:
    columns = batch["columns"]
    assert columns[0] == "_row_kind", columns
    assert tuple(columns[1:]) in schemas, (columns, schemas)
    return schemas[tuple(columns[1:])]


def _check_initial(engine: Engine, warehouse: str, batches: list[dict[str, Any]],
                   schemas: dict[tuple[str, ...], int]) -> int:
    """The initial batches against the engine's batch read; their snapshot."""
    initial = [b for b in batches if b["kind"] == "initial"]
    assert {b["snapshot"] for b in initial} == {initial[0]["snapshot"]}
    snapshot, schema_id = initial[0]["snapshot"], _schema_of(initial[0], schemas)
    ours = sorted((b["shard"], tuple(r)) for b in initial for r in b["rows"])
    expected = sorted((bucket % SHARDS, row)
                      for bucket, row in engine.read_at(warehouse, snapshot, schema_id))
    assert ours == expected
    return int(snapshot)


def _check_steps(engine: Engine, warehouse: str, batches: list[dict[str, Any]],
                 schemas: dict[tuple[str, ...], int], initial: int) -> set[str]:
    """Each follow-up batch against the engine's stream of its snapshots;
    every engine row covered. Returns the kinds of batch seen."""
    streams: dict[int, list[tuple[int, int, tuple[Any, ...]]]] = {}
    covered: set[tuple[int, int]] = set()
    kinds: set[str] = set()
    for batch in (b for b in batches if b["kind"] != "initial"):
        schema_id = _schema_of(batch, schemas)
        if schema_id not in streams:
            streams[schema_id] = engine.stream_steps(warehouse, initial + 1, schema_id)
        first, last = batch["first_snapshot"], batch["snapshot"]
        expected = [row for snapshot, bucket, row in streams[schema_id]
                    if first <= snapshot <= last and bucket % SHARDS == batch["shard"]]
        ours = [tuple(r) for r in batch["rows"]]
        assert _by_key(ours) == _by_key(expected), (batch["kind"], first, last, batch["shard"])
        covered.update((s, batch["shard"]) for s in range(first, last + 1))
        kinds.add(batch["kind"])
    every = engine.stream_steps(warehouse, initial + 1)
    assert every
    missing = {(s, b % SHARDS) for s, b, _ in every} - covered
    assert not missing, f"engine rows of (snapshot, shard) {sorted(missing)} never delivered"
    return kinds


def _start(h: GroupHarness) -> None:
    for member in MEMBERS:
        h.start(member, "--include-row-kind", handler="tests.support.handlers:record_rows")


def _explain(h: GroupHarness) -> str:
    return "\n".join(f"--- {m}\n{h.log(m)[-3000:]}" for m in h.procs)


def _run_group(engine: Engine, h: GroupHarness, write: _Writer) -> None:
    write(range(0, 20))
    engine.alter(h.warehouse, ("add", "x", "BIGINT"))
    write(range(10, 30))
    engine.alter(h.warehouse, ("rename", "a", "b"))
    write(range(20, 40))
    _start(h)  # initial: files of schemas 0, 1 and 2, read through 2
    h.wait_caught_up(set(MEMBERS))
    write(range(0, 4), "-D")
    h.wait_caught_up(set(MEMBERS))
    assert h.terminate_all() == dict.fromkeys(MEMBERS, 0), _explain(h)
    # Stopped for a few snapshots: the members, restarted with the latest
    # schema, read the deltas of snapshots written under older ones.
    engine.alter(h.warehouse, ("drop", "n"))
    write(range(0, 10))
    engine.alter(h.warehouse, ("rename", "b", "c"))
    write(range(5, 15))
    _start(h)
    h.wait_caught_up(set(MEMBERS))
    assert h.terminate_all() == dict.fromkeys(MEMBERS, 0), _explain(h)
    # Stopped for 12 commits and three ALTERs: one catch-up step.
    for i in range(12):
        if i in ALTERS_WHILE_STOPPED:
            engine.alter(h.warehouse, ALTERS_WHILE_STOPPED[i])
        write(range(i * 3, i * 3 + 8), "-D" if i == 5 else "+I")
    _start(h)
    h.wait_caught_up(set(MEMBERS))
    write(range(30, 45))
    h.wait_caught_up(set(MEMBERS))
    assert h.terminate_all() == dict.fromkeys(MEMBERS, 0), _explain(h)


ALTERS_WHILE_STOPPED: dict[int, tuple[str, ...]] = {
    3: ("rename", "c", "d"), 6: ("drop", "x"), 9: ("add", "y", "STRING")}


@pytest.mark.parametrize(("producer", "follow_up"),
                         [("none", "delta"), ("lookup", "changelog")])
def test_an_engine_table_altered_mid_stream_reads_in_a_group_as_the_engine_reads(
    engine: Engine, tmp_path: Path, producer: str, follow_up: str
) -> None:
    warehouse = str(tmp_path / "wh")
    schema = pa.schema([pa.field("k", pa.int64(), nullable=False), pa.field("a", pa.string()),
                        pa.field("n", pa.int64()), pa.field("op", pa.string())])
    engine.create_table(warehouse, schema, primary_keys=["k"], options={
        "bucket": str(SHARDS), "rowkind.field": "op", "changelog-producer": producer})
    h = GroupHarness(tmp_path, f"sqlite://{tmp_path}/coordinator.sqlite", create=False,
                     warehouse=warehouse, poll_interval_ms=100)
    try:
        _run_group(engine, h, _Writer(engine, warehouse))
    finally:
        h.cleanup()
    batches = _batches(h.out)
    schemas = engine.schema_columns(warehouse)
    assert len(schemas) == 8
    initial = _check_initial(engine, warehouse, batches, schemas)
    kinds = _check_steps(engine, warehouse, batches, schemas, initial)
    assert kinds == {follow_up, "catch-up"}, kinds
    used = {_schema_of(b, schemas) for b in batches}
    assert used == {2, 4, 7}, used  # initial and a delta 2; after a restart 4; catch-up 7
    for member in MEMBERS:
        assert not any(line in h.log(member) for line in FELL_BACK), h.log(member)
