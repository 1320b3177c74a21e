"""The group protocol over the in-memory embedded backend (no table needed)."""

from __future__ import annotations

import uuid

import pytest

from coordinators import open_coordinator
from coordinators.protocol import ConnectOptions
from paimon_group.errors import ConfigError, ShardCountMismatch
from paimon_group.protocol.admin import GroupAdmin
from paimon_group.protocol.group import GroupClient
from paimon_group.protocol.names import GroupKeys, consumer_id, validate_group, validate_member_id
from paimon_group.protocol.records import MemberInfo


def _url() -> str:
    return f"memory://group-{uuid.uuid4().hex}"


def _info(member: str) -> MemberInfo:
    return MemberInfo(member_id=member, host="h", pid=1, version="t", started_at=0.0)


@pytest.mark.parametrize("bad", ["", "a/b", "..", ".", "x" * 129, "sp ace", "ü"])
def test_bad_names_are_refused_with_one_line(bad: str) -> None:
    with pytest.raises(ConfigError) as err:
        validate_group(bad)
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError):
        validate_member_id(bad)


def test_consumer_id_is_stable_and_valid() -> None:
    assert consumer_id("orders", 7) == "pg-orders-shard-7"
    assert "/" not in consumer_id("a.b_c-d", 0)
    assert GroupKeys("g").owner(3) == "groups/g/owners/3"


@pytest.mark.asyncio
async def test_shard_count_is_fixed_at_creation() -> None:
    url = _url()
    async with open_coordinator(url) as coord:
        group = GroupClient(coord, "g")
        meta = await group.ensure_meta(8, "db.t")
        assert meta.num_shards == 8
        assert (await group.ensure_meta(None, "db.t")).num_shards == 8
        with pytest.raises(ShardCountMismatch, match="has 8 shards"):
            await group.ensure_meta(4, "db.t")


@pytest.mark.asyncio
async def test_member_id_held_by_live_session_is_refused() -> None:
    url = _url()
    async with open_coordinator(url) as a, open_coordinator(url) as b:
        assert await GroupClient(a, "g").register(_info("m1")) is not None
        assert await GroupClient(b, "g").register(_info("m1")) is None
        assert set(await GroupClient(b, "g").members()) == {"m1"}


@pytest.mark.asyncio
async def test_deposed_leader_cannot_publish() -> None:
    url = _url()
    opts = ConnectOptions(session_timeout_s=5)
    async with open_coordinator(url, opts) as a, open_coordinator(url, opts) as b:
        ga, gb = GroupClient(a, "g"), GroupClient(b, "g")
        epoch_a = await ga.try_lead("a")
        assert epoch_a is not None
        assert await gb.try_lead("b") is None
        first = await ga.publish({"a": [0, 1]}, leader="a", leader_epoch=epoch_a,
                                 previous=None, previous_version=None)
        assert first is not None and first.generation == 1
        assert await ga.resign(epoch_a)
        epoch_b = await gb.try_lead("b")
        assert epoch_b is not None and epoch_b > epoch_a
        prev, version = await gb.read_assignment()
        # a, deposed, tries to publish with its old leader epoch: refused.
        assert await ga.publish({"a": [0, 1]}, leader="a", leader_epoch=epoch_a,
                                previous=prev, previous_version=version) is None
        second = await gb.publish({"b": [0, 1]}, leader="b", leader_epoch=epoch_b,
                                  previous=prev, previous_version=version)
        assert second is not None and second.generation == 2


@pytest.mark.asyncio
async def test_commits_are_fenced_by_epoch_and_epochs_increase() -> None:
    url = _url()
    async with open_coordinator(url) as a, open_coordinator(url) as b:
        ga, gb = GroupClient(a, "g"), GroupClient(b, "g")
        epoch_a = await ga.acquire(0, "a", generation=1)
        assert epoch_a is not None
        assert await gb.acquire(0, "b", generation=1) is None  # owned
        assert await ga.commit_positions({0: (epoch_a, 5)}, "a")
        # a releases together with its final position; b takes over.
        assert await ga.commit_positions({0: (epoch_a, 6)}, "a", release=True)
        epoch_b = await gb.acquire(0, "b", generation=2)
        assert epoch_b is not None and epoch_b > epoch_a
        position, _ = await gb.position(0)
        assert position is not None and position.next_snapshot == 6
        # a's stale commit is rejected and changes nothing.
        assert not await ga.commit_positions({0: (epoch_a, 99)}, "a")
        position, _ = await gb.position(0)
        assert position is not None and position.next_snapshot == 6
        # A batched commit with one stale shard applies nothing at all.
        epoch_b1 = await gb.acquire(1, "b", generation=2)
        assert epoch_b1 is not None
        assert not await gb.commit_positions({0: (epoch_a, 7), 1: (epoch_b1, 7)}, "b")
        assert (await gb.positions()).get(1) is None


@pytest.mark.asyncio
async def test_owner_key_vanishes_with_its_session() -> None:
    url = _url()
    async with open_coordinator(url) as b:
        a = open_coordinator(url)
        await a.connect()
        ga = GroupClient(a, "g")
        epoch = await ga.acquire(2, "a", generation=1)
        assert epoch is not None
        await a.close()
        gb = GroupClient(b, "g")
        assert 2 not in await gb.owners()
        assert await gb.acquire(2, "b", generation=1) is not None


@pytest.mark.asyncio
async def test_reset_refused_while_a_shard_is_owned() -> None:
    url = _url()
    async with open_coordinator(url) as a:
        g = GroupClient(a, "g")
        epoch = await g.acquire(0, "a", generation=1)
        assert epoch is not None
        admin = GroupAdmin(a, "g")
        assert not await admin.reset_positions({0: 1}, "admin")
        assert await g.release(0, epoch)
        assert await admin.reset_positions({0: 1}, "admin")
        assert (await g.positions())[0].next_snapshot == 1


@pytest.mark.asyncio
async def test_operator_commits_that_delete_owner_keys_move_the_forced_mark() -> None:
    """``force_positions`` and ``remove_member`` write the group's ``forced``
    key in the commit that deletes owner keys (members re-read their own
    owner keys when it moves); a force of unowned shards and a removal of a
    member without owner keys do not; ``delete_all`` deletes it."""
    async with open_coordinator(_url()) as a:
        g, admin = GroupClient(a, "g"), GroupAdmin(a, "g")
        await g.ensure_meta(num_shards=4, table="db.t")
        forced = g.keys.forced
        assert await admin.force_positions({0: 3}, "admin")  # no owner: nothing fenced
        assert await a.get(forced) is None
        assert await g.register(_info("m"))
        assert (await admin.remove_member("m")).done  # no owner keys
        assert await a.get(forced) is None
        assert await g.acquire(1, "b", generation=1) is not None
        assert await admin.force_positions({1: 5}, "admin")
        first = await a.get(forced)
        assert first is not None and 1 not in await g.owners()
        assert await g.acquire(2, "c", generation=1) is not None
        assert await g.register(_info("c"))
        assert (await admin.remove_member("c")).done
        second = await a.get(forced)
        assert second is not None and second.version != first.version
        assert await admin.delete_all()
        assert await a.get(forced) is None
