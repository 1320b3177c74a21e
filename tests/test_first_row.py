"""The first row at once (issue 53): a lone member, and a member restarting
into its own group, are assigned with no forming wait.

Real members on sqlite, etcd and ZooKeeper, and a real table. The checks are
on what the leader decided (:class:`~paimon_group.member.publish_delay.PublishDelay`
gave 0 s for every list it saw, and the first generation named the lone
member), not on wall-clock thresholds: the time from ``running`` to the
first batch is printed, for the record.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from paimon_group import GroupMember, MemberConfig
from paimon_group.member import publish_delay as publish_delay_module
from paimon_group.member.publish_delay import PublishDelay
from tests.support.tables import make_append_table, write_rows

Decision = tuple[int, bool, float]


@pytest.fixture
def decisions(monkeypatch: pytest.MonkeyPatch) -> list[Decision]:
    """Each call of the leader's settle: (members, forming, wait)."""
    seen: list[Decision] = []
    real_delay = PublishDelay.delay

    def delay(self: PublishDelay, members: Any, *, now: float, forming: bool = False) -> float:
        wait = real_delay(self, members, now=now, forming=forming)
        seen.append((len(frozenset(members)), forming, wait))
        return wait

    monkeypatch.setattr(publish_delay_module.PublishDelay, "delay", delay)
    return seen


def _coordinator(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if backend == "etcd":
        return str(request.getfixturevalue("etcd_url"))
    if backend == "zookeeper":
        return str(request.getfixturevalue("zk_url"))
    return f"sqlite://{tmp_path}/c.sqlite"


async def _first_batch(member: GroupMember) -> float:
    """Start ``member``; seconds from ``running`` to its first batch."""
    await member.start()
    running = time.monotonic()  # start() returns once the member is running
    batches = member.batches()
    try:
        batch = await asyncio.wait_for(batches.__anext__(), timeout=60)
    finally:
        await batches.aclose()
    assert batch.to_arrow().num_rows > 0
    return time.monotonic() - running


@pytest.mark.asyncio
@pytest.mark.parametrize("backend", ["sqlite", "etcd", "zookeeper"])
async def test_a_lone_member_reads_with_no_forming_wait(
        tmp_path: Path, backend: str, request: pytest.FixtureRequest,
        decisions: list[Decision]) -> None:
    wh = str(tmp_path / "wh")
    make_append_table(wh, "db.t", buckets=4)
    write_rows(wh, "db.t", range(100))
    url = _coordinator(backend, tmp_path, request)
    config = MemberConfig(group="g", warehouse=wh, table="db.t", coordinator=url,
                          member_id=f"m-{uuid.uuid4().hex[:6]}", shards=4,
                          start="earliest", poll_interval_ms=200, mirror_interval_s=3600.0)
    member = GroupMember(config, auto_commit=False)
    try:
        took = await _first_batch(member)
        assignment = member.assignment
        assert assignment is not None and assignment.generation == 1
        assert assignment.shards_of(member.member_id) == [0, 1, 2, 3]
    finally:
        await member.stop()
    print(f"{backend}: first batch {took * 1000:.0f} ms after running")
    # The leader's first look: one member, a forming group, published at once;
    # and it never held a publication back.
    assert decisions[0] == (1, True, 0.0)
    # (A decision on an empty member list, the leader's own leave seen while
    # it stops, publishes nothing: its wait holds nobody back.)
    assert all(wait == 0.0 for members, _, wait in decisions if members)


@pytest.mark.asyncio
async def test_a_member_restarting_into_its_own_group_reads_with_no_forming_wait(
        tmp_path: Path, decisions: list[Decision]) -> None:
    """A restart gets a new member id: the group is forming again (its
    assignment names only the member gone), and its lone member is published
    at once."""
    wh = str(tmp_path / "wh")
    make_append_table(wh, "db.t", buckets=4)
    write_rows(wh, "db.t", range(100))

    def config(member_id: str) -> MemberConfig:
        return MemberConfig(group="g", warehouse=wh, table="db.t",
                            coordinator=f"sqlite://{tmp_path}/c.sqlite", member_id=member_id,
                            shards=4, start="earliest", poll_interval_ms=200,
                            mirror_interval_s=3600.0)

    first = GroupMember(config("before"), auto_commit=False)
    try:
        await _first_batch(first)
    finally:
        await first.stop()
    decisions.clear()
    second = GroupMember(config("after"), auto_commit=False)
    try:
        await _first_batch(second)
        assignment = second.assignment
        assert assignment is not None and assignment.generation == 2
        assert assignment.shards_of("after") == [0, 1, 2, 3]
    finally:
        await second.stop()
    assert decisions[0] == (1, True, 0.0)
    # (A decision on an empty member list, the leader's own leave seen while
    # it stops, publishes nothing: its wait holds nobody back.)
    assert all(wait == 0.0 for members, _, wait in decisions if members)
