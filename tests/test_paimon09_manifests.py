"""Tables whose manifests Paimon 0.9 wrote (no ``_VALUE_STATS_COLS``, no
``_EXTERNAL_PATH``, ...): the planner, both readers and a real group member
read them row for row as pypaimon reads the same table in today's layout.

No 0.9 writer is at hand: the table is written by pypaimon, copied, and the
copy's manifests and manifest lists are rewritten in 0.9's layout
(tests/support/paimon09.py).
"""

from __future__ import annotations

import asyncio
import shutil
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from paimon_group import GroupMember, MemberConfig
from paimon_group.reading.planner import ShardPlanner
from paimon_group.reading.table import ShardedTable
from tests.support.paimon09 import rewrite_as_paimon_09
from tests.support.tables import compact, delete_rows, make_pk_table, open_table, write_rows
from tests.test_arrowread import assert_same, compare_all_paths


def _build(tmp_path: Path) -> tuple[str, str]:
    """A table (with levels, updates and deletes) and its 0.9-layout copy."""
    current = str(tmp_path / "current")
    make_pk_table(current, "db.t", buckets=2, changelog_producer="input", row_kind_field=True)
    write_rows(current, "db.t", range(0, 30), v=1)
    write_rows(current, "db.t", range(20, 40), v=2)
    compact(current, "db.t")
    write_rows(current, "db.t", range(35, 50), v=3)
    delete_rows(current, "db.t", range(0, 5))
    old = str(tmp_path / "old")
    shutil.copytree(current, old)
    assert rewrite_as_paimon_09(open_table(old, "db.t")) > 0
    return current, old


def _all_steps(planner: ShardPlanner, latest: int) -> list[Any]:
    shards = [0, 1]
    steps = [planner.plan_full(shards, s) for s in range(1, latest + 1)]
    position = 1
    while (step := planner.plan_next(shards, position)) is not None:
        steps.append(step)
        position = step.next_snapshot
    return steps


def test_every_path_reads_a_09_table_as_the_current_layout(tmp_path: Path) -> None:
    current, old = _build(tmp_path)
    tables = [ShardedTable.open(wh, "db.t") for wh in (current, old)]
    latest = tables[0].latest_snapshot_id()
    assert latest is not None and tables[1].latest_snapshot_id() == latest
    planners = [ShardPlanner(t, 2, include_row_kind=True, batch_rows=7) for t in tables]
    compared = 0
    for want, got in zip(*(_all_steps(p, latest) for p in planners), strict=True):
        assert sorted(want.splits) == sorted(got.splits)
        for shard, splits in want.splits.items():
            reference = planners[0].pypaimon_read_arrow(splits)
            what = f"{want.kind.value} @{want.snapshot_id} shard {shard}"
            assert_same(planners[1].read_arrow(got.splits[shard]), reference, what)
            assert_same(planners[1].pypaimon_read_arrow(got.splits[shard]), reference, what)
            compared += reference.num_rows
    assert compared > 0
    assert compare_all_paths(old) > 0  # and the Arrow reader never fell back


def _config(wh: str) -> MemberConfig:
    return MemberConfig(group="old", warehouse=wh, table="db.t",
                        coordinator=f"memory://old-{uuid.uuid4().hex}", member_id="m",
                        session_timeout_s=3, poll_interval_ms=50)


@pytest.mark.asyncio
async def test_a_group_member_reads_a_09_table(tmp_path: Path) -> None:
    current, old = _build(tmp_path)
    table = open_table(current, "db.t")
    builder = table.new_read_builder()
    expected = builder.new_read().to_arrow(builder.new_scan().plan().splits())
    rows: list[pa.Table] = []
    async with GroupMember(_config(old)) as member:
        batches = member.batches()
        while sum(t.num_rows for t in rows) < expected.num_rows:
            batch = await asyncio.wait_for(batches.__anext__(), timeout=60)
            assert batch.kind.value == "initial"
            rows.append(batch.to_arrow())
    got = pa.concat_tables(rows).select(expected.column_names).sort_by("id")
    assert got.to_pylist() == expected.sort_by("id").to_pylist()
