"""One group, many tables: real members read several real tables as one group.

Each table keeps its own shards (a range of the group's), its own consumer
files and start; every row of every table is delivered once, in its table's
shard by that table's rule; tables created later join, dropped ones leave.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from paimon_group import GroupMember, MemberConfig
from paimon_group.errors import ConfigError, SnapshotExpired, TableNotFound
from paimon_group.reading.batch import ShardBatch
from tests.support.tables import (
    bucket_of,
    catalog,
    expire_snapshots,
    make_append_table,
    make_pk_table,
    write_rows,
)
from tests.support.waiting import eventually

Seen = dict[str, list[tuple[int, int, int]]]  # table -> (id, shard, group shard)


def _coordinator(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if backend == "etcd":
        return str(request.getfixturevalue("etcd_url"))
    if backend == "zookeeper":
        return str(request.getfixturevalue("zk_url"))
    return f"sqlite://{tmp_path}/c.sqlite"


def _config(wh: Path, url: str, group: str, member: str, *tables: str, **kw: Any) -> MemberConfig:
    settings: dict[str, Any] = {"start": "earliest", "poll_interval_ms": 50,
                                "session_timeout_s": 6, "forming_wait_s": 0, **kw}
    return MemberConfig(group=group, warehouse=str(wh), table=tables[0], tables=tables[1:],
                        coordinator=url, member_id=member, **settings)


def _collector(seen: Seen) -> Any:
    def handle(batch: ShardBatch) -> None:
        for row in batch.to_arrow().to_pylist():
            seen[batch.table].append((row["id"], batch.shard, batch.group_shard))
    return handle


def _rows(seen: Seen, table: str) -> list[int]:
    return sorted(r[0] for r in seen.get(table, []))


@pytest.mark.asyncio
@pytest.mark.parametrize("backend", ["sqlite", "etcd", "zookeeper"])
async def test_two_members_read_three_tables_each_row_once_in_its_shard(
        tmp_path: Path, request: pytest.FixtureRequest, backend: str) -> None:
    wh = tmp_path / "wh"
    orders = make_pk_table(wh, "shop.orders", buckets=4)
    items = make_pk_table(wh, "shop.items", buckets=2)
    make_append_table(wh, "shop.events", buckets=3)
    make_pk_table(wh, "other.t", buckets=2)  # not subscribed
    write_rows(wh, "shop.orders", range(0, 40))
    write_rows(wh, "shop.items", range(100, 120))
    write_rows(wh, "shop.events", range(200, 230))
    url = _coordinator(backend, tmp_path, request)
    group = f"g{uuid.uuid4().hex[:8]}"
    seen: Seen = defaultdict(list)
    a = GroupMember(_config(wh, url, group, "a", "shop.*"), handle_signals=False)
    b = GroupMember(_config(wh, url, group, "b", "shop.*"), handle_signals=False)
    async with a, b:
        runs = [asyncio.create_task(m.run(_collector(seen))) for m in (a, b)]
        try:
            await eventually(lambda: len(_rows(seen, "shop.orders")) >= 40
                             and len(_rows(seen, "shop.items")) >= 20
                             and len(_rows(seen, "shop.events")) >= 30, limit_s=60)
            write_rows(wh, "shop.orders", range(40, 50))
            write_rows(wh, "shop.items", range(120, 125))
            await eventually(lambda: len(_rows(seen, "shop.orders")) >= 50
                             and len(_rows(seen, "shop.items")) >= 25, limit_s=60)
            meta = a.core.meta
            assert meta is not None and meta.tables is not None
            assert [(t.name, t.first, t.shards) for t in meta.tables.ranges] == [
                ("shop.events", 0, 3), ("shop.items", 3, 2), ("shop.orders", 5, 4)]
            assert meta.num_shards == 9 and meta.features == ("tables",)
            # Both members hold shards, in spread order: the widest table's
            # shards over both, each member some of two tables or more.
            await eventually(lambda: a.owned_shards and b.owned_shards
                             and len(a.owned_shards) + len(b.owned_shards) == 9, limit_s=30)
            for m in (a, b):
                held = {meta.tables.locate(k)[0].name for k in m.owned_shards}
                assert len(held) >= 2 and "shop.orders" in held, (m.member_id, m.owned_shards)
        finally:
            for r in runs:
                r.cancel()
            await asyncio.gather(*runs, return_exceptions=True)
    assert _rows(seen, "shop.orders") == list(range(50))
    assert _rows(seen, "shop.items") == list(range(100, 125))
    assert _rows(seen, "shop.events") == list(range(200, 230))
    assert "other.t" not in seen
    firsts = {"shop.events": 0, "shop.items": 3, "shop.orders": 5}
    for name, table, shards in (("shop.orders", orders, 4), ("shop.items", items, 2)):
        for key, shard, group_shard in seen[name]:
            assert shard == bucket_of(table, key) % shards, (name, key)
            assert group_shard == firsts[name] + shard
    for _key, shard, group_shard in seen["shop.events"]:
        assert 0 <= shard < 3 and group_shard == shard
    # Each table's consumer files are its own, named as a group of that table alone.
    for name, shards in (("shop.events", 3), ("shop.items", 2), ("shop.orders", 4)):
        database, table_name = name.split(".")
        files = sorted(p.name for p in (wh / f"{database}.db" / table_name / "consumer").iterdir()
                       if p.name.startswith("consumer-"))
        assert files == [f"consumer-pg-{group}-shard-{k}" for k in range(shards)], name


@pytest.mark.asyncio
async def test_a_table_created_later_joins_and_a_dropped_one_leaves(tmp_path: Path) -> None:
    wh = tmp_path / "wh"
    make_pk_table(wh, "shop.a", buckets=2)
    make_pk_table(wh, "shop.b", buckets=2)
    write_rows(wh, "shop.a", range(10))
    write_rows(wh, "shop.b", range(100, 110))
    url = f"sqlite://{tmp_path}/c.sqlite"
    seen: Seen = defaultdict(list)
    member = GroupMember(_config(wh, url, "g", "a", "shop.*", tables_refresh_s=0.5),
                         handle_signals=False)
    async with member:
        run = asyncio.create_task(member.run(_collector(seen)))
        try:
            await eventually(lambda: len(_rows(seen, "shop.a")) >= 10
                             and len(_rows(seen, "shop.b")) >= 10, limit_s=60)
            make_pk_table(wh, "shop.c", buckets=3)
            write_rows(wh, "shop.c", range(300, 312))
            await eventually(lambda: len(_rows(seen, "shop.c")) >= 12, limit_s=60)
            catalog(wh).drop_table("shop.b")
            await eventually(lambda: member.core.meta is not None
                             and member.core.meta.tables is not None
                             and not any(t.name == "shop.b" for t in
                                         member.core.meta.tables.live()), limit_s=60)
            tables = member.core.meta.tables if member.core.meta else None
            assert tables is not None
            await eventually(lambda: not set(member.owned_shards) & {2, 3}, limit_s=30)
            write_rows(wh, "shop.a", range(10, 15))
            await eventually(lambda: len(_rows(seen, "shop.a")) >= 15, limit_s=60)
            assert not run.done()
            await member.stop()  # waits for the batch in hand and commits it
        finally:
            run.cancel()
            await asyncio.gather(run, return_exceptions=True)
    assert _rows(seen, "shop.a") == list(range(15))
    assert _rows(seen, "shop.b") == list(range(100, 110))
    assert _rows(seen, "shop.c") == list(range(300, 312))


@pytest.mark.asyncio
async def test_bad_subscriptions_are_one_line_before_anything_is_joined(tmp_path: Path) -> None:
    wh = tmp_path / "wh"
    make_pk_table(wh, "shop.a", buckets=2)
    url = f"sqlite://{tmp_path}/c.sqlite"
    with pytest.raises(ConfigError, match="bad --table 'shop'"):
        _config(wh, url, "g", "a", "shop.a", "shop")
    member = GroupMember(_config(wh, url, "g", "a", "shop.a", "shop.missing"),
                         handle_signals=False)
    with pytest.raises(TableNotFound, match=r"shop\.missing not found"):
        await member.start()
    member = GroupMember(_config(wh, url, "g", "a", "none.*"), handle_signals=False)
    with pytest.raises(TableNotFound, match="matches no table"):
        await member.start()


@pytest.mark.asyncio
async def test_the_load_assignor_spreads_a_busy_table_and_packs_quiet_ones(
        tmp_path: Path) -> None:
    wh = tmp_path / "wh"
    make_pk_table(wh, "shop.busy", buckets=4)
    for name in ("shop.q1", "shop.q2", "shop.q3"):
        make_pk_table(wh, name, buckets=2)
        write_rows(wh, name, range(2))
    write_rows(wh, "shop.busy", range(4000))
    url = f"sqlite://{tmp_path}/c.sqlite"
    seen: Seen = defaultdict(list)
    members = [GroupMember(_config(wh, url, "g", m, "shop.*", assignor="load",
                                   forming_wait_s=1.0),
                           handle_signals=False) for m in ("a", "b", "c", "d")]
    await asyncio.gather(*(m.start() for m in members))
    runs = [asyncio.create_task(m.run(_collector(seen))) for m in members]
    try:
        await eventually(lambda: len(_rows(seen, "shop.busy")) >= 4000, limit_s=90)
        await eventually(lambda: all(m.owned_shards for m in members), limit_s=30)
        meta = members[0].core.meta
        assert meta is not None and meta.tables is not None
        busy = meta.tables.ranges[meta.tables.index_of("shop.busy")]
        assignment = members[0].core.assignment
        assert assignment is not None
        # The busy table's shards measured (its full scan was ahead), and
        # each on its own member: no member holds two of them.
        holders = [m for k in busy_shards(busy) for m, held in assignment.shards.items()
                   if k in held]
        assert sorted(holders) == ["a", "b", "c", "d"], assignment.shards
        # Measured across the tables: a load for every shard of the group,
        # the busy table's far above the quiet ones'.
        assert len(assignment.loads) == meta.num_shards == 10
        quiet = [assignment.loads[k] for k in range(meta.num_shards) if k not in busy_shards(busy)]
        assert min(assignment.loads[k] for k in busy_shards(busy)) > 10 * max(quiet)
    finally:
        for r in runs:
            r.cancel()
        await asyncio.gather(*runs, return_exceptions=True)
        for m in members:
            await m.stop()


def busy_shards(table: Any) -> range:
    return range(table.first, table.end)


async def _read_all(member: GroupMember, seen: Seen, wanted: dict[str, int]) -> None:
    """Run ``member`` until ``seen`` holds ``wanted`` rows of each table, then stop it
    gracefully: a batch whose rows are seen is committed when its handler has returned,
    and a ``run`` cancelled between the two would leave it to be read again."""
    async with member:
        run = asyncio.create_task(member.run(_collector(seen)))
        try:
            try:
                await eventually(lambda: all(len(_rows(seen, t)) >= n
                                             for t, n in wanted.items()) or run.done(),
                                 limit_s=120)
            except AssertionError:
                raise AssertionError(
                    f"rows {({t: len(_rows(seen, t)) for t in seen})}, wanted {wanted}; "
                    f"member {member.state.value} error {member.error!r}, owned "
                    f"{member.owned_shards}, positions {member.shard_positions()}") from None
            assert not run.done()
            await member.stop()  # waits for the batch in hand and commits it
        finally:
            run.cancel()
            await asyncio.gather(run, return_exceptions=True)


@pytest.mark.asyncio
@pytest.mark.parametrize("on_data_loss", ["fail", "skip"])
async def test_data_loss_is_one_table_s_and_names_it(tmp_path: Path, on_data_loss: str) -> None:
    wh = tmp_path / "wh"
    make_pk_table(wh, "shop.a", buckets=2)
    make_pk_table(wh, "shop.b", buckets=2)
    write_rows(wh, "shop.a", range(10))
    write_rows(wh, "shop.b", range(100, 110))
    url = f"sqlite://{tmp_path}/c.sqlite"
    seen: Seen = defaultdict(list)
    await _read_all(GroupMember(_config(wh, url, "g", "a", "shop.*"), handle_signals=False),
                    seen, {"shop.a": 10, "shop.b": 10})
    # While no member runs: table b commits three snapshots and expires two of them.
    for first in (110, 120, 130):
        write_rows(wh, "shop.b", range(first, first + 10))
    expire_snapshots(wh, "shop.b", keep_from=4)
    write_rows(wh, "shop.a", range(10, 20))
    member = GroupMember(_config(wh, url, "g", "a", "shop.*", on_data_loss=on_data_loss),
                         handle_signals=False)
    if on_data_loss == "fail":
        async with member:
            run = asyncio.create_task(member.run(_collector(seen)))
            with pytest.raises(SnapshotExpired) as failed:
                await asyncio.wait_for(run, timeout=60)
        line = str(failed.value)
        assert "snapshots 2..3 of table shop.b expired" in line, line
        assert "--table shop.b" in line and "\n" not in line
        return
    await _read_all(member, seen, {"shop.a": 20, "shop.b": 20})
    assert _rows(seen, "shop.a") == list(range(20))
    # b's rows of the expired snapshots are lost, said in one line; the rest read.
    assert _rows(seen, "shop.b") == [*range(100, 110), *range(130, 140)]


@pytest.mark.asyncio
async def test_each_batch_has_its_table_s_schema_as_it_evolves(tmp_path: Path) -> None:
    from tests.test_schema_change import _add_column, _write_with_extra

    wh = tmp_path / "wh"
    make_pk_table(wh, "shop.a", buckets=2)
    make_pk_table(wh, "shop.b", buckets=2)
    write_rows(wh, "shop.a", range(10))
    write_rows(wh, "shop.b", range(100, 110))
    url = f"sqlite://{tmp_path}/c.sqlite"
    columns: dict[str, set[tuple[str, ...]]] = defaultdict(set)
    seen: Seen = defaultdict(list)
    collect = _collector(seen)

    def handle(batch: ShardBatch) -> None:
        columns[batch.table].add(tuple(batch.to_arrow().column_names))
        collect(batch)

    member = GroupMember(_config(wh, url, "g", "a", "shop.*"), handle_signals=False)
    async with member:
        run = asyncio.create_task(member.run(handle))
        try:
            await eventually(lambda: len(_rows(seen, "shop.b")) >= 10, limit_s=60)
            _add_column(str(wh), "shop.b")  # only b evolves
            _write_with_extra(str(wh), "shop.b", range(110, 120))
            write_rows(wh, "shop.a", range(10, 20))
            await eventually(lambda: len(_rows(seen, "shop.b")) >= 20
                             and len(_rows(seen, "shop.a")) >= 20, limit_s=60)
        finally:
            run.cancel()
            await asyncio.gather(run, return_exceptions=True)
    assert columns["shop.a"] == {("id", "v", "payload")}, columns
    assert columns["shop.b"] == {("id", "v", "payload"), ("id", "v", "payload", "extra")}


@pytest.mark.asyncio
@pytest.mark.parametrize("backend", ["sqlite", "etcd"])
async def test_members_starting_together_prepare_a_new_group_once(
        tmp_path: Path, request: pytest.FixtureRequest, backend: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from paimon_group.member import membership

    wh = tmp_path / "wh"
    for k in range(6):
        make_pk_table(wh, f"shop.t{k}", buckets=2)
    url = _coordinator(backend, tmp_path, request)
    group = f"g{uuid.uuid4().hex[:8]}"
    vetted: list[str] = []
    real = membership.prepare_new_group

    def counting(mirror: Any, file_io: Any, path: str, origin: Any) -> Any:
        vetted.append(path)
        return real(mirror, file_io, path, origin)

    monkeypatch.setattr(membership, "prepare_new_group", counting)
    members = [GroupMember(_config(wh, url, group, m, "shop.*"), handle_signals=False)
               for m in ("a", "b", "c", "d")]
    try:
        await asyncio.gather(*(m.start() for m in members))
        metas = {m.core.meta for m in members}
        assert len(metas) == 1  # one record, one incarnation
    finally:
        await asyncio.gather(*(m.stop() for m in members))
    # One member listed and vetted the six tables; the others waited for its record.
    assert len(vetted) == 6 and len(set(vetted)) == 6, vetted



@pytest.mark.asyncio
async def test_a_member_builds_a_table_s_planner_when_it_first_plans_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Opening the group's tables builds no planner (most of a table's
    opening); reading builds one for each table a step is planned of, once
    each however many steps."""
    from paimon_group.reading.table import ShardedTable

    wh = tmp_path / "wh"
    for name in ("shop.a", "shop.b", "shop.empty"):
        make_pk_table(wh, name, buckets=2)
    write_rows(wh, "shop.a", range(0, 10))
    write_rows(wh, "shop.b", range(10, 20))
    built: list[str] = []
    real = ShardedTable.planner

    def counting(self: ShardedTable, *args: Any, **kwargs: Any) -> Any:
        built.append(self.identifier)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(ShardedTable, "planner", counting)
    seen: Seen = defaultdict(list)
    member = GroupMember(_config(wh, f"sqlite://{tmp_path}/c.sqlite", "g", "a", "shop.*"),
                         handle_signals=False)
    async with member:
        assert member.core.tables is not None and len(member.core.tables) == 3
        assert built == []  # three tables opened, no planner
        run = asyncio.create_task(member.run(_collector(seen)))
        try:
            await eventually(lambda: len(_rows(seen, "shop.a")) + len(_rows(seen, "shop.b"))
                             == 20, limit_s=60)
            # (The empty table's planner may be built by now too: until the
            # leader's head is fresh, the member looks for its snapshots itself.)
            write_rows(wh, "shop.empty", range(20, 25))
            write_rows(wh, "shop.a", range(25, 30))
            await eventually(lambda: len(_rows(seen, "shop.empty")) == 5
                             and len(_rows(seen, "shop.a")) == 15, limit_s=60)
        finally:
            run.cancel()
            await asyncio.gather(run, return_exceptions=True)
    assert sorted(built) == ["shop.a", "shop.b", "shop.empty"]  # each once


@pytest.mark.asyncio
async def test_a_table_dropped_under_a_held_batch_leaves_the_others_read(tmp_path: Path) -> None:
    """The handler holds a batch of ``shop.b`` while the table is dropped: its
    read finds the files gone. The member does not fail: the batch is not
    committed, ``shop.b`` is read no more, ``shop.a`` is read on (the
    simulation's seeds 54, 66 and 98 of a group of several tables)."""
    wh = tmp_path / "wh"
    make_pk_table(wh, "shop.a", buckets=2)
    make_pk_table(wh, "shop.b", buckets=2)
    write_rows(wh, "shop.a", range(10))
    write_rows(wh, "shop.b", range(100, 110))
    url = f"sqlite://{tmp_path}/c.sqlite"
    seen: Seen = defaultdict(list)
    dropped: list[str] = []

    def handle(batch: ShardBatch) -> None:
        if batch.table == "shop.b" and not dropped:
            catalog(wh).drop_table("shop.b")
            dropped.append(batch.table)
        _collector(seen)(batch)

    member = GroupMember(_config(wh, url, "g", "a", "shop.*", tables_refresh_s=0.5),
                         handle_signals=False)
    async with member:
        run = asyncio.create_task(member.run(handle))
        try:
            await eventually(lambda: dropped and len(_rows(seen, "shop.a")) >= 10, limit_s=60)
            write_rows(wh, "shop.a", range(10, 15))
            await eventually(lambda: len(_rows(seen, "shop.a")) >= 15, limit_s=60)
            assert not run.done() and member.error is None
        finally:
            run.cancel()
            await asyncio.gather(run, return_exceptions=True)
    assert _rows(seen, "shop.a") == list(range(15))
