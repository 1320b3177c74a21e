"""The commit lane of a step (``paimon_group.member.CommitLane``), without a server.

The commit function is a stand-in that records each call's shards and can be
held open, so each rule of the lane is observed directly: one commit per
step, at once for a shard being revoked, no later than the linger, errors to
every waiter, and a rider not idle while its commit is in flight.
"""

from __future__ import annotations

import asyncio

import pytest

from coordinators.errors import CoordinatorUnavailable
from paimon_group.member import CommitLane, OwnedShard


class FakeCommit:
    def __init__(self) -> None:
        self.calls: list[list[int]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.error: BaseException | None = None

    async def __call__(self, owned: dict[int, OwnedShard], next_snapshot: int) -> None:
        self.calls.append(sorted(owned))
        await self.gate.wait()
        if self.error is not None:
            raise self.error


def shards(*ids: int) -> dict[int, OwnedShard]:
    return {s: OwnedShard(shard=s, epoch=10 + s, generation=1) for s in ids}


@pytest.mark.asyncio
async def test_the_shards_of_a_step_share_one_commit() -> None:
    commit = FakeCommit()
    owned = shards(0, 1, 2)
    lane = CommitLane(commit, 7, riders=shards(5), expected=3, linger_s=60)
    first = asyncio.create_task(lane.commit(owned[0]))
    second = asyncio.create_task(lane.commit(owned[1]))
    await asyncio.sleep(0.01)
    assert commit.calls == [] and not first.done()  # waiting for shard 2
    await lane.commit(owned[2])
    await asyncio.gather(first, second)
    assert commit.calls == [[0, 1, 2, 5]]  # the rider went along
    await lane.flush()
    assert commit.calls == [[0, 1, 2, 5]]  # nothing left


@pytest.mark.asyncio
async def test_a_revoked_shard_commits_at_once() -> None:
    commit = FakeCommit()
    owned = shards(0, 1)
    lane = CommitLane(commit, 7, riders={}, expected=2, linger_s=60)
    owned[0].revoke()
    await asyncio.wait_for(lane.commit(owned[0]), 5)  # not waiting for shard 1
    assert commit.calls == [[0]]
    await lane.commit(owned[1])
    assert commit.calls == [[0], [1]]


@pytest.mark.asyncio
async def test_kick_commits_what_is_queued() -> None:
    commit = FakeCommit()
    owned = shards(0, 1)
    lane = CommitLane(commit, 7, riders={}, expected=2, linger_s=60)
    waiting = asyncio.create_task(lane.commit(owned[0]))
    await asyncio.sleep(0.01)
    lane.kick()  # what a revoke of any shard does
    await asyncio.wait_for(waiting, 5)
    assert commit.calls == [[0]]


@pytest.mark.asyncio
async def test_a_slow_shard_holds_the_others_back_no_longer_than_the_linger() -> None:
    commit = FakeCommit()
    owned = shards(0, 1)
    lane = CommitLane(commit, 7, riders={}, expected=2, linger_s=0.05)
    await asyncio.wait_for(lane.commit(owned[0]), 5)  # shard 1 never finishes
    assert commit.calls == [[0]]
    lane.skipped()
    await lane.flush()
    assert commit.calls == [[0]]


@pytest.mark.asyncio
async def test_a_failed_commit_reaches_every_shard_it_carried() -> None:
    commit = FakeCommit()
    commit.error = CoordinatorUnavailable("coordinator down")
    owned = shards(0, 1)
    lane = CommitLane(commit, 7, riders={}, expected=2, linger_s=60)
    results = await asyncio.gather(lane.commit(owned[0]), lane.commit(owned[1]),
                                   return_exceptions=True)
    assert [type(r) for r in results] == [CoordinatorUnavailable, CoordinatorUnavailable]
    assert commit.calls == [[0, 1]]


@pytest.mark.asyncio
async def test_a_rider_is_not_idle_while_its_commit_is_in_flight() -> None:
    """A revoke waits for idle before it commits the shard's last position and
    releases it: it must not overtake a newer position still in flight."""
    commit = FakeCommit()
    commit.gate.clear()
    riders = shards(3, 4)
    riders[4].revoke()  # revoked before the commit: left out, stays idle
    lane = CommitLane(commit, 7, riders=riders, expected=0, linger_s=60)
    flushing = asyncio.create_task(lane.flush())
    await asyncio.sleep(0.01)
    assert commit.calls == [[3]]
    assert not riders[3].idle.is_set() and riders[4].idle.is_set()
    commit.gate.set()
    await flushing
    assert riders[3].idle.is_set()
