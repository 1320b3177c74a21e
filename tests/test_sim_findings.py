"""Holes found by the seeded fault simulation (tests/sim/), each pinned down by
a deterministic test on the real member and a real table (docs/reliability.md,
"Seeded fault simulation")."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import uuid
from pathlib import Path
from typing import Any

import pytest

from coordinators import open_coordinator
from coordinators.protocol import SessionState
from paimon_group import GroupMember, MemberConfig
from paimon_group.member import MemberState
from paimon_group.member.membership import Membership
from tests.support.tables import make_pk_table, write_rows


@pytest.fixture
def table(tmp_path: Path) -> str:
    wh = str(tmp_path / "wh")
    make_pk_table(wh, "db.t", buckets=2)
    write_rows(wh, "db.t", range(10))
    return wh


class WaitCount:
    """How often an asyncio.Event is waited on, counted by wrapping its ``wait``."""

    def __init__(self, event: asyncio.Event, monkeypatch: pytest.MonkeyPatch) -> None:
        self.waits = 0
        real_wait = event.wait

        async def wait() -> Any:
            self.waits += 1
            return await real_wait()

        monkeypatch.setattr(event, "wait", wait)


@pytest.mark.asyncio
async def test_the_read_loop_does_not_spin_while_the_member_rejoins(
        table: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Simulation seed 14: while a member rejoined after a lost session (its
    coordinator slow to answer), the read loop waited for the join in a loop
    that also woke on the member's wake-up event; the loss had set that event
    and nobody cleared it before the rejoin finished, so the loop spun on the
    event loop (a busy CPU; under the simulation's virtual time, no time
    passed at all). Now it waits for the join, or for a new wake-up."""
    real_join = Membership.join

    async def slow_rejoin(self: Membership, *, first: bool) -> None:
        if not first:
            await asyncio.sleep(1.0)  # a coordinator slow to answer the new session
        await real_join(self, first=first)

    monkeypatch.setattr(Membership, "join", slow_rejoin)
    url = f"memory://spin-{uuid.uuid4().hex}"
    cfg = MemberConfig(group="g", warehouse=table, table="db.t", coordinator=url,
                       member_id="a", session_timeout_s=3, poll_interval_ms=50)
    got: set[int] = set()
    # Another connection keeps the in-memory database while the member has none.
    async with open_coordinator(url), GroupMember(cfg) as member:
        batches = member.batches()
        while len(got) < 10:
            batch = await asyncio.wait_for(batches.__anext__(), timeout=30)
            got.update(batch.to_arrow().column("id").to_pylist())
        joined = member.core.joined
        counted = WaitCount(joined, monkeypatch)
        reader = asyncio.ensure_future(batches.__anext__())
        await asyncio.sleep(0.2)  # the reader waits for a new snapshot
        assert member.core.coordinator is not None
        member.core.coordinator.session.mark(SessionState.LOST)  # type: ignore[attr-defined]
        for _ in range(3000):
            if member.state is MemberState.REJOINING:
                break
            await asyncio.sleep(0.01)
        assert member.state is MemberState.REJOINING
        await asyncio.sleep(0.1)
        # Anything that wakes the member up meanwhile (a revoke ending, a
        # leader's delayed re-check, a session listener) sets the wake-up
        # event; the control loop, which clears it, is not running now.
        member.core.wake.set()
        deadline = asyncio.get_running_loop().time() + 30
        while not (member.state is MemberState.RUNNING and joined.is_set()):
            assert asyncio.get_running_loop().time() < deadline, member.state
            await asyncio.sleep(0.05)
        # About 1 s of rejoining: a wait every 0.5 s (or per wake-up), not a spin.
        assert counted.waits < 20, counted.waits
        reader.cancel()
        with contextlib.suppress(BaseException):
            await reader
        await batches.aclose()


@pytest.mark.asyncio
@pytest.mark.parametrize("error", ["table_replaced", "refused"])
async def test_a_rejoin_that_cannot_succeed_fails_the_member(
        table: str, monkeypatch: pytest.MonkeyPatch, error: str) -> None:
    """Simulation seed 78: the table was dropped and re-created while a member
    rejoined after a lost session; the rejoin raised TableReplaced, which is
    not retried. That error escaped the supervisor without failing the member:
    it stayed REJOINING for ever, delivering nothing, with no error and no
    exit (the same for any error that ends a rejoin: one that is not
    retriable, or a coordinator down past the rejoin's retries). Now the
    member fails with that error, as it does when the error comes from a
    control round."""
    from coordinators.errors import CoordinatorError
    from paimon_group.errors import TableReplaced

    real_join = Membership.join

    async def rejoin_refused(self: Membership, *, first: bool) -> None:
        if not first:
            if error == "table_replaced":
                raise TableReplaced("injected: the table was re-created")
            raise CoordinatorError("injected: refused")
        await real_join(self, first=first)

    monkeypatch.setattr(Membership, "join", rejoin_refused)
    url = f"memory://rejoin-{uuid.uuid4().hex}"
    cfg = MemberConfig(group="g", warehouse=table, table="db.t", coordinator=url,
                       member_id="a", session_timeout_s=3, poll_interval_ms=50)
    got: set[int] = set()
    member = GroupMember(cfg)
    await member.start()
    try:
        batches = member.batches()
        while len(got) < 10:
            batch = await asyncio.wait_for(batches.__anext__(), timeout=30)
            got.update(batch.to_arrow().column("id").to_pylist())
        assert member.core.coordinator is not None
        member.core.coordinator.session.mark(SessionState.LOST)  # type: ignore[attr-defined]
        with pytest.raises((TableReplaced, CoordinatorError), match="injected"):
            await asyncio.wait_for(batches.__anext__(), timeout=30)
        assert member.state is MemberState.FAILED
        assert isinstance(member.error, TableReplaced | CoordinatorError)
    finally:
        await member.stop()


@pytest.mark.asyncio
async def test_a_stop_while_the_member_joins_leaves_no_member_behind(
        table: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Simulation seed 611: stop() ran while start() was still joining (its
    registration waiting for the coordinator). stop() found nothing to leave
    and returned; start() then finished the join: the member key was
    registered and the session kept, but the supervisor saw _stopping and
    ran no control loop. The leader assigned shards to that member, which
    never acquired them: those shards were read by nobody for as long as the
    process lived. Now a join that ends after a stop leaves at once."""
    from paimon_group.protocol.group import GroupClient

    entered, release = asyncio.Event(), asyncio.Event()
    real_register = GroupClient.register

    async def held_register(self: GroupClient, info: Any) -> Any:
        entered.set()
        await release.wait()
        return await real_register(self, info)

    monkeypatch.setattr(GroupClient, "register", held_register)
    url = f"memory://stop-join-{uuid.uuid4().hex}"
    cfg = MemberConfig(group="g", warehouse=table, table="db.t", coordinator=url,
                       member_id="a", session_timeout_s=3, poll_interval_ms=50)
    async with open_coordinator(url) as observer:
        member = GroupMember(cfg)
        starting = asyncio.ensure_future(member.start())
        await asyncio.wait_for(entered.wait(), timeout=30)
        await member.stop()
        release.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(starting, timeout=30)
        assert await observer.get("groups/g/members/a") is None
        assert member.state is MemberState.STOPPED
        await member.stop()


@pytest.mark.asyncio
async def test_a_session_lost_again_while_rejoining_is_retried(
        table: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Simulation seed 100121 (exploring fault rates of 30 %): the new session
    of a rejoin expired before the rejoin registered (its member key create
    found the session gone). The rejoin retried only retriable errors, and a
    lost session is not one: the member failed with SessionLost, where a
    new session was all it needed. Now a rejoin starts over with another
    session."""
    from coordinators.errors import SessionLost

    real_join = Membership.join
    lost = {"left": 1}

    async def join_once_lost(self: Membership, *, first: bool) -> None:
        if not first and lost["left"] > 0:
            lost["left"] -= 1
            raise SessionLost("injected: the new session expired while joining")
        await real_join(self, first=first)

    monkeypatch.setattr(Membership, "join", join_once_lost)
    url = f"memory://rejoin-lost-{uuid.uuid4().hex}"
    cfg = MemberConfig(group="g", warehouse=table, table="db.t", coordinator=url,
                       member_id="a", session_timeout_s=3, poll_interval_ms=50)
    async with open_coordinator(url), GroupMember(cfg) as member:
        batches = member.batches()
        got: set[int] = set()
        while len(got) < 10:
            batch = await asyncio.wait_for(batches.__anext__(), timeout=30)
            got.update(batch.to_arrow().column("id").to_pylist())
        assert member.core.coordinator is not None
        member.core.coordinator.session.mark(SessionState.LOST)  # type: ignore[attr-defined]
        write_rows(table, "db.t", range(10, 20))
        while len(got) < 20:
            batch = await asyncio.wait_for(batches.__anext__(), timeout=30)
            got.update(batch.to_arrow().column("id").to_pylist())
        assert lost["left"] == 0
        assert member.state is MemberState.RUNNING and member.error is None
        await batches.aclose()


@pytest.mark.asyncio
async def test_a_read_back_that_spans_a_rejoin_skips_the_lost_shards(
        table: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Simulation seed 17462: a commit of two shards raised (its outcome
    unknown), so the next read round read their stored positions back, one
    shard after the other, on the coordinator of that moment. The session was
    lost during the first read: the rejoin dropped both shards and closed that
    coordinator, and the read-back went on to the second shard on it. A call
    on a closed coordinator fails for good (every backend raises a
    CoordinatorError that is not retriable): the member failed (in the
    simulation, whose closed connection never answered, its read loop hung
    for ever, the shards acquired again never read). Now a read-back skips
    shards dropped meanwhile: their position is read again when they are
    acquired again."""
    from paimon_group.protocol.group import GroupClient

    real_position = GroupClient.position
    armed = {"left": 0}
    holder: dict[str, GroupMember] = {}

    async def lost_during_read_back(self: GroupClient, shard: int) -> Any:
        result = await real_position(self, shard)
        if armed["left"] > 0:
            armed["left"] -= 1
            # The session is lost while the read-back is under way; the
            # rejoin closes this coordinator before the next shard is read.
            member = holder["member"]
            self.coordinator.session.mark(SessionState.LOST)  # type: ignore[attr-defined]
            deadline = asyncio.get_running_loop().time() + 30
            while member.core.coordinator is self.coordinator:
                assert asyncio.get_running_loop().time() < deadline, member.state
                await asyncio.sleep(0.01)
        return result

    monkeypatch.setattr(GroupClient, "position", lost_during_read_back)
    url = f"memory://read-back-{uuid.uuid4().hex}"
    cfg = MemberConfig(group="g", warehouse=table, table="db.t", coordinator=url,
                       member_id="a", session_timeout_s=3, poll_interval_ms=50)
    async with open_coordinator(url), GroupMember(cfg) as member:
        holder["member"] = member
        batches = member.batches()
        got: set[int] = set()
        while len(got) < 10:
            batch = await asyncio.wait_for(batches.__anext__(), timeout=30)
            got.update(batch.to_arrow().column("id").to_pylist())
        # The last batch commits once the next one is asked for; then the
        # reader waits for a new snapshot.
        nxt = asyncio.ensure_future(batches.__anext__())
        await asyncio.sleep(0.3)
        assert sorted(member.core.owned) == [0, 1]
        # As after a commit of both shards that raised: the next read round
        # reads their positions back first.
        armed["left"] = 1
        for o in member.core.owned.values():
            o.uncertain = True
        write_rows(table, "db.t", range(10, 20))
        batch = await asyncio.wait_for(nxt, timeout=30)
        got.update(batch.to_arrow().column("id").to_pylist())
        while len(got) < 20:
            batch = await asyncio.wait_for(batches.__anext__(), timeout=30)
            got.update(batch.to_arrow().column("id").to_pylist())
        assert armed["left"] == 0
        assert member.state is MemberState.RUNNING and member.error is None
        await batches.aclose()


@pytest.mark.asyncio
@pytest.mark.parametrize("fate", ["drop", "recreate"])
async def test_a_driven_member_notices_a_dropped_or_recreated_table(
        table: str, fate: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Simulation seeds 43, 78, 103, ... (members driven as the Spark source
    drives one): the table check ran only in the read loop, which a member
    driven by a host that plans itself never runs. On a dropped table the
    host found no new snapshot for ever; on a re-created one it planned the
    new table's snapshots from the old table's positions. Now settling the
    positions checks the table now and then too: the member fails with
    TableNotFound or TableReplaced, and the host gets that error."""
    import paimon_group.member.head as head
    import paimon_group.member.host_reads as driving
    from paimon_group.errors import TableNotFound, TableReplaced
    from tests.support.tables import catalog

    url = f"memory://driven-{uuid.uuid4().hex}"
    cfg = MemberConfig(group="g", warehouse=table, table="db.t", coordinator=url,
                       member_id="a", session_timeout_s=3, poll_interval_ms=50)
    async with open_coordinator(url), GroupMember(cfg, auto_commit=False) as member:
        deadline = asyncio.get_running_loop().time() + 30
        while not await member.settle_positions():
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.05)
        catalog(table).drop_table("db.t", False)
        if fate == "recreate":
            make_pk_table(table, "db.t", buckets=2)
            write_rows(table, "db.t", range(100, 110))
        monkeypatch.setattr(driving, "TABLE_CHECK_S", 0.0, raising=False)
        monkeypatch.setattr(head, "TABLE_CHECK_S", 0.0)
        expected = TableNotFound if fate == "drop" else TableReplaced
        # The member leads: its head poll checks the table for the group, and
        # its own check follows as soon as the head stops vouching for it.
        with pytest.raises(expected):
            while True:
                assert asyncio.get_running_loop().time() < deadline + 10
                await member.settle_positions()
                await asyncio.sleep(0.05)
        assert isinstance(member.error, expected)


@pytest.mark.asyncio
async def test_a_start_resolved_across_a_rejoin_does_not_fail_the_member(
        table: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Simulation seed 10369: while the group's start was being resolved from
    the table, the session was lost and the member rejoined, closing the
    coordinator connection the read round had begun on; the round then
    created the group start on that closed connection, which every backend
    refuses for good, and the member failed. A round that spanned a rejoin
    now runs again on the new connection."""
    from paimon_group.reading.table import ShardedTable

    real_resolve = ShardedTable.resolve_start
    holder: dict[str, Any] = {}
    armed = {"left": 1}

    def lost_while_resolving(self: ShardedTable, start: Any) -> Any:
        found = real_resolve(self, start)
        if armed["left"]:
            armed["left"] -= 1
            member = holder["member"]
            old = member.core.coordinator
            loop = holder["loop"]
            assert old is not None
            loop.call_soon_threadsafe(old.session.mark, SessionState.LOST)  # type: ignore[attr-defined]
            import time

            deadline = time.monotonic() + 30
            while member.core.coordinator is old:  # this runs on an I/O thread: the loop rejoins
                assert time.monotonic() < deadline, member.state
                time.sleep(0.01)
        return found

    monkeypatch.setattr(ShardedTable, "resolve_start", lost_while_resolving)
    url = f"memory://start-rejoin-{uuid.uuid4().hex}"
    cfg = MemberConfig(group="g", warehouse=table, table="db.t", coordinator=url,
                       member_id="a", session_timeout_s=3, poll_interval_ms=50,
                       start="earliest")
    async with open_coordinator(url), GroupMember(cfg) as member:
        holder["member"], holder["loop"] = member, asyncio.get_running_loop()
        batches = member.batches()
        got: set[int] = set()
        while len(got) < 10:
            batch = await asyncio.wait_for(batches.__anext__(), timeout=30)
            got.update(batch.to_arrow().column("id").to_pylist())
        assert armed["left"] == 0
        assert member.state is MemberState.RUNNING and member.error is None
        await batches.aclose()


@pytest.mark.asyncio
async def test_a_driven_member_settling_while_it_leaves_holds_nothing(table: str) -> None:
    """Simulation seed 5877: a host (the Spark source) asked for the settled
    positions while its member was leaving; pinning the start of a shard
    without a position was refused locally (the member leaves), and the
    member's internal Stop reached the host, which died of it. Leaving, the
    member now answers that it holds nothing."""
    url = f"memory://settle-leaving-{uuid.uuid4().hex}"
    cfg = MemberConfig(group="g", warehouse=table, table="db.t", coordinator=url,
                       member_id="a", session_timeout_s=3, poll_interval_ms=50)
    async with open_coordinator(url):
        member = GroupMember(cfg)
        await member.start()
        try:
            for _ in range(200):
                if len(member.held_shards()) == 2:
                    break
                await asyncio.sleep(0.05)
            assert member.held_shards() == [0, 1]
            member.core.begin_stop()  # as stop() begins, before the leave ends
            session = member.core.session
            assert session is not None
            member.core.replace_session(dataclasses.replace(session, coordinator=None))
            assert await member.settle_positions() == {}
            member.core.replace_session(session)
        finally:
            await member.stop()


def test_a_full_scan_planned_after_the_table_was_dropped_says_the_table_is_gone(
        table: str) -> None:
    """Simulation seed 15757: a member driven as the Spark source drives one
    pinned a full scan of snapshot 1, the table was dropped, and its planner
    (before the next table check) said "cannot fully scan snapshot 1: it
    does not exist yet", an error the host cannot tell from a bug. A pinned
    snapshot missing with none after it, on a table whose schema is gone, is
    a dropped table: TableNotFound, as the table check says."""
    from paimon_group.errors import TableNotFound
    from paimon_group.reading.table import ShardedTable
    from tests.support.tables import catalog

    planner = ShardedTable.open(table, "db.t").planner(2)
    assert planner.plan_full([0, 1], 1).next_snapshot == 2
    catalog(table).drop_table("db.t", False)
    with pytest.raises(TableNotFound, match="dropped while the group read it"):
        planner.plan_full([0, 1], 1)


def test_a_full_scan_planned_after_the_table_was_recreated_says_so(table: str) -> None:
    """Simulation seed 13004: as seed 15757, but the table was dropped and
    created again: its schema directory exists, so the planner said "does not
    exist yet (latest: None)" for the pinned snapshot of the old table, and the
    host died of it. With the group's table identity known, it is
    TableReplaced, as the table check says."""
    import time

    from paimon_group.errors import TableReplaced
    from paimon_group.protocol.identity import table_identity
    from paimon_group.reading.table import ShardedTable
    from tests.support.tables import catalog, make_pk_table

    sharded = ShardedTable.open(table, "db.t")
    sharded.expected_identity = table_identity(sharded.table)
    planner = sharded.planner(2)
    assert planner.plan_full([0, 1], 1).next_snapshot == 2
    catalog(table).drop_table("db.t", False)
    time.sleep(0.01)  # another creation time, hence another identity
    make_pk_table(table, "db.t", buckets=4)
    with pytest.raises(TableReplaced, match="dropped and re-created while the group read it"):
        planner.plan_full([0, 1], 1)


def test_files_of_an_older_schema_read_after_the_table_was_dropped_say_a_file_is_gone(
        table: str) -> None:
    """Simulation seed 35083: a plan held files written with an older schema
    (a column had been added since), the table was dropped before they were
    read, and the Arrow reader took the older schema it could not find for a
    split it cannot read, handing it to pypaimon's reader, which died of an
    AttributeError the member could not tell from a bug (its consumer died,
    and the member never said the table was gone). A schema file that is
    missing is a file that is gone: FileNotFoundError, which the read round
    turns into TableNotFound / TableReplaced by checking the table."""
    import shutil

    from paimon_group.reading.table import ShardedTable
    from tests.test_schema_change import _add_column, _write_with_extra

    _add_column(table, "db.t")
    _write_with_extra(table, "db.t", range(10, 12))
    sharded = ShardedTable.open(table, "db.t")
    planner = sharded.planner(1)
    latest = sharded.latest_snapshot_id()
    assert latest is not None
    splits = planner.plan_full([0], latest).splits[0]
    # A reader that has not read schema 0 yet (another view of the table).
    planner = ShardedTable.open(table, "db.t").planner(1)
    # A drop under way: the table's directory is deleted file by file, and
    # its schema files may be gone before its data files.
    shutil.rmtree(Path(table) / "db.db" / "t" / "schema")
    with pytest.raises(FileNotFoundError, match="schema 0"):
        planner.read_arrow(splits)
    with pytest.raises(FileNotFoundError, match="schema 0"):
        list(planner.iter_batches(splits))
    shutil.rmtree(Path(table) / "db.db" / "t")  # the drop done
    with pytest.raises(FileNotFoundError):
        planner.read_arrow(splits)
