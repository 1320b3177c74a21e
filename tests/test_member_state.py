"""The member's transition table and a held shard's lifecycle, without a server."""

from __future__ import annotations

import asyncio

import pytest

from paimon_group.member import GroupMember, MemberConfig, MemberState, OwnedShard, ShardState
from paimon_group.member.state import TRANSITIONS, may_move

S = MemberState


def member() -> GroupMember:
    return GroupMember(MemberConfig(group="g", warehouse="/nonexistent", table="db.t",
                                    coordinator="memory://state-test"))


def test_every_state_has_a_row_and_failed_is_terminal() -> None:
    assert set(TRANSITIONS) == set(MemberState)
    assert TRANSITIONS[S.FAILED] == frozenset()
    for state in MemberState:
        if state is not S.FAILED:
            assert may_move(state, S.FAILED)


@pytest.mark.parametrize(("path", "end"), [
    ([S.JOINING, S.RUNNING, S.REJOINING, S.RUNNING, S.LEAVING, S.STOPPED], S.STOPPED),
    ([S.STOPPED], S.STOPPED),  # stop() before start()
    ([S.JOINING, S.LEAVING, S.STOPPED], S.STOPPED),  # stop() after start() raised
    ([S.JOINING, S.RUNNING, S.FAILED, S.LEAVING, S.STOPPED], S.FAILED),
    # A rejoin that completes while the member leaves does not make it RUNNING.
    ([S.JOINING, S.RUNNING, S.REJOINING, S.LEAVING, S.RUNNING], S.LEAVING),
    ([S.RUNNING], S.CREATED),  # not joined yet
])
def test_set_state_follows_the_table(path: list[MemberState], end: MemberState) -> None:
    async def go() -> MemberState:
        m = member()
        for state in path:
            m.core.set_state(state)
        return m.state

    assert asyncio.run(go()) is end


def test_a_shard_lifecycle_in_place_of_two_flags() -> None:
    async def go() -> None:
        revoked = OwnedShard(shard=0, epoch=1, generation=1)
        assert revoked.active and not revoked.revoking and not revoked.dropped
        revoked.revoke()
        assert revoked.state is ShardState.REVOKING and revoked.revoking
        revoked.drop()
        assert revoked.state is ShardState.REVOKED and revoked.revoking and revoked.dropped
        revoked.revoke()  # ended: stays ended
        assert revoked.state is ShardState.REVOKED

        lost = OwnedShard(shard=1, epoch=1, generation=1)
        lost.drop()
        assert lost.state is ShardState.LOST and lost.dropped and not lost.revoking
        lost.revoke()  # ended: a revocation changes nothing
        assert lost.state is ShardState.LOST

    asyncio.run(go())
