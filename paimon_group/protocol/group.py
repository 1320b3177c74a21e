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
* **ownership** and **progress** -- an ephemeral owner key per shard whose
  create version is the shard's epoch, and positions written only with a
  check of that epoch in the same atomic commit, never moving backwards
  (invariants 1 and 2; how each holds: :mod:`paimon_group.protocol.ownership`);

Each family of keys has one writer, a module of this package:
:mod:`~paimon_group.protocol.membership` (the group record, member keys,
goodbyes, the leader key, the assignment) and
:mod:`~paimon_group.protocol.ownership` (owner keys, positions), which this
client is made of; :mod:`~paimon_group.protocol.group_start` (the start),
:mod:`~paimon_group.protocol.table_head` (the table head) and
:mod:`~paimon_group.protocol.sinks` (the sinks), which take it. The
operators' commits (reset, force, delete, remove a member) are
:class:`~paimon_group.protocol.admin.GroupAdmin`'s; the reads both clients
share are :class:`~paimon_group.protocol.group_reads.GroupReads`'.

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

import warnings
from collections.abc import Mapping

from coordinators.protocol import Coordinator
from paimon_group.protocol.admin import GroupAdmin
from paimon_group.protocol.group_views import GroupState, OwnerView, Removal
from paimon_group.protocol.membership import MembershipWrites
from paimon_group.protocol.ownership import OwnershipWrites

__all__ = ["GroupClient", "GroupState", "OwnerView", "Removal"]


def _operators(name: str) -> None:
    warnings.warn(f"GroupClient.{name} is an operator's commit: use "
                  f"paimon_group.protocol.admin.GroupAdmin.{name}",
                  DeprecationWarning, stacklevel=3)


class GroupClient(MembershipWrites, OwnershipWrites):
    """A member's group operations for one group over one coordinator session:
    its writes by family (:class:`~paimon_group.protocol.membership.MembershipWrites`,
    :class:`~paimon_group.protocol.ownership.OwnershipWrites`), its reads
    (:class:`~paimon_group.protocol.group_reads.GroupReads`)."""

    def __init__(self, coordinator: Coordinator, group: str) -> None:
        super().__init__(coordinator, group)

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
