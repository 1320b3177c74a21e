"""Operating a group of several tables (docs/many-tables.md): describe, reset and
delete through the CLI, on real Paimon tables and a real coordinator.

The group record is created as a member of several tables creates it
(:meth:`GroupClient.ensure_tables_meta`, a table map over the real tables);
positions are committed with the group's fenced commit under owner keys
acquired for them, then released, as a stopped member leaves them.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from coordinators import open_coordinator
from paimon_group.cli import main
from paimon_group.protocol.group import GroupClient
from paimon_group.protocol.identity import table_identity
from paimon_group.protocol.names import GroupKeys
from paimon_group.protocol.table_map import TableMap
from paimon_group.reading.mirror import ConsumerMirror
from paimon_group.reading.table import ShardedTable
from tests.support.tables import catalog, make_pk_table, open_table, write_rows

GROUP = "cdc"
# db.a: 2 shards (group shards 0..1), db.b: 3 shards (2..4), db.gone: dropped (5..6).
TABLES = {"db.a": 2, "db.b": 3}
SNAPSHOTS = {"db.a": 4, "db.b": 2}


@pytest.fixture
def warehouse(tmp_path: Path) -> str:
    """Tables db.a (4 snapshots) and db.b (2 snapshots), each 10 rows a snapshot."""
    wh = str(tmp_path / "wh")
    for name, buckets in TABLES.items():
        make_pk_table(wh, name, buckets=buckets)
        for i in range(SNAPSHOTS[name]):
            write_rows(wh, name, range(i * 10, (i + 1) * 10))
    return wh


def table_map(warehouse: str, *, dropped: bool = True) -> TableMap:
    tables = TableMap()
    for name, shards in TABLES.items():
        tables = tables.append(name, table_identity(open_table(warehouse, name)), shards, "bucket")
    if dropped:
        tables = tables.append("db.gone", "schema-0@1", 2, "bucket").drop("db.gone", at=1.0)
    return tables


async def make_group(coordinator: str, warehouse: str, positions: dict[int, int]) -> None:
    """The group record over the tables, and ``positions`` (group shards) committed."""
    async with open_coordinator(coordinator) as coord:
        client = GroupClient(coord, GROUP)
        await client.ensure_tables_meta("db.a, db.b", table_map(warehouse))
        epochs = {}
        for shard in positions:
            epoch = await client.acquire(shard, "m1", generation=1)
            assert epoch is not None
            epochs[shard] = epoch
        assert await client.commit_positions(
            {s: (epochs[s], n) for s, n in positions.items()}, "m1")
        for shard, epoch in epochs.items():
            assert await client.release(shard, epoch)


async def cli(*args: str) -> Result:
    def invoke() -> Result:
        return CliRunner().invoke(main, list(args), catch_exceptions=False)

    return await asyncio.to_thread(invoke)


def common(coordinator: str, warehouse: str) -> list[str]:
    return ["--group", GROUP, "--warehouse", warehouse, "--coordinator", coordinator]


def one_error_line(result: Result) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


async def positions(coordinator: str) -> dict[int, int]:
    async with open_coordinator(coordinator) as coord:
        found = await GroupClient(coord, GROUP).positions()
    return {s: p.next_snapshot for s, p in found.items()}


def consumer_files(warehouse: str, name: str) -> dict[int, int]:
    table = ShardedTable.open(warehouse, name)
    return ConsumerMirror(table.table.file_io, table.table_path, GROUP).all()


def write_consumer_files(warehouse: str, name: str, values: dict[int, int]) -> None:
    table = ShardedTable.open(warehouse, name)
    mirror = ConsumerMirror(table.table.file_io, table.table_path, GROUP, interval_s=0.0)
    for local, n in values.items():
        mirror.write(local, n, force=True)


# -- describe ------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_describe_measures_each_shard_against_its_own_table(
        coordinator: str, warehouse: str) -> None:
    # db.a shard 0 read everything (next 5), shard 1 is 2 behind; db.b shard 0
    # (group 2) read everything (next 3), shard 1 (group 3) is 1 behind, 2 never started.
    await make_group(coordinator, warehouse, {0: 5, 1: 3, 2: 3, 3: 2})
    write_consumer_files(warehouse, "db.b", {1: 2})
    result = await cli("describe", *common(coordinator, warehouse), "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["table"] == "db.a, db.b" and report["num_shards"] == 7
    shards = {s["shard"]: s for s in report["shards"]}
    assert [(s["table"], s["table_shard"]) for s in report["shards"]] == [
        ("db.a", 0), ("db.a", 1), ("db.b", 0), ("db.b", 1), ("db.b", 2),
        ("db.gone", 0), ("db.gone", 1)]
    assert [shards[k]["lag_snapshots"] for k in range(7)] == [0, 2, 0, 1, None, None, None]
    assert shards[3]["consumer_id"] == f"pg-{GROUP}-shard-1"
    assert shards[3]["consumer_file"] == 2 and shards[1]["consumer_file"] is None
    tables = {t["name"]: t for t in report["tables"]}
    assert tables["db.a"]["latest_snapshot"] == 4 and tables["db.b"]["latest_snapshot"] == 2
    assert (tables["db.a"]["first"], tables["db.b"]["first"], tables["db.gone"]["first"]) == \
        (0, 2, 5)
    assert tables["db.a"]["total_lag_snapshots"] == 2
    assert tables["db.b"]["total_lag_snapshots"] == 1
    assert tables["db.gone"]["state"] == "dropped" and tables["db.a"]["state"] == "live"
    assert tables["db.a"]["owned_shards"] == 0 and tables["db.a"]["owners"] == []
    assert report["total_lag_snapshots"] == 3 and report["max_lag_snapshots"] == 2

    text = await cli("describe", *common(coordinator, warehouse))
    assert text.exit_code == 0, text.output
    out = text.stdout
    assert "tables 2 (1 dropped)" in out and "total lag 3 snapshots" in out
    assert "db.gone (dropped)" in out
    rows = [line.split() for line in out.splitlines() if "│" in line or "┃" in line]
    assert any(r[1:4] == ["3", "│", "db.b"] for r in rows), out


@pytest.mark.asyncio
async def test_describe_table_shows_the_tables_it_matches(
        coordinator: str, warehouse: str) -> None:
    await make_group(coordinator, warehouse, {0: 5, 1: 3, 2: 3, 3: 2})
    result = await cli("describe", *common(coordinator, warehouse), "--table", "db.b",
                       "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert [t["name"] for t in report["tables"]] == ["db.b"]
    assert [s["shard"] for s in report["shards"]] == [2, 3, 4]
    assert report["total_lag_snapshots"] == 1
    missing = await cli("describe", *common(coordinator, warehouse), "--table", "db.nope")
    assert missing.exit_code == 2
    assert "--table db.nope: no table of group 'cdc' matches it" in one_error_line(missing)


# -- reset ---------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_reset_of_one_table_moves_its_shards_and_its_consumer_files_only(
        coordinator: str, warehouse: str) -> None:
    await make_group(coordinator, warehouse, {0: 5, 1: 3, 2: 3, 3: 2})
    dry = await cli("reset", *common(coordinator, warehouse), "--table", "db.b",
                    "--to-earliest", "--json")
    assert dry.exit_code == 0, dry.output
    plan = json.loads(dry.stdout)
    assert [(r["shard"], r["table"], r["table_shard"], r["new"]) for r in plan["shards"]] == [
        (2, "db.b", 0, 1), (3, "db.b", 1, 1), (4, "db.b", 2, 1)]
    assert [t["name"] for t in plan["tables"]] == ["db.b"]
    assert plan["tables"][0]["latest_snapshot"] == 2
    assert await positions(coordinator) == {0: 5, 1: 3, 2: 3, 3: 2}  # a dry run

    done = await cli("reset", *common(coordinator, warehouse), "--table", "db.b",
                     "--to-earliest", "--execute")
    assert done.exit_code == 0, done.output
    assert "executed" in done.stdout and "db.b" in done.stdout
    assert await positions(coordinator) == {0: 5, 1: 3, 2: 1, 3: 1, 4: 1}
    assert consumer_files(warehouse, "db.b") == {0: 1, 1: 1, 2: 1}  # local numbers
    assert consumer_files(warehouse, "db.a") == {}


@pytest.mark.asyncio
async def test_reset_without_table_acts_on_every_live_table_each_its_own_latest(
        coordinator: str, warehouse: str) -> None:
    await make_group(coordinator, warehouse, {0: 1, 2: 1})
    done = await cli("reset", *common(coordinator, warehouse), "--to-latest", "--execute",
                     "--json")
    assert done.exit_code == 0, done.output
    plan = json.loads(done.stdout)
    assert plan["executed"] and [t["name"] for t in plan["tables"]] == ["db.a", "db.b"]
    # After each table's own latest (db.a: 4, db.b: 2); the dropped table's shards untouched.
    assert await positions(coordinator) == {0: 5, 1: 5, 2: 3, 3: 3, 4: 3}
    assert consumer_files(warehouse, "db.a") == {0: 5, 1: 5}
    assert consumer_files(warehouse, "db.b") == {0: 3, 1: 3, 2: 3}


@pytest.mark.asyncio
async def test_reset_shards_are_group_numbers_of_the_chosen_tables(
        coordinator: str, warehouse: str) -> None:
    await make_group(coordinator, warehouse, {0: 5, 1: 3, 2: 3, 3: 2})
    done = await cli("reset", *common(coordinator, warehouse), "--table", "db.*",
                     "--shard", "3", "--to-snapshot", "2", "--execute")
    assert done.exit_code == 0, done.output
    assert await positions(coordinator) == {0: 5, 1: 3, 2: 3, 3: 2}
    assert consumer_files(warehouse, "db.b") == {1: 2}
    done = await cli("reset", *common(coordinator, warehouse), "--shard", "1",
                     "--shift-by", "-1", "--execute")
    assert done.exit_code == 0, done.output
    assert (await positions(coordinator))[1] == 2
    assert consumer_files(warehouse, "db.a") == {1: 2}


@pytest.mark.asyncio
@pytest.mark.parametrize("args, says", [
    (["--table", "db.nope"], "--table db.nope: no table of group 'cdc' matches it "
                             "(its tables: db.a, db.b)"),
    (["--table", "db.gone"], "--table db.gone: no table of group 'cdc' matches it"),
    (["--table", "db.a", "--shard", "2"], "--shard 2: not a shard of the tables reset "
                                          "(group 'cdc': db.a 0..1)"),
    (["--shard", "5"], "--shard 5: not a shard of the tables reset"),
    (["--shard", "9"], "--shard 9: not a shard of the tables reset"),
    (["--table", "db.b", "--to-snapshot", "4"], "table db.b: --to-snapshot 4: the table's "
                                                "latest snapshot is 2"),
])
async def test_bad_reset_input_is_one_line_and_writes_nothing(
        coordinator: str, warehouse: str, args: list[str], says: str) -> None:
    await make_group(coordinator, warehouse, {0: 5, 1: 3, 2: 3, 3: 2})
    target = [] if "--to-snapshot" in args else ["--to-earliest"]
    result = await cli("reset", *common(coordinator, warehouse), *args, *target, "--execute")
    assert result.exit_code == 2, result.output
    assert says in one_error_line(result)
    assert await positions(coordinator) == {0: 5, 1: 3, 2: 3, 3: 2}
    assert consumer_files(warehouse, "db.a") == {} and consumer_files(warehouse, "db.b") == {}


@pytest.mark.asyncio
async def test_reset_under_an_owner_is_refused_and_force_fences_it(
        coordinator: str, warehouse: str) -> None:
    await make_group(coordinator, warehouse, {0: 5, 1: 3, 2: 3, 3: 2})
    async with open_coordinator(coordinator) as coord:  # a live owner of db.b's shard 1
        client = GroupClient(coord, GROUP)
        epoch = await client.acquire(3, "m2", generation=2)
        assert epoch is not None
        refused = await cli("reset", *common(coordinator, warehouse), "--table", "db.b",
                            "--to-earliest", "--execute")
        assert refused.exit_code == 1 and "[3]" in one_error_line(refused)
        assert await positions(coordinator) == {0: 5, 1: 3, 2: 3, 3: 2}
        assert consumer_files(warehouse, "db.b") == {}
        forced = await cli("reset", *common(coordinator, warehouse), "--table", "db.b",
                           "--to-earliest", "--execute", "--force")
        assert forced.exit_code == 0, forced.output
        assert await positions(coordinator) == {0: 5, 1: 3, 2: 1, 3: 1, 4: 1}
        assert consumer_files(warehouse, "db.b") == {0: 1, 1: 1, 2: 1}
        # The owner is fenced: its commit is refused, its key gone.
        assert not await client.commit_positions({3: (epoch, 2)}, "m2")
        assert 3 not in await client.owners()


@pytest.mark.asyncio
async def test_a_table_not_found_is_shown_by_describe_and_refused_by_reset(
        coordinator: str, warehouse: str) -> None:
    await make_group(coordinator, warehouse, {0: 5, 1: 3, 2: 3, 3: 2})
    catalog(warehouse).drop_table("db.b")  # before a leader marks it dropped
    result = await cli("describe", *common(coordinator, warehouse), "--json")
    assert result.exit_code == 0, result.output
    tables = {t["name"]: t for t in json.loads(result.stdout)["tables"]}
    assert tables["db.b"]["state"] == "unreadable" and "db.b" in tables["db.b"]["error"]
    assert tables["db.a"]["total_lag_snapshots"] == 2
    refused = await cli("reset", *common(coordinator, warehouse), "--to-earliest",
                        "--execute")
    assert refused.exit_code == 2 and "table db.b of the group" in one_error_line(refused)
    assert await positions(coordinator) == {0: 5, 1: 3, 2: 3, 3: 2}
    done = await cli("reset", *common(coordinator, warehouse), "--table", "db.a",
                     "--to-earliest", "--execute")
    assert done.exit_code == 0, done.output
    assert consumer_files(warehouse, "db.a") == {0: 1, 1: 1}


# -- delete --------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_delete_removes_every_key_and_every_table_s_consumer_files(
        coordinator: str, warehouse: str) -> None:
    await make_group(coordinator, warehouse, {0: 5, 1: 3, 2: 3, 3: 2})
    async with open_coordinator(coordinator) as coord:
        keys = GroupKeys(GROUP)
        for index in (0, 1):
            await coord.create(keys.table_start(index), b'{"kind": "earliest"}')
    write_consumer_files(warehouse, "db.a", {0: 5, 1: 3})
    write_consumer_files(warehouse, "db.b", {0: 3, 1: 2})
    refused = await cli("delete", *common(coordinator, warehouse), "--table", "db.a")
    assert refused.exit_code == 2 and "delete removes the whole group" in \
        one_error_line(refused)
    assert consumer_files(warehouse, "db.a") == {0: 5, 1: 3}

    result = await cli("delete", *common(coordinator, warehouse), "--json")
    assert result.exit_code == 0, result.output
    deleted = json.loads(result.stdout)
    # The record, 4 positions and 2 table starts; 4 consumer files in two tables.
    assert (deleted["deleted_keys"], deleted["deleted_consumer_files"]) == (7, 4)
    assert consumer_files(warehouse, "db.a") == {} and consumer_files(warehouse, "db.b") == {}
    async with open_coordinator(coordinator) as coord:
        for index in (0, 1):
            assert await coord.get(keys.table_start(index)) is None
        assert await coord.get(keys.meta) is None
        assert await coord.list(keys.positions_dir) == []


# -- list ----------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_list_sums_the_lag_of_every_table(coordinator: str, warehouse: str) -> None:
    await make_group(coordinator, warehouse, {0: 5, 1: 3, 2: 3, 3: 2})
    result = await cli("list", "--warehouse", warehouse, "--coordinator", coordinator, "--json")
    assert result.exit_code == 0, result.output
    (group,) = json.loads(result.stdout)["groups"]
    assert (group["group"], group["table"], group["num_shards"]) == (GROUP, "db.a, db.b", 7)
    assert (group["total_lag_snapshots"], group["max_lag_snapshots"]) == (3, 2)


# -- metrics -------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_metrics_label_each_shard_with_its_table_and_measure_it_there(
        coordinator: str, warehouse: str) -> None:
    from paimon_group.member.tables import MemberTable, MemberTables
    from paimon_group.ops.metrics import serve_metrics
    from paimon_group.reading.planner import ShardPlanner
    from tests.test_ops_metrics import HOST, StandInMember, scrape, value

    async with open_coordinator(coordinator) as coord:
        meta = await GroupClient(coord, GROUP).ensure_tables_meta("db.a, db.b",
                                                                  table_map(warehouse))
    assert meta.tables is not None
    member_tables = []
    for index, table_range in enumerate(meta.tables.ranges):
        if table_range.live:
            table = ShardedTable.open(warehouse, table_range.name)
            member_tables.append(MemberTable(
                index, table_range, meta, table, ShardPlanner(table, table_range.shards),
                ConsumerMirror(table.table.file_io, table.table_path, GROUP)))
    member = StandInMember(None, num_shards=meta.num_shards)
    member.meta = meta  # type: ignore[attr-defined]
    member.tables = MemberTables(member_tables, single=False)  # type: ignore[attr-defined]
    member.owned_shards = [1, 3]
    member.positions = {1: 3, 3: 2}  # db.a shard 1: 2 behind 4; db.b shard 1: 1 behind 2
    server = serve_metrics(member, 0, host=HOST)
    try:
        samples = await asyncio.to_thread(scrape, server)
    finally:
        server.close()
    lag = "paimon_group_shard_lag_snapshots"
    assert value(samples, lag, shard="1", table="db.a") == 2
    assert value(samples, lag, shard="3", table="db.b") == 1
    assert value(samples, "paimon_group_shard_position", shard="3", table="db.b") == 2
    assert value(samples, "paimon_group_lag_snapshots") == 3
    assert value(samples, "paimon_group_table_latest_snapshot", table="db.a") == 4
    assert value(samples, "paimon_group_table_latest_snapshot", table="db.b") == 2


@pytest.mark.asyncio
async def test_all_groups_describes_each_as_it_is(coordinator: str, warehouse: str) -> None:
    await make_group(coordinator, warehouse, {0: 5})
    async with open_coordinator(coordinator) as coord:
        await GroupClient(coord, "one").ensure_meta(2, "db.a")
    result = await cli("describe", "--all-groups", "--warehouse", warehouse,
                       "--coordinator", coordinator, "--json")
    assert result.exit_code == 0, result.output
    reports = {r["group"]: r for r in json.loads(result.stdout)["groups"]}
    assert [t["name"] for t in reports[GROUP]["tables"]] == ["db.a", "db.b", "db.gone"]
    assert reports[GROUP]["latest_snapshot"] is None
    # A group of one table: its report has no key of the tables.
    assert "tables" not in reports["one"] and reports["one"]["latest_snapshot"] == 4
    assert all("table" not in s and "table_shard" not in s for s in reports["one"]["shards"])
