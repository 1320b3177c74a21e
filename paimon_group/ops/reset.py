"""``paimon-group reset``: move a group's positions, coordinator and consumer files together.

Without ``force`` the new positions are written only where no owner key
exists (:meth:`~paimon_group.protocol.admin.GroupAdmin.reset_positions`, guarded on
absent owner keys), and only when the group has no live member. With
``force`` each shard's owner key is **deleted in the same commit** that
writes its position, guarded by the owner's epoch as read
(:meth:`~paimon_group.protocol.admin.GroupAdmin.force_positions`): the owner is
fenced (its next commit fails its epoch check), and whoever owns the shard
next creates a new owner key and then reads the position, so it reads the
reset one (invariants 1 and 2: a reset is the one explicit backwards move).
The price: a live owner may still deliver the batch it was working on from
its old position (its commit is then rejected), and it only notices the
reset at that commit.

Paimon consumer files move with the positions (invariant 5: a file never runs
ahead of the coordinator): a file whose new value is not above the shard's
current coordinator position (a rewind) is written *before* the coordinator
commit (a lower file only keeps more snapshots, and it protects the snapshots
we rewind to from expiring between the two writes; the earliest snapshot is
checked again after it is written); any other file is written *after* the
commit. If the commit fails, the files written before it are put back.

Example::

    async with open_coordinator(url) as coord:
        client = GroupAdmin(coord, "orders")
        plan = await plan_reset(client, table, ResetTarget.to_snapshot(42))
        plan = await execute_reset(client, table, plan)
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from coordinators.errors import ConfigError
from paimon_group.errors import GroupBusy
from paimon_group.ops.report import GroupNotFound
from paimon_group.protocol.admin import GroupAdmin
from paimon_group.protocol.group_views import GroupState
from paimon_group.protocol.names import consumer_id
from paimon_group.protocol.records import check_can_follow
from paimon_group.reading.mirror import ConsumerMirror
from paimon_group.reading.start import parse_start
from paimon_group.reading.table import ShardedTable

log = logging.getLogger("paimon_group.admin")

FORCE_ATTEMPTS = 10
"""Forced commits retried this often when owners change under them."""


def admin_actor() -> str:
    """Who wrote a reset position (recorded as the position's ``member_id``)."""
    return f"admin@{socket.gethostname()}"


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
    # The current position's pending full scan: a reset drops it, so the
    # shard changes even when its next snapshot stays the same.
    full_scan: int | None = None
    # A group of several tables: the shard's table and its shard number there.
    table: str | None = None
    table_shard: int | None = None

    @property
    def changes(self) -> bool:
        return self.new is not None and (self.new != self.current or self.full_scan is not None)


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
    # A group of several tables: the tables reset, each with its latest and
    # earliest snapshot (None for a group of one table: the fields above).
    tables: list[dict[str, Any]] | None = None

    @property
    def changing(self) -> list[ShardReset]:
        return [s for s in self.shards if s.changes]

    def to_dict(self) -> dict[str, Any]:
        out = {
            "group": self.group,
            "target": self.target,
            "latest_snapshot": self.latest_snapshot,
            "earliest_snapshot": self.earliest_snapshot,
            "live_members": list(self.live_members),
            "executed": self.executed,
            "forced": self.forced,
            "shards": [
                {"shard": s.shard, "owner": s.owner, "epoch": s.epoch, "current": s.current,
                 "new": s.new, "note": s.note,
                 **({} if s.table is None else {"table": s.table,
                                                 "table_shard": s.table_shard})}
                for s in self.shards
            ],
        }
        if self.tables is not None:
            out["tables"] = [dict(t) for t in self.tables]
        return out


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
    client: GroupAdmin,
    table: ShardedTable,
    target: ResetTarget,
    shards: Iterable[int] | None = None,
) -> ResetPlan:
    """The plan of a reset (changes nothing). ``shards`` None means all shards."""
    state = await client.state()
    if state.meta is None:
        raise GroupNotFound(f"group {client.group!r} does not exist in this coordinator")
    check_can_follow(state.meta, client.group)  # positions of a feature it does not know
    if state.meta.tables is not None:
        raise ConfigError(f"group {client.group!r} reads several tables ({state.meta.table}): "
                          "plan its reset with plan_reset_tables")
    check_table(state, table, client.group)
    num_shards = state.meta.num_shards
    chosen = sorted(set(range(num_shards) if shards is None else shards))
    bad = [s for s in chosen if not 0 <= s < num_shards]
    if bad:
        raise ConfigError(
            f"--shard {bad[0]}: group {client.group!r} has shards 0..{num_shards - 1}"
        )

    def resolve_all() -> tuple[list[ShardReset], int | None, int | None]:
        rows = [shard_reset(state, table, target, s) for s in chosen]
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


def shard_reset(state: GroupState, table: ShardedTable, target: ResetTarget, shard: int, *,
                local: int | None = None) -> ShardReset:
    """The plan of one group shard (blocking: reads the table). ``local``: the
    shard's number in its table, a group of several tables' ``table`` one."""
    pos = state.positions.get(shard)
    current = pos.next_snapshot if pos else None
    full = pos.full_scan if pos else None
    new, note = _resolve(table, target, current)
    if new is not None and full is not None and not note:
        note = f"pending full scan of snapshot {full} dropped"
    elif new is not None and new == current and not note:
        note = "unchanged"
    owner = state.owners.get(shard)
    return ShardReset(shard, current, new, owner.member_id if owner else None,
                      owner.epoch if owner else None, note, full,
                      None if local is None else table.identifier, local)


def check_table(state: GroupState, table: ShardedTable | None, group: str) -> None:
    if state.meta is not None and table is not None and state.meta.table != table.identifier:
        raise ConfigError(
            f"group {group!r} reads table {state.meta.table!r}, not {table.identifier!r}: "
            "check --table"
        )


def admin_mirror(table: ShardedTable, group: str) -> ConsumerMirror:
    # interval 0: every write goes through (nothing is throttled here).
    return ConsumerMirror(table.table.file_io, table.table_path, group, interval_s=0.0)


@dataclass(frozen=True)
class TableFiles:
    """The group's consumer files in one table, in group shard numbers: group
    shard ``first + i`` is the table's shard ``i`` (``0 <= i < shards``), whose
    file is ``pg-<group>-shard-<i>`` in the table's directory. A group of one
    table: ``first`` 0 and every shard (``shards`` None)."""

    table: ShardedTable
    group: str
    first: int = 0
    shards: int | None = None

    def holds(self, shard: int) -> bool:
        return shard >= self.first and (self.shards is None or shard < self.first + self.shards)

    def all(self) -> dict[int, int]:
        """The files' values by group shard (blocking)."""
        found = admin_mirror(self.table, self.group).all()
        return {self.first + i: n for i, n in found.items()
                if self.shards is None or i < self.shards}

    def write(self, values: dict[int, int]) -> None:
        """Write the files of the shards of ``values`` this table holds (blocking)."""
        mirror = admin_mirror(self.table, self.group)
        for s, n in sorted(values.items()):
            if self.holds(s):
                mirror.write(s - self.first, n, force=True)

    def delete(self, shards: Iterable[int]) -> None:
        from pypaimon.consumer.consumer_manager import ConsumerManager

        manager = ConsumerManager(self.table.table.file_io, self.table.table_path)
        for shard in shards:
            if self.holds(shard):
                manager.delete_consumer(consumer_id(self.group, shard - self.first))


@dataclass(frozen=True)
class _FileMoves:
    """The consumer files a reset writes, before and after the coordinator commit."""

    before: dict[int, int]
    after: dict[int, int]
    previous: dict[int, int]  # the files as they were

    @staticmethod
    def of(plan: ResetPlan, previous: dict[int, int]) -> _FileMoves:
        # Every planned shard's file ends equal to its (new or unchanged) position.
        targets = {s.shard: s.new for s in plan.shards if s.new is not None}
        updates = {s: n for s, n in targets.items() if previous.get(s) != n}
        current = {s.shard: s.current for s in plan.shards}
        # Files that are not ahead of the coordinator's current position go
        # first: a file moving backwards then protects the snapshots we rewind
        # to from expiring while the coordinator is written. The others go
        # after the coordinator commit, so that no file is ever ahead of it
        # (invariant 5).
        before = {s: n for s, n in updates.items()
                  if current.get(s) is not None and n <= (current[s] or 0)}
        after = {s: n for s, n in updates.items() if s not in before}
        return _FileMoves(before, after, previous)


async def execute_reset(
    client: GroupAdmin,
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
    return await execute_reset_files(client, [TableFiles(table, client.group)], plan,
                                     force=force, actor=actor)


async def execute_reset_files(
    client: GroupAdmin,
    files: Sequence[TableFiles],
    plan: ResetPlan,
    *,
    force: bool = False,
    actor: str | None = None,
) -> ResetPlan:
    """:func:`execute_reset` with each shard's consumer file in the table of
    ``files`` that holds it (a group of several tables: one each). The
    positions of every table are one coordinator commit."""
    actor = actor or admin_actor()
    previous: dict[int, int] = {}
    for part in files:
        previous.update(await asyncio.to_thread(part.all))
    moves = _FileMoves.of(plan, previous)
    new_positions = {s.shard: s.new for s in plan.changing if s.new is not None}
    if not new_positions and not moves.before and not moves.after:
        return replace(plan, executed=True, forced=force)
    if not force:
        _refuse_if_busy(client.group, await client.state(), new_positions)
    await asyncio.to_thread(_write_files, files, moves.before)
    try:
        for part in files:
            await _check_rewind_retained(
                part.table, {s: n for s, n in moves.before.items() if part.holds(s)},
                new_positions)
        if new_positions:
            await _commit_positions(client, new_positions, actor, force=force)
    except BaseException:
        await _restore_files(files, moves)
        raise
    await asyncio.to_thread(_write_files, files, moves.after)
    log.info("reset group %s (%s): %s", client.group, plan.target, new_positions,
             extra={"group": client.group})
    return replace(plan, executed=True, forced=force)


def _refuse_if_busy(group: str, state: GroupState, positions: dict[int, int]) -> None:
    if state.members:
        raise GroupBusy(
            f"group {group!r} has {len(state.members)} live member(s) "
            f"({', '.join(sorted(state.members))}): stop them first (or wait for their "
            "sessions to expire); --force resets under live members and is dangerous"
        )
    held = sorted(s for s in positions if s in state.owners)
    if held:
        raise GroupBusy(
            f"group {group!r}: shards {held} are owned by a live session; nothing was "
            "reset (stop the members, or use --force, which is dangerous)"
        )


def _write_files(files: Sequence[TableFiles], values: dict[int, int]) -> None:
    for part in files:
        part.write(values)


async def _check_rewind_retained(
    table: ShardedTable, before: dict[int, int], positions: dict[int, int]
) -> None:
    """After the rewound files are written: the snapshots we rewind to must
    still be retained (they may have expired before the files protected them)."""
    lowest = min((n for s, n in before.items() if s in positions), default=None)
    if lowest is None:
        return
    earliest = await asyncio.to_thread(table.earliest_snapshot_id)
    latest = await asyncio.to_thread(table.latest_snapshot_id)
    if earliest is not None and lowest < earliest and lowest <= (latest or 0):
        raise table.expired_error(lowest)


async def _commit_positions(
    client: GroupAdmin, positions: dict[int, int], actor: str, *, force: bool
) -> None:
    if force:
        await _force_positions(client, positions, actor)
    elif not await client.reset_positions(positions, actor):
        owners = await client.owners()
        owned = sorted(s for s in positions if s in owners)
        raise GroupBusy(
            f"group {client.group!r}: shards {owned} are owned by a live session; nothing "
            "was reset (stop the members, or use --force, which is dangerous)"
        )


async def _force_positions(client: GroupAdmin, positions: dict[int, int], actor: str) -> None:
    """:meth:`GroupAdmin.force_positions`, again while owners change under it
    (a new owner read the old position: it must be fenced too)."""
    for _attempt in range(FORCE_ATTEMPTS):
        if await client.force_positions(positions, actor):
            return
        await asyncio.sleep(0.05)
    raise GroupBusy(
        f"group {client.group!r}: owners kept changing during {FORCE_ATTEMPTS} forced reset "
        "attempts; nothing was reset, try again"
    )


async def _restore_files(files: Sequence[TableFiles], moves: _FileMoves) -> None:
    """Put back the files we moved before a commit that failed: they must not
    stay behind positions we did not write (harmless, it only keeps more
    snapshots, but untidy)."""
    restore = {s: moves.previous[s] for s in moves.before if s in moves.previous}
    missing = [s for s in moves.before if s not in moves.previous]
    try:
        await asyncio.to_thread(_write_files, files, restore)
        for part in files:
            await asyncio.to_thread(part.delete, missing)
    except Exception as err:
        log.warning("consumer files not restored after a failed reset: %s", err)


def parse_shards(values: Sequence[int] | None) -> list[int] | None:
    """``--shard`` values (None or empty: every shard)."""
    return sorted(set(values)) if values else None
