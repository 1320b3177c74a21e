"""A column added to the table while members run (ALTER TABLE ADD COLUMN through
pypaimon's catalog) is delivered by the running members, on a real table.

Issue 12, finding 3: the planner's read builder was made once, so 200 of 200
rows written after ADD COLUMN came without the new column."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from paimon_group import GroupMember, MemberConfig
from tests.support.tables import catalog, make_pk_table, open_table, write_rows


def _add_column(warehouse: str, name: str) -> None:
    from pypaimon.schema.data_types import AtomicType
    from pypaimon.schema.schema_change import SchemaChange

    catalog(warehouse).alter_table(name, [SchemaChange.add_column("extra", AtomicType("BIGINT"))])


def _write_with_extra(warehouse: str, name: str, ids: range) -> int:
    table = open_table(warehouse, name)
    assert "extra" in table.field_names
    data = pa.table({
        "id": pa.array(list(ids), pa.int64()),
        "v": pa.array([1] * len(ids), pa.int64()),
        "payload": pa.array([f"p{i}" for i in ids], pa.string()),
        "extra": pa.array([i * 10 for i in ids], pa.int64()),
    }, schema=pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("v", pa.int64()),
                         pa.field("payload", pa.string()), pa.field("extra", pa.int64())]))
    builder = table.new_batch_write_builder()
    write, commit = builder.new_write(), builder.new_commit()
    try:
        write.write_arrow(data)
        commit.commit(write.prepare_commit())
    finally:
        write.close()
        commit.close()
    latest = table.snapshot_manager().get_latest_snapshot()
    return int(latest.id)


async def _collect(batches: Any, rows: dict[int, dict[str, Any]], until: int) -> None:
    while len(rows) < until:
        batch = await asyncio.wait_for(batches.__anext__(), timeout=30)
        for row in batch.to_arrow().to_pylist():
            rows[int(row["id"])] = row


@pytest.mark.asyncio
@pytest.mark.parametrize("arrow_reader", ["1", "0"])
async def test_running_member_delivers_a_column_added_to_the_table(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, arrow_reader: str) -> None:
    monkeypatch.setenv("PAIMON_GROUP_ARROW_READER", arrow_reader)
    wh = str(tmp_path / "wh")
    make_pk_table(wh, "db.t", buckets=2)
    write_rows(wh, "db.t", range(20))
    cfg = MemberConfig(group="schema", warehouse=wh, table="db.t",
                       coordinator=f"memory://schema-{uuid.uuid4().hex}", member_id="a",
                       session_timeout_s=3, poll_interval_ms=50, start="earliest")
    rows: dict[int, dict[str, Any]] = {}
    async with GroupMember(cfg) as member:
        batches = member.batches()
        await _collect(batches, rows, 20)
        assert all("extra" not in r for r in rows.values())
        # The table changes under the running member: a column, then 200 rows.
        _add_column(wh, "db.t")
        _write_with_extra(wh, "db.t", range(100, 200))
        _write_with_extra(wh, "db.t", range(200, 300))
        await _collect(batches, rows, 220)
        await batches.aclose()
    after = [rows[i] for i in range(100, 300)]
    with_column = [r for r in after if r.get("extra") == r["id"] * 10]
    assert len(with_column) == 200, f"{len(with_column)} of 200 rows came with the new column"


@pytest.mark.timeout(300)
def test_running_processes_deliver_a_column_added_to_the_table(tmp_path: Path) -> None:
    """The issue's measurement, with two real ``paimon-group run`` processes."""
    from tests.support.group_procs import GroupHarness

    h = GroupHarness(tmp_path, f"sqlite://{tmp_path}/coord.sqlite", buckets=4)
    try:
        h.write(range(100))
        h.start("m0")
        h.start("m1")
        h.wait_caught_up({"m0", "m1"})
        _add_column(h.warehouse, h.table)
        _write_with_extra(h.warehouse, h.table, range(1000, 1100))
        _write_with_extra(h.warehouse, h.table, range(1100, 1200))
        h.wait_caught_up({"m0", "m1"})
        assert h.terminate_all() == {"m0": 0, "m1": 0}
    finally:
        h.cleanup()
    later = [d for d in h.history().deliveries if any(i >= 1000 for i in d["ids"])]
    rows = sum(len(d["ids"]) for d in later)
    with_column = sum(len(d["ids"]) for d in later if "extra" in d["columns"])
    assert rows == 200 and with_column == 200, f"{with_column} of {rows} rows with the column"
    assert {d["member"] for d in later} == {"m0", "m1"}


def test_a_batch_keeps_the_schema_it_was_planned_with(tmp_path: Path) -> None:
    """Issue 21, a suspected case, real: the planner plans the next step while a
    batch is in the handler, and switches to a newer schema (ALTER TABLE) when
    that step needs it. The batch in the handler then gave the new schema from
    ``schema`` and the new reader's batches from ``iter_batches``, while a
    handler had opened its writer with the old one: ``schema``, ``to_arrow()``
    and ``iter_batches()`` of one batch must agree, whatever happens after."""
    from paimon_group.reading.batch import ShardBatch
    from paimon_group.reading.planner import ShardPlanner
    from paimon_group.reading.table import ShardedTable

    wh = str(tmp_path / "wh")
    make_pk_table(wh, "db.t", buckets=1)
    write_rows(wh, "db.t", range(10))
    planner = ShardPlanner(ShardedTable.open(wh, "db.t"), 1)
    step = planner.plan_next([0], 1)
    assert step is not None
    batch = ShardBatch(group="g", member_id="m", shard=0, num_shards=1, epoch=1, plan=step,
                       planner=planner)
    schema = batch.schema                      # a handler opens its writer with it
    _add_column(wh, "db.t")
    _write_with_extra(wh, "db.t", range(10, 20))
    assert planner.plan_next([0], 2) is not None   # the next step: the planner switches
    assert "extra" in planner.schema.names
    streamed = pa.Table.from_batches(list(batch.iter_batches()), schema)
    assert batch.schema == schema and batch.to_arrow().schema == schema
    assert sorted(streamed.column("id").to_pylist()) == list(range(10))
