"""The group's reads: what the member's client and the operators' client
both read of a group (:class:`GroupReads`).

:class:`~paimon_group.protocol.group.GroupClient` (the member's writes) and
:class:`~paimon_group.protocol.admin.GroupAdmin` (the operators' writes) are
both a :class:`GroupReads`: one reading of the key layout
(:class:`~paimon_group.protocol.names.GroupKeys`), two writers that never
share a commit.
"""

from __future__ import annotations

from collections.abc import Iterable

from coordinators.protocol import Coordinator, Entry
from paimon_group.protocol.group_views import GroupState, OwnerView, leader_of, owner_view
from paimon_group.protocol.names import GroupKeys
from paimon_group.protocol.records import (
    Assignment,
    GroupMeta,
    MemberInfo,
    Owner,
    Position,
    RemovedMember,
    decoded_assignment,
)

__all__ = ["GroupReads"]


class GroupReads:
    """Reads of one group over one coordinator session (no writes)."""

    def __init__(self, coordinator: Coordinator, group: str) -> None:
        self.coordinator = coordinator
        self.keys = GroupKeys(group)
        self.group = group

    async def read_meta(self) -> GroupMeta | None:
        entry = await self.coordinator.get(self.keys.meta)
        return GroupMeta.decode(entry.key, entry.value) if entry else None

    async def leaving(self) -> set[str]:
        """Members that said goodbye and were not yet processed by a leader."""
        return {GroupKeys.last_segment(e.key)
                for e in await self.coordinator.list(self.keys.leaving_dir)}

    async def removed_session(self, member_id: str) -> str | None:
        """The session an operator removed ``member_id`` in (``members remove``).

        Unlike the goodbye marker, which the leader deletes as soon as it has
        published an assignment without the member, this record stays until
        the member itself (or its next registration, or ``delete``) clears it:
        a removed process that notices late must still learn that it was
        removed, not take it for an expired session and rejoin.
        """
        entry = await self.coordinator.get(self.keys.removed(member_id))
        if entry is None:
            return None
        return RemovedMember.decode(entry.key, entry.value).session

    async def members(self) -> dict[str, MemberInfo]:
        out: dict[str, MemberInfo] = {}
        for entry in await self.coordinator.list(self.keys.members_dir):
            info = MemberInfo.decode(entry.key, entry.value)
            out[GroupKeys.last_segment(entry.key)] = info
        return out

    async def own_leader_epoch(self, member_id: str) -> int | None:
        """The leader epoch if the leader key was created by this session as
        ``member_id`` (an ambiguous create that landed), else None."""
        entry = await self.coordinator.get(self.keys.leader)
        if entry is None:
            return None
        owner = Owner.decode(entry.key, entry.value)
        if owner.member_id == member_id and owner.session == self.coordinator.session.id:
            return entry.create_version
        return None

    async def leader(self) -> tuple[str, int] | None:
        return leader_of(await self.coordinator.get(self.keys.leader))

    async def read_assignment(self) -> tuple[Assignment | None, int | None]:
        return self.assignment_of(await self.coordinator.get(self.keys.assignment))

    def assignment_of(self, entry: Entry | None) -> tuple[Assignment | None, int | None]:
        """The assignment and its version in the assignment key's ``entry``."""
        if entry is None:
            return None, None
        return decoded_assignment(entry.key, entry.value), entry.version

    async def owners(self) -> dict[int, OwnerView]:
        """Every shard's owner: a listing of all owner keys, O(shards)."""
        out: dict[int, OwnerView] = {}
        for entry in await self.coordinator.list(self.keys.owners_dir):
            shard = GroupKeys.shard_of(entry.key)
            if shard is None:
                continue
            out[shard] = owner_view(shard, entry)
        return out

    async def owners_of(self, shards: Iterable[int]) -> dict[int, OwnerView]:
        """The owners of ``shards`` only (a shard without an owner key is
        left out), in as few requests as the coordinator allows: what a
        member checks of the shards it holds, O(own shards) rather than
        :meth:`owners`' O(shards)."""
        keys = {self.keys.owner(s): s for s in shards}
        entries = await self.coordinator.get_many(list(keys))
        return {keys[k]: owner_view(keys[k], e) for k, e in entries.items() if e is not None}

    async def positions(self) -> dict[int, Position]:
        out: dict[int, Position] = {}
        for entry in await self.coordinator.list(self.keys.positions_dir):
            shard = GroupKeys.shard_of(entry.key)
            if shard is not None:
                out[shard] = Position.decode(entry.key, entry.value)
        return out

    async def position(self, shard: int) -> tuple[Position | None, int | None]:
        entry = await self.coordinator.get(self.keys.position(shard))
        if entry is None:
            return None, None
        return Position.decode(entry.key, entry.value), entry.version

    async def state(self) -> GroupState:
        meta = await self.read_meta()
        members = await self.members()
        leader = await self.leader()
        assignment, version = await self.read_assignment()
        return GroupState(
            meta=meta,
            members=members,
            leader=leader[0] if leader else None,
            leader_epoch=leader[1] if leader else None,
            assignment=assignment,
            assignment_version=version,
            owners=await self.owners(),
            positions=await self.positions(),
        )
