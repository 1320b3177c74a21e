"""A batch whose files are gone when it is read (issue 37, D1).

A batch is planned, then read later (a handler may hold it before calling
``to_arrow()``). If Paimon's expiry deleted its files meanwhile (snapshot
``first_snapshot`` expired), its rows are lost: every read path raises
``BatchExpired`` (a ``SnapshotExpired``), and a member stops with the
data-loss line (``--on-data-loss fail``) or skips to the earliest retained
snapshot (``skip``), without calling the handler again. A file missing from
a snapshot still retained is ``DataFileMissing``, one line naming the file.

Expiry is done here as Paimon's does it (snapshot files below the new
earliest deleted, the EARLIEST hint written, and the batch's files deleted);
the real engine's expiry is in tests/engine/test_engine_held_batch.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from paimon_group import GroupMember, MemberConfig
from paimon_group.errors import BatchExpired, DataFileMissing, SnapshotExpired
from paimon_group.reading.batch import ShardBatch
from paimon_group.reading.table import ShardedTable
from tests.support.tables import compact, expire_snapshots, make_pk_table, write_rows


@pytest.fixture
def quick_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The earliest retained snapshot asked for again 0.01 s apart (not 0.25 s)."""
    from paimon_group.reading import expiry as missing

    monkeypatch.setattr(missing, "EXPIRY_CHECK_S", 0.01)


def table_of(tmp_path: Path, commits: int = 3) -> str:
    """``db.t`` with 2 buckets and ``commits`` commits of 10 rows (snapshots 1..commits)."""
    wh = str(tmp_path / "wh")
    make_pk_table(wh, "db.t", buckets=2)
    for k in range(commits):
        write_rows(wh, "db.t", range(10 * k, 10 * k + 10))
    return wh


def batch_of(wh: str, snapshot: int, *, full: bool = False) -> ShardBatch:
    table = ShardedTable.open(wh, "db.t")
    planner = table.planner(1)
    step = planner.plan_full([0], snapshot) if full else planner.plan_next([0], snapshot)
    assert step is not None
    return ShardBatch(group="g", member_id="m", shard=0, num_shards=1, epoch=1, plan=step,
                      planner=planner)


def delete_files(batch: ShardBatch) -> list[str]:
    paths = [f.file_path for split in batch.splits for f in split.files]
    for path in paths:
        os.remove(path)
    return paths


def to_dataframe(batch: ShardBatch) -> Any:
    from paimon_group.spark.handler import SparkBatchHandler

    # The rows are read before Spark is asked for anything: no session needed.
    return SparkBatchHandler(lambda df, b: None, spark=object()).to_dataframe(  # type: ignore[arg-type]
        batch)


READS: dict[str, Callable[[ShardBatch], Any]] = {
    "to_arrow": lambda b: b.to_arrow(),
    "iter_batches": lambda b: list(b.iter_batches()),
    "to_dataframe": to_dataframe,
}


@pytest.mark.parametrize("reader", ["arrow", "pypaimon"])
@pytest.mark.parametrize("read", sorted(READS))
def test_a_batch_whose_snapshot_expired_is_data_loss_on_every_read_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, read: str, reader: str) -> None:
    monkeypatch.setenv("PAIMON_GROUP_ARROW_READER", "1" if reader == "arrow" else "0")
    wh = table_of(tmp_path)
    batch = batch_of(wh, 2)
    delete_files(batch)
    expire_snapshots(wh, "db.t", keep_from=3)
    with pytest.raises(BatchExpired) as caught:
        READS[read](batch)
    err = caught.value
    assert isinstance(err, SnapshotExpired) and isinstance(err, FileNotFoundError)
    assert (err.shards, err.first, err.last, err.earliest, err.full_scan) == ((0,), 2, 2, 3,
                                                                              False)
    assert batch.lost is err
    assert "\n" not in str(err)
    assert str(err).startswith("shard 0: file ") and "of snapshot 2 of table db.t is gone: " \
        "snapshot 2 expired before the batch was read (earliest retained: 3)" in str(err)


def test_a_full_scan_batch_whose_snapshot_expired_is_data_loss(tmp_path: Path) -> None:
    wh = table_of(tmp_path)
    batch = batch_of(wh, 2, full=True)
    delete_files(batch)
    expire_snapshots(wh, "db.t", keep_from=3)
    with pytest.raises(BatchExpired) as caught:
        list(batch.iter_batches())
    assert (caught.value.first, caught.value.earliest, caught.value.full_scan) == (2, 3, True)


def test_a_file_deleted_just_before_its_snapshot_expires_is_data_loss(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Paimon's expiration deletes data files before the snapshot files: a
    read in between sees the file gone and the snapshot still there."""
    from paimon_group.reading import expiry as missing

    monkeypatch.setattr(missing, "EXPIRY_CHECK_S", 0.05)
    wh = table_of(tmp_path)
    batch = batch_of(wh, 2)
    delete_files(batch)
    later = threading.Timer(0.3, expire_snapshots, (wh, "db.t"), {"keep_from": 3})
    later.start()
    try:
        with pytest.raises(BatchExpired):
            batch.to_arrow()
    finally:
        later.join()


@pytest.mark.usefixtures("quick_checks")
@pytest.mark.parametrize("read", sorted(READS))
def test_a_missing_file_of_a_retained_snapshot_is_one_line_naming_it(
        tmp_path: Path, read: str) -> None:
    wh = table_of(tmp_path)
    batch = batch_of(wh, 2)
    paths = delete_files(batch)
    with pytest.raises(DataFileMissing) as caught:
        READS[read](batch)
    line = str(caught.value)
    assert isinstance(caught.value, FileNotFoundError)  # as the read's own error was
    assert "\n" not in line and any(p in line for p in paths), line
    assert line.startswith("shard 0: file ")
    assert ("of snapshot 2 of table db.t is missing although snapshot 2 is still retained "
            "(earliest retained: 1): it was not deleted by Paimon's expiry") in line
    assert batch.lost is caught.value


# -- a member whose handler holds a batch while its files expire ---------------


class Holding:
    """A handler holding the (first) batch of snapshot ``hold_at`` until
    ``go`` is set, then reading it (``read``); ``swallow``: it catches what
    the read raises."""

    def __init__(self, read: str, swallow: bool = False, hold_at: int = 2) -> None:
        self.read, self.swallow, self.hold_at = read, swallow, hold_at
        self.held = threading.Event()
        self.go = threading.Event()
        self.calls: list[int] = []
        self.ids: list[int] = []
        self.files: list[str] = []

    def __call__(self, batch: ShardBatch) -> None:
        self.calls.append(batch.first_snapshot)
        if batch.first_snapshot == self.hold_at and not self.held.is_set():
            self.files = [f.file_path for s in batch.splits for f in s.files]
            self.held.set()
            self.go.wait(30)
        try:
            if self.read == "to_arrow":
                table = batch.to_arrow()
            else:
                table = pa.Table.from_batches(list(batch.iter_batches()), batch.schema)
        except Exception:
            if self.swallow:
                return
            raise
        self.ids += table.column("id").to_pylist()


def member_config(wh: str, tmp_path: Path, on_data_loss: str, start: str = "latest"
                  ) -> MemberConfig:
    return MemberConfig(group="g", warehouse=wh, table="db.t",
                        coordinator=f"memory://lost-{uuid.uuid4().hex}", member_id="m",
                        shards=1, start=start, poll_interval_ms=50, session_timeout_s=3,
                        handler_backoff_s=0.01, on_data_loss=on_data_loss,
                        history_path=str(tmp_path / "history.jsonl"))


async def pinned_then_written(wh: str, member: GroupMember) -> None:
    """Once the member's shard is pinned at 2 (start ``latest``), commit 2."""
    for _ in range(600):
        if member.shard_positions().get(0) == 2:
            break
        await asyncio.sleep(0.05)
    write_rows(wh, "db.t", range(10, 20))   # snapshot 2


async def expire_held(wh: str, member: GroupMember, files: list[str]) -> None:
    """Commit 3 and 4 and, once the group's head has seen them (as it would
    at a poll interval), expire snapshots 2 and 3 with the held batch's files."""
    write_rows(wh, "db.t", range(20, 30))   # 3
    write_rows(wh, "db.t", range(30, 40))   # 4
    for _ in range(600):
        if member.core.head.record is not None and member.core.head.record.latest == 4:
            break
        await asyncio.sleep(0.05)
    for path in files:
        os.remove(path)
    expire_snapshots(wh, "db.t", keep_from=4)


async def hold_and_expire(wh: str, member: GroupMember, handler: Holding) -> asyncio.Task[None]:
    """Run ``member``; once it holds the batch of snapshot 2, expire it
    (:func:`expire_held`) and let the handler read."""
    run = asyncio.create_task(member.run(handler))
    await pinned_then_written(wh, member)
    assert await asyncio.to_thread(handler.held.wait, 30)
    await expire_held(wh, member, handler.files)
    handler.go.set()
    return run


@pytest.mark.asyncio
@pytest.mark.parametrize(("read", "swallow"), [("to_arrow", False), ("iter_batches", False),
                                               ("to_arrow", True)])
async def test_a_member_skips_a_batch_that_expired_in_its_handler(
        tmp_path: Path, read: str, swallow: bool) -> None:
    wh = table_of(tmp_path, commits=1)
    handler = Holding(read, swallow)
    async with GroupMember(member_config(wh, tmp_path, "skip")) as member:
        run = await hold_and_expire(wh, member, handler)
        for _ in range(600):
            if member.shard_positions() == {0: 5}:
                break
            await asyncio.sleep(0.05)
        assert not run.done(), run.exception() if run.done() else None
        assert sorted(handler.ids) == list(range(30, 40))  # snapshot 4, after the gap
        assert handler.calls == [2, 4]                       # the lost batch once: no retry
        assert member.stats.skipped_snapshots == 2           # snapshots 2 and 3, counted once
        assert member.stats.handler_errors == 0
        assert member.shard_positions() == {0: 5}
        await member.stop()
        run.cancel()
    skips = [e for e in map(json.loads, (tmp_path / "history.jsonl").read_text().splitlines())
             if e["event"] == "skip"]
    assert [(e["shards"], e["first"], e["earliest"]) for e in skips] == [([0], 2, 4)]


@pytest.mark.asyncio
@pytest.mark.parametrize("on_data_loss", ["fail", "skip"])
async def test_a_held_full_scan_whose_snapshot_expired(tmp_path: Path, on_data_loss: str) -> None:
    """The pinned full scan of snapshot 1 is held while a compaction (2)
    rewrites its files and snapshot 1 expires (the old files deleted, as
    Paimon's expiry does): ``fail`` stops with the full-scan line, ``skip``
    scans the earliest retained snapshot in full instead."""
    wh = table_of(tmp_path, commits=1)
    handler = Holding("to_arrow", hold_at=1)
    async with GroupMember(member_config(wh, tmp_path, on_data_loss, "latest-full")) as member:
        run = asyncio.create_task(member.run(handler))
        assert await asyncio.to_thread(handler.held.wait, 30)
        assert compact(wh, "db.t") == 2
        write_rows(wh, "db.t", range(10, 20))  # 3
        for path in handler.files:
            os.remove(path)
        expire_snapshots(wh, "db.t", keep_from=2)
        handler.go.set()
        if on_data_loss == "fail":
            with pytest.raises(SnapshotExpired, match=r"^shard 0: snapshot 1 of table db\.t, "
                               r"whose full scan was still to be delivered, expired \(earliest "
                               r"retained: 2\): their rows are lost to group g"):
                await asyncio.wait_for(run, 30)
            assert handler.calls == [1]
            return
        for _ in range(600):
            if sorted(handler.ids) == list(range(20)):
                break
            await asyncio.sleep(0.05)
        assert sorted(handler.ids) == list(range(20)), handler.ids  # nothing lost of the table
        assert handler.calls[:2] == [1, 2]  # the lost batch once, then the full scan of 2
        await member.stop()
        run.cancel()


@pytest.mark.asyncio
async def test_an_iterating_member_skips_when_its_loop_goes_on(tmp_path: Path) -> None:
    """``async for`` over ``batches()``: the body gets BatchExpired from its
    read; going on to the next batch lets the member skip (``skip``)."""
    wh = table_of(tmp_path, commits=1)
    async with GroupMember(member_config(wh, tmp_path, "skip")) as member:
        batches = member.batches()
        next_batch = asyncio.ensure_future(batches.__anext__())
        await pinned_then_written(wh, member)
        batch = await asyncio.wait_for(next_batch, 30)
        assert batch.first_snapshot == 2
        await expire_held(wh, member, [f.file_path for s in batch.splits for f in s.files])
        with pytest.raises(SnapshotExpired):
            batch.to_arrow()
        batch = await asyncio.wait_for(batches.__anext__(), 30)
        assert batch.first_snapshot == 4
        assert sorted(batch.to_arrow().column("id").to_pylist()) == list(range(30, 40))
        assert member.stats.skipped_snapshots == 2
        await batches.aclose()


@pytest.mark.asyncio
async def test_a_member_stops_with_the_data_loss_line(tmp_path: Path) -> None:
    wh = table_of(tmp_path, commits=1)
    handler = Holding("iter_batches")
    async with GroupMember(member_config(wh, tmp_path, "fail")) as member:
        run = await hold_and_expire(wh, member, handler)
        with pytest.raises(SnapshotExpired) as caught:
            await asyncio.wait_for(run, 30)
        assert handler.calls == [2]
        assert member.shard_positions() == {0: 2}  # nothing committed past the gap
    line = str(caught.value)
    assert line.startswith("shard 0: snapshots 2..3 of table db.t expired before they were "
                           "read (earliest retained: 4): their rows are lost to group g, so "
                           "reading stops and nothing is committed past them"), line
    assert line.endswith(f"paimon-group reset --group g --warehouse {wh} --table db.t "
                         "--coordinator memory://lost-" + line.split("memory://lost-")[1])
    assert "--to-earliest --shard 0 --execute" in line


@pytest.mark.asyncio
@pytest.mark.usefixtures("quick_checks")
async def test_a_member_stops_on_a_missing_file_of_a_retained_snapshot(tmp_path: Path) -> None:
    wh = table_of(tmp_path, commits=1)
    handler = Holding("to_arrow")
    async with GroupMember(member_config(wh, tmp_path, "skip")) as member:
        run = asyncio.create_task(member.run(handler))
        for _ in range(600):
            if member.shard_positions().get(0) == 2:
                break
            await asyncio.sleep(0.05)
        write_rows(wh, "db.t", range(10, 20))
        assert await asyncio.to_thread(handler.held.wait, 30)
        for path in handler.files:
            os.remove(path)
        handler.go.set()
        with pytest.raises(DataFileMissing) as caught:
            await asyncio.wait_for(run, 30)
        assert handler.calls == [2]  # not retried
    assert "is missing although snapshot 2 is still retained" in str(caught.value)
    assert any(p in str(caught.value) for p in handler.files)


# -- the Spark source's executors --------------------------------------------


def pieces_of(wh: str, snapshots: list[int]) -> list[Any]:
    from paimon_group.spark.source.offsets import Piece

    planner = ShardedTable.open(wh, "db.t").planner(1)
    pieces = []
    for n in snapshots:
        step = planner.plan_next([0], n)
        assert step is not None
        pieces.append(Piece(n, step.kind.value, list(step.splits[0])))
    return pieces


def read_pieces(wh: str, pieces: list[Any], **options: str) -> list[int]:
    from paimon_group.spark.source.options import SourceOptions
    from paimon_group.spark.source.source import ShardPartition, read_partition

    parsed = SourceOptions.parse({"group": "g", "warehouse": wh, "table": "db.t", **options})
    return [i for b in read_partition(parsed, ShardPartition(0, 1, pieces))
            for i in b.column("id").to_pylist()]


@pytest.mark.spark
def test_an_executor_stops_or_skips_a_piece_whose_snapshot_expired(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    wh = table_of(tmp_path)
    pieces = pieces_of(wh, [2, 3])
    for split in pieces[0].splits:
        for f in split.files:
            os.remove(f.file_path)
    expire_snapshots(wh, "db.t", keep_from=3)
    with pytest.raises(SnapshotExpired) as caught:
        read_pieces(wh, pieces)
    assert str(caught.value).startswith(
        "shard 0: snapshot 2 of table db.t expired before they were read (earliest retained: "
        "3): their rows are lost to the query, so it stops (option failOnDataLoss=false skips "
        "such gaps)")
    assert sorted(read_pieces(wh, pieces, failOnDataLoss="false")) == list(range(20, 30))
    assert "shard 0: snapshot 2 of table db.t expired before they were read (earliest " \
        "retained: 3): skipping its rows in this micro-batch (failOnDataLoss=false)" in caplog.text


@pytest.mark.spark
@pytest.mark.usefixtures("quick_checks")
def test_an_executor_stops_on_a_missing_file_of_a_retained_snapshot(tmp_path: Path) -> None:
    wh = table_of(tmp_path)
    pieces = pieces_of(wh, [2])
    for split in pieces[0].splits:
        for f in split.files:
            os.remove(f.file_path)
    with pytest.raises(DataFileMissing, match="is missing although snapshot 2 is still "
                       "retained"):
        read_pieces(wh, pieces, failOnDataLoss="false")
