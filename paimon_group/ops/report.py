"""``paimon-group describe``: everything an operator needs to see about one group.

:func:`read_report` gives a :class:`GroupReport`; its :meth:`~GroupReport.to_dict`
is what ``describe --json`` prints and what :mod:`paimon_group.ops.render`
draws as rich tables:

* the group: ``group``, ``exists``, ``table``, ``num_shards``, ``sharding``
  (the group's rule: ``{"rule": ..., "formula": ...}``, see
  :mod:`paimon_group.protocol.sharding`), ``table_kind`` (fixed, dynamic, unaware or
  postpone), ``assignor`` (``count`` or ``load``), ``state``
  (``empty``: no live member; ``stable``: the published assignment names
  exactly the live members and every shard is owned by the member it is
  assigned to; ``rebalancing``: anything else), ``generation``, ``leader``,
  ``leader_epoch``, ``latest_snapshot``, ``earliest_snapshot``, and totals;
* ``members``: per live member its id, host, pid, version, start time,
  owned and assigned shards and session (``live``); a member the assignment
  still names but whose session is gone is listed with session ``gone``;
  ``load_share``: for a group with the load assignor, the member's share of
  the shard loads published with the assignment (0..1; None otherwise);
* ``shards``: per shard its ``owner``, ``epoch``, ``assigned_to``,
  ``next_snapshot`` (the next snapshot it will read), ``lag_snapshots``,
  ``lag_seconds``, ``unread_rows``, ``last_commit``, the value of its
  Paimon consumer file, and its time to data loss (``time_to_data_loss_s``,
  null when none is foreseen, and ``data_loss``: why, in words); the group's
  are its slowest shard's (with ``data_loss_shard``).

The lag columns are defined in :mod:`paimon_group.ops.lag`.

A group of several tables (docs/many-tables.md) is measured shard by shard
against each shard's own table (:mod:`paimon_group.ops.table_lag`): each shard
also has ``table`` and ``table_shard`` (its number in its table, the one its
consumer id names), ``tables`` lists the ranges of the group's table map with
their totals (``state`` live, dropped or unreadable), and the group's own
``latest_snapshot`` and ``earliest_snapshot`` are null. A group of one table
has none of these keys.

Example::

    report = asyncio.run(read_report(coord, "orders", table))
    print(report.state, report.total_lag_snapshots)
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any

from coordinators.errors import ConfigError
from coordinators.protocol import Coordinator
from paimon_group.ops.lag import DEFAULT_MAX_SNAPSHOTS, ShardProgress, SnapshotFacts
from paimon_group.ops.retention import DataLossEstimate, earliest_loss
from paimon_group.ops.table_lag import OpenedTables, TableReport, TablesFacts, read_tables
from paimon_group.protocol.group_reads import GroupReads
from paimon_group.protocol.group_views import GroupState
from paimon_group.protocol.names import consumer_id
from paimon_group.protocol.records import Assignment, Position
from paimon_group.protocol.sharding import ShardRule
from paimon_group.protocol.table_map import TableMap
from paimon_group.reading.mirror import ConsumerMirror
from paimon_group.reading.table import ShardedTable

log = logging.getLogger("paimon_group.describe")


class GroupNotFound(ConfigError):
    """The named group has no state in this coordinator."""


def group_status(members: int, assignment_members: set[str], live: set[str],
                 owners_match: bool) -> str:
    """``empty``, ``stable`` or ``rebalancing`` (see the module docstring)."""
    if members == 0:
        return "empty"
    if assignment_members == live and owners_match:
        return "stable"
    return "rebalancing"


@dataclass(frozen=True)
class ShardReport:
    """One shard of a :class:`GroupReport` (field names are the JSON keys)."""

    shard: int
    owner: str | None
    epoch: int | None
    owner_generation: int | None
    assigned_to: str | None
    next_snapshot: int | None
    pending_full_scan: int | None
    lag_snapshots: int | None
    lag_seconds: float | None
    unread_rows: int | None
    unread_rows_complete: bool
    expired: bool
    last_commit: float | None
    last_commit_by: str | None
    consumer_id: str
    consumer_file: int | None
    # The time to data loss (paimon_group.ops.retention; None: none foreseen,
    # data_loss says why). describe measures no read rate: it assumes the
    # shard stalls from now on, a lower bound.
    time_to_data_loss_s: float | None = None
    data_loss: str = "caught up"
    # A group of several tables: the shard's table and its shard number there
    # (docs/many-tables.md); None, and not in the JSON, for a group of one table.
    table: str | None = None
    table_shard: int | None = None


@dataclass(frozen=True)
class SinkReport:
    """A target the group's output goes to, and each shard's position in it
    (the next source snapshot it holds output up to; the sink's marks)."""

    kind: str
    warehouse: str
    table: str
    positions: dict[int, int] = field(default_factory=dict)
    error: str | None = None  # why the target could not be read


@dataclass(frozen=True)
class MemberReport:
    """One member of a :class:`GroupReport` (field names are the JSON keys)."""

    member_id: str
    host: str | None
    pid: int | None
    version: str | None
    started_at: float | None
    owned_shards: list[int]
    assigned_shards: list[int]
    session: str | None
    session_state: str  # "live", or "gone": named by the assignment, no session
    leader: bool
    # The member's share (0..1) of the shard loads the leader published with
    # the assignment (load assignor only; None: not measured).
    load_share: float | None = None


@dataclass(frozen=True)
class ShardingReport:
    rule: str
    formula: str


@dataclass(frozen=True)
class GroupReport:
    """The describe report of one group (see the module docstring).

    The totals are derived from ``shards``; ``coordinator`` (the URL, its
    credentials masked) is set by the command that read the report.
    """

    group: str
    exists: bool
    table: str | None
    created_at: float | None
    num_shards: int
    sharding: ShardingReport | None
    table_kind: str | None
    state: str
    generation: int
    leader: str | None
    leader_epoch: int | None
    latest_snapshot: int | None
    earliest_snapshot: int | None
    latest_commit_time: float | None
    members: list[MemberReport] = field(default_factory=list)
    shards: list[ShardReport] = field(default_factory=list)
    described_at: float = 0.0
    coordinator: str | None = None
    assignor: str | None = None  # "count" or "load", from the group record
    sinks: list[SinkReport] = field(default_factory=list)
    # A group of several tables: one per range of its table map (None, and
    # not in the JSON, for a group of one table).
    tables: list[TableReport] | None = None

    @property
    def total_lag_snapshots(self) -> int:
        """Snapshot lag summed over shards. Kept in the JSON for scripts that read
        it; it means little to a reader (4 shards one snapshot behind sum to 4):
        the views show :attr:`max_lag_snapshots` and :attr:`max_lag_seconds`."""
        return sum(s.lag_snapshots or 0 for s in self.shards)

    @property
    def max_lag_snapshots(self) -> int:
        """How many snapshots the slowest shard is behind."""
        return max((s.lag_snapshots or 0 for s in self.shards), default=0)

    @property
    def max_lag_seconds(self) -> float | None:
        lags = [s.lag_seconds for s in self.shards if s.lag_seconds is not None]
        return max(lags) if lags else None

    @property
    def total_unread_rows(self) -> int | None:
        unread = [s.unread_rows for s in self.shards if s.unread_rows is not None]
        return sum(unread) if unread else None

    @property
    def expired_shards(self) -> list[int]:
        return [s.shard for s in self.shards if s.expired]

    def data_loss(self) -> dict[str, Any]:
        """The group's time to data loss: its slowest shard's, and that shard."""
        loss = earliest_loss(DataLossEstimate(s.time_to_data_loss_s, s.data_loss)
                             for s in self.shards)
        slowest = [s.shard for s in self.shards if loss.seconds is not None
                   and s.time_to_data_loss_s == loss.seconds]
        return {**loss.to_dict(), "data_loss_shard": slowest[0] if slowest else None}

    def with_coordinator(self, url: str) -> GroupReport:
        return dataclasses.replace(self, coordinator=url)

    def with_sinks(self, sinks: list[SinkReport]) -> GroupReport:
        return dataclasses.replace(self, sinks=sinks)

    def only_tables(self, pattern: str) -> GroupReport:
        """A group of several tables' report cut to the tables ``pattern`` (a
        name or an ``fnmatch`` pattern over ``database.table``) matches, and
        their shards (the totals follow); ConfigError if none does."""
        if self.tables is None:
            return self
        kept = [t for t in self.tables if fnmatchcase(t.name, pattern)]
        if not kept:
            names = ", ".join(t.name for t in self.tables if t.dropped_at is None) or "none"
            raise ConfigError(f"--table {pattern}: no table of group {self.group!r} matches "
                              f"it (its tables: {names})")
        return dataclasses.replace(self, tables=kept, shards=[
            s for s in self.shards if any(t.holds(s.shard) for t in kept)])

    def to_dict(self) -> dict[str, Any]:
        """The report as ``describe --json`` prints it (JSON-ready values)."""
        out = dataclasses.asdict(self)
        if self.coordinator is None:
            del out["coordinator"]
        if self.tables is None:
            del out["tables"]
            for shard in out["shards"]:
                del shard["table"], shard["table_shard"]
        else:
            out["tables"] = [table_summary(t, self.shards) for t in self.tables]
        out.update(
            total_lag_snapshots=self.total_lag_snapshots,
            max_lag_snapshots=self.max_lag_snapshots,
            max_lag_seconds=self.max_lag_seconds,
            total_unread_rows=self.total_unread_rows,
            expired_shards=self.expired_shards,
            **self.data_loss(),
        )
        return out


def table_summary(table: TableReport, shards: list[ShardReport]) -> dict[str, Any]:
    """One table of a group of several tables as the JSON shows it: its range
    and snapshots, and the totals of its shards."""
    mine = [s for s in shards if table.holds(s.shard)]
    lags = [s.lag_seconds for s in mine if s.lag_seconds is not None]
    unread = [s.unread_rows for s in mine if s.unread_rows is not None]
    return {
        **dataclasses.asdict(table),
        "state": table.state,
        "owned_shards": sum(1 for s in mine if s.owner is not None),
        "owners": sorted({s.owner for s in mine if s.owner is not None}),
        "total_lag_snapshots": sum(s.lag_snapshots or 0 for s in mine),
        "max_lag_snapshots": max((s.lag_snapshots or 0 for s in mine), default=0),
        "max_lag_seconds": max(lags) if lags else None,
        "total_unread_rows": sum(unread) if unread else None,
        "expired_shards": [s.shard for s in mine if s.expired],
    }


@dataclass(frozen=True)
class _TableFacts:
    """What the table says about a group's shards."""

    progress: dict[int, ShardProgress] = field(default_factory=dict)
    consumer_files: dict[int, int] = field(default_factory=dict)
    latest: int | None = None
    earliest: int | None = None
    latest_time_ms: int | None = None


def _consumer_files(table: ShardedTable, group: str) -> dict[int, int]:
    try:
        return ConsumerMirror(table.table.file_io, table.table_path, group).all()
    except Exception as err:
        log.debug("consumer files of %s not read: %s", group, err)
        return {}


async def read_report(
    coordinator: Coordinator,
    group: str,
    table: ShardedTable | None,
    *,
    facts: SnapshotFacts | None = None,
    max_snapshots: int = DEFAULT_MAX_SNAPSHOTS,
    tables: OpenedTables | None = None,
) -> GroupReport:
    """The describe report of ``group`` (see the module docstring).

    ``facts`` may be passed in (and kept) by callers that describe the same
    group repeatedly, so snapshot metadata is read once. A group that does not
    exist gives a report with ``exists`` false and no shards. A group of
    several tables is measured against ``tables`` (its map's live tables by
    position, :mod:`paimon_group.ops.table_lag`), not ``table``.
    """
    state = await GroupReads(coordinator, group).state()
    return await report_from_state(group, state, table, facts=facts, max_snapshots=max_snapshots,
                                   tables=tables)


async def describe_group(
    coordinator: Coordinator,
    group: str,
    table: ShardedTable | None,
    *,
    facts: SnapshotFacts | None = None,
    max_snapshots: int = DEFAULT_MAX_SNAPSHOTS,
    tables: OpenedTables | None = None,
) -> dict[str, Any]:
    """:func:`read_report` as the JSON document ``describe --json`` prints."""
    report = await read_report(coordinator, group, table, facts=facts,
                               max_snapshots=max_snapshots, tables=tables)
    return report.to_dict()


async def report_from_state(
    group: str,
    state: GroupState,
    table: ShardedTable | None,
    *,
    facts: SnapshotFacts | None = None,
    max_snapshots: int = DEFAULT_MAX_SNAPSHOTS,
    count_rows: bool = True,
    tables: OpenedTables | None = None,
) -> GroupReport:
    """The describe report from an already-read :class:`GroupState`.

    ``count_rows`` False skips the unread-rows estimate (no manifest reads).
    ``tables``: as :func:`read_report` takes them.
    """
    meta = state.meta
    num_shards = meta.num_shards if meta else 0
    rule = ShardRule.parse(meta.sharding if meta else None)
    table_map = meta.tables if meta is not None else None
    many: TablesFacts | None = None
    if table_map is not None:
        many = await read_tables(group, state, tables or {}, max_snapshots=max_snapshots,
                                 count_rows=count_rows)
        found = _TableFacts(many.progress, many.consumer_files)
        table = None
    else:
        found = await _read_table(group, state, table, num_shards, rule, facts=facts,
                                  max_snapshots=max_snapshots, count_rows=count_rows)
    shards = _shard_reports(group, state, num_shards, found, table_map)
    live = set(state.members)
    assigned = set(state.assignment.shards) if state.assignment else set()
    owners_match = all(s.owner is not None and s.owner == s.assigned_to for s in shards)
    return GroupReport(
        group=group,
        exists=meta is not None,
        table=meta.table if meta else None,
        created_at=meta.created_at if meta else None,
        num_shards=num_shards,
        sharding=ShardingReport(rule.value, rule.formula) if meta is not None else None,
        table_kind=table.kind.value if table is not None else None,
        state=group_status(len(live), assigned, live, owners_match),
        generation=state.assignment.generation if state.assignment else 0,
        leader=state.leader,
        leader_epoch=state.leader_epoch,
        latest_snapshot=found.latest,
        earliest_snapshot=found.earliest,
        latest_commit_time=(found.latest_time_ms / 1000.0
                            if found.latest_time_ms is not None else None),
        members=_with_load_shares(_member_reports(state, live, assigned), state.assignment),
        shards=shards,
        described_at=time.time(),
        assignor=meta.assignor if meta else None,
        tables=many.tables if many is not None else None,
    )


async def _read_table(
    group: str,
    state: GroupState,
    table: ShardedTable | None,
    num_shards: int,
    rule: ShardRule,
    *,
    facts: SnapshotFacts | None,
    max_snapshots: int,
    count_rows: bool,
) -> _TableFacts:
    """Lag, consumer files and snapshot range of the group's table (none without one)."""
    if table is None:
        return _TableFacts()
    if not num_shards:
        return _TableFacts(latest=await asyncio.to_thread(table.latest_snapshot_id))
    if facts is None or facts.num_shards != num_shards or facts.sharding.rule is not rule:
        facts = SnapshotFacts(table, num_shards, max_snapshots=max_snapshots,
                              count_rows=count_rows, rule=rule)
    used = facts
    # A pinned but undelivered full scan still needs its snapshot: lag counts from it.
    positions = {s: (state.positions[s].effective if s in state.positions else None)
                 for s in range(num_shards)}

    def read() -> _TableFacts:
        progress = used.progress(positions)
        latest_ms = used.commit_time_ms(used.latest) if used.latest is not None else None
        return _TableFacts(progress, _consumer_files(table, group), used.latest, used.earliest,
                           latest_ms)

    return await asyncio.to_thread(read)


def _progress_of(found: _TableFacts, shard: int, pos: Position | None) -> ShardProgress:
    p = found.progress.get(shard)
    if p is not None:
        return p
    if pos is not None and found.latest is not None:
        return ShardProgress(max(0, found.latest + 1 - pos.effective), None, None, False, False)
    return ShardProgress.unknown()


def _shard_reports(group: str, state: GroupState, num_shards: int,
                   found: _TableFacts, table_map: TableMap | None) -> list[ShardReport]:
    shards: list[ShardReport] = []
    for shard in range(num_shards):
        owner = state.owners.get(shard)
        pos = state.positions.get(shard)
        p = _progress_of(found, shard, pos)
        name: str | None = None
        local: int | None = None
        if table_map is not None:
            in_table, local = table_map.locate(shard)
            name = in_table.name
        shards.append(ShardReport(
            shard=shard,
            owner=owner.member_id if owner else None,
            epoch=owner.epoch if owner else None,
            owner_generation=owner.generation if owner else None,
            assigned_to=state.assignment.owner_of(shard) if state.assignment else None,
            next_snapshot=pos.next_snapshot if pos else None,
            pending_full_scan=pos.full_scan if pos else None,
            lag_snapshots=p.lag_snapshots,
            lag_seconds=p.lag_seconds,
            unread_rows=p.unread_rows,
            unread_rows_complete=p.unread_rows_complete,
            expired=p.expired,
            last_commit=pos.committed_at if pos else None,
            last_commit_by=pos.member_id if pos else None,
            consumer_id=consumer_id(group, shard if local is None else local),
            consumer_file=found.consumer_files.get(shard),
            **p.data_loss.to_dict(),
            table=name,
            table_shard=local,
        ))
    return shards


def _member_reports(state: GroupState, live: set[str], assigned: set[str]) -> list[MemberReport]:
    owned_by: dict[str, list[int]] = {}
    for shard, view in state.owners.items():
        owned_by.setdefault(view.member_id, []).append(shard)
    assignment = state.assignment

    def assigned_shards(m: str) -> list[int]:
        return assignment.shards_of(m) if assignment else []

    members = [
        MemberReport(m, info.host, info.pid, info.version, info.started_at,
                     sorted(owned_by.get(m, [])), assigned_shards(m), info.session, "live",
                     m == state.leader)
        for m, info in sorted(state.members.items())
    ]
    # Members the assignment still names but whose session ended (crashed,
    # or waited for by a rebalance delay): shown so that operators see them.
    # Not for an empty group: its last assignment names whoever ran last.
    members += [
        MemberReport(m, None, None, None, None, sorted(owned_by.get(m, [])),
                     assigned_shards(m), None, "gone", False)
        for m in sorted(assigned - live if live else set())
    ]
    return members


def _with_load_shares(members: list[MemberReport],
                      assignment: Assignment | None) -> list[MemberReport]:
    """Each member's share of the published shard loads (load assignor)."""
    loads = assignment.loads if assignment is not None else []
    total = sum(loads)
    if assignment is None or total <= 0:
        return members
    return [dataclasses.replace(m, load_share=sum(
        loads[s] for s in m.assigned_shards if 0 <= s < len(loads)) / total) for m in members]
