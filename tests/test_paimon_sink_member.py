"""The Paimon sink inside real members: a member whose batch went into the
target but whose position was never committed (it hung, then was stopped),
and the next owner, which is delivered the batch again (planned anew, over a
longer range): the sink finds it in the target, the member commits the
position the target holds and reads on from there. Every source row is in
the target once. Real pypaimon tables, the embedded SQLite coordinator."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from click.testing import CliRunner
from rich.console import Console

from paimon_group import GroupMember, MemberConfig
from paimon_group.cli import main
from paimon_group.errors import AlreadyWritten
from paimon_group.ops.render import describe_renderable
from paimon_group.reading.batch import ShardBatch
from paimon_group.sink import PaimonSink
from tests.support.tables import (
    _create,
    catalog,
    delete_rows,
    make_pk_table,
    open_table,
    write_rows,
)
from tests.support.waiting import eventually as _until

OUT = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("v", pa.int64())])


def _config(wh: str, coordinator: str, member: str) -> MemberConfig:
    return MemberConfig(group="out", warehouse=wh, table="db.src", coordinator=coordinator,
                        member_id=member, session_timeout_s=3, poll_interval_ms=50,
                        start="earliest")


def _target_ids(wh: str) -> list[int]:
    table = open_table(wh, "db.out")
    builder = table.new_read_builder()
    rows = builder.new_read().to_arrow(builder.new_scan().plan().splits())
    return sorted(rows.column("id").to_pylist())


@pytest.mark.asyncio
async def test_a_batch_in_the_target_but_not_in_the_coordinator_is_not_written_again(
        tmp_path: Path) -> None:
    wh = str(tmp_path / "wh")
    make_pk_table(wh, "db.src", buckets=2)
    for k in range(3):
        write_rows(wh, "db.src", range(10 * k, 10 * k + 10))
    _create(wh, "db.out", OUT, primary_keys=[], options={"bucket": "-1"})
    coordinator = f"sqlite://{tmp_path}/coord.sqlite"
    sink = PaimonSink(wh, "db.out", commit_interval_s=0.2)
    hung, release = threading.Event(), threading.Event()

    def hangs_after_shard_0(batch: ShardBatch) -> None:
        sink.write(batch.to_arrow().select(["id", "v"]), batch)
        if batch.shard == 0 and not hung.is_set():
            hung.set()   # in the target; the member never commits its position
            release.wait(30)

    def writes(batch: ShardBatch) -> None:
        sink.write(batch.to_arrow().select(["id", "v"]), batch)

    a = GroupMember(_config(wh, coordinator, "a"))
    await a.start()
    run_a = asyncio.ensure_future(a.run(hangs_after_shard_0))
    await _until(hung.is_set)
    write_rows(wh, "db.src", range(30, 40))   # the next owner's full scan would be longer
    await a.stop(timeout=0.5)                 # the hung batch is abandoned, not committed
    release.set()
    await asyncio.wait_for(asyncio.gather(run_a, return_exceptions=True), 10)
    marks = sink.marks("out")
    assert 0 in marks

    async with GroupMember(_config(wh, coordinator, "b")) as b:
        run_b = asyncio.ensure_future(b.run(writes))
        write_rows(wh, "db.src", range(40, 50))
        await _until(lambda: _target_ids(wh) == list(range(50)))
        await asyncio.sleep(1.0)  # nothing more comes
        assert _target_ids(wh) == list(range(50))
        positions = b.shard_positions()
        assert positions[0] is not None and positions[0] >= marks[0].next_snapshot
        report = await asyncio.to_thread(_describe, wh, coordinator)
        run_b.cancel()
    sink.close()
    # describe shows each shard's position in the target beside the coordinator's.
    [shown] = report["sinks"]
    assert (shown["kind"], shown["table"]) == ("paimon", "db.out")
    target = {int(s): n for s, n in shown["positions"].items()}
    assert target == {s: m.next_snapshot for s, m in sink.marks("out").items()}
    assert sorted(target) == [0, 1]
    for row in report["shards"]:
        assert row["next_snapshot"] >= target[row["shard"]]
    console = Console(record=True, width=120)
    console.print(describe_renderable(report))
    shown_text = console.export_text()
    assert "paimon db.out" in shown_text and "coordinator" in shown_text


def _describe(wh: str, coordinator: str) -> dict[str, Any]:
    result = CliRunner().invoke(main, ["describe", "--group", "out", "--warehouse", wh,
                                       "--coordinator", coordinator, "--json"])
    assert result.exit_code == 0, result.output
    report: dict[str, Any] = json.loads(result.output)
    return report


CHANGES_PK = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("v", pa.int64()),
                        pa.field("seq", pa.int64()), pa.field("kind", pa.string())])
CHANGES_LOG = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("v", pa.int64()),
                         pa.field("_row_kind", pa.string())])


def _kinds_config(wh: str, coordinator: str, group: str, include_row_kind: bool
                  ) -> MemberConfig:
    return MemberConfig(group=group, warehouse=wh, table="db.src", coordinator=coordinator,
                        member_id=f"{group}-1", session_timeout_s=3, poll_interval_ms=50,
                        start="earliest", include_row_kind=include_row_kind)


def _held(wh: str, name: str, *columns: str) -> list[tuple[Any, ...]]:
    table = open_table(wh, name)
    builder = table.new_read_builder()
    rows = builder.new_read().to_arrow(builder.new_scan().plan().splits())
    return sorted(zip(*(rows.column(c).to_pylist() for c in columns), strict=True))


@pytest.mark.asyncio
@pytest.mark.parametrize("reader", ["arrow", "pypaimon"])
async def test_deletes_and_updates_of_a_primary_key_source_reach_both_targets(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reader: str) -> None:
    """A primary-key source receives inserts, updates and deletes while two
    groups (row kinds requested) write it through sinks: the primary-key
    target (``'rowkind.field'``) holds what the source holds, its deleted
    keys gone; the append target records every change once, with its kind.
    Both read paths deliver the kinds."""
    monkeypatch.setenv("PAIMON_GROUP_ARROW_READER", "1" if reader == "arrow" else "0")
    wh = str(tmp_path / "wh")
    make_pk_table(wh, "db.src", buckets=2, row_kind_field=True)
    write_rows(wh, "db.src", range(10), v=1)
    _create(wh, "db.pk", CHANGES_PK, primary_keys=["id"],
            options={"bucket": "2", "sequence.field": "seq", "rowkind.field": "kind"})
    _create(wh, "db.log", CHANGES_LOG, primary_keys=[], options={"bucket": "-1"})
    coordinator = f"sqlite://{tmp_path}/coord.sqlite"
    sinks = {"pk": PaimonSink(wh, "db.pk", commit_interval_s=0.1),
             "log": PaimonSink(wh, "db.log", commit_interval_s=0.1)}

    def handler(group: str) -> Any:
        def handle(batch: ShardBatch) -> None:
            sinks[group].write(batch.to_arrow().select(["_row_kind", "id", "v"]), batch)
        return handle

    members = [GroupMember(_kinds_config(wh, coordinator, g, True)) for g in sinks]
    runs = []
    for member, group in zip(members, sinks, strict=True):
        await member.start()
        runs.append(asyncio.ensure_future(member.run(handler(group))))
    try:
        await _until(lambda: len(_held(wh, "db.log", "id")) == 10)
        write_rows(wh, "db.src", range(5), v=2, op="+U")
        delete_rows(wh, "db.src", [0, 1, 7], v=2)
        write_rows(wh, "db.src", [7], v=3)             # deleted, then inserted again
        source = _held(wh, "db.src", "id", "v")
        assert source == [(2, 2), (3, 2), (4, 2), (5, 1), (6, 1), (7, 3), (8, 1), (9, 1)]
        await _until(lambda: _held(wh, "db.pk", "id", "v") == source)
        await _until(lambda: len(_held(wh, "db.log", "id")) == 10 + 5 + 3 + 1)
        await asyncio.sleep(0.5)  # nothing more comes
        assert _held(wh, "db.pk", "id", "v") == source
        assert _held(wh, "db.log", "id", "v", "_row_kind") == sorted(
            [(i, 1, "+I") for i in range(10)] + [(i, 2, "+U") for i in range(5)]
            + [(0, 2, "-D"), (1, 2, "-D"), (7, 2, "-D"), (7, 3, "+I")])
    finally:
        for member in members:
            await member.stop(timeout=5)
        await asyncio.gather(*runs, return_exceptions=True)
        for sink in sinks.values():
            sink.close()


@pytest.mark.asyncio
@pytest.mark.parametrize("reader", ["arrow", "pypaimon"])
async def test_deletes_read_without_row_kinds_are_refused_not_written_as_inserts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reader: str) -> None:
    """A group that did not request row kinds reads a delete: the batch
    counts it (``retractions``, on both read paths), and the sink refuses
    the output (which cannot say it is a delete) in one line saying to
    request row kinds and keep ``_row_kind``; the deleted key was not
    written as an insert."""
    monkeypatch.setenv("PAIMON_GROUP_ARROW_READER", "1" if reader == "arrow" else "0")
    wh = str(tmp_path / "wh")
    make_pk_table(wh, "db.src", buckets=2, row_kind_field=True)
    write_rows(wh, "db.src", range(4), v=1)
    _create(wh, "db.log", OUT, primary_keys=[], options={"bucket": "-1"})
    coordinator = f"sqlite://{tmp_path}/coord.sqlite"
    sink = PaimonSink(wh, "db.log", commit_interval_s=0.1)
    refused: list[tuple[int, str]] = []

    def handle(batch: ShardBatch) -> None:
        try:
            sink.write(batch.to_arrow().select(["id", "v"]), batch)
        except Exception as err:
            refused.append((batch.retractions, str(err)))
            raise

    member = GroupMember(_kinds_config(wh, coordinator, "plain", False))
    await member.start()
    run = asyncio.ensure_future(member.run(handle))
    try:
        await _until(lambda: len(_held(wh, "db.log", "id")) == 4)
        delete_rows(wh, "db.src", [2], v=2)
        await _until(lambda: bool(refused))
    finally:
        await member.stop(timeout=5)
        await asyncio.gather(run, return_exceptions=True)
        sink.close()
    retracted, line = refused[0]
    assert retracted == 1
    assert "\n" not in line and "read 1 deletes or update-befores" in line, line
    assert "--include-row-kind" in line and "keep the _row_kind column" in line, line
    assert _held(wh, "db.log", "id", "v") == [(i, 1) for i in range(4)]
PK_OUT = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("v", pa.int64()),
                    pa.field("seq", pa.int64())])


def _delete_group(wh: str, coordinator: str) -> None:
    result = CliRunner().invoke(main, ["delete", "--group", "out", "--warehouse", wh,
                                       "--coordinator", coordinator])
    assert result.exit_code == 0, result.output


async def _run_until(member: GroupMember, handle: Any, check: object,
                     timeout: float = 60) -> None:
    """Run ``member`` with ``handle`` until ``check()``, then stop it."""
    run = asyncio.ensure_future(member.run(handle))
    try:
        await _until(check, "the condition", timeout)
    finally:
        run.cancel()
        await asyncio.gather(run, return_exceptions=True)


@pytest.mark.asyncio
async def test_a_source_table_dropped_and_re_created_is_written_whole(tmp_path: Path) -> None:
    """The group ran into the target; the source table was dropped and
    re-created with fewer snapshots, and the group deleted and started again
    (docs/operations.md): the target's marks hold positions of the old table,
    past the new table's latest snapshot. Every row of the new table lands
    in the target."""
    wh = str(tmp_path / "wh")
    make_pk_table(wh, "db.src", buckets=2)
    for k in range(5):
        write_rows(wh, "db.src", range(10 * k, 10 * k + 10))
    _create(wh, "db.out", OUT, primary_keys=[], options={"bucket": "-1"})
    coordinator = f"sqlite://{tmp_path}/coord.sqlite"

    def writes(sink: PaimonSink) -> Any:
        def handle(batch: ShardBatch) -> None:
            sink.write(batch.to_arrow().select(["id", "v"]), batch)
        return handle

    with PaimonSink(wh, "db.out", commit_interval_s=0.2) as sink:
        async with GroupMember(_config(wh, coordinator, "a")) as a:
            await _run_until(a, writes(sink), lambda: _target_ids(wh) == list(range(50)))
        assert {m.next_snapshot for m in sink.marks("out").values()} == {6}
    catalog(wh).drop_table("db.src")
    await asyncio.sleep(0.01)  # another creation time: another table identity
    make_pk_table(wh, "db.src", buckets=2)
    for k in range(2):
        write_rows(wh, "db.src", range(100 + 10 * k, 110 + 10 * k))
    await asyncio.to_thread(_delete_group, wh, coordinator)
    expected = [*range(50), *range(100, 120)]
    with PaimonSink(wh, "db.out", commit_interval_s=0.2) as sink:
        async with GroupMember(_config(wh, coordinator, "b")) as b:
            await _run_until(b, writes(sink), lambda: _target_ids(wh) == expected, timeout=30)
            assert all(p is not None and p <= 3 for p in b.shard_positions().values())
    assert _target_ids(wh) == expected


@pytest.mark.asyncio
async def test_a_group_started_again_with_another_shard_count_writes_what_a_shard_lagged(
        tmp_path: Path) -> None:
    """Shard 1 lagged behind shard 0 when the group stopped; the group is
    deleted and started again with one shard, from the earliest snapshot: its
    shard 0 holds the buckets of both former shards, and the former shard 0's
    mark does not hold for it. Every source row lands in the target."""
    wh = str(tmp_path / "wh")
    make_pk_table(wh, "db.src", buckets=2)
    for k in range(3):
        write_rows(wh, "db.src", range(10 * k, 10 * k + 10))
    _create(wh, "db.out", PK_OUT, primary_keys=["id"],
            options={"bucket": "2", "sequence.field": "seq"})
    coordinator = f"sqlite://{tmp_path}/coord.sqlite"
    lag = threading.Event()

    def lags(sink: PaimonSink) -> Any:
        def handle(batch: ShardBatch) -> None:
            if batch.shard == 1 and lag.is_set():
                raise RuntimeError("shard 1 lags")
            sink.write(batch.to_arrow().select(["id", "v"]), batch)
        return handle

    config = dataclasses.replace(_config(wh, coordinator, "a"), shards=2,
                                 max_handler_attempts=1)
    with PaimonSink(wh, "db.out", commit_interval_s=0.2) as sink:
        async with GroupMember(config) as a:
            run = asyncio.ensure_future(a.run(lags(sink)))
            await _until(lambda: _target_ids(wh) == list(range(30)))
            lag.set()
            for k in range(3, 6):
                write_rows(wh, "db.src", range(10 * k, 10 * k + 10))
            await asyncio.gather(run, return_exceptions=True)  # failed on shard 1
        marks = sink.marks("out")
        assert marks[1].next_snapshot < marks[0].next_snapshot, marks
    assert _target_ids(wh) != list(range(60))  # shard 1's rows of snapshots 4-6 are not in
    await asyncio.to_thread(_delete_group, wh, coordinator)
    with PaimonSink(wh, "db.out", commit_interval_s=0.2) as sink:
        config = dataclasses.replace(_config(wh, coordinator, "b"), shards=1)
        async with GroupMember(config) as b:
            await _run_until(b, lags(sink), lambda: _target_ids(wh) == list(range(60)),
                             timeout=30)
    assert _target_ids(wh) == list(range(60))


@pytest.mark.asyncio
async def test_a_sink_holding_a_batch_past_the_table_s_latest_snapshot_stops_the_member(
        tmp_path: Path) -> None:
    """A sink that says it holds the batch up to a snapshot the table has not
    reached (marks of another table): the member stops in one line and
    commits no position past the table's latest snapshot."""
    wh = str(tmp_path / "wh")
    make_pk_table(wh, "db.src", buckets=2)
    for k in range(2):
        write_rows(wh, "db.src", range(10 * k, 10 * k + 10))
    coordinator = f"sqlite://{tmp_path}/coord.sqlite"

    def held_far_ahead(batch: ShardBatch) -> None:
        raise AlreadyWritten("held", shard=batch.shard, next_snapshot=40)

    async with GroupMember(_config(wh, coordinator, "a")) as a:
        with pytest.raises(AlreadyWritten, match=r"past the table's latest snapshot 2") as err:
            await asyncio.wait_for(a.run(held_far_ahead), 30)
        assert "\n" not in str(err.value)
        assert all(p is None or p <= 3 for p in a.shard_positions().values())


@pytest.mark.asyncio
async def test_a_former_and_a_new_owner_of_a_shard_in_one_sink_commit_write_it_once(
        tmp_path: Path) -> None:
    """Two members of one process share a sink. The first queues its batch
    in the sink and leaves with that write under way; the second takes the
    shard and is delivered the same batch, and both are in the sink's next
    commit: the later one is judged against the mark the earlier leaves, so
    the batch is in the target once."""
    wh = str(tmp_path / "wh")
    make_pk_table(wh, "db.src", buckets=2)
    for k in range(3):
        write_rows(wh, "db.src", range(10 * k, 10 * k + 10))
    _create(wh, "db.out", OUT, primary_keys=[], options={"bucket": "-1"})
    coordinator = f"sqlite://{tmp_path}/coord.sqlite"
    sink = PaimonSink(wh, "db.out", commit_interval_s=0.2)
    both, queued = threading.Event(), threading.Event()
    wait_due = sink._wait_due

    def gathers_both() -> None:  # the committer's wait: until both owners queued
        while not both.is_set():
            if len(sink._queue) >= 2:
                both.set()
                break
            if sink._queue:
                queued.set()
            sink._cond.wait(0.05)
        wait_due()

    sink._wait_due = gathers_both  # type: ignore[method-assign]
    delivered: list[ShardBatch] = []

    def writes(batch: ShardBatch) -> None:
        delivered.append(batch)
        sink.write(batch.to_arrow().select(["id", "v"]), batch)

    a = GroupMember(dataclasses.replace(_config(wh, coordinator, "a"), shards=1))
    await a.start()
    run_a = asyncio.ensure_future(a.run(writes))
    await _until(queued.is_set)
    await a.stop(timeout=0.5)   # its write stays under way, queued in the sink
    async with GroupMember(dataclasses.replace(_config(wh, coordinator, "b"),
                                               shards=1)) as b:
        run_b = asyncio.ensure_future(b.run(writes))
        await _until(lambda: (b.shard_positions().get(0) or 0) >= 4, limit_s=60)
        run_b.cancel()
        await asyncio.gather(run_b, return_exceptions=True)
    await asyncio.wait_for(asyncio.gather(run_a, return_exceptions=True), 10)
    # The first batch: the former owner's went in, the new owner's was found
    # there when its commit judged it after the former's (the sink says so on
    # the batch: sink_holds); the later ones only the new owner read.
    first = [b for b in delivered if b.first_snapshot == delivered[0].first_snapshot]
    assert [(b.member_id, b.sink_holds is not None) for b in first] == [
        ("a", False), ("b", True)], delivered
    assert _target_ids(wh) == list(range(30))
    sink.close()
