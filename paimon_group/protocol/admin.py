"""The operators' client: the group's commits no member makes.

:class:`GroupAdmin` is what ``paimon-group reset``, ``delete`` and
``members remove`` (:mod:`paimon_group.ops`) write with, beside the member's
:class:`~paimon_group.protocol.group.GroupClient` (both read as
:class:`~paimon_group.protocol.group_reads.GroupReads`). Each write is one guarded,
atomic commit, so an operator can never corrupt what live members do:

* **reset** -- positions written only where no owner key exists
  (:meth:`GroupAdmin.reset_positions`);
* **force** -- positions written under live owners, each owner key deleted
  in the same commit, guarded by the epoch read (:meth:`GroupAdmin.force_positions`);
* **delete** -- every key of the group in one commit, refused while any
  member, owner or leader key exists (:meth:`GroupAdmin.delete_all`);
* **remove a member** -- its member, owner and leader keys deleted and its
  goodbye recorded, guarded by the create versions (:meth:`GroupAdmin.remove_member`).

A position an operator writes carries epoch 0: no owner wrote it.

A commit that deletes owner keys also writes the group's ``forced`` key
(:attr:`~paimon_group.protocol.names.GroupKeys.forced`), in the same commit:
members read that key in every control round and re-read their own owner
keys only when it moved, so they notice within a round a shard taken from
them, without reading every owner key they hold each time
(member/ownership.py).

Example (in-memory backend)::

    import asyncio
    from coordinators import open_coordinator
    from paimon_group.protocol.admin import GroupAdmin
    from paimon_group.protocol.group import GroupClient

    async def main() -> None:
        async with open_coordinator("memory://admin-doc") as coord:
            await GroupClient(coord, "orders").ensure_meta(num_shards=2, table="db.orders")
            admin = GroupAdmin(coord, "orders")
            assert await admin.reset_positions({0: 7}, "operator")
            assert await admin.delete_all() == 2

    asyncio.run(main())
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from coordinators.errors import CorruptValue
from coordinators.protocol import Check, Delete, Put
from paimon_group.protocol.group_reads import GroupReads
from paimon_group.protocol.group_views import Removal
from paimon_group.protocol.names import validate_member_id
from paimon_group.protocol.records import (
    MemberInfo,
    Owner,
    OwnersForced,
    Position,
    RemovedMember,
)

__all__ = ["GroupAdmin"]


def _reset_position(next_snapshot: int, actor: str, now: float) -> bytes:
    """A position written by an operator (epoch 0: no owner wrote it)."""
    return Position(next_snapshot=next_snapshot, epoch=0, member_id=actor,
                    committed_at=now).encode()


class GroupAdmin(GroupReads):
    """Operators' commits on one group over one coordinator session (its
    reads: :class:`~paimon_group.protocol.group_reads.GroupReads`, as the
    member's client's)."""

    def _forced(self, actor: str, now: float) -> Put:
        """The write that tells members owner keys were deleted (module docstring)."""
        return Put(self.keys.forced, OwnersForced(actor=actor, forced_at=now).encode())

    # -- commits ----------------------------------------------------------

    async def reset_positions(self, positions: Mapping[int, int], actor: str) -> bool:
        """Administrative reset: write positions for shards that have no owner.

        Each write is guarded by the owner key being absent, so a reset can
        never race a live owner's commits.
        """
        now = time.time()
        checks = [Check.is_absent(self.keys.owner(s)) for s in sorted(positions)]
        ops: list[Put | Delete] = [Put(self.keys.position(s), _reset_position(n, actor, now))
                                   for s, n in sorted(positions.items())]
        return await self.coordinator.commit(checks, ops)

    async def force_positions(self, positions: Mapping[int, int], actor: str) -> bool:
        """Write positions under live owners: each owner key is deleted in the
        same commit, which fences the owner (its next commit fails its epoch
        check); whoever owns the shard next reads the new position.

        Guarded per shard by the owner key being absent or still at the epoch
        read here: an owner that appears or changes in between makes the
        commit fail (False; read again and retry), since a new owner read the
        old position and must be fenced too.
        """
        owners = await self.owners()
        now = time.time()
        checks: list[Check] = []
        ops: list[Put | Delete] = []
        for s, n in sorted(positions.items()):
            owner = owners.get(s)
            if owner is None:
                checks.append(Check.is_absent(self.keys.owner(s)))
            else:
                checks.append(Check.created_at(self.keys.owner(s), owner.epoch))
                ops.append(Delete(self.keys.owner(s)))
            ops.append(Put(self.keys.position(s), _reset_position(n, actor, now)))
        if any(isinstance(op, Delete) for op in ops):
            ops.append(self._forced(actor, now))
        return await self.coordinator.commit(checks, ops)

    async def delete_all(self) -> int | None:
        """Delete the group: its record, assignment, positions, goodbyes,
        removal records, sinks and its tables' keys (a group of several
        tables: each range's start), in one commit (so a half-deleted group cannot exist).

        Guarded on every deleted key being the one read, and on no member,
        owner or leader key existing. The number of keys deleted (0: the
        group has none), or None when the group changed meanwhile (a member
        started?) and nothing was deleted.
        """
        coord, keys = self.coordinator, self.keys
        entries = [e for e in (await coord.get(keys.meta), await coord.get(keys.assignment),
                               await coord.get(keys.start), await coord.get(keys.head),
                               await coord.get(keys.forced))
                   if e is not None]
        for directory in (keys.positions_dir, keys.leaving_dir, keys.removed_dir, keys.sinks_dir,
                          *await self._table_dirs()):
            entries += await coord.list(directory)
        live = [e for d in (keys.owners_dir, keys.members_dir) for e in await coord.list(d)]
        if not entries:
            return 0
        checks = [Check.at_version(e.key, e.version) for e in entries]
        checks.append(Check.is_absent(keys.leader))
        checks += [Check.is_absent(e.key) for e in live]
        if not await coord.commit(checks, [Delete(e.key) for e in entries]):
            return None
        return len(entries)

    async def _table_dirs(self) -> list[str]:
        """The key directories of the tables of a group of several tables
        (each range's start, docs/many-tables.md); none for a group of one."""
        try:
            meta = await self.read_meta()
        except (CorruptValue, ValueError):  # deleted all the same, its tables' keys left
            return []
        if meta is None or meta.tables is None:
            return []
        return [self.keys.table_dir(i) for i in range(len(meta.tables))]

    async def remove_member(self, member_id: str) -> Removal:
        """Force ``member_id`` out: delete its member key, its owner keys and
        (if it leads) the leader key, and record its goodbye, in one commit
        guarded by the create versions of the keys deleted.

        The goodbye (what a gracefully leaving member writes) makes a leader
        that keeps a vanished static member's shards move them at once. The
        removal record names the removed session: the leader deletes the
        goodbye as soon as it has moved the shards, and a live process that
        notices late must still learn that it was removed (it exits) rather
        than take its missing member key for an expired session (it would
        rejoin). Its epochs are gone, so its commits are fenced from then on.
        """
        validate_member_id(member_id)
        coord, keys = self.coordinator, self.keys
        member = await coord.get(keys.member(member_id))
        owned = [e for e in await coord.list(keys.owners_dir)
                 if Owner.decode(e.key, e.value).member_id == member_id]
        leader = await coord.get(keys.leader)
        leads = leader is not None and Owner.decode(leader.key, leader.value).member_id == member_id
        removing = [e for e in (member, leader if leads else None) if e is not None] + owned
        assignment, _ = await self.read_assignment()
        if not removing and (assignment is None or member_id not in assignment.shards):
            return Removal(known=False, done=False)
        ops: list[Put | Delete] = [Put(keys.leaving(member_id), b"{}")]
        if member is not None:
            session = MemberInfo.decode(member.key, member.value).session
            ops.append(Put(keys.removed(member_id),
                           RemovedMember(session=session, removed_at=time.time()).encode()))
        ops += [Delete(e.key) for e in removing]
        if owned:
            ops.append(self._forced(f"remove {member_id}", time.time()))
        done = await coord.commit([Check.created_at(e.key, e.create_version) for e in removing],
                                  ops)
        return Removal(known=True, done=done, removed_keys=tuple(sorted(e.key for e in removing)))
