"""A remembered snapshot planned after it expired (issue 37, D4), on real tables.

A member keeps the texts of the snapshots the group's head handed over and
plans them without reading their files. Once Paimon's expiration deleted a
snapshot's manifest lists and its file, planning it from memory failed with
``FileNotFoundError('...manifest-list-... does not exist')``: the member
FAILED, and ``--on-data-loss skip`` was ignored. A file missing under a plan
now asks the store whether the snapshot is retained: expired, it is handled
as any expired position (the one line, or the skip); retained, one line
naming the file."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from pathlib import Path
from typing import Any

import pytest

from paimon_group import GroupMember, MemberConfig
from paimon_group.errors import SnapshotExpired
from paimon_group.member.state import MemberState
from paimon_group.reading import expiry
from paimon_group.reading.table import ShardedTable
from tests.support.tables import make_pk_table, open_table, write_rows
from tests.support.waiting import eventually as _until


def expire_with_manifest_lists(warehouse: str, name: str, *, keep_from: int) -> None:
    """Expire the snapshots below ``keep_from`` as Paimon's expiration does:
    each one's manifest lists (base, delta, changelog: a retained snapshot
    never names another's), then its file; then the EARLIEST hint."""
    table = open_table(warehouse, name)
    manager = table.snapshot_manager()
    manifests = f"{str(table.table_path).rstrip('/')}/manifest"
    for snapshot_id in range(1, keep_from):
        snapshot = manager.get_snapshot_by_id(snapshot_id)
        if snapshot is None:
            continue
        for listed in (snapshot.base_manifest_list, snapshot.delta_manifest_list,
                       snapshot.changelog_manifest_list):
            if listed:
                table.file_io.delete_quietly(f"{manifests}/{listed}")
        table.file_io.delete(manager.get_snapshot_path(snapshot_id))
    table.file_io.overwrite_file_utf8(f"{manager.snapshot_dir}/EARLIEST", str(keep_from))


async def _remembered_then_expired(tmp_path: Path, on_data_loss: str
                                   ) -> tuple[GroupMember, asyncio.Task[None], set[int]]:
    """One member, one shard: the full scan of snapshot 1 waits in the handler
    while snapshots 2-4 are committed (the head hands each over: remembered),
    then 1-3 expire with their manifest lists, then the handler returns: the
    next plan is snapshot 2, from memory."""
    wh = str(tmp_path / "wh")
    make_pk_table(wh, "db.t", buckets=2)
    write_rows(wh, "db.t", range(10))
    cfg = MemberConfig(group="g", warehouse=wh, table="db.t", member_id="m", shards=1,
                       coordinator=f"sqlite://{tmp_path}/c.sqlite", session_timeout_s=5,
                       poll_interval_ms=50, on_data_loss=on_data_loss, max_handler_attempts=1)
    holding, release = threading.Event(), threading.Event()
    got: set[int] = set()

    def handler(batch: Any) -> None:
        got.update(batch.to_arrow().column("id").to_pylist())
        if batch.snapshot_id == 1:
            holding.set()
            release.wait(60)

    member = GroupMember(cfg)
    await member.start()
    task = asyncio.create_task(member.run(handler))
    await _until(holding.is_set, "the full scan of snapshot 1 in the handler")
    table = member.table
    assert table is not None
    for snapshot_id in (2, 3, 4):
        assert write_rows(wh, "db.t", range(snapshot_id * 10, snapshot_id * 10 + 10)) == \
            snapshot_id
        await _until(lambda s=snapshot_id: s in table._remembered, f"{snapshot_id} remembered")
    expire_with_manifest_lists(wh, "db.t", keep_from=4)
    assert 2 in table._remembered  # the text outlived the snapshot
    release.set()
    return member, task, got


@pytest.mark.asyncio
async def test_a_remembered_snapshot_that_expired_stops_the_member_in_one_line(
        tmp_path: Path) -> None:
    member, task, _ = await _remembered_then_expired(tmp_path, "fail")
    try:
        with pytest.raises(SnapshotExpired) as info:
            await asyncio.wait_for(task, 60)
    finally:
        await member.stop(timeout=5)
    message = str(info.value)
    assert "\n" not in message, message
    assert "snapshots 2..3 of table db.t expired" in message, message
    assert "paimon-group reset" in message and "--shard 0" in message, message


@pytest.mark.asyncio
async def test_a_remembered_snapshot_that_expired_is_skipped_with_the_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="paimon_group.member")
    member, task, got = await _remembered_then_expired(tmp_path, "skip")
    try:
        await _until(lambda: set(range(40, 50)) <= got or task.done(), "snapshot 4 delivered")
        assert not task.done(), task.result()
        assert member.state is not MemberState.FAILED
    finally:
        await member.stop(timeout=5)
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, 10)  # run() ends with the stop
    assert got == set(range(10)) | set(range(40, 50))  # 2 and 3 lost, said once
    warnings = [r.getMessage() for r in caplog.records if "--on-data-loss skip" in r.getMessage()]
    assert len(warnings) == 1 and "snapshots 2..3 of table db.t expired" in warnings[0], warnings
    assert member.stats.skipped_snapshots == 2


def _remembering(wh: str, snapshots: int) -> ShardedTable:
    """A table with ``snapshots`` snapshots, each text remembered as a member
    remembers what the head hands over."""
    make_pk_table(wh, "db.t", buckets=2)
    for i in range(snapshots):
        write_rows(wh, "db.t", range(i * 10, i * 10 + 10))
    table = ShardedTable.open(wh, "db.t")
    for snapshot_id in range(1, snapshots + 1):
        table.remember_snapshot(snapshot_id, table.snapshot_text(snapshot_id))
    return table


def test_a_full_scan_and_a_catch_up_planned_from_memory_after_expiry_are_expired(
        tmp_path: Path) -> None:
    wh = str(tmp_path / "wh")
    table = _remembering(wh, 4)
    table_more = _remembering(str(tmp_path / "wh2"), 14)
    expire_with_manifest_lists(wh, "db.t", keep_from=4)
    expire_with_manifest_lists(str(tmp_path / "wh2"), "db.t", keep_from=12)

    with pytest.raises(SnapshotExpired) as info:
        table.planner(2).plan_full([0, 1], 3)  # the text of 3 is remembered
    assert "snapshot 3 of table db.t has expired" in str(info.value)
    with pytest.raises(SnapshotExpired):
        table.planner(2, catch_up_threshold=1).plan_next([0, 1], 2)
    assert sorted(table_more._remembered) == [11, 12, 13, 14]  # the newest four
    with pytest.raises(SnapshotExpired) as info:
        table_more.planner(2, catch_up_threshold=2).plan_next([0, 1], 11)
    assert "snapshot 11 " in str(info.value)
    step = table.planner(2).plan_full([0, 1], 4)  # retained: planned as before
    assert step.snapshot_id == 4


def test_a_retained_snapshot_with_a_missing_manifest_list_is_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not an expiry: the snapshot is still there, a file it names is not."""
    monkeypatch.setattr(expiry, "EXPIRY_CHECKS", 3)
    monkeypatch.setattr(expiry, "EXPIRY_CHECK_S", 0.01)
    wh = str(tmp_path / "wh")
    table = _remembering(wh, 2)
    snapshot = table.snapshot(2)
    Path(table.manifest_dir(), snapshot.delta_manifest_list).unlink()
    with pytest.raises(Exception) as info:
        table.planner(2).plan_next([0, 1], 2)
    message = str(info.value)
    assert not isinstance(info.value, (SnapshotExpired, FileNotFoundError)), message
    assert "\n" not in message and "snapshot 2 of table db.t is retained" in message, message
    assert snapshot.delta_manifest_list in message, message
