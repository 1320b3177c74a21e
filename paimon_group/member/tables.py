"""The tables a member reads, and which of them holds each of the group's shards.

A group of one table has one :class:`MemberTable` whose range is every shard
of the group (its records, keys and consumer files are today's). A group of
several tables (docs/many-tables.md) has one per range of its table map
(:class:`~paimon_group.protocol.table_map.TableMap`): group shard ``k`` is
shard ``k - first`` of the table whose range holds it. Each table has:

* its :class:`~paimon_group.reading.table.ShardedTable` and its planner, both
  in the table's own shard numbers (``0 .. shards - 1``): a step is planned for
  the table's shards and its splits are keyed by them;
* its consumer files' mirror, also in the table's numbers, so shard ``k`` of
  the group writes ``pg-<group>-shard-<k - first>`` into that table's
  directory: the consumer id a group of that table alone would use;
* ``meta``, the group's record as seen from the table (its shard count,
  sharding rule, name and identity; no map): what the single-table functions
  (consumer files' origin and start, the identity check) take;
* ``index``, its position in the map (None for the group's one table): its
  start is ``groups/<g>/tables/<i>/start`` (``groups/<g>/start`` for one table);
* ``gone``: why it is not read any more (dropped or re-created), once found.

:class:`MemberTables` holds them by range and routes a group shard to its
table; :class:`RoutedMirror` is the member's mirror in group shard numbers
(what the commits and ownership parts call), each call sent to the table of
the shard in the table's numbers.
"""

from __future__ import annotations

import bisect
import builtins
import dataclasses
import logging
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from paimon_group.protocol.identity import table_identity
from paimon_group.protocol.records import GroupMeta
from paimon_group.protocol.sharding import ShardRule
from paimon_group.protocol.table_map import NotInMap, TableRange
from paimon_group.reading.mirror import ConsumerMirror, MirroredPosition
from paimon_group.reading.planner import ShardPlanner, StepPlan
from paimon_group.reading.table import ShardedTable

log = logging.getLogger("paimon_group.member")

__all__ = ["MemberTable", "MemberTables", "RoutedMirror", "TableGone", "table_meta"]


class TableGone(Exception):
    """A batch or a step of a table of a group of several found dropped or
    re-created meanwhile (its files gone with it): not committed, and the
    table not read any more; the member goes on with the others."""


def table_meta(meta: GroupMeta, table: TableRange) -> GroupMeta:
    """The group's record as the table ``table`` of its map sees it: the
    table's shard count, rule, name and identity, no map. A group of one
    table is its own record."""
    return dataclasses.replace(meta, num_shards=table.shards, sharding=table.sharding,
                               table=table.name, table_id=table.table_id, tables=None)


@dataclass(eq=False)
class MemberTable:
    """One table of the member's group (see the module docstring)."""

    index: int | None  # position in the table map; None: the group's one table
    range: TableRange
    group_meta: GroupMeta  # the group's record as the last join read it
    table: ShardedTable
    new_planner: Callable[[], ShardPlanner]  # see :attr:`planner`
    mirror: ConsumerMirror
    gone: str | None = None
    _planner: ShardPlanner | None = dataclasses.field(default=None, init=False, repr=False)
    _planner_lock: threading.Lock = dataclasses.field(default_factory=threading.Lock,
                                                      init=False, repr=False)

    @property
    def planner(self) -> ShardPlanner:
        """The table's planner, built at its first use (a step planned, in
        the planning thread): a member of a group of many tables opens every
        table but reads only those of its shards, and a planner (the table's
        schema read, its readers made) is most of a table's opening."""
        planner = self._planner
        if planner is None:
            with self._planner_lock:  # the planning thread and a prefetch
                if self._planner is None:
                    self._planner = self.new_planner()
                planner = self._planner
        return planner

    def plan_full(self, shards: Sequence[int], snapshot_id: int) -> StepPlan:
        """:meth:`ShardPlanner.plan_full` of the table's ``shards`` (its numbers)."""
        return self.planner.plan_full(list(shards), snapshot_id)

    def plan_next(self, shards: Sequence[int], position: int, *, known_latest: int | None = None,
                  catch_up_threshold: int | None = None) -> StepPlan | None:
        """:meth:`ShardPlanner.plan_next` of the table's ``shards`` (its numbers)."""
        return self.planner.plan_next(list(shards), position, known_latest=known_latest,
                                      catch_up_threshold=catch_up_threshold)

    @property
    def name(self) -> str:
        return self.range.name

    @property
    def meta(self) -> GroupMeta:
        """The group's record as this table sees it (:func:`table_meta`)."""
        if self.index is None:
            return self.group_meta
        return table_meta(self.group_meta, self.range)

    @property
    def first(self) -> int:
        return self.range.first

    def local(self, shard: int) -> int:
        """The table's shard number of group shard ``shard``."""
        local = shard - self.range.first
        if not 0 <= local < self.range.shards:
            raise NotInMap(f"group shard {shard} is not of table {self.name!r}")
        return local

    def group_shard(self, local: int) -> int:
        """The group shard of the table's shard ``local``."""
        return self.range.first + local

    def in_place(self) -> bool:
        """Whether the table is still the one of its range, its identity read
        afresh (one small read); found dropped or re-created, it is marked
        ``gone`` with one WARNING (a step planned of a table re-created under
        its name since is of the new table: not this range's to deliver)."""
        current = table_identity(self.table.table)
        if self.gone is None and current != self.range.table_id:
            self.gone = "re-created" if current else "dropped"
            log.warning("table %s was %s: its shards %d..%d are not read any more (the "
                        "group's leader takes it out of the group)", self.name, self.gone,
                        self.range.first, self.range.end - 1)
        return self.gone is None

    @property
    def group_shards(self) -> builtins.range:
        return range(self.range.first, self.range.end)

    def __repr__(self) -> str:
        return (f"MemberTable({self.name!r}, shards {self.range.first}.."
                f"{self.range.end - 1}{', gone' if self.gone else ''})")


class MemberTables:
    """The member's tables by range (see the module docstring)."""

    def __init__(self, tables: Iterable[MemberTable], *, single: bool) -> None:
        self._tables = sorted(tables, key=lambda t: t.first)
        self._firsts = [t.first for t in self._tables]
        # Whether any table is bucket-unaware (the file rule): only their
        # starts can move, which the control round reads (member/control.py).
        self.any_file_rule = self._any_file_rule()
        self.single = single
        self.mirror = RoutedMirror(self)

    def _any_file_rule(self) -> bool:
        return any(ShardRule.parse(t.range.sharding) is ShardRule.FILE for t in self._tables)

    def __iter__(self) -> Iterator[MemberTable]:
        return iter(self._tables)

    def __len__(self) -> int:
        return len(self._tables)

    @property
    def only(self) -> MemberTable:
        """The one table of a group of one table."""
        assert self._tables, "no table"
        return self._tables[0]

    def of(self, shard: int) -> MemberTable:
        """The table holding group shard ``shard``; NotInMap if none does."""
        i = bisect.bisect_right(self._firsts, shard) - 1
        if i < 0 or shard >= self._tables[i].range.end:
            raise NotInMap(f"group shard {shard} is outside every table this member knows")
        return self._tables[i]

    def get(self, shard: int) -> MemberTable | None:
        try:
            return self.of(shard)
        except NotInMap:
            return None

    def gone(self, shard: int) -> MemberTable | None:
        """The table of group shard ``shard`` if the group has several and
        that table was found gone; None otherwise."""
        table = None if self.single else self.get(shard)
        return table if table is not None and table.gone is not None else None

    def by_table(self, shards: Iterable[int]) -> dict[MemberTable, list[int]]:
        """``shards`` grouped by their table (each list in the given order)."""
        out: dict[MemberTable, list[int]] = defaultdict(list)
        for shard in shards:
            out[self.of(shard)].append(shard)
        return dict(out)

    def rebind(self, meta: GroupMeta) -> None:
        """The group's record as a join (or a re-read) found it: each table
        sees its incarnation and identity from now on."""
        for table in self._tables:
            table.group_meta = meta
            if table.index is None:
                table.range = dataclasses.replace(table.range, table_id=meta.table_id,
                                                  shards=meta.num_shards,
                                                  sharding=meta.sharding)
        self.any_file_rule = self._any_file_rule()

    def with_tables(self, added: Iterable[MemberTable]) -> MemberTables:
        """These tables and ``added`` (ranges the map appended since)."""
        return MemberTables([*self._tables, *added], single=self.single)


class RoutedMirror:
    """The consumer files' mirror in group shard numbers: each call goes to
    the mirror of the shard's table, in the table's numbers."""

    def __init__(self, tables: MemberTables) -> None:
        self._tables = tables

    def _at(self, shard: int) -> tuple[ConsumerMirror, int]:
        table = self._tables.of(shard)
        return table.mirror, table.local(shard)

    @property
    def file_io(self) -> Any:
        """The file system of the first table's consumer files."""
        return self._tables.only.mirror.file_io

    def read_position(self, shard: int) -> MirroredPosition | None:
        mirror, local = self._at(shard)
        return mirror.read_position(local)

    def read(self, shard: int) -> int | None:
        mirror, local = self._at(shard)
        return mirror.read(local)

    def due(self, shard: int, next_snapshot: int, *, full_scan_pending: bool = False,
            start_moves: int | None = None) -> bool:
        if self._tables.of(shard).gone is not None:
            return False
        mirror, local = self._at(shard)
        return mirror.due(local, next_snapshot, full_scan_pending=full_scan_pending,
                          start_moves=start_moves)

    def write(self, shard: int, next_snapshot: int, *, force: bool = False,
              full_scan_pending: bool = False, start_moves: int | None = None) -> bool:
        if self._tables.of(shard).gone is not None:
            return False  # no file into a dropped table's directory (it would make it again)
        mirror, local = self._at(shard)
        return mirror.write(local, next_snapshot, force=force,
                            full_scan_pending=full_scan_pending, start_moves=start_moves)

    def write_many(self, shards: Sequence[int], next_snapshot: int, *,
                   full_scan_pending: bool = False,
                   start_moves: Mapping[int, int] | None = None) -> dict[int, BaseException]:
        """:meth:`ConsumerMirror.write_many`, one call per table; the errors by group shard."""
        moves = start_moves or {}
        failed: dict[int, BaseException] = {}
        for table, group_shards in self._tables.by_table(shards).items():
            if table.gone is not None:
                continue  # as write()
            locals_ = [table.local(s) for s in group_shards]
            errors = table.mirror.write_many(
                locals_, next_snapshot, full_scan_pending=full_scan_pending,
                start_moves={table.local(s): moves[s] for s in group_shards if s in moves})
            failed.update({table.group_shard(local): err for local, err in errors.items()})
        return failed

    def pending(self) -> dict[int, int]:
        """Nothing is buffered (:meth:`ConsumerMirror.pending`)."""
        return {}
