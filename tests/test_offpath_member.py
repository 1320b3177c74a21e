"""Off the happy path of one member (issue 12, findings 1, 4, 6, 7 and 12).

Every fault is injected deterministically at the exact coordinator call, on a
real Paimon table and the in-memory coordinator: a call that raises without
being applied ("not applied but raised"), a call that is applied and then
raises ("applied but raised", a reply lost after the write landed), and a
``SessionSuspended`` (ZooKeeper's brief loss of connection). No sleeps decide
an outcome: the tests wait for a state with a bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from coordinators import open_coordinator
from coordinators.errors import CoordinatorError, CoordinatorUnavailable, SessionSuspended
from coordinators.protocol import Coordinator, Delete, Op, Put
from paimon_group import GroupMember, MemberConfig
from paimon_group.errors import ShardCountMismatch
from paimon_group.member import MemberState
from paimon_group.member.commits import Commits
from paimon_group.member.membership import Membership
from paimon_group.member.ownership import ShardOwnership
from paimon_group.member.read_loop import ReadLoop
from paimon_group.member.state import OwnedShard
from paimon_group.protocol.group import GroupClient
from paimon_group.protocol.records import Position
from tests.support.tables import make_pk_table, write_rows
from tests.test_member_parts import make_core, owned_shard


@dataclass
class Fault:
    """Raise ``error`` on the next ``count`` calls of ``method`` that ``match``;
    ``applied``: the call is made first (its effect lands), then it raises."""

    method: str
    match: Callable[[tuple[Any, ...]], bool]
    error: Callable[[], CoordinatorError]
    applied: bool = False
    count: int = 1
    hits: int = 0


def inject(coord: Coordinator, *faults: Fault) -> None:
    """Wrap ``create``/``commit``/``get``/``list`` of one coordinator instance."""
    for name in ("create", "commit", "get", "list"):
        real = getattr(coord, name)

        def make(name: str, real: Callable[..., Awaitable[Any]]) -> Callable[..., Any]:
            async def call(*args: Any, **kwargs: Any) -> Any:
                fault = next((f for f in faults if f.method == name and f.count > 0
                              and f.match(args)), None)
                if fault is None:
                    return await real(*args, **kwargs)
                fault.count -= 1
                fault.hits += 1
                if fault.applied:
                    await real(*args, **kwargs)
                raise fault.error()
            return call

        setattr(coord, name, make(name, real))


def writes(fragment: str, *, delete: bool = False) -> Callable[[tuple[Any, ...]], bool]:
    """A commit that puts (or deletes) a key containing ``fragment``."""
    def match(args: tuple[Any, ...]) -> bool:
        ops: Sequence[Op] = args[1]
        kind = Delete if delete else Put
        return any(isinstance(op, kind) and fragment in op.key for op in ops)
    return match


def unavailable() -> CoordinatorError:
    return CoordinatorUnavailable("injected: no answer")


def suspended() -> CoordinatorError:
    return SessionSuspended("injected: session suspended")


def faulty_members(monkeypatch: pytest.MonkeyPatch, *faults: Fault,
                   member: str | None = None) -> None:
    """Members (only ``member``, if given) open coordinators with ``faults``."""
    real_open = Membership.connect_coordinator

    async def open_faulty(self: Membership) -> Coordinator:
        coord = await real_open(self)
        if member is None or self._core.member_id == member:
            inject(coord, *faults)
        return coord

    monkeypatch.setattr(Membership, "connect_coordinator", open_faulty)


def config(wh: str, url: str, member: str, **kw: Any) -> MemberConfig:
    return MemberConfig(group="g", warehouse=wh, table="db.t", coordinator=url,
                        member_id=member, session_timeout_s=3, poll_interval_ms=50, **kw)


async def read_ids(member: GroupMember, count: int,
                   on_batch: Callable[[Any], Awaitable[None]] | None = None) -> set[int]:
    got: set[int] = set()
    batches = member.batches()
    try:
        while len(got) < count:
            batch = await asyncio.wait_for(batches.__anext__(), timeout=30)
            if on_batch is not None:
                await on_batch(batch)
            got.update(batch.to_arrow().column("id").to_pylist())
    finally:
        await batches.aclose()
    return got


async def until(probe: Callable[[], Awaitable[bool]], what: str, limit_s: float = 30) -> None:
    deadline = asyncio.get_running_loop().time() + limit_s
    while not await probe():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"not within {limit_s}s: {what}")
        await asyncio.sleep(0.05)


@pytest.fixture
def table(tmp_path: Path) -> str:
    wh = str(tmp_path / "wh")
    make_pk_table(wh, "db.t", buckets=2)
    write_rows(wh, "db.t", range(10))
    return wh


def memory_url() -> str:
    return f"memory://offpath-{uuid.uuid4().hex}"


# -- finding 6: a retriable error during a control round ---------------------


@pytest.mark.asyncio
async def test_session_suspended_during_a_control_round_is_retried(
        table: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first owner-key create of the member raises SessionSuspended (as
    ZooKeeper does while the connection is down): the round is retried, the
    member does not fail."""
    fault = Fault("create", lambda a: "/owners/" in a[0], suspended)
    faulty_members(monkeypatch, fault)
    async with GroupMember(config(table, memory_url(), "a")) as member:
        assert await read_ids(member, 10) == set(range(10))
        assert fault.hits == 1
        assert member.state is MemberState.RUNNING and member.error is None


@pytest.mark.asyncio
async def test_non_retriable_error_in_a_control_round_still_fails_the_member(
        table: str, monkeypatch: pytest.MonkeyPatch) -> None:
    fault = Fault("create", lambda a: "/owners/" in a[0],
                  lambda: CoordinatorError("injected: refused"))
    faulty_members(monkeypatch, fault)
    member = GroupMember(config(table, memory_url(), "a"))
    await member.start()
    try:
        with pytest.raises(CoordinatorError, match="injected: refused"):
            await read_ids(member, 10)
        assert member.state is MemberState.FAILED
    finally:
        await member.stop()


@pytest.mark.asyncio
@pytest.mark.zk
async def test_zookeeper_suspension_during_a_control_round_is_retried(
        table: str, zk_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a real ZooKeeper server: the session is marked SUSPENDED just before
    the member's first owner-key create, so the backend itself raises
    SessionSuspended; the member carries on once the heartbeat confirms the
    session again."""
    from coordinators.protocol import SessionState

    real_acquire = GroupClient.acquire
    state = {"left": 1}

    async def acquire(self: GroupClient, shard: int, member_id: str, generation: int) -> Any:
        if state["left"] > 0:
            state["left"] -= 1
            self.coordinator.session.mark(SessionState.SUSPENDED)  # type: ignore[attr-defined]
        return await real_acquire(self, shard, member_id, generation)

    monkeypatch.setattr(GroupClient, "acquire", acquire)
    async with GroupMember(config(table, zk_url, "a")) as member:
        assert await read_ids(member, 10) == set(range(10))
        assert state["left"] == 0
        assert member.state is MemberState.RUNNING and member.error is None


# -- finding 1: a failed start pin ---------------------------------------------


def position_put(pred: Callable[[Position], bool], *,
                 release: bool | None = None) -> Callable[[tuple[Any, ...]], bool]:
    """A commit that puts a position for which ``pred`` holds (and releases
    its owner key or not, unless ``release`` is None)."""
    def match(args: tuple[Any, ...]) -> bool:
        ops: Sequence[Op] = args[1]
        deletes = any(isinstance(op, Delete) and "/owners/" in op.key for op in ops)
        if release is not None and deletes != release:
            return False
        return any(isinstance(op, Put) and "/positions/" in op.key
                   and pred(Position.decode(op.key, op.value)) for op in ops)
    return match


@pytest.mark.asyncio
@pytest.mark.parametrize("applied", [False, True], ids=["not-applied", "applied"])
async def test_a_failed_start_pin_is_retried_before_anything_is_read(
        table: str, monkeypatch: pytest.MonkeyPatch, applied: bool) -> None:
    """The commit pinning the resolved start raises: nothing is read before
    a pin is stored (the next round reads back a pin that landed, or resolves
    and pins again), so a later owner can never resolve the start anew."""
    fault = Fault("commit", position_put(lambda p: p.full_scan is not None), unavailable,
                  applied=applied)
    faulty_members(monkeypatch, fault)
    unpinned: list[int] = []
    async with GroupMember(config(table, memory_url(), "a")) as member:
        assert member.core.coordinator is not None
        client = GroupClient(member.core.coordinator, "g")

        async def pinned(batch: Any) -> None:
            position, _ = await client.position(batch.shard)
            if position is None:
                unpinned.append(batch.shard)

        assert await read_ids(member, 10, pinned) == set(range(10))
    assert fault.hits == 1
    assert unpinned == []


# -- finding 7: an ambiguous step commit, then a release -----------------------


@pytest.mark.asyncio
async def test_release_after_an_ambiguous_step_commit_never_lowers_the_position(
        table: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Member a's commit of next snapshot 3 lands but raises. Before a reads
    again, member b joins and one shard moves: a's release must not write the
    older position 2 (b would deliver snapshot 2 again, and the position would
    move backwards)."""
    fault = Fault("commit", position_put(lambda p: p.next_snapshot == 3, release=False),
                  unavailable, applied=True)
    faulty_members(monkeypatch, fault, member="a")
    resume = asyncio.Event()
    real_plan = ReadLoop._plan_next

    async def plan_next(self: ReadLoop, *args: Any) -> Any:
        if fault.hits and self._core.member_id == "a":
            await resume.wait()  # a does not read on until b has its shard
        return await real_plan(self, *args)

    monkeypatch.setattr(ReadLoop, "_plan_next", plan_next)
    url = memory_url()
    async with GroupMember(config(table, url, "a")) as a:
        batches = a.batches()
        got: set[int] = set()
        while len(got) < 10:
            got.update((await asyncio.wait_for(batches.__anext__(), 30))
                       .to_arrow().column("id").to_pylist())
        write_rows(table, "db.t", range(10, 20))
        while len(got) < 20:
            got.update((await asyncio.wait_for(batches.__anext__(), 30))
                       .to_arrow().column("id").to_pylist())
        pending = asyncio.ensure_future(batches.__anext__())  # acks the last batch
        try:
            await until(lambda: _true(fault.hits == 1), "the ambiguous commit")
            async with GroupMember(config(table, url, "b")) as b:
                await until(lambda: _true(len(b.owned_shards) == 1
                                          and len(a.owned_shards) == 1), "one shard moved")
                assert b.core.coordinator is not None
                positions = await GroupClient(b.core.coordinator, "g").positions()
                assert {s: p.next_snapshot for s, p in positions.items()} == {0: 3, 1: 3}
                resume.set()
        finally:
            resume.set()
            pending.cancel()
            with contextlib.suppress(BaseException):
                await pending
            await batches.aclose()


async def _true(value: bool) -> bool:
    return value


# -- finding 7: the owner's guard (OwnedShard, written through Commits) -----------


@contextlib.asynccontextmanager
async def commits_on_one_shard() -> AsyncIterator[tuple[Coordinator, GroupClient, Commits,
                                                          OwnedShard]]:
    """A member core's commits part, holding shard 0 (no position yet)."""
    async with open_coordinator(memory_url()) as coord:
        core = make_core(coord)
        assert core.group is not None
        yield coord, core.group, Commits(core, core.owned_record()), await owned_shard(core, 0)


@pytest.mark.asyncio
async def test_a_lower_position_is_never_written_under_the_same_epoch() -> None:
    async with commits_on_one_shard() as (coord, group, commits, o):
        await commits.commit({0: o}, 5)
        # Lower: not written, and not a rejection (the shard stays ours).
        await commits.commit({0: o}, 3)
        # A pending full scan at the same next snapshot is lower too.
        await commits.commit({0: o}, 5, full_scan=4)
        assert o.active and (o.committed, o.next_snapshot, o.full_scan) == (5, 5, None)
        position, _ = await group.position(0)
        assert position is not None and (position.next_snapshot, position.full_scan) == (5, None)
        # The release writes the owner's position, never a lower one.
        assert await commits.release(group, o, finished=True)
        assert await coord.get(group.keys.owner(0)) is None
        position, _ = await group.position(0)
        assert position is not None and position.next_snapshot == 5


@pytest.mark.asyncio
@pytest.mark.parametrize("applied", [False, True], ids=["not-applied", "applied"])
async def test_a_lower_position_after_an_ambiguous_commit(applied: bool) -> None:
    """A commit of 5 raised: a later commit of 3 is compared with the stored
    position, read back: written if 5 did not land, left out if it did (and
    reading goes on from 5)."""
    async with commits_on_one_shard() as (coord, group, commits, o):
        await commits.commit({0: o}, 2)
        inject(coord, Fault("commit", position_put(lambda p: p.next_snapshot == 5),
                            unavailable, applied=applied))
        with pytest.raises(CoordinatorUnavailable):
            await commits.commit({0: o}, 5)
        assert o.uncertain and o.committed == 2
        await commits.commit({0: o}, 3)
        assert not o.uncertain and o.next_snapshot == (5 if applied else 3)
        assert await commits.release(group, o, finished=True)
        position, _ = await group.position(0)
        assert position is not None and position.next_snapshot == (5 if applied else 3)
        assert await coord.get(group.keys.owner(0)) is None


@pytest.mark.asyncio
async def test_a_release_that_reads_back_never_writes_over_a_commit_made_meanwhile() -> None:
    """A driven member leaving: a commit of 5 raised (not applied); the
    release reads the stored position back (2) and, while that answer is on
    its way, the host's commit of 9 is sent. Were they to interleave, the
    release would write 2 over 9 under the same epoch and the next owner
    read 7 snapshots again: the member's position writes run one at a time."""
    async with commits_on_one_shard() as (coord, group, commits, o):
        await commits.commit({0: o}, 2)
        inject(coord, Fault("commit", position_put(lambda p: p.next_snapshot == 5),
                            unavailable, applied=False))
        with pytest.raises(CoordinatorUnavailable):
            await commits.commit({0: o}, 5)
        real_get = coord.get
        reading, answer = asyncio.Event(), asyncio.Event()

        async def slow_get(key: str) -> Any:
            entry = await real_get(key)
            if key == group.keys.position(0) and not answer.is_set():
                reading.set()
                await answer.wait()  # read, not yet answered
            return entry

        coord.get = slow_get  # type: ignore[method-assign]
        release = asyncio.ensure_future(commits.release(group, o, finished=True))
        await reading.wait()
        nine = asyncio.ensure_future(commits.commit({0: o}, 9))
        await asyncio.sleep(0.2)
        answer.set()
        released, _ = await asyncio.gather(release, nine)
        assert released
        position, _ = await group.position(0)
        assert position is not None
        assert o.committed != 9 or position.next_snapshot >= 9, (o.committed, position)
        assert await coord.get(group.keys.owner(0)) is None


@pytest.mark.asyncio
async def test_a_shard_whose_revocation_ended_commits_nothing() -> None:
    """Its release was tried with its last position; were its owner key still
    there (a release of unknown outcome), a later commit of the ended record
    would land behind the back of the record that acquires the shard again
    under that key: it is refused, never sent."""
    async with commits_on_one_shard() as (_coord, group, commits, o):
        await commits.commit({0: o}, 2)
        o.revoke()
        o.drop()
        await commits.commit({0: o}, 9)
        position, _ = await group.position(0)
        assert position is not None and position.next_snapshot == 2
        assert o.committed == 2


# -- finding 12: the stored shard count, and the refused commit -------------------


@pytest.mark.asyncio
async def test_without_shards_a_group_created_meanwhile_keeps_its_count(
        table: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Between the member's read of the group record (absent) and its create,
    another member creates the group with 1 shard. Without --shards the stored
    count wins (one log line), instead of "--shards 2 contradicts it"."""
    url = memory_url()

    async def create_first(coord: Coordinator) -> None:
        meta_key = GroupClient(coord, "g").keys.meta
        real_create = coord.create

        async def create(key: str, value: bytes, *, ephemeral: bool = False) -> Any:
            if key == meta_key:
                async with open_coordinator(url) as other:
                    await GroupClient(other, "g").ensure_meta(1, "db.t")
            return await real_create(key, value, ephemeral=ephemeral)

        coord.create = create  # type: ignore[method-assign]

    real_open = Membership.connect_coordinator

    async def open_racing(self: Membership) -> Coordinator:
        coord = await real_open(self)
        await create_first(coord)
        return coord

    monkeypatch.setattr(Membership, "connect_coordinator", open_racing)
    caplog.set_level(logging.INFO, logger="paimon_group.member")
    async with GroupMember(config(table, url, "a")) as member:
        assert member.num_shards == 1
        assert await read_ids(member, 10) == set(range(10))
    assert any("keeps its stored shard count 1" in r.getMessage() for r in caplog.records)


@pytest.mark.asyncio
async def test_an_explicit_contradicting_shards_names_the_stored_count(table: str) -> None:
    url = memory_url()
    async with open_coordinator(url) as other:  # the memory store lives while it is open
        await GroupClient(other, "g").ensure_meta(1, "db.t")
        with pytest.raises(ShardCountMismatch,
                           match=r"has 1 shards stored; --shards 2 contradicts"):
            await GroupMember(config(table, url, "a", shards=2)).start()
        # Without --shards the same group is joined with its stored count.
        async with GroupMember(config(table, url, "b")) as member:
            assert member.num_shards == 1


@pytest.mark.asyncio
@pytest.mark.parametrize("how", ["start", "async with"])
async def test_a_start_that_fails_keeps_nothing_open(
        table: str, tmp_path: Path, how: str) -> None:
    """A start that raises after the coordinator was opened closes it (its
    session ends at once, no member key stays behind) and the history file,
    also for a caller that never calls stop(): ``async with`` cannot, as
    ``__aexit__`` does not run when ``__aenter__`` raises. Found by the
    simulation: a worker running 20,000 seeds ran out of file descriptors,
    one history file per failed start."""
    url = memory_url()
    async with open_coordinator(url) as other:
        await GroupClient(other, "g").ensure_meta(1, "db.t")
        member = GroupMember(config(table, url, "a", shards=2,
                                    history_path=str(tmp_path / "h.jsonl")))
        with pytest.raises(ShardCountMismatch):
            if how == "start":
                await member.start()
            else:
                async with member:
                    raise AssertionError("not reached")
        assert member.core.coordinator is None
        assert member.history.closed
        assert await GroupClient(other, "g").members() == {}
        if how == "async with":
            assert member.state is MemberState.STOPPED


@pytest.mark.asyncio
async def test_a_commit_after_the_graceful_leave_gave_up_is_refused(table: str) -> None:
    """A batch still in the handler when the leave stops waiting for it is
    abandoned; its commit, once the handler returns, is refused locally
    (counted in ``refused_commits`` and the history), never sent."""
    member = GroupMember(config(table, memory_url(), "a", revoke_timeout_s=0.1,
                                max_parallel_shards=1))
    await member.start()
    entered, release = threading.Event(), threading.Event()

    def handler(batch: Any) -> None:
        entered.set()
        release.wait(30)

    runner = asyncio.ensure_future(member.run(handler))
    try:
        await until(lambda: _true(entered.is_set()), "a batch in the handler")
        await member.stop(timeout=1)
        release.set()
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(runner, 30)
    finally:
        release.set()
    assert member.stats.refused_commits == 1


# -- finding 4: a revoke that cannot release --------------------------------------


def release_commit(args: tuple[Any, ...]) -> bool:
    """A commit deleting an owner key (a revoke's release)."""
    ops: Sequence[Op] = args[1]
    return any(isinstance(op, Delete) and "/owners/" in op.key for op in ops)


@pytest.mark.asyncio
async def test_a_release_that_raised_is_retried_until_the_key_is_gone(
        table: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Member b joins and one of a's shards moves to it; a's release commit
    raises without being applied. a's session lives on, so the owner key is
    only ever deleted by a retry: b acquires the shard and delivers it."""
    fault = Fault("commit", release_commit, unavailable)
    faulty_members(monkeypatch, fault, member="a")
    url = memory_url()
    async with GroupMember(config(table, url, "a")) as a:
        assert await read_ids(a, 10) == set(range(10))
        async with GroupMember(config(table, url, "b")) as b:
            await until(lambda: _true(fault.hits == 1), "the release raised")
            await until(lambda: _true(len(b.owned_shards) == 1 and len(a.owned_shards) == 1),
                        "the moved shard acquired by b")
            assert await read_ids(b, 1)  # b reads its shard
            assert not a.ownership.releases


@pytest.mark.asyncio
async def test_a_revoke_while_the_session_is_not_confirmed_live_releases_later(
        table: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The session cannot be confirmed live at the moment of the revoke (a
    suspended etcd keep-alive, a ZooKeeper disconnection): the release is not
    attempted then, but once the session is confirmed again."""
    url = memory_url()
    real_revoke = ShardOwnership.revoke
    blinded: list[str] = []

    async def revoke(self: ShardOwnership, shards: list[int], *, reason: str) -> None:
        if self._core.member_id == "a" and reason == "reassigned" and not blinded:
            blinded.append(reason)
            assert self._core.coordinator is not None
            session = self._core.coordinator.session
            real_is_live = session.is_live
            session.is_live = lambda margin_s=0.0, now=None: False  # type: ignore[method-assign]
            try:
                await real_revoke(self, shards, reason=reason)
            finally:
                session.is_live = real_is_live  # type: ignore[method-assign]
            return
        await real_revoke(self, shards, reason=reason)

    monkeypatch.setattr(ShardOwnership, "revoke", revoke)
    async with GroupMember(config(table, url, "a")) as a:
        assert await read_ids(a, 10) == set(range(10))
        async with GroupMember(config(table, url, "b")) as b:
            await until(lambda: _true(len(b.owned_shards) == 1 and len(a.owned_shards) == 1),
                        "the moved shard acquired by b")
            assert blinded


@pytest.mark.asyncio
async def test_sweep_releases_only_unowned_keys_of_our_own() -> None:
    from paimon_group.protocol.releasing import PendingReleases

    url = memory_url()
    async with open_coordinator(url) as ours, open_coordinator(url) as theirs, \
            open_coordinator(url) as old:
        mine, other, older = (GroupClient(c, "g") for c in (ours, theirs, old))
        owned = await mine.acquire(0, "m", 1)
        orphan = await mine.acquire(1, "m", 1)
        assigned = await mine.acquire(2, "m", 1)
        foreign = await other.acquire(3, "x", 1)
        stale = await older.acquire(4, "m", 1)  # our member id, an older session
        assert None not in (owned, orphan, assigned, foreign, stale)
        pending = PendingReleases()
        assert owned is not None
        released = await pending.sweep(mine, "m", owned={0: owned}, assigned={2})
        assert sorted(released) == [1, 4]
        assert sorted(await mine.owners()) == [0, 2, 3]
        assert not pending
