"""A starting group is published once (:mod:`paimon_group.member.publish_delay`,
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
from paimon_group.member import publish_delay as publish_delay_module
from paimon_group.member.publish_delay import PublishDelay
from paimon_group.protocol.group import GroupClient
from paimon_group.protocol.records import Assignment
from tests.support.tables import make_append_table


def test_a_forming_group_waits_for_arrivals_to_pause() -> None:
    s = PublishDelay(forming_quiet_s=1.0, forming_max_s=10.0)
    assert s.delay({"a", "m0"}, now=0.0, forming=True) == 1.0  # two at once wait
    members = {"a", "m0"}
    for i in range(1, 8):  # an arrival every 0.5 s: never quiet for 1 s
        members.add(f"m{i}")
        assert s.delay(members, now=0.5 * i, forming=True) == pytest.approx(1.0)
    assert s.delay(members, now=4.0, forming=True) == pytest.approx(0.5)
    assert s.delay(members, now=4.5, forming=True) == 0.0  # quiet for 1 s: publish


def test_a_lone_member_is_published_at_once_and_an_arrival_then_held() -> None:
    """Issue 53: a forming group's lone member waits for nothing; an arrival
    within the forming quiet of it is a burst (one generation more at most)."""
    s = PublishDelay(forming_quiet_s=1.0, forming_max_s=10.0)
    assert s.delay({"a"}, now=0.0, forming=True) == 0.0  # published at once
    assert s.young(0.5) and not s.young(1.0)
    # Published: the group is no longer forming, but young.
    assert s.delay({"a", "b"}, now=0.3) == pytest.approx(1.0)
    assert s.holding and not s.young(0.3)
    assert s.delay({"a", "b", "c"}, now=0.8) == pytest.approx(1.0)
    assert s.delay({"a", "b"}, now=1.0) == pytest.approx(1.0)  # a departure: still held
    assert s.delay({"a", "b"}, now=2.0) == 0.0  # quiet for 1 s: publish
    assert not s.holding
    assert s.delay({"a", "b", "c"}, now=5.0) == 0.0  # a lone join later: at once


def test_a_lone_member_then_a_join_after_the_quiet_is_at_once() -> None:
    s = PublishDelay(forming_quiet_s=1.0)
    assert s.delay({"a"}, now=0.0, forming=True) == 0.0
    assert s.delay({"a", "b"}, now=1.5) == 0.0  # a join into a running group
    t = PublishDelay(forming_quiet_s=0.0)  # the wait switched off
    assert t.delay({"a", "b"}, now=0.0, forming=True) == 0.0


def test_a_forming_group_is_published_by_its_longest_wait() -> None:
    s = PublishDelay(forming_quiet_s=1.0, forming_max_s=10.0)
    published = []
    members: set[str] = set()
    for i in range(200):  # an arrival every 0.1 s for 20 s
        members.add(f"m{i}")
        if s.delay(members, now=0.1 * i, forming=not published) == 0.0:
            published.append(round(0.1 * i, 1))
    # The lone first member at once; the burst after it not starved: published
    # at the longest wait from the first arrival it saw.
    assert published[:2] == [0.0, 10.1]


def test_a_group_that_is_not_forming_publishes_a_lone_change_at_once() -> None:
    s = PublishDelay()
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
async def test_a_burst_of_arrivals_into_a_new_group_is_one_generation_more_at_most(
        table: str) -> None:
    """Five members arriving 0.15 s apart into a new group: the first, alone,
    is published at once (issue 53); the leader then waits for the arrivals
    to pause and publishes one generation for all five (before issue 41 the
    first member was given every shard and each arrival took some from it:
    a generation per arrival)."""
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
        assert assignment.generation <= 2
        # Only the first member gave shards up (those the last generation
        # moved from it), each once; the others were given theirs once.
        assert all(m.stats.shards_moved["revoked"] == 0 for m in members[1:])
        assert members[0].stats.shards_moved["revoked"] <= 40 - 8
    finally:
        await asyncio.gather(*(m.stop() for m in members))


@pytest.mark.asyncio
async def test_fifty_members_starting_at_once_form_one_generation(table: str) -> None:
    """Fifty members started together into a new group: one generation names
    them all (two at most, when the leader's first look saw itself alone)."""
    url = f"memory://fifty-{uuid.uuid4().hex}"
    members = [GroupMember(_config(table, url, f"m{i:02d}", 200), auto_commit=False)
               for i in range(50)]
    try:
        await asyncio.gather(*(m.start() for m in members))
        await _until_owned(members, 200)
        assignment = await _assignment(url)
        assert assignment is not None and len(assignment.shards) == 50
        assert assignment.generation == 1
    finally:
        await asyncio.gather(*(m.stop() for m in members))


@pytest.mark.asyncio
async def test_a_join_into_a_stable_group_is_not_held(table: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The forming wait is for a group nobody reads in: a join into a stable
    group (and a leave) is published at once."""
    decisions: list[tuple[int, bool, float]] = []
    real_delay = PublishDelay.delay

    def delay(self: PublishDelay, members: Any, *, now: float, forming: bool = False) -> float:
        wait = real_delay(self, members, now=now, forming=forming)
        decisions.append((len(frozenset(members)), forming, wait))
        return wait

    monkeypatch.setattr(publish_delay_module.PublishDelay, "delay", delay)
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
