"""A starting group is published once (:mod:`paimon_group.member.settle`,
``forming``), and a group that reads is not held by it.

Real members on the in-memory coordinator and a real table.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from coordinators import open_coordinator
from paimon_group import GroupMember, MemberConfig
from paimon_group.member import settle as settle_module
from paimon_group.member.settle import ArrivalSettle
from paimon_group.protocol.group import GroupClient
from paimon_group.protocol.records import Assignment
from tests.support.tables import make_append_table


def test_a_forming_group_waits_for_arrivals_to_pause() -> None:
    s = ArrivalSettle(forming_quiet_s=1.0, forming_max_s=10.0)
    assert s.delay({"a"}, now=0.0, forming=True) == 1.0  # the first member waits
    members = {"a"}
    for i in range(1, 8):  # an arrival every 0.5 s: never quiet for 1 s
        members.add(f"m{i}")
        assert s.delay(members, now=0.5 * i, forming=True) == pytest.approx(1.0)
    assert s.delay(members, now=4.0, forming=True) == pytest.approx(0.5)
    assert s.delay(members, now=4.5, forming=True) == 0.0  # quiet for 1 s: publish


def test_a_forming_group_is_published_by_its_longest_wait() -> None:
    s = ArrivalSettle(forming_quiet_s=1.0, forming_max_s=10.0)
    published = []
    members: set[str] = set()
    for i in range(200):  # an arrival every 0.1 s for 20 s
        members.add(f"m{i}")
        if s.delay(members, now=0.1 * i, forming=True) == 0.0:
            published.append(round(0.1 * i, 1))
    assert published[0] == 10.0  # not starved: published at the longest wait


def test_a_group_that_is_not_forming_publishes_a_lone_change_at_once() -> None:
    s = ArrivalSettle()
    assert s.delay({"a"}, now=0.0, forming=False) == 0.0  # a leader taking over
    assert s.delay({"a", "b"}, now=5.0, forming=False) == 0.0  # a join
    assert s.delay({"a"}, now=10.0, forming=False) == 0.0  # a leave


def _config(wh: str, url: str, member_id: str, shards: int) -> MemberConfig:
    return MemberConfig(group="g", warehouse=wh, table="db.t", coordinator=url,
                        member_id=member_id, shards=shards, session_timeout_s=5,
                        poll_interval_ms=200, mirror_interval_s=3600.0)


async def _assignment(url: str) -> Assignment | None:
    async with open_coordinator(url) as coord:
        assignment, _ = await GroupClient(coord, "g").read_assignment()
    return assignment


async def _until_owned(members: list[GroupMember], shards: int, limit_s: float = 30) -> None:
    deadline = time.monotonic() + limit_s
    while sum(len(m.owned_shards) for m in members) < shards or any(
            not m.owned_shards for m in members):
        assert time.monotonic() < deadline, "the group did not settle"
        await asyncio.sleep(0.05)


@pytest.fixture
def table(tmp_path: Path) -> Iterator[str]:
    wh = str(tmp_path / "wh")
    make_append_table(wh, "db.t", buckets=-1)
    yield wh


@pytest.mark.asyncio
async def test_a_burst_of_arrivals_into_a_new_group_is_one_generation(table: str) -> None:
    """Five members arriving 0.15 s apart into a new group: the leader waits
    for the arrivals to pause and publishes one generation, so no shard is
    acquired and then moved (before: the first member was given every shard
    at once, and the others took them from it)."""
    url = f"memory://forming-{uuid.uuid4().hex}"
    members = [GroupMember(_config(table, url, f"m{i}", 40), auto_commit=False)
               for i in range(5)]
    async def start_after(m: GroupMember, delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        await m.start()

    try:
        await asyncio.gather(*(start_after(m, 0.15 * i) for i, m in enumerate(members)))
        await _until_owned(members, 40)
        assignment = await _assignment(url)
        assert assignment is not None and sorted(assignment.shards) == [m.member_id
                                                                         for m in members]
        assert assignment.generation == 1
        assert sum(m.stats.rebalances for m in members) == 0
    finally:
        await asyncio.gather(*(m.stop() for m in members))


@pytest.mark.asyncio
async def test_a_join_into_a_stable_group_is_not_held(table: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The forming wait is for a group nobody reads in: a join into a stable
    group (and a leave) is published at once."""
    decisions: list[tuple[int, bool, float]] = []
    real_delay = ArrivalSettle.delay

    def delay(self: ArrivalSettle, members: Any, *, now: float, forming: bool = False) -> float:
        wait = real_delay(self, members, now=now, forming=forming)
        decisions.append((len(frozenset(members)), forming, wait))
        return wait

    monkeypatch.setattr(settle_module.ArrivalSettle, "delay", delay)
    url = f"memory://stable-{uuid.uuid4().hex}"
    members = [GroupMember(_config(table, url, f"m{i}", 8), auto_commit=False)
               for i in range(3)]
    try:
        for m in members[:2]:
            await m.start()
        await _until_owned(members[:2], 8)
        await asyncio.sleep(0.5)
        decisions.clear()
        called = time.monotonic()
        await members[2].start()
        await _until_owned(members, 8)
        joined = [(forming, wait) for n, forming, wait in decisions if n == 3]
        assert joined and joined[0] == (False, 0.0)
        assert time.monotonic() - called < 5.0
        decisions.clear()
        await members[1].stop()
        await _until_owned([members[0], members[2]], 8)
        left = [(forming, wait) for n, forming, wait in decisions if n == 2]
        assert left and left[0] == (False, 0.0)
    finally:
        await asyncio.gather(*(m.stop() for m in members))


@pytest.mark.asyncio
async def test_a_member_is_ready_only_once_the_published_assignment_names_it(
    table: str, tmp_path: Path
) -> None:
    """A new member of a group whose assignment names only a member that left
    is not ready until the assignment names it, and then holds every shard.
    Before, it was ready at once with no shard (its entry absent: ``[]``), and
    a Spark query's ``availableNow`` run planned nothing (issue 56, S1)."""
    url = f"sqlite://{tmp_path}/c.sqlite"   # the group outlives its members
    first = GroupMember(_config(table, url, "a", 4), auto_commit=False)
    await first.start()
    try:
        await _until_owned([first], 4)
    finally:
        await first.stop()
    second = GroupMember(_config(table, url, "b", 4), auto_commit=False)
    await second.start()
    try:
        deadline = time.monotonic() + 30
        while not second.ready:
            assert time.monotonic() < deadline, "the new member never became ready"
            await asyncio.sleep(0.02)
        assignment = second.assignment
        assert assignment is not None and assignment.shards_of("b") == [0, 1, 2, 3]
        assert second.owned_shards == [0, 1, 2, 3]
    finally:
        await second.stop()
