"""The table map of a group of several tables: which of the group's shards are whose.

A group's shards stay integers ``0..S-1`` whatever it reads; a group of several
tables keeps, in its group record (:attr:`~paimon_group.protocol.records.GroupMeta.tables`),
one :class:`TableRange` per table: its name, its identity, its sharding rule and the
contiguous range ``first .. first + shards - 1`` of the group's shards it owns. Group
shard ``k`` is shard ``k - first`` of the table whose range holds it, so every record
that names shards (owners, epochs, positions, the assignment) keeps its meaning and its
invariants. docs/many-tables.md is the design.

The invariants, kept by every operation and checked on every decode:

* the ranges are in order and contiguous from 0 (no gap, no overlap): the map's
  :attr:`TableMap.total_shards` is the group's shard count;
* a range is never reused nor moved: a new table gets the next free range
  (:meth:`TableMap.append`), a dropped one keeps its range, marked
  (:meth:`TableMap.drop`), and a table re-created under its name is a new range. So
  a position key never changes table;
* at most one live range per name.

An append that would make the encoded map longer than :data:`MAX_ENCODED_BYTES` is
refused (the group record is one coordinator value); a stored map is read whatever
its length.

Examples::

    >>> tables = TableMap().append("shop.orders", "schema-0@1", 4, "bucket")
    >>> tables = tables.append("shop.items", "schema-0@2", 2, "bucket")
    >>> tables.total_shards, tables.to_group_shard("shop.items", 1)
    (6, 5)
    >>> table, local = tables.locate(5)
    >>> table.name, local
    ('shop.items', 1)
    >>> tables.spread_order()
    [0, 4, 1, 5, 2, 3]
    >>> tables = tables.drop("shop.orders", at=100.0)
    >>> tables = tables.append("shop.orders", "schema-0@3", 4, "bucket")
    >>> [(t.name, t.first, t.dropped_at) for t in tables.ranges]
    [('shop.orders', 0, 100.0), ('shop.items', 4, None), ('shop.orders', 6, None)]
    >>> tables.spread_order()
    [4, 6, 5, 7, 8, 9]
    >>> TableMap.decode(tables.encode()) == tables
    True
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from coordinators.errors import ConfigError
from paimon_group.protocol.sharding import ShardRule

__all__ = ["MAX_ENCODED_BYTES", "NotInMap", "TableMap", "TableRange"]

MAX_ENCODED_BYTES = 512 * 1024
"""The longest encoded table map. The group record is one coordinator value, and
ZooKeeper refuses a request over its ``jute.maxbuffer`` (1048575 bytes by default:
:data:`coordinators.zookeeper.limits.JUTE_MAXBUFFER`; etcd's default request limit
is 1.5 MiB): half of it leaves the rest of the record and of its guarded commit
room. A table of 8 shards named ``warehouse_db.orders_00001`` takes 118 bytes:
4,454 such tables fit (tests/test_table_map.py); with shorter names, some 4,800."""


class NotInMap(LookupError):
    """A group shard outside every range, or a table the map does not name."""


@dataclass(frozen=True)
class TableRange:
    """One table of the group: ``name`` (``database.table``), ``table_id`` (its
    identity, :func:`~paimon_group.protocol.identity.table_identity`), the group
    shards ``first .. first + shards - 1`` it owns, its ``sharding`` rule (a
    :class:`~paimon_group.protocol.sharding.ShardRule` value) and ``dropped_at``
    (the wall time it was found dropped; None while it is live)."""

    name: str
    table_id: str
    first: int
    shards: int
    sharding: str = "bucket"
    dropped_at: float | None = None

    @property
    def end(self) -> int:
        """The first group shard after this range."""
        return self.first + self.shards

    @property
    def live(self) -> bool:
        return self.dropped_at is None

    def encode(self) -> dict[str, Any]:
        data: dict[str, Any] = {"name": self.name, "table_id": self.table_id,
                                "first": self.first, "shards": self.shards,
                                "sharding": self.sharding}
        if self.dropped_at is not None:
            data["dropped_at"] = self.dropped_at
        return data

    @classmethod
    def decode(cls, data: Any) -> TableRange:
        """The range ``data`` encodes (fields it does not know are ignored: a
        newer version's); ValueError if it is not one."""
        if not isinstance(data, dict):
            raise ValueError(f"a table range is not a JSON object: {data!r}")
        try:
            dropped = data.get("dropped_at")
            table = TableRange(
                name=_text(data["name"], "name"), table_id=_text(data["table_id"], "table_id"),
                first=_whole(data["first"], "first"), shards=_whole(data["shards"], "shards"),
                sharding=_text(data.get("sharding", "bucket"), "sharding"),
                dropped_at=None if dropped is None else _time(dropped))
        except KeyError as err:
            raise ValueError(f"a table range without {err.args[0]!r}: {data!r}") from None
        table.check()
        return table

    def check(self) -> None:
        """ValueError unless the range's own fields are valid."""
        _check_name(self.name)
        if self.first < 0:
            raise ValueError(f"table {self.name!r}: negative first shard {self.first}")
        if self.shards < 1:
            raise ValueError(f"table {self.name!r}: {self.shards} shards (at least 1)")
        ShardRule.parse(self.sharding)


@dataclass(frozen=True)
class TableMap:
    """The tables of a group, their ranges in order (see the module docstring)."""

    ranges: tuple[TableRange, ...] = ()

    def __post_init__(self) -> None:
        _check_ranges(self.ranges)

    def __iter__(self) -> Iterator[TableRange]:
        return iter(self.ranges)

    def __len__(self) -> int:
        return len(self.ranges)

    @property
    def total_shards(self) -> int:
        """The group's shard count: the end of the last range (dropped ones included)."""
        return self.ranges[-1].end if self.ranges else 0

    def live(self) -> tuple[TableRange, ...]:
        """The ranges of the tables still there, in order."""
        return tuple(t for t in self.ranges if t.live)

    def index_of(self, name: str) -> int:
        """The position in :attr:`ranges` of the live table ``name``."""
        for index, table in enumerate(self.ranges):
            if table.live and table.name == name:
                return index
        raise NotInMap(f"the group reads no table {name!r}")

    def to_group_shard(self, table: int | str, local: int) -> int:
        """The group shard of shard ``local`` of ``table`` (its position in
        :attr:`ranges`, or the name of a live table)."""
        index = self.index_of(table) if isinstance(table, str) else table
        if not 0 <= index < len(self.ranges):
            raise NotInMap(f"no table at position {index} of {len(self.ranges)}")
        found = self.ranges[index]
        if not 0 <= local < found.shards:
            raise NotInMap(f"table {found.name!r} has {found.shards} shards: no shard {local}")
        return found.first + local

    def locate(self, group_shard: int) -> tuple[TableRange, int]:
        """The table whose range holds ``group_shard``, and its shard there."""
        starts = [t.first for t in self.ranges]
        index = bisect.bisect_right(starts, group_shard) - 1
        if group_shard < 0 or index < 0 or group_shard >= self.ranges[index].end:
            raise NotInMap(f"group shard {group_shard} is outside every table's range "
                           f"(the map's shards are 0..{self.total_shards - 1})")
        found = self.ranges[index]
        return found, group_shard - found.first

    def append(self, name: str, table_id: str, shards: int, sharding: str) -> TableMap:
        """This map with ``name`` in the next free range. ValueError for a live
        table of that name; ConfigError (one line, not retriable) when the map
        would no longer fit :data:`MAX_ENCODED_BYTES`."""
        return self.extend([(name, table_id, shards, sharding)])

    def extend(self, tables: Iterable[tuple[str, str, int, str]]) -> TableMap:
        """:meth:`append` of each ``(name, table_id, shards, sharding)`` in
        turn, raising as the first append that would; the map is checked and
        sized once (a group of hundreds of tables is made in one go: appended
        one by one, each append checked and encoded the whole map again)."""
        live = {t.name for t in self.ranges if t.live}
        ranges = list(self.ranges)
        size = self.encoded_size()
        for name, table_id, shards, sharding in tables:
            if name in live:
                raise ValueError(f"table {name!r} is in the group already")
            table = TableRange(name=name, table_id=table_id,
                               first=ranges[-1].end if ranges else 0,
                               shards=shards, sharding=sharding)
            table.check()
            # A compact list's bytes: "[", its items joined by ",", "]".
            size += _encoded_size(table.encode()) + (1 if ranges else 0)
            ranges.append(table)
            live.add(name)
            if size > MAX_ENCODED_BYTES:
                raise ConfigError(
                    f"table {name!r} cannot join the group: its table map would be {size} "
                    f"bytes ({len(ranges)} tables), over the {MAX_ENCODED_BYTES} a group "
                    "record holds; subscribe this group to fewer tables and read the others "
                    "in another group")
        return TableMap(tuple(ranges))

    def drop(self, name: str, at: float) -> TableMap:
        """This map with the live table ``name`` marked dropped at ``at``; its
        range stays, never to be reused."""
        index = self.index_of(name)
        ranges = list(self.ranges)
        old = ranges[index]
        ranges[index] = TableRange(name=old.name, table_id=old.table_id, first=old.first,
                                   shards=old.shards, sharding=old.sharding, dropped_at=at)
        return TableMap(tuple(ranges))

    def spread_order(self) -> list[int]:
        """The live tables' group shards in the order the count assignor deals
        them (:func:`~paimon_group.protocol.assignor.assign`'s ``order``): shard 0
        of every live table, then shard 1 of every live table, and so on, so that
        each member gets a share of every table rather than whole tables."""
        live = self.live()
        deepest = max((t.shards for t in live), default=0)
        return [t.first + local for local in range(deepest) for t in live if local < t.shards]

    def encode(self) -> list[dict[str, Any]]:
        """The map as plain JSON values (a list of objects, in range order)."""
        return [t.encode() for t in self.ranges]

    def encoded_size(self) -> int:
        """The bytes of the map in a group record (compact JSON)."""
        return _encoded_size(self.encode())

    @classmethod
    def decode(cls, data: Any) -> TableMap:
        """The map ``data`` encodes; ValueError (the record is corrupt) if it is
        not a valid one: overlapping, gapped or negative ranges, a live name twice."""
        if not isinstance(data, list):
            raise ValueError(f"a table map is not a JSON list: {type(data).__name__}")
        return TableMap(tuple(TableRange.decode(item) for item in data))


def _encoded_size(data: Any) -> int:
    return len(json.dumps(data, sort_keys=True, separators=(",", ":")).encode())


def _check_ranges(ranges: tuple[TableRange, ...]) -> None:
    """ValueError unless ``ranges`` are contiguous from 0 with one live range a name."""
    end = 0
    live: set[str] = set()
    for table in ranges:
        table.check()
        if table.first < end:
            raise ValueError(f"table {table.name!r}: its range from shard {table.first} "
                             f"overlaps the one before it (which ends at {end - 1})")
        if table.first > end:
            raise ValueError(f"table {table.name!r}: its range starts at shard {table.first}, "
                             f"not {end} (ranges are contiguous)")
        if table.live:
            if table.name in live:
                raise ValueError(f"table {table.name!r} is live in two ranges")
            live.add(table.name)
        end = table.end


def _check_name(name: str) -> None:
    database, dot, table = name.partition(".")
    if not (database and dot and table):
        raise ValueError(f"table name {name!r} is not 'database.table'")


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{what} is not a string: {value!r}")
    return value


def _whole(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{what} is not an integer: {value!r}")
    return value


def _time(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"dropped_at is not a number: {value!r}")
    return float(value)
