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
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from coordinators.base import Coordinator, Delete, Op, Put
from coordinators.errors import CoordinatorError, CoordinatorUnavailable, SessionSuspended
from paimon_group import GroupMember, MemberConfig
from paimon_group.group import GroupClient
from paimon_group.member import MemberState
from tests.support.tables import make_pk_table, write_rows


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
    real_open = GroupMember._open_coordinator

    async def open_faulty(self: GroupMember) -> Coordinator:
        coord = await real_open(self)
        if member is None or self.member_id == member:
            inject(coord, *faults)
        return coord

    monkeypatch.setattr(GroupMember, "_open_coordinator", open_faulty)


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
    from coordinators.base import SessionState

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
