"""``paimon-group reset`` of a group of several tables (docs/many-tables.md).

The positions are the group's (one coordinator key per group shard, one
commit for every table's shards); each shard's new position is resolved
against its own table, and its consumer file is written in that table's
directory under the table's shard number
(:class:`~paimon_group.ops.reset.TableFiles`). ``--table`` (a name or a
``fnmatch`` pattern over ``database.table``) chooses the tables; without it
every live table is reset. ``--shard`` values are group shard numbers, and
must be shards of the chosen tables.

Example::

    indices = select_tables(meta, "cdc", "shop.*")
    plan = await plan_reset_tables(client, {i: opened[i] for i in indices}, target)
    plan = await execute_reset_files(client, table_files(meta, opened, "cdc"), plan)
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from fnmatch import fnmatchcase
from typing import Any

from coordinators.errors import ConfigError
from paimon_group.ops.report import GroupNotFound
from paimon_group.ops.reset import ResetPlan, ResetTarget, ShardReset, TableFiles, shard_reset
from paimon_group.protocol.admin import GroupAdmin
from paimon_group.protocol.records import GroupMeta, check_can_follow
from paimon_group.protocol.table_map import TableMap
from paimon_group.reading.table import ShardedTable

__all__ = ["plan_reset_tables", "select_tables", "table_files"]


def select_tables(meta: GroupMeta, group: str, pattern: str | None) -> list[int]:
    """The positions in the group's map of the live tables ``pattern`` (a name
    or a pattern; None: every live table) matches; a one-line ConfigError
    when it matches none."""
    tables = _map_of(meta, group)
    live = [(i, t) for i, t in enumerate(tables.ranges) if t.live]
    chosen = [i for i, t in live if pattern is None or fnmatchcase(t.name, pattern)]
    if not chosen:
        names = ", ".join(t.name for _, t in live) or "none"
        raise ConfigError(f"--table {pattern}: no table of group {group!r} matches it "
                          f"(its tables: {names})")
    return chosen


def table_files(meta: GroupMeta, opened: Mapping[int, ShardedTable],
                group: str) -> list[TableFiles]:
    """The consumer files of ``group`` in each opened table, by its range."""
    tables = _map_of(meta, group)
    return [TableFiles(table, group, tables.ranges[i].first, tables.ranges[i].shards)
            for i, table in sorted(opened.items())]


async def plan_reset_tables(
    client: GroupAdmin,
    opened: Mapping[int, ShardedTable],
    target: ResetTarget,
    shards: Iterable[int] | None = None,
) -> ResetPlan:
    """The plan of a reset of the tables ``opened`` (by position in the map;
    changes nothing). ``shards`` (group shards; None: every shard of those
    tables) must be shards of those tables."""
    state = await client.state()
    if state.meta is None:
        raise GroupNotFound(f"group {client.group!r} does not exist in this coordinator")
    check_can_follow(state.meta, client.group)
    tables = _map_of(state.meta, client.group)
    ranges = {i: tables.ranges[i] for i in opened}
    own = sorted(k for r in ranges.values() for k in range(r.first, r.end))
    chosen = own if shards is None else sorted(set(shards))
    bad = [s for s in chosen if s not in set(own)]
    if bad:
        held = ", ".join(f"{r.name} {r.first}..{r.end - 1}" for _, r in sorted(ranges.items()))
        raise ConfigError(f"--shard {bad[0]}: not a shard of the tables reset "
                          f"(group {client.group!r}: {held})")

    def resolve_all() -> tuple[list[ShardReset], list[dict[str, Any]]]:
        rows: list[ShardReset] = []
        found: list[dict[str, Any]] = []
        for i, table in sorted(opened.items()):
            r = ranges[i]
            mine = [s for s in chosen if r.first <= s < r.end]
            if not mine:
                continue
            try:
                rows += [shard_reset(state, table, target, s, local=s - r.first) for s in mine]
            except ConfigError as err:
                raise ConfigError(f"table {r.name}: {err}") from None
            found.append({"name": r.name, "first": r.first, "shards": r.shards,
                          "latest_snapshot": table.latest_snapshot_id(),
                          "earliest_snapshot": table.earliest_snapshot_id()})
        return rows, found

    rows, found = await asyncio.to_thread(resolve_all)
    return ResetPlan(group=client.group, target=str(target), shards=rows,
                     live_members=sorted(state.members), tables=found)


def _map_of(meta: GroupMeta, group: str) -> TableMap:
    if meta.tables is None:
        raise ConfigError(f"group {group!r} reads one table ({meta.table}), not several")
    return meta.tables
