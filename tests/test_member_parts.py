"""Each part of a member, built alone on a member core (no GroupMember).

The core (:class:`~paimon_group.member.core.MemberCore`) is the state every
part reads; the parts get it and their sibling parts passed in. Here the core
talks to a real in-memory coordinator (``memory://``), and a sibling part a
test does not look at is a small stand-in, so each part's own rules are
observed directly.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterable, Iterator

import pytest
import pytest_asyncio

from coordinators import open_coordinator
from coordinators.errors import CoordinatorError, SessionLost
from coordinators.protocol import Coordinator
from paimon_group.config.member import MemberConfig
from paimon_group.member.commits import Commits
from paimon_group.member.control import Control
from paimon_group.member.core import JoinedSession, MemberCore
from paimon_group.member.host_reads import HostReads
from paimon_group.member.membership import Membership
from paimon_group.member.ownership import ShardOwnership
from paimon_group.member.read_loop import ReadLoop
from paimon_group.member.state import OwnedShard
from paimon_group.protocol.group import GroupClient
from paimon_group.protocol.records import Assignment, GroupMeta, MemberInfo
from paimon_group.protocol.table_map import TableRange


class Listener:
    def __init__(self) -> None:
        self.calls: list[tuple[str, list[int]]] = []

    def on_assigned(self, shards: list[int]) -> None:
        self.calls.append(("assigned", shards))

    def on_revoked(self, shards: list[int]) -> None:
        self.calls.append(("revoked", shards))

    def on_lost(self, shards: list[int]) -> None:
        self.calls.append(("lost", shards))


class NoMirror:
    """A consumer mirror that writes no files."""

    def due(self, shard: int, n: int, *, full_scan_pending: bool,
            start_moves: int | None = None) -> bool:
        return False

    def read_position(self, shard: int) -> None:
        return None


class NoTable:
    """The one table of a core joined with no table: every shard its own."""

    index = None
    gone = None
    single = True
    range = TableRange(name="db.t", table_id="", first=0, shards=1 << 20)

    def local(self, shard: int) -> int:
        return shard


class NoTables:
    """The tables of a core joined with no table (:class:`NoTable` for every shard)."""

    single = True
    any_file_rule = False  # no table: no start that moves

    def __init__(self) -> None:
        self.mirror = NoMirror()
        self._table = NoTable()

    def get(self, shard: int) -> NoTable:
        return self._table

    of = get

    def by_table(self, shards: Iterable[int]) -> dict[NoTable, list[int]]:
        listed = list(shards)
        return {self._table: listed} if listed else {}

    def __iter__(self) -> Iterator[NoTable]:
        return iter(())


@pytest.fixture
def url() -> str:
    return f"memory://parts-{uuid.uuid4().hex}"


async def _session(url: str) -> AsyncIterator[Coordinator]:
    coord = open_coordinator(url)
    await coord.connect()
    try:
        yield coord
    finally:
        await coord.close()


@pytest_asyncio.fixture
async def coordinator(url: str) -> AsyncIterator[Coordinator]:
    async for coord in _session(url):
        yield coord


@pytest_asyncio.fixture
async def another(url: str) -> AsyncIterator[Coordinator]:
    """Another member's session on the same coordinator."""
    async for coord in _session(url):
        yield coord


def make_core(coord: Coordinator, member: str = "m", listener: Listener | None = None,
              *, forming_wait_s: float = 1.0, shards: int | None = None) -> MemberCore:
    """A member core joined to ``coord`` (as the join leaves it), no table;
    with ``shards``, joined to a group of that many shards."""
    cfg = MemberConfig(group="g", warehouse="/nonexistent", table="db.t",
                       coordinator="memory://unused", member_id=member, session_timeout_s=3,
                       forming_wait_s=forming_wait_s)
    core = MemberCore(cfg, listener=listener)
    core.replace_session(JoinedSession(
        meta=None if shards is None else GroupMeta(num_shards=shards, table="db.t",
                                                   created_at=0.0),
        tables=NoTables(),  # type: ignore[arg-type]
        coordinator=coord, group=GroupClient(coord, "g")))
    core.joined.set()
    return core


def ownership_part(coord: Coordinator) -> tuple[MemberCore, Listener, ShardOwnership]:
    """The ownership part on a core joined to ``coord``, and the core's listener."""
    listener = Listener()
    core = make_core(coord, listener=listener)
    owned = core.owned_record()
    return core, listener, ShardOwnership(core, Commits(core, owned), owned)


async def owned_shard(core: MemberCore, shard: int, *, at: int | None = None) -> OwnedShard:
    """Acquire ``shard``'s owner key for the core's member (and commit ``at``)."""
    assert core.group is not None
    epoch = await core.group.acquire(shard, core.member_id, 1)
    assert epoch is not None
    o = OwnedShard(shard=shard, epoch=epoch, generation=1)
    if at is not None:
        assert await core.group.commit_positions({shard: (epoch, at)}, core.member_id)
        o.next_snapshot = o.committed = at
    core.owned_record()[shard] = o
    return o


# -- commits ----------------------------------------------------------------


@pytest.mark.asyncio
async def test_commits_advance_an_owned_shard_and_drop_a_stale_one(
        coordinator: Coordinator) -> None:
    listener = Listener()
    core = make_core(coordinator, listener=listener)
    commits = Commits(core, core.owned_record())
    ours = await owned_shard(core, 0, at=1)
    stale = OwnedShard(shard=1, epoch=999, generation=1)  # nobody gave us this epoch
    core.owned_record()[1] = stale
    await commits.commit({0: ours}, 5)
    assert (ours.committed, ours.next_snapshot, core.stats.commits) == (5, 5, 1)
    await commits.commit({1: stale}, 5)
    assert stale.dropped and 1 not in core.owned
    assert core.stats.rejected_commits == 1
    assert listener.calls == [("lost", [1])]
    assert core.group is not None
    position, _ = await core.group.position(0)
    assert position is not None and position.next_snapshot == 5


@pytest.mark.asyncio
async def test_commits_read_back_takes_the_stored_position(coordinator: Coordinator) -> None:
    core = make_core(coordinator)
    commits = Commits(core, core.owned_record())
    o = await owned_shard(core, 0, at=3)
    # A commit that landed although its answer was lost: stored 9, we know 3.
    assert core.group is not None
    assert await core.group.commit_positions({0: (o.epoch, 9)}, "m")
    o.uncertain = True
    await commits.read_back([o])
    assert (o.uncertain, o.committed, o.next_snapshot) == (False, 9, 9)


# -- ownership --------------------------------------------------------------


@pytest.mark.asyncio
async def test_ownership_acquires_free_shards_and_reads_their_positions(
        coordinator: Coordinator, another: Coordinator) -> None:
    core, listener, ownership = ownership_part(coordinator)
    other = GroupClient(another, "g")
    assert await other.acquire(2, "x", 1) is not None  # held by another member
    for shard, at in ((0, 7), (1, 4)):  # released by their previous owner
        epoch = await other.acquire(shard, "x", 1)
        assert epoch is not None
        assert await other.commit_positions({shard: (epoch, at)}, "x", release=True)
    core.leadership_record().assignment = Assignment(generation=3, leader="m",
                                                     leader_epoch=1, shards={"m": [0, 1, 2]})
    assert ownership.pending_acquisitions() == [0, 1, 2]
    await ownership.acquire([0, 1, 2], 3)
    assert sorted(core.owned) == [0, 1]
    assert (core.owned[0].next_snapshot, core.owned[1].next_snapshot) == (7, 4)
    assert ownership.pending_acquisitions() == [2]
    assert listener.calls == [("assigned", [0, 1])]


@pytest.mark.asyncio
async def test_ownership_revoke_commits_and_releases_in_one_step(
        coordinator: Coordinator) -> None:
    core, listener, ownership = ownership_part(coordinator)
    o = await owned_shard(core, 4, at=6)
    o.revoke()
    await ownership.revoke([4], reason="reassigned")
    assert core.owned == {} and o.dropped
    assert core.stats.shards_moved["revoked"] == 1
    assert listener.calls == [("revoked", [4])]
    assert core.group is not None
    assert (await core.group.owners_of([4])) == {}  # the owner key is gone
    position, _ = await core.group.position(4)
    assert position is not None and position.next_snapshot == 6
    assert not ownership.releases


@pytest.mark.asyncio
async def test_ownership_check_drops_a_shard_whose_key_is_gone(
        coordinator: Coordinator) -> None:
    core, listener, ownership = ownership_part(coordinator)
    kept = await owned_shard(core, 0, at=1)
    gone = await owned_shard(core, 1, at=1)
    assert core.group is not None
    assert await core.group.release(1, gone.epoch)  # as `members remove` would
    await ownership.check_ownership(core.group)
    assert sorted(core.owned) == [0] and kept.active and gone.dropped
    assert listener.calls == [("lost", [1])]
    assert not ownership.sweep_due  # the first check swept once


# -- reading ----------------------------------------------------------------


class RecordingCommits(Commits):
    """The commits part, with its read-back recorded (not sent)."""

    def __init__(self, core: MemberCore) -> None:
        super().__init__(core, core.owned_record())
        self.read_back_of: list[list[int]] = []

    async def read_back(self, owned: list[OwnedShard]) -> None:
        self.read_back_of.append([o.shard for o in owned])
        for o in owned:
            o.uncertain = False


@pytest.mark.asyncio
async def test_reading_settles_only_uncertain_shards(coordinator: Coordinator) -> None:
    core = make_core(coordinator)
    commits = RecordingCommits(core)
    reading = ReadLoop(core, commits)
    sure = await owned_shard(core, 0, at=2)
    unsure = await owned_shard(core, 1, at=2)
    unsure.uncertain = True
    await reading.settle([sure, unsure])
    assert commits.read_back_of == [[1]]
    assert not unsure.uncertain


@pytest.mark.asyncio
async def test_reading_stops_at_once_when_the_member_leaves(coordinator: Coordinator) -> None:
    core = make_core(coordinator)
    reading = ReadLoop(core, Commits(core, core.owned_record()))
    await owned_shard(core, 0, at=2)
    core.begin_stop()

    async def process(batch: object, slot: object) -> None:
        raise AssertionError("nothing is delivered once the member leaves")

    await reading.run(process)
    assert core.error is None and core.stats.batches == 0


@pytest.mark.asyncio
async def test_reading_ends_quietly_when_the_leave_closes_the_coordinator_under_a_round(
        coordinator: Coordinator) -> None:
    """A round in flight when the leave closes the coordinator (the shards are
    released already) ends the reading; the member does not fail (a docs
    test's member stopped just after acquiring, its pin refused as "closed")."""
    core = make_core(coordinator)
    reading = ReadLoop(core, Commits(core, core.owned_record()))
    calls = 0

    async def round_under_a_closing_leave(process: object) -> None:
        nonlocal calls
        calls += 1
        core.begin_stop()  # the stop arrives while the round runs
        raise CoordinatorError("etcd coordinator etcd://x/p is closed; open a new one")

    reading._read_loop = round_under_a_closing_leave  # type: ignore[assignment,method-assign]

    async def process(batch: object, slot: object) -> None:
        raise AssertionError("nothing is delivered")

    await asyncio.wait_for(reading.run(process), timeout=5)
    assert calls == 1 and core.error is None


# -- driving ----------------------------------------------------------------


@pytest.mark.asyncio
async def test_driving_commits_positions_forward_only(coordinator: Coordinator) -> None:
    core = make_core(coordinator)
    commits = Commits(core, core.owned_record())
    driving = HostReads(core, commits, ReadLoop(core, commits))
    await owned_shard(core, 0, at=5)
    await owned_shard(core, 1, at=5)
    assert driving.held_shards() == [0, 1]
    assert driving.mark_busy([0, 7]) == [0]
    assert not core.owned[0].idle.is_set()
    driving.mark_idle([0])
    assert core.owned[0].idle.is_set()
    result = await driving.commit_positions({0: 3, 1: 8, 9: 8})
    assert result == {0: True, 1: True, 9: False}
    assert core.owned[0].committed == 5  # not moved back
    assert core.owned[1].committed == 8 and core.stats.commits == 1


# -- control ----------------------------------------------------------------


class RecordingOwnership(ShardOwnership):
    """The ownership part, with acquisitions and revocations recorded (not sent)."""

    def __init__(self, core: MemberCore) -> None:
        owned = core.owned_record()
        super().__init__(core, Commits(core, owned), owned)
        self.acquired: list[tuple[list[int], int]] = []
        self.revoked: list[tuple[list[int], str]] = []

    async def acquire(self, shards: list[int], generation: int, *,
                      interrupt: object = None) -> None:
        self.acquired.append((list(shards), generation))

    async def revoke(self, shards: list[int], *, reason: str) -> None:
        self.revoked.append((list(shards), reason))


async def register(core: MemberCore, coord: Coordinator) -> None:
    assert core.group is not None
    info = MemberInfo(member_id=core.member_id, host="h", pid=1, version="0",
                      started_at=0.0, session=coord.session.id)
    assert await core.group.register(info) is not None


@pytest.mark.asyncio
async def test_control_round_leads_publishes_and_follows(coordinator: Coordinator) -> None:
    # A new group's leader waits for arrivals to pause (tests/test_forming_group.py):
    # here at once.
    core = make_core(coordinator, forming_wait_s=0.0, shards=3)
    await register(core, coordinator)
    ownership = RecordingOwnership(core)
    control = Control(core, ownership, core.leadership_record())
    await control.reconcile({"local"})
    assert core.is_leader
    assert core.assignment is not None and core.assignment.shards_of("m") == [0, 1, 2]
    assert ownership.acquired == [([0, 1, 2], core.assignment.generation)]
    assert core.group is not None
    published, _ = await core.group.read_assignment()
    assert published is not None and published.generation == core.assignment.generation


@pytest.mark.asyncio
async def test_control_round_without_our_member_key_is_a_lost_session(
        coordinator: Coordinator) -> None:
    core = make_core(coordinator, shards=1)
    ownership = RecordingOwnership(core)
    with pytest.raises(SessionLost, match="member key"):
        await Control(core, ownership, core.leadership_record()).reconcile({"local"})
    assert not core.is_leader and ownership.acquired == []


# -- membership -------------------------------------------------------------


@pytest.mark.asyncio
async def test_membership_leave_deregisters_releases_and_resigns(
        coordinator: Coordinator) -> None:
    core = make_core(coordinator)
    await register(core, coordinator)
    assert core.group is not None
    core.leadership_record().leader_epoch = await core.group.try_lead("m")
    assert core.leader_epoch is not None
    await owned_shard(core, 0, at=1)
    await owned_shard(core, 2, at=1)
    ownership = RecordingOwnership(core)
    membership = Membership(core, ownership, Control(core, ownership, core.leadership_record()))
    await membership.leave()
    assert "m" not in await core.group.members()
    assert ownership.revoked == [([0, 2], "leaving")]
    assert all(o.revoking for o in core.owned.values())
    assert await core.group.leader() is None and core.leader_epoch is None
