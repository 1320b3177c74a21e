"""An ambiguous leader create (it landed, but the caller got an error) is adopted
by the session that made it, instead of leaving a leader key nobody knows it
holds (issue 12, finding 5: no assignment was ever published while that
session lived).

The fault is injected at the exact call: the coordinator's ``create`` of the
leader key is applied, then raises ``CoordinatorUnavailable``, as an etcd Txn
whose reply timed out or a ZooKeeper create whose connection dropped after
the server applied it."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest

from coordinators import open_coordinator
from coordinators.errors import CoordinatorUnavailable
from coordinators.protocol import Coordinator
from paimon_group import GroupMember, MemberConfig
from paimon_group.member.membership import Membership
from paimon_group.protocol.group import GroupClient
from tests.support.tables import make_pk_table, write_rows


def applied_but_raised(coord: Coordinator, key_suffix: str, *, then_fail_gets: int = 0) -> None:
    """The next ``create`` of a key ending in ``key_suffix`` is applied and then
    raises; the ``then_fail_gets`` reads of that key right after it raise too
    (the caller cannot even read the outcome back at once)."""
    real_create, real_get = coord.create, coord.get
    state = {"creates": 1, "gets": 0}

    async def create(key: str, value: bytes, *, ephemeral: bool = False) -> Any:
        entry = await real_create(key, value, ephemeral=ephemeral)
        if key.endswith(key_suffix) and state["creates"] > 0:
            state["creates"] -= 1
            state["gets"] = then_fail_gets
            raise CoordinatorUnavailable("injected: the create was applied, its reply lost")
        return entry

    async def get(key: str) -> Any:
        if key.endswith(key_suffix) and state["gets"] > 0:
            state["gets"] -= 1
            raise CoordinatorUnavailable("injected: read back failed")
        return await real_get(key)

    coord.create = create  # type: ignore[method-assign]
    coord.get = get  # type: ignore[method-assign]


def _url(request: pytest.FixtureRequest, backend: str, tmp_path: Path) -> str:
    if backend == "memory":
        return f"memory://lead-{uuid.uuid4().hex}"
    if backend == "sqlite":
        return f"sqlite://{tmp_path}/coord.sqlite"
    if backend == "zk":
        return str(request.getfixturevalue("zk_url"))
    return f"{request.getfixturevalue('etcd_url')}/lead-{uuid.uuid4().hex}"


@pytest.mark.asyncio
@pytest.mark.parametrize("backend", ["memory", "sqlite", "etcd", "zk"])
async def test_ambiguous_leader_create_is_adopted_by_its_session(
        request: pytest.FixtureRequest, backend: str, tmp_path: Path) -> None:
    url = _url(request, backend, tmp_path)
    async with open_coordinator(url) as a, open_coordinator(url) as b:
        ga, gb = GroupClient(a, "g"), GroupClient(b, "g")
        applied_but_raised(a, "/leader")
        epoch = await ga.try_lead("a")
        leader = await gb.leader()
        assert leader is not None and epoch == leader[1] and leader[0] == "a"
        # The adopted epoch publishes (the publish is guarded by it).
        assert await ga.publish({"a": [0]}, leader="a", leader_epoch=epoch,
                                previous=None, previous_version=None) is not None
        # Another session, even under the same member id, adopts nothing.
        assert await gb.try_lead("a") is None
        assert await gb.own_leader_epoch("a") is None


@pytest.mark.asyncio
async def test_member_whose_leader_create_was_ambiguous_leads(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The member cannot read the outcome back in the same round either: it
    adopts the key on its next control round, publishes, and reads."""
    wh = str(tmp_path / "wh")
    make_pk_table(wh, "db.t", buckets=2)
    write_rows(wh, "db.t", range(10))
    real_open = Membership.connect_coordinator

    async def open_faulty(self: Membership) -> Coordinator:
        coord = await real_open(self)
        applied_but_raised(coord, "/leader", then_fail_gets=1)
        return coord

    monkeypatch.setattr(Membership, "connect_coordinator", open_faulty)
    cfg = MemberConfig(group="lead", warehouse=wh, table="db.t",
                       coordinator=f"memory://lead-{uuid.uuid4().hex}", member_id="a",
                       session_timeout_s=3, poll_interval_ms=50)
    got: set[int] = set()
    async with GroupMember(cfg) as member:
        batches = member.batches()
        while len(got) < 10:
            batch = await asyncio.wait_for(batches.__anext__(), timeout=30)
            got.update(batch.to_arrow().column("id").to_pylist())
        assert member.is_leader
        await batches.aclose()
    assert got == set(range(10))
