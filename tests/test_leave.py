"""A graceful leave releases every shard the member holds at its end (issue 37, D5).

A control round still acquiring when the leave begins must not leave a shard
behind: the leave took its list of shards when it began, and a shard whose
acquisition landed after that was neither released nor reported until the
session closed (its owner key outlived the leave; ``on_assigned`` without
``on_revoked``). The race is driven deterministically: the member's
acquisition of shard 1 is held until the leave has begun (its member key
deleted), while a batch of shard 0 is in the handler, so the leave's release
waits for it.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from paimon_group import GroupMember, MemberConfig
from paimon_group.member import MemberState
from paimon_group.member.membership import Membership
from paimon_group.protocol.group import GroupClient
from tests.support.tables import make_pk_table, write_rows


class Listener:
    def __init__(self) -> None:
        self.calls: dict[str, set[int]] = {"assigned": set(), "revoked": set(), "lost": set()}

    def on_assigned(self, shards: list[int]) -> None:
        self.calls["assigned"].update(shards)

    def on_revoked(self, shards: list[int]) -> None:
        self.calls["revoked"].update(shards)

    def on_lost(self, shards: list[int]) -> None:
        self.calls["lost"].update(shards)


@pytest.fixture(params=["sqlite", pytest.param("etcd", marks=pytest.mark.etcd)])
def coordinator_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite://{tmp_path}/coordinator-{uuid.uuid4().hex}.sqlite"
    url: str = request.getfixturevalue("etcd_url")
    return url


async def until(probe: Callable[[], bool], what: str, limit_s: float = 30) -> None:
    deadline = asyncio.get_running_loop().time() + limit_s
    while not probe():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"not within {limit_s}s: {what}")
        await asyncio.sleep(0.02)


def hold_acquisition_until_the_leave(monkeypatch: pytest.MonkeyPatch, shard: int,
                                     held: asyncio.Event, left: asyncio.Event) -> None:
    """Member a's owner-key create of ``shard`` waits (``held`` set) until its
    member key is deleted by the leave (``left`` set)."""
    real_acquire = GroupClient.acquire
    real_deregister = GroupClient.deregister

    async def acquire(self: GroupClient, s: int, member_id: str, generation: int) -> Any:
        if s == shard and member_id == "a":
            held.set()
            await left.wait()
        return await real_acquire(self, s, member_id, generation)

    async def deregister(self: GroupClient, member_id: str, *, goodbye: bool = True) -> None:
        await real_deregister(self, member_id, goodbye=goodbye)
        if member_id == "a":
            left.set()

    monkeypatch.setattr(GroupClient, "acquire", acquire)
    monkeypatch.setattr(GroupClient, "deregister", deregister)


def record_the_end_of_the_leave(monkeypatch: pytest.MonkeyPatch,
                                at_end: dict[str, Any]) -> None:
    """What the coordinator and the member say once ``leave()`` returned,
    before the session is closed (which deletes every key it holds)."""
    real_leave: Callable[[Membership], Awaitable[None]] = Membership.leave

    async def leave(self: Membership) -> None:
        await real_leave(self)
        group = self._core.group
        assert group is not None
        at_end["owners"] = {s: v.member_id for s, v in (await group.owners()).items()}
        at_end["positions"] = await group.positions()
        at_end["held"] = self._core.owned_shards

    monkeypatch.setattr(Membership, "leave", leave)


@pytest.mark.asyncio
async def test_a_shard_acquired_while_the_member_leaves_is_released_by_the_leave(
        tmp_path: Path, coordinator_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    wh = str(tmp_path / "wh")
    make_pk_table(wh, "db.t", buckets=2)
    write_rows(wh, "db.t", range(10))
    held, left = asyncio.Event(), asyncio.Event()
    hold_acquisition_until_the_leave(monkeypatch, 1, held, left)
    at_end: dict[str, Any] = {}
    record_the_end_of_the_leave(monkeypatch, at_end)
    listener = Listener()
    member = GroupMember(
        MemberConfig(group="g", warehouse=wh, table="db.t", coordinator=coordinator_url,
                     member_id="a", session_timeout_s=3, poll_interval_ms=50),
        listener=listener)
    await member.start()
    batches = member.batches()
    try:
        # Shard 0 is acquired and its batch is in the handler; the round that
        # acquired it is still acquiring shard 1.
        batch = await asyncio.wait_for(batches.__anext__(), 30)
        assert batch.shard == 0
        await asyncio.wait_for(held.wait(), 30)
        assert member.owned_shards == [0]
        stopping = asyncio.ensure_future(member.stop())
        # The acquisition of shard 1 lands while the leave waits for the batch.
        await until(lambda: 1 in member.owned_shards or stopping.done(), "shard 1 acquired")
        await member.commit(batch, wait=False)
        await asyncio.wait_for(stopping, 30)
    finally:
        await batches.aclose()
    assert member.state is MemberState.STOPPED and member.error is None
    assert at_end["held"] == []
    assert {s: m for s, m in at_end["owners"].items() if m == "a"} == {}
    assert listener.calls == {"assigned": {0, 1}, "revoked": {0, 1}, "lost": set()}
    # The batch's position was committed before the release, and not lowered.
    positions = at_end["positions"]
    assert positions[0].next_snapshot == 2 and positions[0].full_scan is None
