"""Conformance: real session expiry, with the session held by another process.

A ``tests.support.session_holder`` process connects, creates one ephemeral
key and prints ``READY``. The tests SIGKILL or SIGSTOP it and check, from a
coordinator in this process, that the key vanishes about one session timeout
later, that commits fenced on its create version are refused, that watches
wake, and (SIGSTOP then SIGCONT) that the paused process learns its session is
LOST and can no longer create ephemeral keys under it.
"""

from __future__ import annotations

import asyncio
import signal

import pytest

from coordinators import Check, Coordinator, CoordinatorUnavailable, Put
from tests.conformance.conftest import OpenCoordinator, StartHolder
from tests.conformance.holder import Holder
from tests.conformance.waiting import drain, wait_until_listed
from tests.support.waiting import eventually

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(300)]

HOLDER_TIMEOUT_S = 2.0


def read_create_version(holder: Holder) -> int:
    """The create version of the holder's key, from its ``READY`` line."""
    ready = next(line for line in holder.lines if line.startswith("READY "))
    return int(ready.split()[1])


async def wait_gone(coordinator: Coordinator, key: str) -> None:
    async def gone() -> bool:
        return await coordinator.get(key) is None

    await eventually(gone, f"{key} deleted after its holder's session expired")


async def stop_between_transactions(holder: Holder, coordinator: Coordinator) -> None:
    """SIGSTOP the holder, making sure it does not hold the database's lock.

    With the embedded backend a process stopped inside a write transaction
    stalls every writer (documented in coordinators.sqlite); the test wants
    a process stopped between transactions, as a real pause usually is. A
    write from here proves it; if the write cannot get the lock, continue the
    holder for a moment and stop it again.
    """
    for attempt in range(10):
        holder.signal(signal.SIGSTOP)
        try:
            await coordinator.commit([], [Put(f"probe/{attempt}", b"")])
            return
        except CoordinatorUnavailable:
            holder.signal(signal.SIGCONT)
            await asyncio.sleep(0.1)
    raise AssertionError("could not stop the holder outside a transaction")


async def test_session_deadline_advances_with_heartbeats(open_coord: OpenCoordinator) -> None:
    coordinator = await open_coord(session_timeout_s=2.0)
    session = coordinator.session
    first = session.deadline
    assert session.is_live()
    assert not session.is_live(margin_s=session.timeout_s + 3600.0)

    async def advanced() -> bool:
        return session.deadline > first

    await eventually(advanced, "session deadline advanced by a heartbeat")
    assert session.is_live()


async def test_sigkilled_holder_loses_its_ephemeral_key(
    start_holder: StartHolder, open_coord: OpenCoordinator
) -> None:
    observer = await open_coord()
    holder = await start_holder("owners/0", HOLDER_TIMEOUT_S)
    create_version = read_create_version(holder)
    owned = await observer.get("owners/0")
    assert owned is not None and owned.ephemeral and owned.create_version == create_version
    # Fenced on the holder's epoch, the commit goes through while it lives.
    assert await observer.commit(
        [Check.created_at("owners/0", create_version)], [Put("positions/0", b"1")]
    )

    holder.signal(signal.SIGKILL)
    await wait_gone(observer, "owners/0")

    assert not await observer.commit(
        [Check.created_at("owners/0", create_version)], [Put("positions/0", b"2")]
    )
    position = await observer.get("positions/0")
    assert position is not None and position.value == b"1"
    # A new owner gets a larger epoch.
    successor = await observer.create("owners/0", b"next", ephemeral=True)
    assert successor is not None and successor.create_version > create_version


async def test_watch_wakes_when_a_killed_holder_key_expires(
    start_holder: StartHolder, open_coord: OpenCoordinator
) -> None:
    observer = await open_coord()
    holder = await start_holder("members/h", HOLDER_TIMEOUT_S)
    async with observer.watch("members/") as watch:
        assert [e.key for e in await observer.list("members/")] == ["members/h"]
        await drain(watch)
        holder.signal(signal.SIGKILL)
        await wait_until_listed(watch, observer, "members/", [])


async def test_sigstopped_holder_expires_and_learns_it_is_lost(
    start_holder: StartHolder, open_coord: OpenCoordinator
) -> None:
    observer = await open_coord()
    holder = await start_holder("owners/1", HOLDER_TIMEOUT_S)
    create_version = read_create_version(holder)

    await stop_between_transactions(holder, observer)
    try:
        await wait_gone(observer, "owners/1")
        assert not await observer.commit(
            [Check.created_at("owners/1", create_version)], [Put("positions/1", b"x")]
        )
    finally:
        holder.signal(signal.SIGCONT)

    await holder.expect("STATE lost")
    assert await holder.expect("CREATE_AFTER_LOST") == "CREATE_AFTER_LOST SessionLost"
    assert await observer.get("owners/1-after-lost") is None
    assert await observer.get("owners/1") is None
    assert await asyncio.wait_for(holder.process.wait(), 60.0) == 0


async def test_holder_that_is_not_paused_keeps_its_key(
    start_holder: StartHolder, open_coord: OpenCoordinator
) -> None:
    observer = await open_coord()
    holder = await start_holder("owners/2", HOLDER_TIMEOUT_S)
    create_version = read_create_version(holder)
    # Several session timeouts: heartbeats keep the key, whatever the others do.
    for n in range(3):
        await asyncio.sleep(HOLDER_TIMEOUT_S)
        assert await observer.commit([], [Put(f"busy/{n}", b"")])
        owned = await observer.get("owners/2")
        assert owned is not None and owned.create_version == create_version
    assert not any(line.startswith("STATE lost") for line in holder.lines)
    holder.signal(signal.SIGTERM)
    assert await asyncio.wait_for(holder.process.wait(), 60.0) == 0
    assert await observer.get("owners/2") is None
