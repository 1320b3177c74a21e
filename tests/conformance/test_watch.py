"""Conformance: level-triggered watches of a directory's direct children."""

from __future__ import annotations

import asyncio

import pytest

from coordinators import Coordinator, Delete, Put
from tests.conformance.conftest import OpenCoordinator
from tests.conformance.waiting import WAKE_LIMIT_S, drain, wait_until_listed

pytestmark = pytest.mark.asyncio


async def test_watch_wakes_after_create_put_and_delete(open_coord: OpenCoordinator) -> None:
    watcher, writer = await open_coord(), await open_coord()
    async with watcher.watch("members/") as watch:
        await drain(watch)
        await writer.create("members/a", b"1")
        assert await watch.wait(timeout=WAKE_LIMIT_S)
        await drain(watch)
        assert await writer.commit([], [Put("members/a", b"2")])
        assert await watch.wait(timeout=WAKE_LIMIT_S)
        await drain(watch)
        assert await writer.delete("members/a")
        assert await watch.wait(timeout=WAKE_LIMIT_S)
        await drain(watch)
        assert await writer.commit([], [Put("members/b", b""), Delete("members/c")])
        assert await watch.wait(timeout=WAKE_LIMIT_S)


async def test_a_keys_only_watch_wakes_for_creates_and_deletes(
        open_coord: OpenCoordinator) -> None:
    """``values=False`` (owner keys): every create and delete still wakes it,
    a delete followed at once by a re-create too, and so do keys that were there
    before the watch began."""
    watcher, writer = await open_coord(), await open_coord()
    await writer.create("keys/before", b"")
    async with watcher.watch("keys/", values=False) as watch:
        await drain(watch)
        await writer.create("keys/a", b"1")
        assert await watch.wait(timeout=WAKE_LIMIT_S)
        await drain(watch)
        assert await writer.delete("keys/before")
        assert await watch.wait(timeout=WAKE_LIMIT_S)
        await drain(watch)
        assert await writer.commit([], [Delete("keys/a")])
        assert await writer.create("keys/a", b"2") is not None
        assert await watch.wait(timeout=WAKE_LIMIT_S)
        await drain(watch)
        assert await writer.delete("keys/a")
        assert await watch.wait(timeout=WAKE_LIMIT_S)


async def test_watch_wakes_for_own_writes(coord: Coordinator) -> None:
    async with coord.watch("own/") as watch:
        await drain(watch)
        await coord.create("own/k", b"")
        assert await watch.wait(timeout=WAKE_LIMIT_S)


async def test_a_value_read_after_its_wake_wakes_the_reader_once(
        open_coord: OpenCoordinator) -> None:
    """A put that the reader reads after the wake does not wake it again: a
    second wake per change would have every member read the group's head
    twice per publication."""
    watcher, writer = await open_coord(), await open_coord()
    await writer.create("once/k", b"0")
    async with watcher.watch("once/") as watch:
        await drain(watch)
        for i in range(1, 6):
            assert await writer.commit([], [Put("once/k", str(i).encode())])
            assert await watch.wait(timeout=WAKE_LIMIT_S)
            entry = await watcher.get("once/k")
            assert entry is not None and entry.value == str(i).encode()
            assert await watch.wait(timeout=0.5) is False, f"woken twice by put {i}"


async def test_wait_returns_false_when_nothing_changes(open_coord: OpenCoordinator) -> None:
    watcher, writer = await open_coord(), await open_coord()
    await writer.create("quiet/existing", b"")
    async with watcher.watch("quiet/") as watch:
        await drain(watch)
        # Writes elsewhere are not changes of "quiet/".
        await writer.create("loud/k", b"")
        await writer.create("quietly/k", b"")
        assert await watch.wait(timeout=0.5) is False
        assert await watch.wait(timeout=0.0) is False


async def test_change_between_watch_and_wait_is_not_missed(open_coord: OpenCoordinator) -> None:
    watcher, writer = await open_coord(), await open_coord()
    watch = watcher.watch("lvl/")
    try:
        assert await watcher.list("lvl/") == []
        await writer.create("lvl/k", b"")
        # Level-triggered: the change happened before this wait began.
        await wait_until_listed(watch, watcher, "lvl/", ["lvl/k"])
    finally:
        await watch.close()


async def test_watch_reports_changes_made_while_nobody_waits(
    open_coord: OpenCoordinator,
) -> None:
    watcher, writer = await open_coord(), await open_coord()
    async with watcher.watch("later/") as watch:
        await drain(watch)
        await writer.create("later/a", b"")
        await asyncio.sleep(0.5)
        await writer.create("later/b", b"")
        await wait_until_listed(watch, watcher, "later/", ["later/a", "later/b"])


async def test_no_change_is_missed_in_a_burst(open_coord: OpenCoordinator) -> None:
    watcher, writer = await open_coord(), await open_coord()
    keys = [f"burst/{n:02d}" for n in range(20)]

    async def write_all() -> None:
        for key in keys:
            await writer.create(key, b"")

    async with watcher.watch("burst/") as watch:
        await drain(watch)
        writing = asyncio.create_task(write_all())
        try:
            await wait_until_listed(watch, watcher, "burst/", keys)
        finally:
            await writing


async def test_two_watches_on_one_directory_both_wake(open_coord: OpenCoordinator) -> None:
    a, b, writer = await open_coord(), await open_coord(), await open_coord()
    async with a.watch("both/") as wa, b.watch("both/") as wb:
        await drain(wa)
        await drain(wb)
        await writer.create("both/k", b"")
        assert await wa.wait(timeout=WAKE_LIMIT_S)
        assert await wb.wait(timeout=WAKE_LIMIT_S)


async def test_watch_wakes_when_an_ephemeral_key_goes_with_its_closed_session(
    open_coord: OpenCoordinator,
) -> None:
    watcher, member = await open_coord(), await open_coord()
    await member.create("eph/m", b"", ephemeral=True)
    async with watcher.watch("eph/") as watch:
        await drain(watch)
        await member.close()
        await wait_until_listed(watch, watcher, "eph/", [])


async def test_a_watch_of_some_children_wakes_for_them(
        open_coord: OpenCoordinator, coordinator_url: str) -> None:
    """``children``: a change of each named child wakes the watch (created,
    updated, deleted, in one commit with others). On etcd, which then streams
    only their key range, a change of any other key of the directory does
    not; the other backends may report it (a watch may report more)."""
    watcher, writer = await open_coord(), await open_coord()
    async with watcher.watch("g/", children=("assignment", "leader")) as watch:
        await drain(watch)
        await writer.create("g/leader", b"1")
        assert await watch.wait(timeout=WAKE_LIMIT_S)
        await drain(watch)
        assert await writer.commit([], [Put("g/assignment", b"2"), Put("g/start", b"x")])
        assert await watch.wait(timeout=WAKE_LIMIT_S)
        await drain(watch)
        assert await writer.delete("g/leader")
        assert await watch.wait(timeout=WAKE_LIMIT_S)
        await drain(watch)
        if coordinator_url.startswith("etcd"):
            for key in ("g/start", "g/owners/1", "g/members/m", "g/leaving/m", "g/a"):
                await writer.create(key, b"")
            assert await writer.commit([], [Put("g/start", b"y"), Put("g/positions/1", b"")])
            assert not await watch.wait(timeout=1.0)
            await writer.create("g/assignmentz", b"")  # in the range, not a child named
            assert not await watch.wait(timeout=0.5)
            assert await writer.commit([], [Put("g/assignment", b"3")])
            assert await watch.wait(timeout=WAKE_LIMIT_S)
