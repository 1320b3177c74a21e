"""The member's writes of shard owners and positions (one family of keys:
``owners/<shard>``, ``positions/<shard>``).

* **ownership** -- an ephemeral owner key per shard, created only when absent;
  its create version is the shard's **epoch** (strictly increasing across
  owners, because create versions are);
* **progress** -- positions written only with a check that the owner key still
  carries the writer's epoch, in the same atomic commit (invariant 1). A
  position never moves backwards (invariant 2): a new owner reads the
  position *after* creating its owner key, so it sees every commit the
  previous owner made (those commits either happened before the key was
  re-created, or failed their check); that an owner's own commits never
  lower the stored position is the owner's to keep (the member's
  :class:`~paimon_group.member.state.OwnedShard`, written through
  :class:`~paimon_group.member.commits.Commits`, which leaves out, as
  ``unwritten``, a position lower than one it stored or may have stored).

A part of the member's :class:`~paimon_group.protocol.group.GroupClient`.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping

from coordinators.protocol import Check, Delete, Put
from paimon_group.errors import CoordinatorUnavailable
from paimon_group.protocol import commit_size
from paimon_group.protocol.group_reads import GroupReads
from paimon_group.protocol.records import Owner, Position

__all__ = ["OwnershipWrites"]


class OwnershipWrites(GroupReads):
    """Owner keys and positions of one group over one coordinator session."""

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
        unwritten: Collection[int] = (),
    ) -> bool:
        """Fenced commit of ``{shard: (epoch, next_snapshot)}`` in one atomic commit.

        Applied only if every shard's owner key still has the given epoch
        (invariant 1). With ``release`` the owner keys are deleted in the same
        commit (a graceful handoff: the position and the release land together,
        so the next owner always starts from the final position).

        The positions are written as given, except those of ``unwritten``:
        their epoch is checked, their position left as stored (the caller
        found it lower than one it stored: positions never move backwards,
        invariant 2, and the owner keeps that; see the module docstring).
        ``start_moves``: the moves of the group start each shard's position
        derives from.
        """
        if not updates:
            return True
        return await self._commit_positions(updates, member_id, release, full_scan,
                                            start_moves=start_moves, unwritten=unwritten)

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
        return await self._commit_positions(positions, member_id, True, None, bare,
                                            start_moves=start_moves)

    async def _commit_positions(self, updates: Mapping[int, tuple[int, int]], member_id: str,
                                release: bool, full_scan: Mapping[int, int] | None,
                                bare: Mapping[int, int] | None = None, *,
                                start_moves: Mapping[int, int] | None = None,
                                unwritten: Collection[int] = ()) -> bool:
        now = time.time()
        scans, moves = full_scan or {}, start_moves or {}
        checks: list[Check] = []
        ops: list[Put | Delete] = []
        for shard, (epoch, next_snapshot) in sorted(updates.items()):
            checks.append(Check.created_at(self.keys.owner(shard), epoch))
            if shard not in unwritten:
                pos = Position(
                    next_snapshot=next_snapshot, epoch=epoch, member_id=member_id,
                    committed_at=now, full_scan=scans.get(shard), start_moves=moves.get(shard),
                )
                ops.append(Put(self.keys.position(shard), pos.encode()))
            if release:
                ops.append(Delete(self.keys.owner(shard)))
        for shard, epoch in sorted((bare or {}).items()):
            checks.append(Check.created_at(self.keys.owner(shard), epoch))
            ops.append(Delete(self.keys.owner(shard)))
        return await self.coordinator.commit(checks, ops)
