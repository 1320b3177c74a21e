"""Operating a group: describe, list, reset, delete and members remove, through the
CLI, against the embedded SQLite coordinator and a real etcd server.

Members are driven step by step through the group protocol
(:class:`ProtocolMember`: real coordinator sessions, real member and owner
keys, real fenced commits), so each test puts the group in exactly the state
it needs. Real ``paimon-group run`` processes are in ``test_ops_process.py``.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from click.testing import CliRunner, Result

from coordinators import ConnectOptions, Coordinator, open_coordinator
from paimon_group.cli import main
from paimon_group.protocol.group import GroupClient
from paimon_group.protocol.names import GroupKeys
from paimon_group.protocol.records import MemberInfo
from paimon_group.reading.mirror import ConsumerMirror
from paimon_group.reading.table import ShardedTable
from tests.support.tables import (
    bucket_of,
    expire_snapshots,
    make_pk_table,
    open_table,
    write_rows,
)

TABLE = "db.t"
BUCKETS = 4
SHARDS = 4
ROWS_PER_SNAPSHOT = 10
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def warehouse(tmp_path: Path) -> str:
    """A table with 5 snapshots of 10 rows each (ids 0..49)."""
    wh = str(tmp_path / "wh")
    make_pk_table(wh, TABLE, buckets=BUCKETS)
    for i in range(5):
        write_rows(wh, TABLE, range(i * ROWS_PER_SNAPSHOT, (i + 1) * ROWS_PER_SNAPSHOT))
    return wh


class ProtocolMember:
    """A member driven by hand through the group protocol, on its own session."""

    def __init__(self, coord: Coordinator, group: str, member_id: str) -> None:
        self.coord = coord
        self.client = GroupClient(coord, group)
        self.member_id = member_id
        self.epochs: dict[int, int] = {}

    async def join(self, shards: list[int], *, lead: bool = True) -> None:
        await self.client.ensure_meta(SHARDS, TABLE)
        await self.client.register_or_fail(MemberInfo(
            member_id=self.member_id, host="host-" + self.member_id, pid=4242,
            version="9.9.9", started_at=time.time(), session=self.coord.session.id))
        if lead:
            epoch = await self.client.try_lead(self.member_id)
            assert epoch is not None
            previous, version = await self.client.read_assignment()
            published = await self.client.publish(
                {self.member_id: shards}, leader=self.member_id, leader_epoch=epoch,
                previous=previous, previous_version=version)
            assert published is not None
        for shard in shards:
            epoch = await self.client.acquire(shard, self.member_id, generation=1)
            assert epoch is not None
            self.epochs[shard] = epoch

    async def commit(self, positions: dict[int, int]) -> bool:
        return await self.client.commit_positions(
            {s: (self.epochs[s], n) for s, n in positions.items()}, self.member_id)


@pytest_asyncio.fixture
async def sessions(coordinator: str) -> AsyncIterator[list[Coordinator]]:
    """Open coordinators (member sessions) of the test; all closed at the end."""
    opened: list[Coordinator] = []
    yield opened
    for coord in reversed(opened):
        await coord.close()


async def member(sessions: list[Coordinator], coordinator: str, group: str,
                 member_id: str, shards: list[int], *, lead: bool = True) -> ProtocolMember:
    coord = open_coordinator(coordinator, ConnectOptions(session_timeout_s=30.0))
    await coord.connect()
    sessions.append(coord)
    m = ProtocolMember(coord, group, member_id)
    await m.join(shards, lead=lead)
    return m


async def stopped_group(coordinator: str, group: str, positions: dict[int, int]) -> None:
    """A group whose member committed ``positions`` and left (no live key remains)."""
    async with open_coordinator(coordinator) as coord:
        m = ProtocolMember(coord, group, "gone-member")
        await m.join(sorted(positions))
        assert await m.commit(positions)
        for shard, epoch in m.epochs.items():
            assert await m.client.release(shard, epoch)


async def cli(*args: str) -> Result:
    """Run the CLI in a worker thread (our sessions keep heartbeating meanwhile)."""
    def invoke() -> Result:
        return CliRunner().invoke(main, list(args), catch_exceptions=False)

    return await asyncio.to_thread(invoke)


def common(coordinator: str, warehouse: str, group: str = "g") -> list[str]:
    return ["--group", group, "--warehouse", warehouse, "--table", TABLE,
            "--coordinator", coordinator]


def one_error_line(result: Result) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


def rows_per_shard(warehouse: str, snapshots: range) -> dict[int, int]:
    """Rows each shard gets from ``snapshots`` (snapshot i holds ids 10(i-1)..10i-1)."""
    table = open_table(warehouse, TABLE)
    out = {s: 0 for s in range(SHARDS)}
    for snapshot in snapshots:
        for row_id in range((snapshot - 1) * ROWS_PER_SNAPSHOT, snapshot * ROWS_PER_SNAPSHOT):
            out[bucket_of(table, row_id) % SHARDS] += 1
    return out


async def read_positions(coordinator: str, group: str = "g") -> dict[int, int]:
    async with open_coordinator(coordinator) as coord:
        positions = await GroupClient(coord, group).positions()
    return {s: p.next_snapshot for s, p in positions.items()}


def consumer_files(warehouse: str, group: str = "g") -> dict[int, int]:
    table = ShardedTable.open(warehouse, TABLE)
    return ConsumerMirror(table.table.file_io, table.table_path, group).all()


# -- describe ------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_describe_reports_owners_lag_in_snapshots_time_and_rows(
    coordinator: str, warehouse: str, sessions: list[Coordinator]
) -> None:
    m1 = await member(sessions, coordinator, "g", "m1", [0, 1, 2, 3])
    # Shard 0 read everything, 1 stops before snapshot 4, 2 before 2; 3 never committed.
    assert await m1.commit({0: 6, 1: 4, 2: 2})
    before = time.time()
    result = await cli("describe", *common(coordinator, warehouse), "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    for key in ("group", "generation", "leader", "latest_snapshot", "members", "shards"):
        assert key in report
    assert report["group"] == "g"
    assert report["latest_snapshot"] == 5
    assert report["leader"] == "m1"
    assert report["state"] == "stable"
    shards = {s["shard"]: s for s in report["shards"]}
    expected_rows = {1: rows_per_shard(warehouse, range(4, 6))[1],
                     2: rows_per_shard(warehouse, range(2, 6))[2]}
    assert shards[0]["lag_snapshots"] == 0 and shards[0]["lag_seconds"] == 0
    assert shards[0]["unread_rows"] == 0
    assert shards[1]["lag_snapshots"] == 2
    assert shards[1]["unread_rows"] == expected_rows[1]
    assert shards[2]["lag_snapshots"] == 4
    assert shards[2]["unread_rows"] == expected_rows[2]
    assert shards[2]["unread_rows_complete"] is True
    # Lag in time: the age of the oldest unread snapshot's commit.
    table = ShardedTable.open(warehouse, TABLE)
    commit_2 = (table.snapshot_commit_time_ms(2) or 0) / 1000.0
    commit_4 = (table.snapshot_commit_time_ms(4) or 0) / 1000.0
    for shard, commit in ((2, commit_2), (1, commit_4)):
        assert before - commit <= shards[shard]["lag_seconds"] <= report["described_at"] - commit
    assert shards[2]["lag_seconds"] >= shards[1]["lag_seconds"]
    assert shards[3]["next_snapshot"] is None and shards[3]["lag_snapshots"] is None
    for s in shards.values():
        assert s["owner"] == "m1" and s["epoch"] == m1.epochs[s["shard"]]
        assert s["consumer_id"] == f"pg-g-shard-{s['shard']}"
    assert shards[1]["last_commit"] is not None and shards[1]["last_commit_by"] == "m1"
    (m,) = report["members"]
    assert m["member_id"] == "m1" and m["host"] == "host-m1" and m["pid"] == 4242
    assert m["version"] == "9.9.9" and m["owned_shards"] == [0, 1, 2, 3]
    assert m["session_state"] == "live" and m["leader"] is True
    assert report["total_lag_snapshots"] == 6
    assert report["max_lag_snapshots"] == 4   # the slowest shard, not a sum over shards
    assert report["total_unread_rows"] == expected_rows[1] + expected_rows[2]

    # The table for people shows the same numbers.
    result = await cli("describe", *common(coordinator, warehouse))
    assert result.exit_code == 0, result.output
    assert "m1 (leader)" in result.stdout and "behind" in result.stdout


@pytest.mark.asyncio
async def test_describe_group_states(
    coordinator: str, warehouse: str, sessions: list[Coordinator]
) -> None:
    await stopped_group(coordinator, "g", {0: 6, 1: 6, 2: 6, 3: 6})
    report = json.loads((await cli("describe", *common(coordinator, warehouse), "--json")).stdout)
    assert report["state"] == "empty" and report["members"] == []
    await member(sessions, coordinator, "g", "m1", [0, 1, 2, 3])
    report = json.loads((await cli("describe", *common(coordinator, warehouse), "--json")).stdout)
    assert report["state"] == "stable"
    # A second member joined, the assignment does not name it yet: rebalancing.
    await member(sessions, coordinator, "g", "m2", [], lead=False)
    report = json.loads((await cli("describe", *common(coordinator, warehouse), "--json")).stdout)
    assert report["state"] == "rebalancing"
    assert [m["member_id"] for m in report["members"]] == ["m1", "m2"]


@pytest.mark.asyncio
async def test_describe_flags_positions_older_than_the_earliest_snapshot(
    coordinator: str, warehouse: str
) -> None:
    await stopped_group(coordinator, "g", {0: 2, 1: 6, 2: 6, 3: 6})
    expire_snapshots(warehouse, TABLE, keep_from=4)
    report = json.loads((await cli("describe", *common(coordinator, warehouse), "--json")).stdout)
    shard0 = report["shards"][0]
    assert shard0["expired"] is True and report["expired_shards"] == [0]
    assert shard0["unread_rows_complete"] is False
    text = (await cli("describe", *common(coordinator, warehouse))).stdout
    assert "EXPIRED" in text


@pytest.mark.asyncio
async def test_describe_of_an_unknown_group(coordinator: str, warehouse: str) -> None:
    await stopped_group(coordinator, "other", {0: 1})
    """As kafka-consumer-groups --describe: a missing group is an error (exit 2),
    with --table or without; --json still prints the report saying so."""
    result = await cli("describe", *common(coordinator, warehouse, "nope"), "--json")
    assert result.exit_code == 2
    assert json.loads(result.stdout)["exists"] is False
    result = await cli("describe", *common(coordinator, warehouse, "nope"))
    assert result.exit_code == 2 and "does not exist" in one_error_line(result)


# -- list ------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_list_shows_groups_with_members_and_total_lag(
    coordinator: str, warehouse: str, sessions: list[Coordinator]
) -> None:
    await stopped_group(coordinator, "alpha", {0: 1, 1: 6, 2: 6, 3: 4})
    m = await member(sessions, coordinator, "beta", "b1", [0, 1, 2, 3])
    assert await m.commit({0: 6, 1: 6, 2: 6, 3: 6})
    result = await cli("list", "--warehouse", warehouse, "--coordinator", coordinator, "--json")
    assert result.exit_code == 0, result.output
    groups = {g["group"]: g for g in json.loads(result.stdout)["groups"]}
    assert set(groups) == {"alpha", "beta"}
    assert groups["alpha"]["members"] == 0 and groups["alpha"]["state"] == "empty"
    assert groups["alpha"]["total_lag_snapshots"] == 5 + 2
    assert groups["alpha"]["max_lag_snapshots"] == 5
    assert groups["beta"]["members"] == 1 and groups["beta"]["total_lag_snapshots"] == 0
    assert groups["beta"]["table"] == TABLE and groups["beta"]["num_shards"] == SHARDS
    text = await cli("list", "--warehouse", warehouse, "--coordinator", coordinator)
    assert "alpha" in text.stdout and "beta" in text.stdout
    # Without a warehouse there is no table to measure lag against.
    result = await cli("list", "--coordinator", coordinator, "--json")
    groups = {g["group"]: g for g in json.loads(result.stdout)["groups"]}
    assert groups["alpha"]["total_lag_snapshots"] is None


def test_list_needs_a_coordinator(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["list"])
    assert result.exit_code == 2
    assert "--coordinator" in one_error_line(result)
    # A warehouse where no group ever ran has no embedded coordinator: say so,
    # do not create one.
    result = CliRunner().invoke(main, ["list", "--warehouse", str(tmp_path)])
    assert result.exit_code == 2 and "no coordinator" in one_error_line(result)
    assert not (tmp_path / ".paimon-group").exists()


# -- reset -------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_reset_prints_the_plan_and_changes_nothing_without_execute(
    coordinator: str, warehouse: str
) -> None:
    await stopped_group(coordinator, "g", {0: 6, 1: 6, 2: 5, 3: 6})
    before_files = consumer_files(warehouse)
    result = await cli("reset", *common(coordinator, warehouse), "--to-snapshot", "3", "--json")
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert plan["executed"] is False
    assert [(s["shard"], s["current"], s["new"]) for s in plan["shards"]] == [
        (0, 6, 3), (1, 6, 3), (2, 5, 3), (3, 6, 3)]
    assert await read_positions(coordinator) == {0: 6, 1: 6, 2: 5, 3: 6}
    assert consumer_files(warehouse) == before_files
    text = await cli("reset", *common(coordinator, warehouse), "--to-snapshot", "3")
    assert "dry run" in text.stdout and "--execute" in text.stdout


@pytest.mark.asyncio
async def test_reset_execute_writes_positions_and_consumer_files_together(
    coordinator: str, warehouse: str
) -> None:
    await stopped_group(coordinator, "g", {0: 6, 1: 6, 2: 5, 3: 6})
    result = await cli("reset", *common(coordinator, warehouse), "--to-snapshot", "3",
                       "--shard", "1", "--shard", "2", "--execute", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["executed"] is True
    assert await read_positions(coordinator) == {0: 6, 1: 3, 2: 3, 3: 6}
    files = consumer_files(warehouse)
    assert files[1] == 3 and files[2] == 3
    # Forward again: to the latest (skip everything unread).
    result = await cli("reset", *common(coordinator, warehouse), "--to-latest", "--execute")
    assert result.exit_code == 0, result.output
    assert "executed" in result.stdout
    assert await read_positions(coordinator) == {0: 6, 1: 6, 2: 6, 3: 6}
    assert consumer_files(warehouse) == {0: 6, 1: 6, 2: 6, 3: 6}


@pytest.mark.asyncio
async def test_reset_drops_a_pending_full_scan_even_at_the_same_next_snapshot(
    coordinator: str, warehouse: str
) -> None:
    """A shard pinned at a full scan of 1 (next 2), reset to snapshot 2: the
    full scan is dropped (as the data-loss lines' reset --to-earliest needs
    when the earliest retained snapshot follows an expired full scan)."""
    async with open_coordinator(coordinator) as coord:
        m = ProtocolMember(coord, "g", "gone-member")
        await m.join([0, 1, 2, 3])
        assert await m.client.commit_positions(
            {s: (e, 2) for s, e in m.epochs.items()}, m.member_id,
            full_scan=dict.fromkeys(m.epochs, 1))
        for shard, epoch in m.epochs.items():
            assert await m.client.release(shard, epoch)
    result = await cli("reset", *common(coordinator, warehouse), "--to-snapshot", "2",
                       "--shard", "0", "--execute", "--json")
    assert result.exit_code == 0, result.output
    note = json.loads(result.stdout)["shards"][0]["note"]
    assert note == "pending full scan of snapshot 1 dropped"
    async with open_coordinator(coordinator) as coord:
        positions = await GroupClient(coord, "g").positions()
    assert {s: (p.next_snapshot, p.full_scan) for s, p in positions.items()} == {
        0: (2, None), 1: (2, 1), 2: (2, 1), 3: (2, 1)}


@pytest.mark.asyncio
async def test_reset_targets(coordinator: str, warehouse: str) -> None:
    await stopped_group(coordinator, "g", {0: 6, 1: 4, 2: 2, 3: 6})
    table = ShardedTable.open(warehouse, TABLE)

    async def plan(*target: str) -> dict[int, tuple[int | None, str]]:
        result = await cli("reset", *common(coordinator, warehouse), *target, "--json")
        assert result.exit_code == 0, result.output
        return {s["shard"]: (s["new"], s["note"]) for s in json.loads(result.stdout)["shards"]}

    assert {s: n for s, (n, _) in (await plan("--to-earliest")).items()} == dict.fromkeys(
        range(4), 1)
    assert {s: n for s, (n, _) in (await plan("--to-latest")).items()} == dict.fromkeys(
        range(4), 6)
    # --shift-by moves each shard by N and clamps to what exists.
    shifted = await plan("--shift-by", "-3")
    assert {s: n for s, (n, _) in shifted.items()} == {0: 3, 1: 1, 2: 1, 3: 3}
    assert "clamped" in shifted[2][1]
    assert {s: n for s, (n, _) in (await plan("--shift-by", "2")).items()} == {
        0: 6, 1: 6, 2: 4, 3: 6}
    # A timestamp: the first snapshot committed at or after it.
    t3 = (table.snapshot_commit_time_ms(3) or 0) / 1000.0
    iso = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t3)) + f".{int(t3 * 1000) % 1000:03d}Z"
    assert {n for n, _ in (await plan("--to-timestamp", iso)).values()} == {3}


@pytest.mark.asyncio
async def test_reset_bad_input_is_one_line(coordinator: str, warehouse: str) -> None:
    await stopped_group(coordinator, "g", {0: 6, 1: 6, 2: 6, 3: 6})
    args = common(coordinator, warehouse)
    for bad, words in [
        (["--to-latest", "--to-earliest"], "exactly one"),
        ([], "exactly one"),
        (["--to-snapshot", "0"], "start at 1"),
        (["--to-snapshot", "9"], "at most 6"),
        (["--to-timestamp", "yesterday"], "ISO-8601"),
        (["--to-latest", "--shard", "4"], "shards 0..3"),
    ]:
        result = await cli("reset", *args, *bad)
        assert result.exit_code == 2, (bad, result.output)
        assert words in one_error_line(result)
    result = await cli("reset", *common(coordinator, warehouse, "nope"), "--to-latest")
    assert result.exit_code == 2 and "does not exist" in one_error_line(result)
    expire_snapshots(warehouse, TABLE, keep_from=3)
    result = await cli("reset", *args, "--to-snapshot", "2", "--execute")
    assert result.exit_code == 1 and "expired" in one_error_line(result)
    assert await read_positions(coordinator) == {0: 6, 1: 6, 2: 6, 3: 6}


@pytest.mark.asyncio
async def test_reset_is_refused_while_members_are_live(
    coordinator: str, warehouse: str, sessions: list[Coordinator]
) -> None:
    m1 = await member(sessions, coordinator, "g", "m1", [0, 1, 2, 3])
    assert await m1.commit({0: 6, 1: 6, 2: 6, 3: 6})
    files = consumer_files(warehouse)
    result = await cli("reset", *common(coordinator, warehouse), "--to-earliest", "--execute")
    assert result.exit_code == 1
    line = one_error_line(result)
    assert "live member" in line and "m1" in line and "--force" in line
    assert await read_positions(coordinator) == {0: 6, 1: 6, 2: 6, 3: 6}
    assert consumer_files(warehouse) == files
    # The plan alone (no --execute) is fine while members run.
    assert (await cli("reset", *common(coordinator, warehouse), "--to-earliest")).exit_code == 0


@pytest.mark.asyncio
async def test_reset_dry_run_says_what_execute_would_do(
    coordinator: str, warehouse: str, sessions: list[Coordinator]
) -> None:
    await stopped_group(coordinator, "g", {0: 6, 1: 6, 2: 5, 3: 6})
    text = (await cli("reset", *common(coordinator, warehouse), "--to-snapshot", "3")).stdout
    assert "--execute would move shard(s) 0, 1, 2, 3" in text, text
    m1 = await member(sessions, coordinator, "g", "m1", [0, 1, 2, 3])
    assert m1.epochs
    text = (await cli("reset", *common(coordinator, warehouse), "--to-snapshot", "3")).stdout
    assert "--execute would be refused now: live members m1" in " ".join(text.split()), text


@pytest.mark.asyncio
async def test_table_is_read_from_the_group(coordinator: str, warehouse: str) -> None:
    """describe, reset and delete need no --table: the group knows its table."""
    await stopped_group(coordinator, "g", {0: 6, 1: 6, 2: 5, 3: 6})
    args = ["--group", "g", "--warehouse", warehouse, "--coordinator", coordinator]
    report = json.loads((await cli("describe", *args, "--json")).stdout)
    assert report["table"] == TABLE and report["total_lag_snapshots"] == 1
    plan = json.loads((await cli("reset", *args, "--to-snapshot", "3", "--json")).stdout)
    assert [s["new"] for s in plan["shards"]] == [3, 3, 3, 3]
    result = await cli("delete", *args)
    assert result.exit_code == 0 and "deleted group g" in result.stdout
    result = await cli("describe", *args)
    assert result.exit_code == 2
    assert "does not exist" in one_error_line(result)


@pytest.mark.asyncio
async def test_describe_all_groups(coordinator: str, warehouse: str) -> None:
    await stopped_group(coordinator, "alpha", {0: 1, 1: 6, 2: 6, 3: 4})
    await stopped_group(coordinator, "beta", {0: 6, 1: 6, 2: 6, 3: 6})
    args = ["--all-groups", "--warehouse", warehouse, "--coordinator", coordinator]
    result = await cli("describe", *args, "--json")
    assert result.exit_code == 0, result.output
    reports = json.loads(result.stdout)["groups"]
    assert [(r["group"], r["total_lag_snapshots"]) for r in reports] == [
        ("alpha", 7), ("beta", 0)]
    text = (await cli("describe", *args)).stdout
    assert "alpha" in text and "beta" in text
    result = await cli("describe", "--warehouse", warehouse, "--coordinator", coordinator)
    assert result.exit_code == 2 and "--all-groups" in one_error_line(result)


@pytest.mark.asyncio
async def test_forced_reset_fences_the_live_owner(
    coordinator: str, warehouse: str, sessions: list[Coordinator]
) -> None:
    m1 = await member(sessions, coordinator, "g", "m1", [0, 1, 2, 3])
    assert await m1.commit({0: 6, 1: 6, 2: 6, 3: 6})
    result = await cli("reset", *common(coordinator, warehouse), "--to-snapshot", "2",
                       "--shard", "0", "--execute", "--force")
    assert result.exit_code == 0, result.output
    assert (await read_positions(coordinator))[0] == 2
    assert consumer_files(warehouse)[0] == 2
    # The owner's epoch is gone: its next commit on shard 0 is rejected, the
    # others are untouched.
    assert not await m1.commit({0: 7})
    assert await m1.commit({1: 6})
    # Whoever acquires shard 0 now reads the reset position.
    epoch = await m1.client.acquire(0, "m1", generation=1)
    assert epoch is not None and epoch > m1.epochs[0]
    position, _ = await m1.client.position(0)
    assert position is not None and position.next_snapshot == 2


# -- delete ---------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_delete_is_refused_while_members_are_live(
    coordinator: str, warehouse: str, sessions: list[Coordinator]
) -> None:
    m1 = await member(sessions, coordinator, "g", "m1", [0, 1, 2, 3])
    assert await m1.commit({0: 6, 1: 6, 2: 6, 3: 6})
    table = ShardedTable.open(warehouse, TABLE)
    ConsumerMirror(table.table.file_io, table.table_path, "g").write(0, 6)
    result = await cli("delete", *common(coordinator, warehouse))
    assert result.exit_code == 1
    assert "live members" in one_error_line(result)
    assert await read_positions(coordinator) == {0: 6, 1: 6, 2: 6, 3: 6}
    assert consumer_files(warehouse) == {0: 6}


@pytest.mark.asyncio
async def test_delete_removes_coordinator_state_and_consumer_files(
    coordinator: str, warehouse: str
) -> None:
    await stopped_group(coordinator, "g", {0: 6, 1: 6, 2: 6, 3: 6})
    await stopped_group(coordinator, "keep", {0: 3})
    table = ShardedTable.open(warehouse, TABLE)
    for group, shard in [("g", 0), ("g", 3), ("keep", 0)]:
        ConsumerMirror(table.table.file_io, table.table_path, group).write(shard, 6)
    result = await cli("delete", *common(coordinator, warehouse), "--json")
    assert result.exit_code == 0, result.output
    outcome = json.loads(result.stdout)
    assert outcome["deleted_consumer_files"] == 2 and outcome["deleted_keys"] >= 6
    async with open_coordinator(coordinator) as coord:
        keys = GroupKeys("g")
        assert await coord.get(keys.meta) is None
        for directory in (keys.positions_dir, keys.owners_dir, keys.members_dir):
            assert await coord.list(directory) == []
        assert await coord.get(keys.assignment) is None
        assert await coord.get(GroupKeys("keep").meta) is not None
    assert consumer_files(warehouse, "g") == {}
    assert consumer_files(warehouse, "keep") == {0: 6}
    # Deleting again: the group is gone.
    result = await cli("delete", *common(coordinator, warehouse))
    assert result.exit_code == 2 and "does not exist" in one_error_line(result)
    # A group of another table is refused, not half-deleted.
    result = await cli("delete", "--group", "keep", "--warehouse", warehouse,
                       "--table", "db.other", "--coordinator", coordinator)
    assert result.exit_code == 2


@pytest.mark.asyncio
async def test_delete_cleans_orphaned_consumer_files(coordinator: str, warehouse: str) -> None:
    await stopped_group(coordinator, "other", {0: 1})  # the coordinator exists
    table = ShardedTable.open(warehouse, TABLE)
    ConsumerMirror(table.table.file_io, table.table_path, "orphan").write(1, 4)
    # Unknown to this coordinator: kept unless asked (they may be another
    # coordinator's live group's files).
    result = await cli("delete", *common(coordinator, warehouse, "orphan"))
    assert result.exit_code == 2 and "--orphaned-files" in one_error_line(result)
    assert "1 consumer files" in one_error_line(result)
    assert consumer_files(warehouse, "orphan") != {}
    result = await cli("delete", *common(coordinator, warehouse, "orphan"), "--json",
                       "--orphaned-files")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"group": "orphan", "deleted_keys": 0,
                                         "deleted_consumer_files": 1}
    assert consumer_files(warehouse, "orphan") == {}


# -- members remove ----------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_members_remove_forces_a_member_out_and_fences_it(
    coordinator: str, warehouse: str, sessions: list[Coordinator]
) -> None:
    m1 = await member(sessions, coordinator, "g", "m1", [0, 1])
    m2 = await member(sessions, coordinator, "g", "m2", [2, 3], lead=False)
    assert await m1.commit({0: 3, 1: 3}) and await m2.commit({2: 3, 3: 3})
    result = await cli("members", "remove", "--group", "g", "--coordinator", coordinator,
                       "m1", "--json")
    assert result.exit_code == 0, result.output
    removed = json.loads(result.stdout)["removed_keys"]
    assert removed == sorted(["groups/g/leader", "groups/g/members/m1", "groups/g/owners/0",
                              "groups/g/owners/1"])
    # Its goodbye is recorded, so a rebalance delay does not keep its shards.
    async with open_coordinator(coordinator) as coord:
        assert await coord.get(GroupKeys("g").leaving("m1")) is not None
    # Its commits are fenced; m2 carries on; a new leader can be elected.
    assert not await m1.commit({0: 4})
    assert await m2.commit({2: 4})
    assert await m2.client.try_lead("m2") is not None
    report = json.loads((await cli("describe", *common(coordinator, warehouse), "--json")).stdout)
    assert [m["member_id"] for m in report["members"] if m["session_state"] == "live"] == ["m2"]
    assert report["shards"][0]["owner"] is None and report["shards"][0]["next_snapshot"] == 3


@pytest.mark.asyncio
async def test_members_remove_records_the_removed_session_until_it_is_seen(
    coordinator: str, warehouse: str, sessions: list[Coordinator]
) -> None:
    """The goodbye is gone as soon as the leader has moved the shards; the
    removal record, naming the removed session, stays for the process to find,
    and never names a later session of the same id."""
    m1 = await member(sessions, coordinator, "g", "m1", [0, 1])
    await member(sessions, coordinator, "g", "m2", [2, 3], lead=False)
    result = await cli("members", "remove", "--group", "g", "--coordinator", coordinator, "m2")
    assert result.exit_code == 0, result.output
    m2_session = sessions[1].session.id
    # The leader has published without m2 and forgets its goodbye...
    await m1.client.forget_leaving("m2")
    assert "m2" not in await m1.client.leaving()
    # ...the removal record still names m2's session, and no other.
    assert await m1.client.removed_session("m2") == m2_session
    assert await m1.client.removed_session("m1") is None
    assert m2_session != sessions[0].session.id
    # A gone member's removal writes no record (no session was removed).
    result = await cli("members", "remove", "--group", "g", "--coordinator", coordinator, "m9")
    assert result.exit_code == 2
    # delete (once the group is stopped) takes the record away with the rest.
    for coord in sessions:
        await coord.close()
    sessions.clear()
    result = await cli("delete", *common(coordinator, warehouse))
    assert result.exit_code == 0, result.output
    async with open_coordinator(coordinator) as coord:
        assert await coord.list(GroupKeys("g").removed_dir) == []


@pytest.mark.asyncio
async def test_members_remove_of_a_member_only_the_assignment_remembers(
    coordinator: str, warehouse: str
) -> None:
    # Its session is gone, but the last assignment still names it: a leader with
    # a rebalance delay would keep its shards waiting. A goodbye ends the wait.
    await stopped_group(coordinator, "g", {0: 3, 1: 3})
    result = await cli("members", "remove", "--group", "g", "--coordinator", coordinator,
                       "gone-member")
    assert result.exit_code == 0, result.output
    assert "goodbye is recorded" in result.stdout
    async with open_coordinator(coordinator) as coord:
        assert await coord.get(GroupKeys("g").leaving("gone-member")) is not None
    # delete takes the goodbye away with the rest of the group.
    result = await cli("delete", *common(coordinator, warehouse))
    assert result.exit_code == 0, result.output
    async with open_coordinator(coordinator) as coord:
        assert await coord.list(GroupKeys("g").leaving_dir) == []


@pytest.mark.asyncio
async def test_members_remove_of_an_unknown_member(
    coordinator: str, warehouse: str, sessions: list[Coordinator]
) -> None:
    await member(sessions, coordinator, "g", "m1", [0])
    result = await cli("members", "remove", "--group", "g", "--coordinator", coordinator, "zz")
    assert result.exit_code == 2
    assert "not in group" in one_error_line(result)
    result = await cli("members", "remove", "--group", "nope", "--coordinator", coordinator,
                       "m1")
    assert result.exit_code == 2 and "does not exist" in one_error_line(result)
    result = await cli("members", "remove", "--group", "g", "--coordinator", coordinator,
                       "bad/id")
    assert result.exit_code == 2 and "invalid member id" in one_error_line(result)


# -- describe --watch -------------------------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize("as_json", [True, False], ids=["json", "rich"])
async def test_describe_watch_refreshes_until_interrupted(
    coordinator: str, warehouse: str, sessions: list[Coordinator], as_json: bool
) -> None:
    m1 = await member(sessions, coordinator, "g", "m1", [0, 1, 2, 3])
    assert await m1.commit({0: 2, 1: 2, 2: 2, 3: 2})
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "paimon_group", "describe", *common(coordinator, warehouse),
        "--watch", "0.2", *(["--json"] if as_json else []),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=REPO,
        # Rich draws live only on a terminal: make it believe the pipe is one.
        env={**os.environ, "TTY_COMPATIBLE": "1", "COLUMNS": "120"},
    )
    assert proc.stdout is not None
    try:
        if as_json:
            first = json.loads(await asyncio.wait_for(proc.stdout.readline(), 60))
            assert first["shards"][0]["next_snapshot"] == 2
            assert await m1.commit({0: 4})
            # A later refresh, on the same session, shows the new position.
            for _ in range(600):
                line = json.loads(await asyncio.wait_for(proc.stdout.readline(), 60))
                if line["shards"][0]["next_snapshot"] == 4:
                    assert line["shards"][0]["lag_snapshots"] == 2
                    break
            else:
                raise AssertionError("the watch never showed the new position")
        else:
            # Redrawn in place: the table comes again after a cursor move up.
            seen = b""
            while seen.count(b"m1 (leader)") < 3:
                chunk = await asyncio.wait_for(proc.stdout.read(4096), 60)
                assert chunk, "describe --watch ended by itself"
                seen += chunk
            assert b"\x1b[" in seen and b"A" in seen.split(b"m1 (leader)", 1)[1]
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
