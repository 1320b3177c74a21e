"""Conformance: keys, versions, guarded commits (see coordinators.protocol)."""

from __future__ import annotations

import pytest

from coordinators import (
    Check,
    ConfigError,
    ConnectOptions,
    Coordinator,
    Delete,
    Put,
    SessionState,
    open_coordinator,
)
from tests.conformance.conftest import OpenCoordinator
from tests.support.waiting import eventually

pytestmark = pytest.mark.asyncio


async def test_connect_and_close(coordinator_url: str) -> None:
    coordinator = open_coordinator(coordinator_url, ConnectOptions(session_timeout_s=10.0))
    await coordinator.connect()
    try:
        session = coordinator.session
        assert session.state is SessionState.CONNECTED
        assert session.id and isinstance(session.id, str)
        assert session.is_live()
        assert await coordinator.get("nothing/here") is None
    finally:
        await coordinator.close()
    await coordinator.close()  # closing twice is harmless


async def test_async_with_connects_and_closes(coordinator_url: str, coord: Coordinator) -> None:
    # ``coord`` stays open throughout, which keeps a memory:// database alive.
    async with open_coordinator(coordinator_url) as coordinator:
        assert coordinator.session.state is SessionState.CONNECTED
        assert await coordinator.create("k", b"v") is not None
    async with open_coordinator(coordinator_url) as again:
        entry = await again.get("k")
        assert entry is not None and entry.value == b"v"


async def test_url_property_is_the_url_without_credentials(coordinator_url: str) -> None:
    coordinator = open_coordinator(coordinator_url)
    assert "://" in coordinator.url
    assert coordinator.url in repr(coordinator)


async def test_create_if_absent(coord: Coordinator) -> None:
    first = await coord.create("a/k", b"one")
    assert first is not None
    assert (first.key, first.value, first.ephemeral) == ("a/k", b"one", False)
    assert await coord.create("a/k", b"two") is None
    assert await coord.create("a/k", b"three", ephemeral=True) is None
    stored = await coord.get("a/k")
    assert stored == first


async def test_create_returns_what_get_reads(coord: Coordinator) -> None:
    created = await coord.create("a/e", b"\x00\xffbytes", ephemeral=True)
    assert created is not None and created.ephemeral
    assert await coord.get("a/e") == created


async def test_ephemeral_keys_vanish_when_their_session_closes(
    open_coord: OpenCoordinator,
) -> None:
    owner, observer = await open_coord(), await open_coord()
    assert await owner.create("members/m1", b"", ephemeral=True) is not None
    assert await owner.create("positions/0", b"7") is not None
    seen = await observer.get("members/m1")
    assert seen is not None and seen.ephemeral
    await owner.close()

    async def gone() -> bool:
        return await observer.get("members/m1") is None

    await eventually(gone, "ephemeral key deleted after its session closed", limit_s=10.0)
    persistent = await observer.get("positions/0")
    assert persistent is not None and persistent.value == b"7"


async def test_get_missing_is_none(coord: Coordinator) -> None:
    assert await coord.get("no/such/key") is None


async def test_get_many_reads_what_get_reads(coord: Coordinator) -> None:
    """Present, absent and repeated keys, and more keys than one etcd
    transaction may hold (128): each entry exactly as :meth:`get` gives it."""
    keys = [f"many/k{i:03d}" for i in range(150)]
    for key in keys[::2]:
        assert await coord.create(key, key.encode(), ephemeral=key.endswith("0")) is not None
    wanted = [*keys, "many/absent", keys[0]]
    got = await coord.get_many(wanted)
    assert list(got) == list(dict.fromkeys(wanted))
    for key in got:
        assert got[key] == await coord.get(key), key
    assert sum(entry is not None for entry in got.values()) == 75
    assert await coord.get_many([]) == {}


async def test_list_returns_direct_children_sorted(coord: Coordinator) -> None:
    for key in ("d/b", "d/a", "d/c", "d/a/deeper", "d2/x", "dx", "other/d/a"):
        assert await coord.create(key, key.encode()) is not None
    listed = await coord.list("d/")
    assert [e.key for e in listed] == ["d/a", "d/b", "d/c"]
    assert [e.value for e in listed] == [b"d/a", b"d/b", b"d/c"]
    assert [e.key for e in await coord.list("d/a/")] == ["d/a/deeper"]
    assert await coord.list("empty/") == []


async def test_list_shows_only_keys_that_were_created(coord: Coordinator) -> None:
    # "p/q" is never created itself: it must not appear as a child of "p/"
    # even where the backend stores parents of "p/q/r" (ZooKeeper znodes).
    assert await coord.create("p/q/r", b"") is not None
    assert await coord.create("p/s", b"") is not None
    assert [e.key for e in await coord.list("p/")] == ["p/s"]
    assert await coord.get("p/q") is None


async def test_list_marks_ephemeral_entries(coord: Coordinator) -> None:
    await coord.create("m/eph", b"", ephemeral=True)
    await coord.create("m/per", b"")
    assert [(e.key, e.ephemeral) for e in await coord.list("m/")] == [
        ("m/eph", True),
        ("m/per", False),
    ]


async def test_create_version_strictly_increases_across_delete_and_recreate(
    coord: Coordinator,
) -> None:
    first = await coord.create("epochs/0", b"")
    assert first is not None
    other = await coord.create("epochs/1", b"")
    assert other is not None and other.create_version > first.create_version
    assert await coord.delete("epochs/0")
    again = await coord.create("epochs/0", b"")
    assert again is not None
    assert again.create_version > other.create_version > first.create_version
    ephemeral = await coord.create("epochs/2", b"", ephemeral=True)
    assert ephemeral is not None and ephemeral.create_version > again.create_version


async def test_version_changes_on_every_put(coord: Coordinator) -> None:
    created = await coord.create("v/k", b"0")
    assert created is not None
    versions = [created.version]
    for n in range(1, 4):
        assert await coord.commit([], [Put("v/k", str(n).encode())])
        entry = await coord.get("v/k")
        assert entry is not None
        assert entry.value == str(n).encode()
        assert entry.create_version == created.create_version
        versions.append(entry.version)
    assert len(set(versions)) == len(versions), versions


async def test_put_creates_a_missing_key(coord: Coordinator) -> None:
    before = await coord.create("w/before", b"")
    assert before is not None
    assert await coord.commit([], [Put("w/new", b"x")])
    entry = await coord.get("w/new")
    assert entry is not None and entry.value == b"x" and not entry.ephemeral
    assert entry.create_version > before.create_version


async def test_commit_applies_when_every_check_holds(coord: Coordinator) -> None:
    owner = await coord.create("owners/0", b"me", ephemeral=True)
    position = await coord.create("positions/0", b"1")
    assert owner is not None and position is not None
    await coord.create("trash/x", b"")
    ok = await coord.commit(
        [
            Check.created_at("owners/0", owner.create_version),
            Check.at_version("positions/0", position.version),
            Check.is_absent("fences/0"),
        ],
        [Put("positions/0", b"2"), Put("positions/1", b"9"), Delete("trash/x")],
    )
    assert ok
    moved = await coord.get("positions/0")
    assert moved is not None and moved.value == b"2" and moved.version != position.version
    added = await coord.get("positions/1")
    assert added is not None and added.value == b"9"
    assert await coord.get("trash/x") is None


async def test_commit_with_no_checks_and_no_ops(coord: Coordinator) -> None:
    assert await coord.commit([], [])
    assert await coord.commit([], [Delete("never/existed")])
    assert await coord.get("never/existed") is None


STALE_CASES = [
    "absent-but-exists",
    "created_at-but-recreated",
    "created_at-but-missing",
    "at_version-but-written",
    "at_version-but-missing",
]


@pytest.mark.parametrize("stale", STALE_CASES)
async def test_commit_applies_nothing_when_any_check_is_stale(
    coord: Coordinator, open_coord: OpenCoordinator, stale: str
) -> None:
    other = await open_coord()
    owner = await coord.create("owners/0", b"me")
    position = await coord.create("positions/0", b"1")
    await coord.create("trash/x", b"keep")
    assert owner is not None and position is not None
    good = [
        Check.created_at("owners/0", owner.create_version),
        Check.at_version("positions/0", position.version),
        Check.is_absent("fences/0"),
    ]
    # Another member makes exactly one of the checks stale.
    if stale == "absent-but-exists":
        assert await other.create("fences/0", b"") is not None
    elif stale == "created_at-but-recreated":
        assert await other.delete("owners/0")
        assert await other.create("owners/0", b"thief") is not None
    elif stale == "created_at-but-missing":
        assert await other.delete("owners/0")
    elif stale == "at_version-but-written":
        assert await other.commit([], [Put("positions/0", b"5")])
    else:
        assert await other.delete("positions/0")
    snapshot = {key: await coord.get(key) for key in ("positions/0", "positions/1", "trash/x")}

    ok = await coord.commit(
        good,
        [Put("positions/0", b"2"), Put("positions/1", b"9"), Delete("trash/x")],
    )

    assert not ok
    for key, before in snapshot.items():
        assert await coord.get(key) == before, f"{key} changed by a refused commit"


async def test_commit_refused_with_one_stale_check_among_many(coord: Coordinator) -> None:
    entries = [await coord.create(f"multi/{n}", b"0") for n in range(5)]
    assert all(e is not None for e in entries)
    checks = [Check.at_version(e.key, e.version) for e in entries if e is not None]
    assert await coord.commit([], [Put("multi/3", b"moved")])
    assert not await coord.commit(checks, [Put(f"multi/{n}", b"1") for n in range(5)])
    assert [e.value for e in await coord.list("multi/")] == [b"0", b"0", b"0", b"moved", b"0"]


async def test_delete(coord: Coordinator) -> None:
    await coord.create("del/k", b"")
    await coord.create("del/e", b"", ephemeral=True)
    assert await coord.delete("del/k")
    assert await coord.delete("del/e")
    assert await coord.get("del/k") is None
    assert await coord.list("del/") == []
    assert not await coord.delete("del/k")


async def test_another_session_can_delete_an_ephemeral_key(open_coord: OpenCoordinator) -> None:
    owner, other = await open_coord(), await open_coord()
    await owner.create("eph/k", b"", ephemeral=True)
    assert await other.delete("eph/k")
    assert await owner.get("eph/k") is None


@pytest.mark.parametrize("bad", ["", "/a", "a/", "a//b"])
async def test_bad_keys_are_refused(coord: Coordinator, bad: str) -> None:
    with pytest.raises(ConfigError):
        await coord.create(bad, b"")
    with pytest.raises(ConfigError):
        await coord.get(bad)


@pytest.mark.parametrize("bad", ["a", "/a/", "a//"])
async def test_bad_directories_are_refused(coord: Coordinator, bad: str) -> None:
    with pytest.raises(ConfigError):
        await coord.list(bad)
