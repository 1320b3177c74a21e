"""Administrative operations on groups: list, reset positions, delete, remove a member.

Every change is one guarded, atomic coordinator commit (or a short retry
loop of them), so an administrator can never corrupt what live members do:

``reset``
    Without ``force`` the new positions are written only where no owner key
    exists (:meth:`GroupClient.reset_positions`, guarded on absent owner
    keys), and only when the group has no live member. With ``force`` each
    shard's owner key is **deleted in the same commit** that writes its
    position, guarded by the owner's epoch as read: the owner is fenced (its
    next commit fails its epoch check), and whoever owns the shard next
    creates a new owner key and then reads the position, so it reads the
    reset one (invariants 1 and 2: a reset is the one explicit backwards
    move). The price: a live owner may still deliver the batch it was
    working on from its old position (its commit is then rejected), and it
    only notices the reset at that commit.
``delete``
    Removes every key of the group in one commit, refused while any member,
    owner or leader key exists; then deletes the group's Paimon consumer
    files (orphaned ones would keep snapshots from expiring forever).
``remove_member``
    Deletes a member's member key, its owner keys and (if it leads) the
    leader key, and records its goodbye (so a rebalance delay does not keep
    its shards waiting), in one commit guarded by the create versions. Safe
    even if the process is alive: its commits are fenced by the deleted
    epochs, and the leader reassigns its shards when the member list changes.

Paimon consumer files move with the positions (invariant 5: a file never runs
ahead of the coordinator): a file whose new value is not above the shard's
current coordinator position (a rewind) is written *before* the coordinator
commit (a lower file only keeps more snapshots, and it protects the snapshots
we rewind to from expiring between the two writes; the earliest snapshot is
checked again after it is written); any other file is written *after* the
commit. If the commit fails, the files written before it are put back.

Example::

    async with open_coordinator(url) as coord:
        client = GroupClient(coord, "orders")
        plan = await plan_reset(client, table, ResetTarget.to_snapshot(42))
        plan = await execute_reset(client, table, plan)
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from coordinators.base import Check, Coordinator, Delete, Entry, Put
from coordinators.errors import ConfigError, CorruptValue
from paimon_group.describe import GroupNotFound, report_from_state
from paimon_group.errors import GroupBusy
from paimon_group.group import GroupClient, GroupState
from paimon_group.mirror import ConsumerMirror
from paimon_group.names import GroupKeys, consumer_id, validate_group, validate_member_id
from paimon_group.records import GroupMeta, MemberInfo, Owner, Position, RemovedMember
from paimon_group.start import parse_start
from paimon_group.table import ShardedTable

log = logging.getLogger("paimon_group.admin")

FORCE_ATTEMPTS = 10
"""Forced commits retried this often when owners change under them."""


class MemberNotFound(ConfigError):
    """The member id is not known to the group (no key, no shard, no assignment)."""


def admin_actor() -> str:
    """Who wrote a reset position (recorded as the position's ``member_id``)."""
    return f"admin@{socket.gethostname()}"


# -- list ------------------------------------------------------------------


async def list_groups(
    coordinator: Coordinator,
    open_table: Callable[[str], ShardedTable | None] | None = None,
) -> list[dict[str, Any]]:
    """Every group of the coordinator with its member count, state and total lag.

    ``open_table(identifier)`` gives the table a group reads (or None when it
    cannot be opened: the lag is then null). Tables are opened once each.
    """
    tables: dict[str, ShardedTable | None] = {}
    out: list[dict[str, Any]] = []
    for entry in await coordinator.list(GroupKeys.all_groups()):
        name = GroupKeys.last_segment(entry.key)
        try:
            validate_group(name)
            meta = GroupMeta.decode(entry.key, entry.value)
        except (ConfigError, CorruptValue) as err:
            log.warning("skipping %s: %s", entry.key, err)
            continue
        state = await GroupClient(coordinator, name).state()
        table: ShardedTable | None = None
        if open_table is not None:
            if meta.table not in tables:
                try:
                    tables[meta.table] = await asyncio.to_thread(open_table, meta.table)
                except Exception as err:  # lag is optional in a listing
                    log.warning("group %s: table %s not opened: %s", name, meta.table, err)
                    tables[meta.table] = None
            table = tables[meta.table]
        report = await report_from_state(name, state, table, count_rows=False)
        out.append(
            {
                "group": name,
                "table": meta.table,
                "num_shards": meta.num_shards,
                "members": len(state.members),
                "state": report["state"],
                "generation": report["generation"],
                # Unknown (None) without the table, or when no shard has a position yet.
                "total_lag_snapshots": (
                    report["total_lag_snapshots"]
                    if table and any(x["lag_snapshots"] is not None for x in report["shards"])
                    else None
                ),
                "max_lag_seconds": report["max_lag_seconds"],
            }
        )
    return out


# -- reset -----------------------------------------------------------------


@dataclass(frozen=True)
class ResetTarget:
    """Where ``reset`` moves positions to.

    ``kind`` is ``earliest`` (the earliest retained snapshot: its changes and
    every later one are delivered again; this is not a full scan), ``latest``
    (after the latest snapshot: skip everything unread), ``snapshot``
    (``value`` = the next snapshot to read), ``timestamp`` (``text`` = the
    ISO-8601 time; the first snapshot committed at or after it) or ``shift``
    (``value`` added to each shard's position, clamped to the retained range).
    """

    kind: str
    value: int = 0
    text: str = ""

    def __str__(self) -> str:
        if self.kind == "snapshot":
            return f"to snapshot {self.value}"
        if self.kind == "timestamp":
            return f"to timestamp {self.text}"
        if self.kind == "shift":
            return f"shift by {self.value:+d}"
        return f"to {self.kind}"

    @staticmethod
    def from_options(
        *,
        to_earliest: bool = False,
        to_latest: bool = False,
        to_snapshot: int | None = None,
        to_timestamp: str | None = None,
        shift_by: int | None = None,
    ) -> ResetTarget:
        """Exactly one of the options, or a one-line ConfigError."""
        chosen: list[ResetTarget] = []
        if to_earliest:
            chosen.append(ResetTarget("earliest"))
        if to_latest:
            chosen.append(ResetTarget("latest"))
        if to_snapshot is not None:
            if to_snapshot < 1:
                raise ConfigError(f"--to-snapshot {to_snapshot}: snapshot ids start at 1")
            chosen.append(ResetTarget("snapshot", to_snapshot))
        if to_timestamp is not None:
            start = parse_start(f"timestamp:{to_timestamp}")
            assert start.timestamp_ms is not None
            chosen.append(ResetTarget("timestamp", start.timestamp_ms, to_timestamp))
        if shift_by is not None:
            chosen.append(ResetTarget("shift", shift_by))
        if len(chosen) != 1:
            raise ConfigError(
                "give exactly one of --to-earliest, --to-latest, --to-snapshot N, "
                "--to-timestamp ISO-8601, --shift-by N"
            )
        return chosen[0]


@dataclass(frozen=True)
class ShardReset:
    shard: int
    current: int | None
    new: int | None
    owner: str | None = None
    epoch: int | None = None
    note: str = ""

    @property
    def changes(self) -> bool:
        return self.new is not None and self.new != self.current


@dataclass(frozen=True)
class ResetPlan:
    """What a reset does, shard by shard; nothing changes until it is executed."""

    group: str
    target: str
    shards: list[ShardReset] = field(default_factory=list)
    live_members: list[str] = field(default_factory=list)
    latest_snapshot: int | None = None
    earliest_snapshot: int | None = None
    executed: bool = False
    forced: bool = False

    @property
    def changing(self) -> list[ShardReset]:
        return [s for s in self.shards if s.changes]

    def to_dict(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "target": self.target,
            "latest_snapshot": self.latest_snapshot,
            "earliest_snapshot": self.earliest_snapshot,
            "live_members": list(self.live_members),
            "executed": self.executed,
            "forced": self.forced,
            "shards": [
                {"shard": s.shard, "owner": s.owner, "epoch": s.epoch, "current": s.current,
                 "new": s.new, "note": s.note}
                for s in self.shards
            ],
        }


def _resolve(
    table: ShardedTable, target: ResetTarget, current: int | None
) -> tuple[int | None, str]:
    """The new position of one shard and a note (blocking: reads the table)."""
    latest = table.latest_snapshot_id()
    earliest = table.earliest_snapshot_id()
    low = earliest if earliest is not None else 1
    high = (latest or 0) + 1  # "after the latest": nothing unread
    if target.kind == "earliest":
        return low, ""
    if target.kind == "latest":
        return high, ""
    if target.kind == "snapshot":
        n = target.value
        if n > high:
            raise ConfigError(
                f"--to-snapshot {n}: the table's latest snapshot is {latest}; a position can "
                f"be at most {high} (nothing unread)"
            )
        if n < low:
            raise table.expired_error(n)
        return n, ""
    if target.kind == "timestamp":
        return table.resolve_start(parse_start(f"timestamp:{target.value}")).next_snapshot, ""
    if target.kind == "shift":
        if current is None:
            return None, "no position yet: unchanged"
        wanted = current + target.value
        clamped = min(max(wanted, low), high)
        return clamped, "" if clamped == wanted else f"clamped to {low}..{high}"
    raise ConfigError(f"unknown reset target {target.kind!r}")


async def plan_reset(
    client: GroupClient,
    table: ShardedTable,
    target: ResetTarget,
    shards: Iterable[int] | None = None,
) -> ResetPlan:
    """The plan of a reset (changes nothing). ``shards`` None means all shards."""
    state = await client.state()
    if state.meta is None:
        raise GroupNotFound(f"group {client.group!r} does not exist in this coordinator")
    _check_table(state, table, client.group)
    num_shards = state.meta.num_shards
    chosen = sorted(set(range(num_shards) if shards is None else shards))
    bad = [s for s in chosen if not 0 <= s < num_shards]
    if bad:
        raise ConfigError(
            f"--shard {bad[0]}: group {client.group!r} has shards 0..{num_shards - 1}"
        )

    def resolve_all() -> tuple[list[ShardReset], int | None, int | None]:
        rows: list[ShardReset] = []
        for s in chosen:
            pos = state.positions.get(s)
            current = pos.next_snapshot if pos else None
            new, note = _resolve(table, target, current)
            if new is not None and new == current and not note:
                note = "unchanged"
            owner = state.owners.get(s)
            rows.append(ShardReset(s, current, new, owner.member_id if owner else None,
                                   owner.epoch if owner else None, note))
        return rows, table.latest_snapshot_id(), table.earliest_snapshot_id()

    rows, latest, earliest = await asyncio.to_thread(resolve_all)
    return ResetPlan(
        group=client.group,
        target=str(target),
        shards=rows,
        live_members=sorted(state.members),
        latest_snapshot=latest,
        earliest_snapshot=earliest,
    )


def _check_table(state: GroupState, table: ShardedTable | None, group: str) -> None:
    if state.meta is not None and table is not None and state.meta.table != table.identifier:
        raise ConfigError(
            f"group {group!r} reads table {state.meta.table!r}, not {table.identifier!r}: "
            "check --table"
        )


def _mirror(table: ShardedTable, group: str) -> ConsumerMirror:
    # interval 0: every write goes through (nothing is throttled here).
    return ConsumerMirror(table.table.file_io, table.table_path, group, interval_s=0.0)


async def execute_reset(
    client: GroupClient,
    table: ShardedTable,
    plan: ResetPlan,
    *,
    force: bool = False,
    actor: str | None = None,
) -> ResetPlan:
    """Apply ``plan``: coordinator positions and consumer files, together.

    Refused with :class:`GroupBusy` while the group has live members or owned
    shards, unless ``force`` (see the module docstring for what it costs).
    """
    actor = actor or admin_actor()
    mirror = _mirror(table, client.group)
    files_before: dict[int, int] = await asyncio.to_thread(mirror.all)
    new_positions = {s.shard: s.new for s in plan.changing if s.new is not None}
    # Every planned shard's file ends equal to its (new or unchanged) position.
    targets = {s.shard: s.new for s in plan.shards if s.new is not None}
    file_updates = {s: n for s, n in targets.items() if files_before.get(s) != n}
    if not new_positions and not file_updates:
        return replace(plan, executed=True, forced=force)
    state = await client.state()
    if state.members and not force:
        raise GroupBusy(
            f"group {client.group!r} has {len(state.members)} live member(s) "
            f"({', '.join(sorted(state.members))}): stop them first (or wait for their "
            "sessions to expire); --force resets under live members and is dangerous"
        )
    held = sorted(s for s in new_positions if s in state.owners)
    if held and not force:
        raise GroupBusy(
            f"group {client.group!r}: shards {held} are owned by a live session; nothing was "
            "reset (stop the members, or use --force, which is dangerous)"
        )
    current = {s.shard: s.current for s in plan.shards}
    # Files that are not ahead of the coordinator's current position go first:
    # a file moving backwards then protects the snapshots we rewind to from
    # expiring while the coordinator is written. The others go after the
    # coordinator commit, so that no file is ever ahead of it (invariant 5).
    before = {s: n for s, n in file_updates.items()
              if current.get(s) is not None and n <= (current[s] or 0)}
    after = {s: n for s, n in file_updates.items() if s not in before}

    def write_files(values: dict[int, int]) -> None:
        for s, n in sorted(values.items()):
            mirror.write(s, n, force=True)

    await asyncio.to_thread(write_files, before)
    try:
        lowest = min((n for s, n in before.items() if s in new_positions), default=None)
        if lowest is not None:
            earliest = await asyncio.to_thread(table.earliest_snapshot_id)
            latest = await asyncio.to_thread(table.latest_snapshot_id)
            if earliest is not None and lowest < earliest and lowest <= (latest or 0):
                raise table.expired_error(lowest)
        if not new_positions:
            pass
        elif force:
            await _force_positions(client, new_positions, actor)
        elif not await client.reset_positions(new_positions, actor):
            owners = await client.owners()
            owned = sorted(s for s in new_positions if s in owners)
            raise GroupBusy(
                f"group {client.group!r}: shards {owned} are owned by a live session; nothing "
                "was reset (stop the members, or use --force, which is dangerous)"
            )
    except BaseException:
        # Put back the files we moved: they must not stay behind positions we
        # did not write (harmless, it only keeps more snapshots, but untidy).
        restore = {s: files_before[s] for s in before if s in files_before}
        try:
            await asyncio.to_thread(write_files, restore)
            missing = [s for s in before if s not in files_before]
            await asyncio.to_thread(_delete_consumer_files, table, client.group, missing)
        except Exception as err:
            log.warning("consumer files not restored after a failed reset: %s", err)
        raise
    await asyncio.to_thread(write_files, after)
    log.info("reset group %s (%s): %s", client.group, plan.target, new_positions,
             extra={"group": client.group})
    return replace(plan, executed=True, forced=force)


def _delete_consumer_files(table: ShardedTable, group: str, shards: Iterable[int]) -> None:
    from pypaimon.consumer.consumer_manager import ConsumerManager

    manager = ConsumerManager(table.table.file_io, table.table_path)
    for shard in shards:
        manager.delete_consumer(consumer_id(group, shard))


async def _force_positions(client: GroupClient, positions: dict[int, int], actor: str) -> None:
    """Write positions under live owners: delete each owner key in the same commit.

    Guarded per shard by the owner key being absent or still at the epoch we
    read, so an owner that appears or changes in between makes the commit
    fail and we re-read (a new owner read the old position; it must be fenced
    too).
    """
    keys = client.keys
    for _attempt in range(FORCE_ATTEMPTS):
        owners = await client.owners()
        now = time.time()
        checks: list[Check] = []
        ops: list[Put | Delete] = []
        for s, n in sorted(positions.items()):
            owner = owners.get(s)
            if owner is None:
                checks.append(Check.is_absent(keys.owner(s)))
            else:
                checks.append(Check.created_at(keys.owner(s), owner.epoch))
                ops.append(Delete(keys.owner(s)))
            ops.append(Put(keys.position(s), Position(
                next_snapshot=n, epoch=0, member_id=actor, committed_at=now).encode()))
        if await client.coordinator.commit(checks, ops):
            return
        await asyncio.sleep(0.05)
    raise GroupBusy(
        f"group {client.group!r}: owners kept changing during {FORCE_ATTEMPTS} forced reset "
        "attempts; nothing was reset, try again"
    )


# -- delete ----------------------------------------------------------------


async def delete_group(
    client: GroupClient, table: ShardedTable | None
) -> dict[str, Any]:
    """Delete every coordinator key of the group, then its consumer files.

    Refused (:class:`GroupBusy`) while any member, owner or leader key exists.
    A group with no coordinator state but leftover consumer files (a crashed
    delete, or a coordinator that was wiped) has its files deleted.
    """
    coord = client.coordinator
    keys = client.keys
    state = await client.state()
    _check_table(state, table, client.group)
    if state.members or state.owners or state.leader is not None:
        live = sorted(set(state.members) | {o.member_id for o in state.owners.values()})
        raise GroupBusy(
            f"group {client.group!r} has live members ({', '.join(live) or state.leader}): "
            "stop them before deleting it"
        )
    meta_entry = await coord.get(keys.meta)
    assignment_entry = await coord.get(keys.assignment)
    # Positions, and goodbyes of members (static membership) not yet processed.
    persistent = [e for d in (keys.positions_dir, keys.leaving_dir, keys.removed_dir)
                  for e in await coord.list(d)]
    leftovers = [e for d in (keys.owners_dir, keys.members_dir) for e in await coord.list(d)]
    entries: list[Entry] = [e for e in (meta_entry, assignment_entry) if e is not None]
    entries += persistent
    # Every key we delete must still be the one we read; no leader may appear.
    checks = [Check.at_version(e.key, e.version) for e in entries]
    checks.append(Check.is_absent(keys.leader))
    checks += [Check.is_absent(e.key) for e in leftovers]
    deleted = 0
    if entries:
        # The metadata goes in the same commit, so a half-deleted group cannot exist.
        ops: list[Put | Delete] = [Delete(e.key) for e in entries]
        if not await coord.commit(checks, ops):
            raise GroupBusy(
                f"group {client.group!r} changed while it was being deleted (a member "
                "started?); nothing was deleted"
            )
        deleted = len(entries)
    files = 0
    if table is not None:
        files = await asyncio.to_thread(_mirror(table, client.group).delete_all)
    if not deleted and not files:
        raise GroupNotFound(
            f"group {client.group!r} does not exist in this coordinator and has no consumer "
            "files in the table"
        )
    log.info("deleted group %s: %d keys, %d consumer files", client.group, deleted, files,
             extra={"group": client.group})
    return {"group": client.group, "deleted_keys": deleted, "deleted_consumer_files": files}


# -- members remove -------------------------------------------------------------


async def remove_member(client: GroupClient, member_id: str) -> dict[str, Any]:
    """Force ``member_id`` out of the group (see the module docstring).

    Besides deleting its keys, the same commit records a goodbye for it
    (``groups/<group>/leaving/<id>``, what a gracefully leaving member writes),
    so a leader that keeps a vanished static member's shards for
    ``--rebalance-delay`` moves them at once. That is also all there is to do
    for a member that has no session any more but is still waited for.
    """
    validate_member_id(member_id)
    coord = client.coordinator
    keys = client.keys
    for _attempt in range(FORCE_ATTEMPTS):
        member = await coord.get(keys.member(member_id))
        owned = [
            e for e in await coord.list(keys.owners_dir)
            if Owner.decode(e.key, e.value).member_id == member_id
        ]
        leader = await coord.get(keys.leader)
        leads = leader is not None and Owner.decode(leader.key, leader.value).member_id == member_id
        removing: list[Entry] = [e for e in (member, leader if leads else None) if e is not None]
        removing += owned
        assignment, _ = await client.read_assignment()
        assigned = assignment is not None and member_id in assignment.shards
        if not removing and not assigned:
            if await client.read_meta() is None:
                raise GroupNotFound(f"group {client.group!r} does not exist in this coordinator")
            raise MemberNotFound(f"member {member_id!r} is not in group {client.group!r}")
        checks = [Check.created_at(e.key, e.create_version) for e in removing]
        ops: list[Put | Delete] = [Put(keys.leaving(member_id), b"{}")]
        if member is not None:
            # The leader deletes the goodbye as soon as it has moved the
            # shards; this record stays, so a live process that notices late
            # still learns that it was removed (it exits) rather than taking
            # its missing member key for an expired session (it would rejoin).
            session = MemberInfo.decode(member.key, member.value).session
            ops.append(Put(keys.removed(member_id),
                           RemovedMember(session=session, removed_at=time.time()).encode()))
        ops += [Delete(e.key) for e in removing]
        if await coord.commit(checks, ops):
            removed = sorted(e.key for e in removing)
            log.info("removed member %s from group %s: %s", member_id, client.group, removed,
                     extra={"group": client.group, "member": member_id})
            note = "" if removing else (
                "no live session and no shard held; its goodbye is recorded, so the leader "
                "moves its shards now instead of waiting for it")
            return {"group": client.group, "member_id": member_id, "removed_keys": removed,
                    "note": note}
        await asyncio.sleep(0.05)
    raise GroupBusy(f"group {client.group!r}: member {member_id!r} kept changing; try again")


def parse_shards(values: Sequence[int] | None) -> list[int] | None:
    """``--shard`` values (None or empty: every shard)."""
    return sorted(set(values)) if values else None
