"""The member's side of the group protocol, over the coordinator protocol.

:class:`GroupClient` takes a connected :class:`~coordinators.protocol.Coordinator`
(never a backend) and speaks the group's key layout
(:class:`~paimon_group.protocol.names.GroupKeys`). Every write that matters is one
guarded commit:

* **group creation** -- ``create`` of the metadata key (first writer wins; the
  shard count is fixed from then on);
* **membership** -- an ephemeral member key bound to the session;
* **leadership** -- an ephemeral leader key; its create version is the
  *leader epoch*;
* **assignment** -- published only with a check that the leader key still has
  the publisher's leader epoch and that the assignment was not changed since
  it was read: a deposed leader cannot publish (its check fails);
* **ownership** -- an ephemeral owner key per shard, created only when absent;
  its create version is the shard's **epoch** (strictly increasing across
  owners, because create versions are);
* **progress** -- positions written only with a check that the owner key still
  carries the writer's epoch, in the same atomic commit (invariant 1). A
  position never moves backwards (invariant 2): a new owner reads the
  position *after* creating its owner key, so it sees every commit the
  previous owner made (those commits either happened before the key was
  re-created, or failed their check), and an owner's own commits never
  lower the stored position either: :meth:`GroupClient.commit_positions`
  leaves out the write of a position lower than one this client already
  committed, or may have committed (a commit that raised), under the same
  epoch (see there).

The operators' commits (reset, force, delete, remove a member) are
:class:`~paimon_group.protocol.admin.GroupAdmin`'s; the reads both share are
:class:`~paimon_group.protocol.group_reads.GroupReads`'.

Example (in-memory backend)::

    import asyncio
    from coordinators import open_coordinator
    from paimon_group.protocol.group import GroupClient

    async def main() -> None:
        async with open_coordinator("memory://group-doc") as coord:
            group = GroupClient(coord, "orders")
            await group.ensure_meta(num_shards=4, table="db.orders")
            epoch = await group.acquire(0, "m1", generation=1)
            assert epoch is not None
            assert await group.commit_positions({0: (epoch, 5)}, "m1")

    asyncio.run(main())
"""

from __future__ import annotations

import asyncio
import time
import warnings
from collections.abc import Mapping

from coordinators.protocol import Check, Coordinator, Delete, Entry, Put
from paimon_group.errors import CoordinatorUnavailable, MemberIdInUse, ShardCountMismatch
from paimon_group.protocol import commit_size
from paimon_group.protocol.admin import GroupAdmin
from paimon_group.protocol.group_reads import GroupReads
from paimon_group.protocol.group_views import GroupState, OwnerView, Removal
from paimon_group.protocol.identity import (
    check_group_assignor,
    check_group_warehouse,
    check_shard_bound,
    check_table_identity,
)
from paimon_group.protocol.names import validate_member_id
from paimon_group.protocol.position_marks import PositionMarks
from paimon_group.protocol.records import (
    Assignment,
    GroupMeta,
    MemberInfo,
    Owner,
    Position,
    check_can_follow,
    position_order,
)

__all__ = ["GroupClient", "GroupState", "OwnerView", "Removal"]


def _operators(name: str) -> None:
    warnings.warn(f"GroupClient.{name} is an operator's commit: use "
                  f"paimon_group.protocol.admin.GroupAdmin.{name}",
                  DeprecationWarning, stacklevel=3)


class GroupClient(GroupReads):
    """A member's group operations for one group over one coordinator session
    (its reads: :class:`~paimon_group.protocol.group_reads.GroupReads`)."""

    def __init__(self, coordinator: Coordinator, group: str) -> None:
        super().__init__(coordinator, group)
        self._marks = PositionMarks()  # what our commits of positions may have left
        # One position commit at a time: deciding that a position does not
        # lower the stored one (which may read it back) and sending it must
        # not interleave with another commit of this client, or a release
        # decided before a step's commit landed writes its older position
        # over it (a step commits 9, then the release writes its 6).
        self._commit_lock = asyncio.Lock()

    # -- metadata -------------------------------------------------------

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

    # -- ownership -----------------------------------------------------

    async def acquire(self, shard: int, member_id: str, generation: int) -> int | None:
        """Create the owner key of ``shard``; the new epoch, or None if owned by another.

        If the create's outcome is unknown (the coordinator timed out, the
        write may have landed), or the key exists, the key is read back: a
        key created by *this session* is ours and its epoch is returned.
        Without this, a lost acknowledgement would leave the shard held by a
        key nobody knows it owns, until the session ends.
        """
        session = self.coordinator.session.id
        key = self.keys.owner(shard)
        try:
            entry = await self.coordinator.create(
                key,
                Owner(member_id=member_id, generation=generation, session=session).encode(),
                ephemeral=True,
            )
        except CoordinatorUnavailable:
            entry = None
        if entry is not None:
            return entry.create_version
        existing = await self.coordinator.get(key)
        if existing is not None and Owner.decode(key, existing.value).session == session:
            return existing.create_version
        return None

    async def release(self, shard: int, epoch: int) -> bool:
        """Delete our owner key, only if it is still ours (same epoch).

        A release whose outcome is unknown (the coordinator timed out) is read
        back and tried again: a key left behind would hold the shard, owned
        by nobody who knows it, until our session ends.
        """
        key = self.keys.owner(shard)
        for _ in range(3):
            try:
                return await self.coordinator.commit(
                    [Check.created_at(key, epoch)], [Delete(key)])
            except CoordinatorUnavailable:
                entry = await self.coordinator.get(key)
                if entry is None or entry.create_version != epoch:
                    return True  # it landed (or the key is no longer ours)
        return await self.coordinator.commit([Check.created_at(key, epoch)], [Delete(key)])

    # -- progress ------------------------------------------------------

    async def commit_positions(
        self,
        updates: Mapping[int, tuple[int, int]],
        member_id: str,
        *,
        release: bool = False,
        full_scan: Mapping[int, int] | None = None,
        start_moves: Mapping[int, int] | None = None,
    ) -> bool:
        """Fenced commit of ``{shard: (epoch, next_snapshot)}`` in one atomic commit.

        Applied only if every shard's owner key still has the given epoch
        (invariant 1). With ``release`` the owner keys are deleted in the same
        commit (a graceful handoff: the position and the release land together,
        so the next owner always starts from the final position).

        Positions never move backwards (invariant 2). A shard's position lower
        (in :func:`~paimon_group.protocol.records.position_order`) than one this client
        committed under the same epoch, or read back, is **not written**: the
        rest of the commit (the epoch check, the release) still applies, and
        the result is True. It is a no-op rather than a rejection because a
        rejection means "stale epoch" to the caller, which would drop a shard
        it still owns. A position lower than one of our commits that *raised*
        (it may have landed) is first compared with the stored one, read back.
        This client's position commits run one at a time. ``start_moves``:
        the moves of the group start each shard's position derives from.
        """
        if not updates:
            return True
        async with self._commit_lock:
            return await self._commit_positions(updates, member_id, release, full_scan,
                                                start_moves=start_moves)

    async def release_many(self, positions: Mapping[int, tuple[int, int]],
                           bare: Mapping[int, int], member_id: str,
                           start_moves: Mapping[int, int] | None = None) -> bool:
        """Release several shards in one fenced commit: ``positions``
        (``{shard: (epoch, next_snapshot)}``) with their last position, as
        :meth:`commit_positions` with ``release``; ``bare`` (``{shard: epoch}``)
        without one. True if every owner key still had its epoch and all were
        deleted; False if one had not, and then nothing was written.
        At most :data:`~paimon_group.protocol.commit_size.SHARDS_PER_COMMIT` shards."""
        if len(positions) + len(bare) > commit_size.SHARDS_PER_COMMIT:
            raise ValueError(f"at most {commit_size.SHARDS_PER_COMMIT} shards in one commit")
        async with self._commit_lock:
            return await self._commit_positions(positions, member_id, True, None, bare,
                                                start_moves=start_moves)

    async def _commit_positions(self, updates: Mapping[int, tuple[int, int]], member_id: str,
                                release: bool, full_scan: Mapping[int, int] | None,
                                bare: Mapping[int, int] | None = None, *,
                                start_moves: Mapping[int, int] | None = None) -> bool:
        now = time.time()
        scans, moves = full_scan or {}, start_moves or {}
        checks: list[Check] = []
        ops: list[Put | Delete] = []
        written: dict[int, tuple[int, tuple[int, ...]]] = {}
        for shard, (epoch, next_snapshot) in sorted(updates.items()):
            checks.append(Check.created_at(self.keys.owner(shard), epoch))
            order = position_order(next_snapshot, scans.get(shard), moves.get(shard, 0))
            if not await self._lowers(shard, epoch, order):
                pos = Position(
                    next_snapshot=next_snapshot, epoch=epoch, member_id=member_id,
                    committed_at=now, full_scan=scans.get(shard), start_moves=moves.get(shard),
                )
                ops.append(Put(self.keys.position(shard), pos.encode()))
                written[shard] = (epoch, order)
            if release:
                ops.append(Delete(self.keys.owner(shard)))
        for shard, epoch in sorted((bare or {}).items()):
            checks.append(Check.created_at(self.keys.owner(shard), epoch))
            ops.append(Delete(self.keys.owner(shard)))
        try:
            ok = await self.coordinator.commit(checks, ops)
        except BaseException:
            for shard, mark in written.items():
                self._marks.raise_unsure(shard, mark)
            raise
        if ok:
            for shard, mark in written.items():
                self._marks.raise_floor(shard, mark)
        return ok

    async def _lowers(self, shard: int, epoch: int, order: tuple[int, ...]) -> bool:
        """Whether writing ``order`` under ``epoch`` would lower the stored position."""
        known = self._marks.lowers(shard, epoch, order)
        if known is not None:
            return known
        # A commit of ours that raised may have landed above ``order``: read
        # the stored position back (rare; the common path reads nothing). A
        # commit still in flight on the server lands before anything we send
        # later on the same session (ZooKeeper orders a session's requests),
        # so a later landing of it only moves the position forwards.
        stored, _ = await self.position(shard)
        return self._marks.read_back(shard, epoch, order,
                                     None if stored is None else stored.order)

    # -- operators' commits: GroupAdmin's (kept for existing callers) -------

    async def reset_positions(self, positions: Mapping[int, int], actor: str) -> bool:
        """The operators' :meth:`~paimon_group.protocol.admin.GroupAdmin.reset_positions`."""
        _operators("reset_positions")
        return await GroupAdmin(self.coordinator, self.group).reset_positions(positions, actor)

    async def force_positions(self, positions: Mapping[int, int], actor: str) -> bool:
        """The operators' :meth:`~paimon_group.protocol.admin.GroupAdmin.force_positions`."""
        _operators("force_positions")
        return await GroupAdmin(self.coordinator, self.group).force_positions(positions, actor)

    async def delete_all(self) -> int | None:
        """The operators' :meth:`~paimon_group.protocol.admin.GroupAdmin.delete_all`."""
        _operators("delete_all")
        return await GroupAdmin(self.coordinator, self.group).delete_all()

    async def remove_member(self, member_id: str) -> Removal:
        """The operators' :meth:`~paimon_group.protocol.admin.GroupAdmin.remove_member`."""
        _operators("remove_member")
        return await GroupAdmin(self.coordinator, self.group).remove_member(member_id)
