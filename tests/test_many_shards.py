"""A member holding many shards: its commits fit the coordinator's transactions,
its releases take few commits, and its acquisitions stop at a newer generation.

etcd refuses a transaction of more than 128 compares or operations
(``--max-txn-ops``, counted for the compares and the operations apart); a
member's step commit carries a compare and a write for every shard it holds
(the shards without rows ride along), so a member of more than 128 shards
could not commit a step on etcd at all (and a release of more than 64 shards
with their positions, two operations each, would not fit either). The
member-level test runs on every backend; the part tests count the commits
on the in-memory one.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from coordinators import open_coordinator
from coordinators.protocol import Coordinator, Delete
from paimon_group import GroupMember, MemberConfig
from paimon_group.member import ownership as ownership_module
from paimon_group.protocol.admin import GroupAdmin
from paimon_group.protocol.commit_size import SHARDS_PER_COMMIT, commit_chunks
from paimon_group.protocol.group import GroupClient
from paimon_group.protocol.records import Assignment
from tests.support.tables import make_pk_table, write_rows
from tests.test_member_parts import _session, owned_shard, ownership_part


@pytest_asyncio.fixture
async def coordinator() -> AsyncIterator[Coordinator]:
    async for coord in _session(f"memory://many-{uuid.uuid4().hex}"):
        yield coord


def count_commits(coord: Coordinator) -> list[int]:
    """Wrap ``coord.commit``: the list gets each commit's number of owner-key deletions."""
    deletions: list[int] = []
    real = coord.commit

    async def commit(checks: Any, ops: Any) -> bool:
        deletions.append(sum(isinstance(op, Delete) and "/owners/" in op.key for op in ops))
        return await real(checks, ops)

    coord.commit = commit  # type: ignore[method-assign]
    return deletions


def test_commit_chunks_fit_an_etcd_transaction() -> None:
    chunks = commit_chunks(range(99, -1, -1))
    assert [len(c) for c in chunks] == [32, 32, 32, 4]
    assert [s for c in chunks for s in c] == list(range(100))
    # A shard is one compare and up to two operations: within etcd's 128.
    assert 2 * SHARDS_PER_COMMIT <= 128


async def _url(request: pytest.FixtureRequest, backend: str, tmp_path: Path) -> str:
    if backend == "memory":
        return f"memory://many-{uuid.uuid4().hex}"
    if backend == "sqlite":
        return f"sqlite://{tmp_path}/coord.sqlite"
    return str(request.getfixturevalue(f"{backend}_url"))


@pytest.mark.asyncio
@pytest.mark.parametrize("backend", [
    "memory", "sqlite", pytest.param("etcd", marks=pytest.mark.etcd),
    pytest.param("zk", marks=pytest.mark.zk)])
async def test_a_member_of_150_shards_reads_and_commits_them_all(
        request: pytest.FixtureRequest, backend: str, tmp_path: Path) -> None:
    url = await _url(request, backend, tmp_path)
    wh = str(tmp_path / "wh")
    make_pk_table(wh, "db.t", buckets=150)
    write_rows(wh, "db.t", range(20))
    cfg = MemberConfig(group="many", warehouse=wh, table="db.t", coordinator=url,
                       member_id="a", shards=150, session_timeout_s=5, poll_interval_ms=50,
                       history_path=str(tmp_path / "history.jsonl"))
    got: list[int] = []
    async with GroupMember(cfg) as member:
        batches = member.batches()
        while len(got) < 20:
            batch = await asyncio.wait_for(batches.__anext__(), timeout=60)
            got += batch.to_arrow().column("id").to_pylist()
        for _ in range(600):  # then every shard at the same position: one step
            if len(member.held_shards()) == 150:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)
        write_rows(wh, "db.t", range(20, 30))
        while len(got) < 30:
            batch = await asyncio.wait_for(batches.__anext__(), timeout=60)
            got += batch.to_arrow().column("id").to_pylist()
        await batches.aclose()
        assert member.stats.rejected_commits == 0
        async with open_coordinator(url) as coord:
            positions = await GroupClient(coord, "many").positions()
    assert sorted(got) == list(range(30))
    # No commit failed on its way (before: etcd refused the step's commit of
    # 150 shards, "too many operations in txn request").
    records = [json.loads(line) for line in (tmp_path / "history.jsonl").read_text().splitlines()]
    commits = [r for r in records if r.get("event") == "commit"]
    assert commits and {r["outcome"] for r in commits} == {"accepted"}
    # Every shard's position was committed (the start's pin and the steps
    # carry all 150, the shards without rows too).
    assert sorted(positions) == list(range(150))


@pytest.mark.asyncio
async def test_a_release_of_70_shards_takes_three_commits(coordinator: Coordinator) -> None:
    core, listener, ownership = ownership_part(coordinator)
    owned = [await owned_shard(core, s, at=5 if s % 2 else None) for s in range(70)]
    deletions = count_commits(coordinator)
    for o in owned:
        o.revoke()
    await ownership.revoke(list(range(70)), reason="reassigned")
    assert deletions == [32, 32, 6]
    assert core.owned == {} and all(o.dropped for o in owned)
    assert listener.calls == [("revoked", list(range(70)))]
    assert core.group is not None
    assert await core.group.owners() == {}
    positions = await core.group.positions()
    assert sorted(positions) == list(range(1, 70, 2))  # those that had one, no others
    assert {p.next_snapshot for p in positions.values()} == {5}


@pytest.mark.asyncio
async def test_a_refused_release_commit_is_done_again_shard_by_shard(
        coordinator: Coordinator) -> None:
    core, listener, ownership = ownership_part(coordinator)
    owned = [await owned_shard(core, s, at=3) for s in range(40)]
    assert core.group is not None
    # Shard 7's owner key was deleted meanwhile (``members remove``): the
    # first commit's check fails, so its 32 shards are released one by one.
    assert await core.group.release(7, owned[7].epoch)
    deletions = count_commits(coordinator)
    for o in owned:
        o.revoke()
    await ownership.revoke(list(range(40)), reason="reassigned")
    assert deletions == [32, *[1] * 32, 8]
    assert listener.calls == [("revoked", [s for s in range(40) if s != 7]), ("lost", [7])]
    assert await core.group.owners() == {}


@pytest.mark.asyncio
async def test_acquisitions_stop_once_a_newer_generation_is_out(
        coordinator: Coordinator, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ownership_module, "RECHECK_S", 0.0)  # look before every shard
    core, _, ownership = ownership_part(coordinator)
    ownership._resume_from_file = lambda shard: None  # type: ignore[method-assign]
    group = core.group
    assert group is not None
    first = Assignment(generation=1, leader="m", leader_epoch=1, shards={"m": list(range(50))})
    await coordinator.commit([], [_put_assignment(group, first)])
    core.leadership_record().assignment = first
    real_acquire = group.acquire

    async def acquire(shard: int, member_id: str, generation: int) -> int | None:
        epoch = await real_acquire(shard, member_id, generation)
        if shard == 4:  # a newer generation is published after the fifth
            newer = Assignment(generation=2, leader="m", leader_epoch=1,
                               shards={"m": list(range(25)), "n": list(range(25, 50))})
            await coordinator.commit([], [_put_assignment(group, newer)])
        return epoch

    group.acquire = acquire  # type: ignore[method-assign]
    await ownership.acquire(list(range(50)), 1)
    assert sorted(core.owned) == [0, 1, 2, 3, 4]
    assert core.wake.is_set()  # the next round follows generation 2 at once
    # While the generation stays the same, every shard is acquired.
    await ownership.acquire(list(range(5, 10)), 2)
    assert sorted(core.owned) == list(range(10))


def _put_assignment(group: GroupClient, assignment: Assignment) -> Any:
    from coordinators.protocol import Put

    return Put(group.keys.assignment, assignment.encode())


def test_the_worked_examples_hold() -> None:
    import doctest

    from paimon_group.protocol import commit_size

    for module in (commit_size,):
        failures, tried = doctest.testmod(module, raise_on_error=False)
        assert tried > 0 and failures == 0, module.__name__


@pytest.mark.asyncio
async def test_members_of_one_process_decode_an_assignment_once(
        coordinator: Coordinator) -> None:
    """Every member of a process reads the same bytes: one decode for all
    (500 members of a process each decoding 8,192 shards' assignment put
    5-7 s between a publication and the releases it asked for)."""
    first, second = GroupClient(coordinator, "g"), GroupClient(coordinator, "g")
    published = Assignment(generation=1, leader="m", leader_epoch=1,
                           shards={"m": list(range(50)), "n": list(range(50, 100))})
    await coordinator.commit([], [_put_assignment(first, published)])
    a, _ = await first.read_assignment()
    b, _ = await second.read_assignment()
    assert a == published and a is b
    newer = Assignment(generation=2, leader="m", leader_epoch=1, shards={"m": list(range(100))})
    await coordinator.commit([], [_put_assignment(first, newer)])
    c, _ = await second.read_assignment()
    assert c == newer and c is not a


@pytest.mark.asyncio
@pytest.mark.etcd
async def test_a_reset_of_200_shards_on_etcd_needs_a_larger_max_txn_ops(
        etcd_server_factory: Any) -> None:
    """An operator's reset is one commit (all or nothing): beyond etcd's
    --max-txn-ops it is refused with one line naming the flag, and nothing is
    written; with the flag raised (docs/etcd.md) it goes through."""
    from coordinators.errors import CoordinatorError

    positions = dict.fromkeys(range(200), 5)
    default = etcd_server_factory()
    async with open_coordinator(default.url_with_prefix()) as coord:
        group = GroupClient(coord, "g")
        await group.ensure_meta(200, "db.t")
        with pytest.raises(CoordinatorError, match="--max-txn-ops") as err:
            await GroupAdmin(coord, "g").reset_positions(positions, "operator")
        assert "\n" not in str(err.value) and len(str(err.value)) < 400
        assert await group.positions() == {}
    raised = etcd_server_factory(extra_args=("--max-txn-ops", "416"))
    async with open_coordinator(raised.url_with_prefix()) as coord:
        group = GroupClient(coord, "g")
        await group.ensure_meta(200, "db.t")
        assert await GroupAdmin(coord, "g").reset_positions(positions, "operator")
        assert sorted(await group.positions()) == list(range(200))
