"""The member's writes of the group record, its member key, goodbyes, the
leader key and the assignment (one family of keys:
``groups/<group>``, ``members/``, ``leaving/``, ``removed/``, ``leader``,
``assignment``).

* **group creation** -- ``create`` of the metadata key (first writer wins; the
  shard count is fixed from then on);
* **membership** -- an ephemeral member key bound to the session;
* **leadership** -- an ephemeral leader key; its create version is the
  *leader epoch*;
* **assignment** -- published only with a check that the leader key still has
  the publisher's leader epoch and that the assignment was not changed since
  it was read: a deposed leader cannot publish (its check fails).

A part of the member's :class:`~paimon_group.protocol.group.GroupClient`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping

from coordinators.protocol import Check, Delete, Entry, Put
from paimon_group.errors import CoordinatorUnavailable, MemberIdInUse, ShardCountMismatch
from paimon_group.protocol.group_reads import GroupReads
from paimon_group.protocol.identity import (
    check_group_assignor,
    check_group_warehouse,
    check_shard_bound,
    check_table_identity,
)
from paimon_group.protocol.names import validate_member_id
from paimon_group.protocol.records import (
    TABLES_FEATURE,
    Assignment,
    GroupMeta,
    MemberInfo,
    Owner,
    check_can_follow,
)
from paimon_group.protocol.table_map import TableMap

__all__ = ["MembershipWrites"]


class MembershipWrites(GroupReads):
    """The group record, membership, leadership and the assignment of one
    group over one coordinator session."""

    # -- the group record ----------------------------------------------

    async def ensure_meta(
        self, num_shards: int | None, table: str, *, sharding: str = "bucket",
        incarnation: str = "", table_id: str = "", warehouse: str = "",
        explicit: bool = True, assignor: str | None = None,
    ) -> GroupMeta:
        """The group's metadata, creating it with ``num_shards`` if the group is new.

        ``num_shards`` None means "whatever the group has" (required when new).
        A different shard count for an existing group is a ShardCountMismatch
        when it was asked for (``explicit``: ``--shards``). A count only planned
        for a new group (``explicit=False``: the table's default) yields to the
        stored one (another member may create the group meanwhile). More shards
        than the backend's ``max_shards`` is a one-line ConfigError, new or not.
        ``sharding`` (a :class:`~paimon_group.protocol.sharding.ShardRule` value),
        ``incarnation``, ``table_id`` and ``warehouse`` (normalised) are stored only
        when the group is created. A group created on another warehouse is a
        :class:`~paimon_group.errors.WarehouseMismatch`. A ``table_id`` other than the
        stored one (the table was re-created) is a :class:`~paimon_group.errors.TableReplaced`
        (a record without one, from before identities were stored, is not checked).
        ``assignor`` (None: the stored one; ``count`` for a new group) other than the
        stored one is an :class:`~paimon_group.errors.AssignorMismatch`."""
        meta = await self.read_meta()
        if meta is None:
            if num_shards is None:
                raise ShardCountMismatch(
                    f"group {self.group!r} does not exist yet: give its shard count"
                )
            check_shard_bound(self.coordinator, self.group, num_shards)
            new = GroupMeta(num_shards=num_shards, table=table, created_at=time.time(),
                            sharding=sharding, incarnation=incarnation, table_id=table_id,
                            warehouse=warehouse, assignor=assignor or "count")
            created = await self.coordinator.create(self.keys.meta, new.encode())
            if created is not None:
                return new
            meta = await self.read_meta()
            assert meta is not None  # created concurrently by another member
        check_can_follow(meta, self.group)
        check_shard_bound(self.coordinator, self.group, meta.num_shards)
        check_group_warehouse(meta, self.group, warehouse)
        if explicit and num_shards is not None and meta.num_shards != num_shards:
            raise ShardCountMismatch(
                f"group {self.group!r} has {meta.num_shards} shards stored; --shards "
                f"{num_shards} contradicts it (leave out --shards to use the stored count, "
                "use another group name, or delete the group first)"
            )
        check_group_assignor(meta, self.group, assignor)
        if meta.table != table:
            raise ShardCountMismatch(
                f"group {self.group!r} reads table {meta.table!r}, not {table!r}"
            )
        if table_id:
            check_table_identity(meta, self.group, table_id)
        return meta

    async def ensure_tables_meta(
        self, subscription: str, tables: TableMap, *, incarnation: str = "",
        warehouse: str = "", assignor: str | None = None,
    ) -> GroupMeta:
        """The record of a group of several tables (docs/many-tables.md),
        created with the map ``tables`` (the tables found, each in its range)
        if the group is new; the stored record otherwise, whose map may differ
        (its leader keeps it: :meth:`update_table_map`). ``subscription`` is
        what the group reads (its ``--table`` values), stored as the record's
        ``table``: a member of another subscription, or a group of one table,
        is refused in one line."""
        meta = await self.read_meta()
        if meta is None:
            check_shard_bound(self.coordinator, self.group, tables.total_shards)
            new = GroupMeta(num_shards=tables.total_shards, table=subscription,
                            created_at=time.time(), incarnation=incarnation,
                            warehouse=warehouse, assignor=assignor or "count",
                            features=(TABLES_FEATURE,), tables=tables)
            if await self.coordinator.create(self.keys.meta, new.encode()) is not None:
                return new
            meta = await self.read_meta()
            assert meta is not None  # created concurrently by another member
        check_can_follow(meta, self.group)
        check_group_warehouse(meta, self.group, warehouse)
        check_group_assignor(meta, self.group, assignor)
        if meta.tables is None or meta.table != subscription:
            raise ShardCountMismatch(
                f"group {self.group!r} reads {meta.table!r}, not {subscription!r}: give the "
                "same --table values as its other members, or use another group name")
        check_shard_bound(self.coordinator, self.group, meta.num_shards)
        return meta

    async def claim_creation(self) -> bool:
        """Whether this session prepares the new group (its ephemeral key
        ``creating``, the first creator's); the others wait for the record."""
        return await self.coordinator.create(self.keys.creating, b"", ephemeral=True) is not None

    async def end_creation(self) -> None:
        """The group is created (or its creation failed): the claim ends."""
        await self.coordinator.delete(self.keys.creating)

    async def update_table_map(self, before: GroupMeta, tables: TableMap,
                               leader_epoch: int) -> GroupMeta | None:
        """The record ``before`` with the map ``tables`` (tables appended or
        marked dropped), written only if the record is still ``before`` and
        ``leader_epoch`` still leads (one guarded commit: a deposed leader, or
        one that read an older record, writes nothing); None when it did not."""
        entry = await self.coordinator.get(self.keys.meta)
        if entry is None or GroupMeta.decode(entry.key, entry.value) != before:
            return None
        check_shard_bound(self.coordinator, self.group, tables.total_shards)
        new = dataclasses.replace(before, tables=tables, num_shards=tables.total_shards)
        ok = await self.coordinator.commit(
            [Check.created_at(self.keys.leader, leader_epoch),
             Check.at_version(self.keys.meta, entry.version)],
            [Put(self.keys.meta, new.encode())])
        return new if ok else None

    # -- membership -----------------------------------------------------

    async def register(self, info: MemberInfo) -> Entry | None:
        """Create our ephemeral member key; None if the id is held by a live session."""
        validate_member_id(info.member_id)
        return await self.coordinator.create(
            self.keys.member(info.member_id), info.encode(), ephemeral=True
        )

    async def register_or_fail(self, info: MemberInfo) -> Entry:
        entry = await self.register(info)
        if entry is None:
            raise MemberIdInUse(
                f"member id {info.member_id!r} is held by another live process in group "
                f"{self.group!r}; stop it or choose another --member-id"
            )
        return entry

    async def deregister(self, member_id: str, *, goodbye: bool = True) -> None:
        """Leave the member list; with ``goodbye`` also say so (a graceful leave).

        The goodbye marker tells a leader using a rebalance delay (static
        membership) to move this member's shards at once instead of keeping
        them for its return.
        """
        ops: list[Put | Delete] = [Delete(self.keys.member(member_id))]
        if goodbye:
            ops.insert(0, Put(self.keys.leaving(member_id), b"{}"))
        await self.coordinator.commit([], ops)

    async def forget_leaving(self, member_id: str) -> None:
        await self.coordinator.delete(self.keys.leaving(member_id))

    async def forget_removed(self, member_id: str) -> None:
        await self.coordinator.delete(self.keys.removed(member_id))

    # -- leadership and assignment -----------------------------------------

    async def try_lead(self, member_id: str) -> int | None:
        """Become leader if there is none; our leader epoch, or None.

        The leader record carries our session. A create whose outcome is
        unknown (it raised, but may have landed) is read back: a leader key
        created by *this session* is ours, and its create version is our
        leader epoch. Without this the key would exist, nobody would know it
        leads, and no assignment would be published until our session ended.
        """
        session = self.coordinator.session.id
        try:
            entry = await self.coordinator.create(
                self.keys.leader,
                Owner(member_id=member_id, generation=0, session=session).encode(),
                ephemeral=True,
            )
        except CoordinatorUnavailable:
            entry = None
        if entry is not None:
            return entry.create_version
        return await self.own_leader_epoch(member_id)

    async def resign(self, leader_epoch: int) -> bool:
        return await self.coordinator.commit(
            [Check.created_at(self.keys.leader, leader_epoch)], [Delete(self.keys.leader)]
        )

    async def publish(
        self,
        shards: Mapping[str, list[int]],
        *,
        leader: str,
        leader_epoch: int,
        previous: Assignment | None,
        previous_version: int | None,
        home: Mapping[str, list[int]] | None = None,
        away_since: Mapping[str, float] | None = None,
        loads: Mapping[int, int] | None = None,
    ) -> Assignment | None:
        """Publish the next generation (``loads``: by shard); None if we are no
        longer leader or lost a race."""
        generation = (previous.generation if previous else 0) + 1
        assignment = Assignment(
            generation=generation,
            leader=leader,
            leader_epoch=leader_epoch,
            shards={m: sorted(s) for m, s in sorted(shards.items())},
            published_at=time.time(),
            home={m: sorted(s) for m, s in sorted((home or {}).items())},
            away_since=dict(sorted((away_since or {}).items())),
            loads=[int(loads.get(s, 0)) for s in range(max(loads) + 1)] if loads else [],
        )
        guard = (
            Check.is_absent(self.keys.assignment)
            if previous_version is None
            else Check.at_version(self.keys.assignment, previous_version)
        )
        ok = await self.coordinator.commit(
            [Check.created_at(self.keys.leader, leader_epoch), guard],
            [Put(self.keys.assignment, assignment.encode())],
        )
        return assignment if ok else None
