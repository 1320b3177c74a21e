"""Lag of a group of several tables (docs/many-tables.md): each shard against its table.

A group of several tables keeps a table map in its record
(:class:`~paimon_group.protocol.table_map.TableMap`): group shard ``k`` is
shard ``k - first`` of the table whose range holds it. :func:`read_tables`
measures each live table's shards against that table's own latest snapshot
(a :class:`~paimon_group.ops.lag.SnapshotFacts` per table, in the table's
shard numbers), reads that table's consumer files of the group (named with
the table's shard numbers) and gives both back in group shard numbers, with
one :class:`TableReport` per range of the map. A dropped table is not read:
its report says when it was dropped; a table that could not be opened says
why.

Example::

    found = await read_tables("cdc", state, {0: orders, 1: items})
    found.progress[5].lag_snapshots, found.tables[1].latest_snapshot
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from paimon_group.ops.lag import DEFAULT_MAX_SNAPSHOTS, ShardProgress, SnapshotFacts
from paimon_group.protocol.group_views import GroupState
from paimon_group.protocol.sharding import ShardRule
from paimon_group.protocol.table_map import TableMap, TableRange
from paimon_group.reading.mirror import ConsumerMirror
from paimon_group.reading.table import ShardedTable

log = logging.getLogger("paimon_group.describe")

__all__ = ["OpenedTables", "TableReport", "TablesFacts", "read_tables"]

OpenedTables = Mapping[int, ShardedTable | str]
"""The tables of a group's map by their position in it: the opened table, or
why it could not be opened (one line). Dropped tables are not in it."""


@dataclass(frozen=True)
class TableReport:
    """One range of a group's table map as ``describe`` shows it (field names
    are the JSON keys; the per-table totals are added from the shards)."""

    index: int
    name: str
    table_id: str
    first: int
    shards: int
    sharding: str
    dropped_at: float | None
    table_kind: str | None = None
    latest_snapshot: int | None = None
    earliest_snapshot: int | None = None
    latest_commit_time: float | None = None
    error: str | None = None  # why the table was not read

    @property
    def state(self) -> str:
        """``live``, ``dropped``, or ``unreadable`` (not opened: ``error`` says why)."""
        if self.dropped_at is not None:
            return "dropped"
        return "unreadable" if self.error else "live"

    def holds(self, shard: int) -> bool:
        return self.first <= shard < self.first + self.shards

    @staticmethod
    def of(index: int, table: TableRange, *, table_kind: str | None = None,
           latest_snapshot: int | None = None, earliest_snapshot: int | None = None,
           latest_commit_time: float | None = None, error: str | None = None) -> TableReport:
        return TableReport(index, table.name, table.table_id, table.first, table.shards,
                           table.sharding, table.dropped_at, table_kind, latest_snapshot,
                           earliest_snapshot, latest_commit_time, error)


@dataclass(frozen=True)
class TablesFacts:
    """What the tables say about a group's shards, in group shard numbers."""

    tables: list[TableReport] = field(default_factory=list)
    progress: dict[int, ShardProgress] = field(default_factory=dict)
    consumer_files: dict[int, int] = field(default_factory=dict)


async def read_tables(
    group: str, state: GroupState, opened: OpenedTables, *,
    max_snapshots: int = DEFAULT_MAX_SNAPSHOTS, count_rows: bool = True,
) -> TablesFacts:
    """Each live table's shards measured against that table (see the module docstring)."""
    meta = state.meta
    assert meta is not None and meta.tables is not None, "not a group of several tables"
    table_map: TableMap = meta.tables
    out = TablesFacts()
    for index, table_range in enumerate(table_map.ranges):
        if not table_range.live:
            out.tables.append(TableReport.of(index, table_range))
            continue
        table = opened.get(index, "not opened")
        if isinstance(table, str):
            out.tables.append(TableReport.of(index, table_range, error=table))
            continue
        positions = {local: (state.positions[shard].effective
                             if shard in state.positions else None)
                     for local, shard in enumerate(range(table_range.first, table_range.end))}
        try:
            report = await asyncio.to_thread(
                _read_one, group, index, table_range, table, positions, out,
                max_snapshots, count_rows)
        except Exception as err:  # one table unreadable: the others are still shown
            report = TableReport.of(index, table_range,
                                    error=f"{type(err).__name__}: {err}"[:200])
        out.tables.append(report)
    return out


def _read_one(group: str, index: int, table_range: TableRange, table: ShardedTable,
              positions: dict[int, int | None], out: TablesFacts, max_snapshots: int,
              count_rows: bool) -> TableReport:
    """One table's facts (blocking); its shards' progress and files put in ``out``."""
    facts = SnapshotFacts(table, table_range.shards, max_snapshots=max_snapshots,
                          count_rows=count_rows, rule=ShardRule.parse(table_range.sharding))
    progress = facts.progress(positions)
    latest_ms = facts.commit_time_ms(facts.latest) if facts.latest is not None else None
    try:
        files = ConsumerMirror(table.table.file_io, table.table_path, group).all()
    except Exception as err:
        log.debug("consumer files of %s in %s not read: %s", group, table_range.name, err)
        files = {}
    first = table_range.first
    out.progress.update({first + local: p for local, p in progress.items()})
    out.consumer_files.update({first + local: n for local, n in files.items()
                               if 0 <= local < table_range.shards})
    return TableReport.of(index, table_range, table_kind=table.kind.value,
                          latest_snapshot=facts.latest, earliest_snapshot=facts.earliest,
                          latest_commit_time=None if latest_ms is None else latest_ms / 1000.0)
