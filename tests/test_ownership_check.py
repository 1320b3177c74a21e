"""The ownership check costs nothing per shard on an idle member (issues 29, 55).

Every member must notice when an operator deletes an owner key of its
(``members remove``, ``reset --force``). It used to list every owner key of
the group once per session: at 2,048 shards that listing and its decoding
were 70 % of an idle member's CPU. Then it read its own owner keys once per
session, still the larger part of an idle member's CPU in a group of 200
tables. Now each such operator commit also writes the group's ``forced`` key,
which every control round reads in its one request: a member reads its own
owner keys (in one request) only when that key moved, when a sweep for
orphaned keys of its own is due (once per session, after a failed round), and
every six sessions for a deletion made some other way.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest

from coordinators import open_coordinator
from coordinators.errors import CoordinatorUnavailable
from coordinators.protocol import Check, Coordinator, Delete, Put
from paimon_group import GroupMember, MemberConfig
from paimon_group.protocol.admin import GroupAdmin
from paimon_group.protocol.group import GroupClient
from paimon_group.protocol.records import OwnersForced
from tests.support.tables import make_append_table, write_rows
from tests.support.waiting import eventually as _until


def _config(wh: str, url: str, member: str, shards: int) -> MemberConfig:
    return MemberConfig(group="g", warehouse=wh, table="db.t", coordinator=url,
                        member_id=member, session_timeout_s=2, poll_interval_ms=50,
                        shards=shards)


def _table(tmp_path: Path) -> str:
    wh = str(tmp_path / "wh")
    make_append_table(wh, "db.t", buckets=-1)
    write_rows(wh, "db.t", range(10))
    return wh


def _losses(member: GroupMember) -> list[list[int]]:
    """The shards ``member`` reports lost (``on_lost``), as they come."""
    lost: list[list[int]] = []
    real_notify = member.core.notify

    def notify(event: str, shards: list[int]) -> None:
        if event == "on_lost":
            lost.append(list(shards))
        real_notify(event, shards)

    member.core.notify = notify  # type: ignore[method-assign,assignment]
    return lost


def _count_reads(coord: Coordinator, owners_dir: str) -> dict[str, Any]:
    """Wrap ``list`` and ``get_many`` of one coordinator instance: how often
    the owners directory was listed, and which keys were read together."""
    seen: dict[str, Any] = {"listings": 0, "batches": []}
    real_list, real_get_many = coord.list, coord.get_many

    async def counting_list(prefix: str) -> Any:
        if prefix == owners_dir:
            seen["listings"] += 1
        return await real_list(prefix)

    async def counting_get_many(keys: Any) -> Any:
        if any(k.startswith(owners_dir) for k in keys):  # not a control round's own keys
            seen["batches"].append(sorted(keys))
        return await real_get_many(keys)

    coord.list = counting_list  # type: ignore[method-assign]
    coord.get_many = counting_get_many  # type: ignore[method-assign]
    return seen


@pytest.mark.asyncio
@pytest.mark.parametrize("backend", ["etcd", "zookeeper"])
async def test_an_idle_member_reads_its_owner_keys_only_when_an_operator_forced(
        tmp_path: Path, backend: str, request: pytest.FixtureRequest) -> None:
    """Two idle members of 64 shards, on a real server: over three sessions
    neither lists nor reads any owner key; an operator's ``reset --force`` of
    one shard of a's makes each read its own owner keys, in one request, and
    a drops that shard (then takes it back)."""
    wh = _table(tmp_path)
    if backend == "etcd":
        url = str(request.getfixturevalue("etcd_server").url_with_prefix())
    else:
        url = str(request.getfixturevalue("zk_server").unique_url())
    a, b = GroupMember(_config(wh, url, "a", 64)), GroupMember(_config(wh, url, "b", 64))
    await a.start()
    await b.start()
    try:
        await _until(lambda: len(a.owned_shards) == 32 and len(b.owned_shards) == 32,
                     "32 shards each")
        # Past the first check of each session (the one sweep it makes).
        await asyncio.sleep(2.5)
        counts = {}
        for m in (a, b):
            assert m.core.coordinator is not None and m.core.group is not None
            counts[m.member_id] = _count_reads(m.core.coordinator, m.core.group.keys.owners_dir)
        await asyncio.sleep(6.5)  # three sessions (2 s), within the slow check (12 s)
        for m in (a, b):
            assert counts[m.member_id] == {"listings": 0, "batches": []}, m.member_id
        own = {m.member_id: sorted(m.core.group.keys.owner(s) for s in m.owned_shards)
               for m in (a, b) if m.core.group is not None}
        taken = a.owned_shards[0]
        lost = _losses(a)
        async with open_coordinator(url) as operator:
            assert await GroupAdmin(operator, "g").force_positions({taken: 1}, "operator")
        await _until(lambda: lost == [[taken]], "a noticed the forced shard")
        await _until(lambda: all(counts[m]["batches"] for m in own), "both read their keys")
        for m, keys in own.items():
            seen = counts[m]
            assert seen["listings"] == 0, m
            assert seen["batches"][0] == keys, m
        await _until(lambda: len(a.owned_shards) == 32, "a took its shard back")
    finally:
        await a.stop()
        await b.stop()


@pytest.mark.asyncio
@pytest.mark.parametrize("how", ["with the forced mark", "deleted some other way"])
async def test_an_owner_key_deleted_by_an_operator_is_still_noticed(
        tmp_path: Path, how: str) -> None:
    """A shard whose owner key an operator deleted is dropped and taken
    back: at the next round when the deletion wrote the forced mark (as
    ``reset --force`` and ``members remove`` do); at the slow periodic check
    after a deletion that wrote none."""
    wh = _table(tmp_path)
    url = f"memory://ownership-{uuid.uuid4().hex}"
    async with GroupMember(_config(wh, url, "a", 4)) as a:
        await _until(lambda: len(a.owned_shards) == 4, "4 shards")
        lost = _losses(a)
        assert a.core.group is not None
        async with open_coordinator(url) as operator:
            key = a.core.group.keys.owner(2)
            entry = await operator.get(key)
            assert entry is not None
            if how == "with the forced mark":
                forced = a.core.group.keys.forced
                assert await operator.get(forced) is None
                # The member's own key stays: only its owner keys go, with the mark.
                assert await operator.commit(
                    [Check.created_at(key, entry.create_version)],
                    [Delete(key), Put(forced, OwnersForced(actor="operator").encode())])
            else:
                assert await operator.commit([Check.created_at(key, entry.create_version)],
                                             [Delete(key)])
        await _until(lambda: lost == [[2]], "shard 2 lost")
        await _until(lambda: len(a.owned_shards) == 4, "shard 2 acquired again")


@pytest.mark.asyncio
async def test_an_orphaned_key_of_ours_is_swept_after_a_failed_round(tmp_path: Path) -> None:
    """An owner key our session created but does not know of (an acquisition
    whose reply was lost) blocks its shard's assignee. A control round that
    failed is when that can happen: the next check lists every owner key and
    releases the orphan, and the assignee takes the shard."""
    wh = _table(tmp_path)
    url = f"memory://ownership-{uuid.uuid4().hex}"
    async with GroupMember(_config(wh, url, "a", 4)) as a, \
            GroupMember(_config(wh, url, "b", 4)) as b:
        await _until(lambda: len(a.owned_shards) == 2 and len(b.owned_shards) == 2,
                     "2 shards each")
        assert a.core.coordinator is not None and a.core.group is not None
        theirs = b.owned_shards[0]
        key = a.core.group.keys.owner(theirs)
        # The orphan: b's key of the shard goes (as an operator would delete
        # it), and a's session creates one in its place, unknown to a. Only
        # then is the operators' mark moved: b, told at once, would take its
        # shard back before a's session could.
        async with open_coordinator(url) as operator:
            entry = await operator.get(key)
            assert entry is not None
            assert await operator.commit([Check.created_at(key, entry.create_version)],
                                         [Delete(key)])
            assert a.assignment is not None
            assert await GroupClient(a.core.coordinator, "g").acquire(
                theirs, "a", a.assignment.generation) is not None
            forced = Put(a.core.group.keys.forced, OwnersForced(actor="operator").encode())
            assert await operator.commit([], [forced])
        await _until(lambda: theirs not in b.owned_shards, "b noticed its key gone")
        # One failed control round of a's.
        real_reconcile = a.control.reconcile
        failed: list[bool] = []

        async def reconcile(fired: set[str]) -> None:
            if not failed:
                failed.append(True)
                raise CoordinatorUnavailable("injected: no answer")
            await real_reconcile(fired)

        a.control.reconcile = reconcile  # type: ignore[method-assign]
        await _until(lambda: bool(failed), "a round failed")
        await _until(lambda: theirs in b.owned_shards, "the orphan swept, b took its shard")
