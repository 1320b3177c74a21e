"""Administrative operations on groups: list, delete, remove a member (reset:
:mod:`paimon_group.ops.reset`).

Every change is one guarded, atomic commit of the group protocol
(:class:`~paimon_group.protocol.admin.GroupAdmin`), or a short retry loop of them, so
an administrator can never corrupt what live members do:

``delete``
    Removes every key of the group in one commit
    (:meth:`~paimon_group.protocol.admin.GroupAdmin.delete_all`), refused while any
    member, owner or leader key exists; then deletes the group's Paimon
    consumer files (orphaned ones would keep snapshots from expiring forever).
``remove_member``
    Deletes a member's member key, its owner keys and (if it leads) the
    leader key, and records its goodbye (so a rebalance delay does not keep
    its shards waiting), in one commit guarded by the create versions
    (:meth:`~paimon_group.protocol.admin.GroupAdmin.remove_member`). Safe even if the
    process is alive: its commits are fenced by the deleted epochs, and the
    leader reassigns its shards when the member list changes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from coordinators.errors import ConfigError, CorruptValue
from coordinators.protocol import Coordinator
from paimon_group.errors import GroupBusy
from paimon_group.ops.report import GroupNotFound, GroupReport, report_from_state
from paimon_group.ops.reset import FORCE_ATTEMPTS, admin_mirror, check_table
from paimon_group.protocol.admin import GroupAdmin
from paimon_group.protocol.group_reads import GroupReads
from paimon_group.protocol.names import GroupKeys, validate_group, validate_member_id
from paimon_group.protocol.records import GroupMeta
from paimon_group.reading.table import ShardedTable

log = logging.getLogger("paimon_group.admin")


class MemberNotFound(ConfigError):
    """The member id is not known to the group (no key, no shard, no assignment)."""


# -- list ------------------------------------------------------------------


@dataclass(frozen=True)
class GroupSummary:
    """One row of ``paimon-group list`` (field names are the JSON keys)."""

    group: str
    table: str
    num_shards: int
    members: int
    state: str
    generation: int
    total_lag_snapshots: int | None  # unknown without the table, or before any position
    max_lag_seconds: float | None
    max_lag_snapshots: int | None = None  # the slowest shard; None as total_lag_snapshots
    total_unread_rows: int | None = None  # rows behind, where the manifests give them

    @staticmethod
    def of(meta: GroupMeta, report: GroupReport, members: int, has_table: bool) -> GroupSummary:
        known = has_table and any(s.lag_snapshots is not None for s in report.shards)
        return GroupSummary(
            group=report.group, table=meta.table, num_shards=meta.num_shards, members=members,
            state=report.state, generation=report.generation,
            total_lag_snapshots=report.total_lag_snapshots if known else None,
            max_lag_seconds=report.max_lag_seconds,
            max_lag_snapshots=report.max_lag_snapshots if known else None,
            total_unread_rows=report.total_unread_rows if known else None,
        )

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


async def list_groups(
    coordinator: Coordinator,
    open_table: Callable[[str], ShardedTable | None] | None = None,
    *,
    warehouse: str = "",
) -> list[GroupSummary]:
    """Every group of the coordinator with its member count, state and lag (the
    slowest shard's, as ``list`` shows it; the sum over shards as well).

    ``open_table(identifier)`` gives the table a group reads (or None when it
    cannot be opened: the lag is then null). Tables are opened once each. A
    group created on another warehouse than ``warehouse`` (normalised; a
    shared coordinator) gets no table: a same-named table here is not its own.
    """
    tables: dict[str, ShardedTable | None] = {}
    out: list[GroupSummary] = []
    for entry in await coordinator.list(GroupKeys.all_groups()):
        name = GroupKeys.last_segment(entry.key)
        try:
            validate_group(name)
            meta = GroupMeta.decode(entry.key, entry.value)
        except (ConfigError, CorruptValue) as err:
            log.warning("skipping %s: %s", entry.key, err)
            continue
        state = await GroupReads(coordinator, name).state()
        elsewhere = bool(warehouse and meta.warehouse and meta.warehouse != warehouse)
        # A group of several tables: each live table of its map.
        names = {-1: meta.table} if meta.tables is None else {
            i: t.name for i, t in enumerate(meta.tables.ranges) if t.live}
        found: dict[int, ShardedTable] = {}
        for index, identifier in names.items():
            if open_table is None or elsewhere:
                break
            if identifier not in tables:
                tables[identifier] = await _open_quietly(open_table, name, identifier)
            opened = tables[identifier]
            if opened is not None:
                found[index] = opened
        report = await report_from_state(name, state, found.get(-1), count_rows=False,
                                         tables=None if meta.tables is None else found)
        out.append(GroupSummary.of(meta, report, len(state.members), bool(found)))
    return out


async def _open_quietly(open_table: Callable[[str], ShardedTable | None], group: str,
                        identifier: str) -> ShardedTable | None:
    try:
        return await asyncio.to_thread(open_table, identifier)
    except Exception as err:  # lag is optional in a listing
        log.warning("group %s: table %s not opened: %s", group, identifier, err)
        return None


# -- delete ----------------------------------------------------------------


@dataclass(frozen=True)
class DeletedGroup:
    """What ``delete`` did (field names are the JSON keys)."""

    group: str
    deleted_keys: int
    deleted_consumer_files: int

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


async def delete_group(client: GroupAdmin, table: ShardedTable | None, *,
                       orphaned_files: bool = False,
                       tables: Sequence[ShardedTable] | None = None) -> DeletedGroup:
    """Delete every coordinator key of the group, then its consumer files
    (a group of several tables: in each of ``tables``, its map's live tables,
    given instead of ``table``).

    Refused (:class:`GroupBusy`) while any member, owner or leader key exists.
    A group this coordinator does not know keeps its consumer files unless
    ``orphaned_files`` says to delete them: they may be left by a delete that
    failed half way or a wiped coordinator, but they may as well be the files
    of a live group whose coordinator is another one (a wrong or forgotten
    ``--coordinator``), and deleting those would let the snapshots that group
    still has to read expire.
    """
    state = await client.state()
    if tables is None:
        check_table(state, table, client.group)
    if state.members or state.owners or state.leader is not None:
        live = sorted(set(state.members) | {o.member_id for o in state.owners.values()})
        raise GroupBusy(
            f"group {client.group!r} has live members ({', '.join(live) or state.leader}): "
            "stop them before deleting it"
        )
    deleted = await client.delete_all()
    if deleted is None:
        raise GroupBusy(
            f"group {client.group!r} changed while it was being deleted (a member "
            "started?); nothing was deleted"
        )
    files = 0
    mirrors = [admin_mirror(t, client.group)
               for t in (tables if tables is not None else [table] if table else [])]
    if mirrors:
        if not deleted and not orphaned_files:
            found = sum([len(await asyncio.to_thread(m.all)) for m in mirrors])
            raise GroupNotFound(
                f"group {client.group!r} does not exist in this coordinator" + (
                    f"; the table has {found} consumer files of a group of that name (left "
                    "by a delete that failed half way or a wiped coordinator, or the files "
                    "of a group in another coordinator: check --coordinator); add "
                    "--orphaned-files to delete them" if found else
                    " and has no consumer files in the table"))
        files = sum([await asyncio.to_thread(m.delete_all) for m in mirrors])
    if not deleted and not files:
        raise GroupNotFound(
            f"group {client.group!r} does not exist in this coordinator and has no consumer "
            "files in the table"
        )
    log.info("deleted group %s: %d keys, %d consumer files", client.group, deleted, files,
             extra={"group": client.group})
    return DeletedGroup(client.group, deleted, files)


# -- members remove -------------------------------------------------------------


@dataclass(frozen=True)
class MemberRemoved:
    """What ``members remove`` did (field names are the JSON keys)."""

    group: str
    member_id: str
    removed_keys: list[str]
    note: str  # why nothing was removed, when nothing was

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


async def remove_member(client: GroupAdmin, member_id: str) -> MemberRemoved:
    """Force ``member_id`` out of the group (see the module docstring).

    Besides deleting its keys, the same commit records a goodbye for it
    (``groups/<group>/leaving/<id>``, what a gracefully leaving member writes),
    so a leader that keeps a vanished static member's shards for
    ``--rebalance-delay-s`` moves them at once. That is also all there is to do
    for a member that has no session any more but is still waited for.
    """
    validate_member_id(member_id)
    for _attempt in range(FORCE_ATTEMPTS):
        removal = await client.remove_member(member_id)
        if not removal.known:
            if await client.read_meta() is None:
                raise GroupNotFound(f"group {client.group!r} does not exist in this coordinator")
            raise MemberNotFound(f"member {member_id!r} is not in group {client.group!r}")
        if removal.done:
            removed = list(removal.removed_keys)
            log.info("removed member %s from group %s: %s", member_id, client.group, removed,
                     extra={"group": client.group, "member": member_id})
            note = "" if removed else (
                "no live session and no shard held; its goodbye is recorded, so the leader "
                "moves its shards now instead of waiting for it")
            return MemberRemoved(client.group, member_id, removed, note)
        await asyncio.sleep(0.05)
    raise GroupBusy(f"group {client.group!r}: member {member_id!r} kept changing; try again")
