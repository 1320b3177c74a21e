"""What a read of a group gives: its owners, its whole state, a removal.

Plain, frozen data, decoded from the coordinator's entries by
:class:`paimon_group.protocol.group.GroupClient` (which re-exports these names).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from coordinators.protocol import Entry
from paimon_group.protocol.records import Assignment, GroupMeta, MemberInfo, Owner, Position

__all__ = ["GroupState", "OwnerView", "Removal", "leader_of", "owner_view"]


@dataclass(frozen=True)
class OwnerView:
    shard: int
    member_id: str
    epoch: int
    generation: int
    session: str = ""  # the coordinator session that created the key ("" before it was stored)


def leader_of(entry: Entry | None) -> tuple[str, int] | None:
    """The leader's member id and leader epoch (the key's create version) from
    the leader key's entry; None when there is no leader."""
    if entry is None:
        return None
    return Owner.decode(entry.key, entry.value).member_id, entry.create_version


def owner_view(shard: int, entry: Entry) -> OwnerView:
    """The owner of ``shard`` from its owner key's entry (its epoch: the
    key's create version)."""
    owner = Owner.decode(entry.key, entry.value)
    return OwnerView(shard, owner.member_id, entry.create_version, owner.generation,
                     owner.session)


@dataclass(frozen=True)
class GroupState:
    """One consistent-enough read of a group, for decisions and for describe."""

    meta: GroupMeta | None
    members: dict[str, MemberInfo] = field(default_factory=dict)
    leader: str | None = None
    leader_epoch: int | None = None
    assignment: Assignment | None = None
    assignment_version: int | None = None
    owners: dict[int, OwnerView] = field(default_factory=dict)
    positions: dict[int, Position] = field(default_factory=dict)


@dataclass(frozen=True)
class Removal:
    """What :meth:`GroupClient.remove_member` did."""

    known: bool  # the member has keys, or the assignment names it (else nothing is done)
    done: bool  # the commit was accepted (False: its keys changed meanwhile; try again)
    removed_keys: tuple[str, ...] = ()
