"""A member reads the clock it was built with (``GroupMember(clock=...)``).

Its lease is judged on that clock: the session gate lets work through only
while the member's clock is a safety margin before the session's local
deadline (invariant 3), whatever ``time.monotonic`` says; its history lines
are stamped by it; its commit size is an attribute of its commits part.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from coordinators import open_coordinator
from coordinators.protocol import Coordinator
from paimon_group import GroupMember, MemberConfig
from paimon_group.config.clock import SYSTEM_CLOCK, ManualClock
from paimon_group.member.core import JoinedSession, MemberCore
from paimon_group.protocol.commit_size import SHARDS_PER_COMMIT, commit_chunks
from paimon_group.protocol.group import GroupClient
from tests.test_member_parts import NoTables


def _config(**kw: object) -> MemberConfig:
    return MemberConfig(group="g", warehouse="/nonexistent", table="db.t",
                        coordinator=f"memory://clock-{uuid.uuid4().hex}", member_id="m",
                        session_timeout_s=3, **kw)  # type: ignore[arg-type]


@pytest_asyncio.fixture
async def coordinator() -> AsyncIterator[Coordinator]:
    coord = open_coordinator(f"memory://clock-{uuid.uuid4().hex}")
    await coord.connect()
    try:
        yield coord
    finally:
        await coord.close()


def _joined(core: MemberCore, coord: Coordinator) -> MemberCore:
    core.replace_session(JoinedSession(
        meta=None, tables=NoTables(),  # type: ignore[arg-type]
        coordinator=coord, group=GroupClient(coord, "g")))
    core.joined.set()
    return core


@pytest.mark.asyncio
async def test_the_lease_deadline_is_judged_on_the_member_s_clock(
        coordinator: Coordinator) -> None:
    clock = ManualClock()
    core = _joined(MemberCore(_config(), clock=clock), coordinator)
    margin = core.timing.margin_s
    last_safe = coordinator.session.deadline - margin
    clock.now = last_safe - 0.5
    await asyncio.wait_for(core.wait_live(), 1.0)
    # Past the deadline minus the margin on the member's clock: no work goes
    # through, though the session is live on the system's clock.
    clock.now = last_safe + 0.01
    assert coordinator.session.is_live(margin)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(core.wait_live(for_commit=True), 0.2)
    clock.now = last_safe - 0.5
    await asyncio.wait_for(core.wait_live(for_commit=True), 1.0)


@pytest.mark.asyncio
async def test_the_session_gate_stops_on_the_system_clock_by_default(
        coordinator: Coordinator) -> None:
    core = _joined(MemberCore(_config()), coordinator)
    assert core.clock is SYSTEM_CLOCK
    await asyncio.wait_for(core.wait_live(), 1.0)


def test_the_member_stamps_its_history_on_its_clock(
        tmp_path: Path) -> None:
    clock = ManualClock(start=50.0)
    member = GroupMember(_config(history_path=str(tmp_path / "h.jsonl")), clock=clock,
                         handle_signals=False)
    member.history.record("probe")
    clock.advance(7.0)
    member.history.record("probe")
    lines = [json.loads(line) for line in (tmp_path / "h.jsonl").read_text().splitlines()]
    assert [(d["t"], d["wall"]) for d in lines] == [
        (50.0, ManualClock.WALL_OFFSET + 50.0), (57.0, ManualClock.WALL_OFFSET + 57.0)]
    member.history.close()


def test_the_commit_size_is_the_commits_part_s() -> None:
    member = GroupMember(_config(), handle_signals=False)
    assert member.commits.shards_per_commit == SHARDS_PER_COMMIT
    assert commit_chunks(range(5), 2) == [[0, 1], [2, 3], [4]]
    with pytest.raises(ValueError):
        commit_chunks(range(5), SHARDS_PER_COMMIT + 1)
