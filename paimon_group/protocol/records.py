"""Typed records stored as JSON values in the coordinator.

Each record knows how to encode itself and how to decode a stored value;
a value that cannot be decoded raises :class:`~coordinators.errors.CorruptValue`
naming the key, never a bare ``KeyError`` or ``JSONDecodeError``.

Example::

    >>> p = Position(next_snapshot=12, epoch=7, member_id="m1", committed_at=0.0)
    >>> Position.decode("k", p.encode()).next_snapshot
    12
"""

from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass, field
from typing import Any, Self

from coordinators.errors import CorruptValue
from paimon_group.errors import IncompatibleVersion
from paimon_group.protocol.table_map import TableMap
from paimon_group.version import __version__

FORMAT_VERSION = 1
"""The format of the records this version writes, and the highest it reads.

Every record of 0.1.0 and 0.2.0 is format 1: fields are only added, each with
a default that means what a record without it meant, so a member of either
version reads the other's records (an older one ignores the fields it does not
know). A release that changes what an existing field means writes a higher
``format`` into the records it changes; a member that reads a record of a
format above its own refuses in one line naming both versions
(:func:`check_format`). A record without ``format`` is format 1.
docs/design.md, "Versions and compatibility".
"""

TABLES_FEATURE = "tables"
"""The feature of a group of several tables (its record has a table map,
docs/many-tables.md): a member of a release without it cannot follow one."""

FEATURES: frozenset[str] = frozenset({TABLES_FEATURE})
"""The group features this version follows. A feature older members
cannot follow is named in the group record (:attr:`GroupMeta.features`) only
once every live member lists it in its :attr:`MemberInfo.features`
(:func:`unable_to_follow`); a member that finds a feature it does not know in
use refuses to join (:func:`check_can_follow`).

``tables`` is named by a group of several tables from its creation (no older
member can be in it then: its record is new); a group of one table never
names it, so it meets 0.1.0 and 0.2.0 members as before."""


def check_format(key: str, data: dict[str, Any]) -> None:
    """Refuse a record of a newer format (one line, both versions)."""
    fmt = data.get("format", FORMAT_VERSION)
    if isinstance(fmt, int) and fmt > FORMAT_VERSION:
        by = data.get("written_by")
        raise IncompatibleVersion(
            f"the record at coordinator key {key!r} has format {fmt}"
            f"{f' (written by paimon-group {by})' if by else ''}; this member is "
            f"paimon-group {__version__}, which reads format {FORMAT_VERSION}: "
            f"upgrade it to {by or 'the version that wrote it'} or later")


def _load(key: str, value: bytes) -> dict[str, Any]:
    try:
        data = json.loads(value.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CorruptValue(f"corrupt value at coordinator key {key!r}: not JSON") from err
    if not isinstance(data, dict):
        raise CorruptValue(f"corrupt value at coordinator key {key!r}: not a JSON object")
    return data


class _Record:
    def encode(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":")).encode()  # type: ignore[call-overload]

    @classmethod
    def decode(cls, key: str, value: bytes) -> Self:
        data = _load(key, value)
        check_format(key, data)
        try:
            return cls._from_dict(data)
        except (KeyError, TypeError, ValueError) as err:
            raise CorruptValue(
                f"corrupt value at coordinator key {key!r}: {type(err).__name__}: {err}"
            ) from err

    @classmethod
    def _from_dict(cls, data: dict[str, Any]) -> Self:
        fields = cls.__dataclass_fields__  # type: ignore[attr-defined]
        return cls(**{k: v for k, v in data.items() if k in fields})


@dataclass(frozen=True)
class GroupMeta(_Record):
    """``groups/<group>``: fixed at creation; a different shard count is an error.

    ``sharding`` is the group's sharding rule (a
    :class:`~paimon_group.protocol.sharding.ShardRule` value), chosen at creation; a
    record stored without one (older groups) decodes as ``"bucket"``, the
    ``bucket % num_shards`` those groups were created with.

    ``incarnation`` is a random id given to the group when it is created (a
    group re-created after a wiped or switched coordinator gets a new one):
    the Paimon consumer files record which incarnation wrote them
    (:mod:`paimon_group.reading.consumer_meta`). ``table_id`` is the identity of the
    table the group was created on (:func:`paimon_group.protocol.identity.table_identity`):
    a table dropped and re-created under the same name has another one.
    ``warehouse`` is the normalised URI of the warehouse the group was created
    on (:func:`paimon_group.config.warehouses.normalised_warehouse`, never with
    credentials): a coordinator shared by several warehouses keeps each group
    to its own (:func:`paimon_group.protocol.identity.check_group_warehouse`).
    All three are empty in records of groups created before they existed
    (unknown: not checked).

    ``assignor`` is how the leader assigns shards (``count`` or ``load``, see
    :data:`paimon_group.protocol.assignor.ASSIGNORS`), chosen at creation; a record
    stored without one decodes as ``"count"``.

    ``features`` are the group features in use that a member must follow to
    take part (:data:`FEATURES`; empty in every group of 0.1.0 and 0.2.0), and
    ``written_by`` the version that wrote the record (this one's when
    created here; empty in 0.1.0's).

    ``tables`` is the table map of a group of several tables
    (:class:`~paimon_group.protocol.table_map.TableMap`: each table's range of the
    group's shards); None for a group of one table, whose record is encoded
    without it, byte for byte as before it existed.
    """

    num_shards: int
    table: str
    created_at: float
    format: int = FORMAT_VERSION
    sharding: str = "bucket"
    incarnation: str = ""
    table_id: str = ""
    warehouse: str = ""
    assignor: str = "count"
    features: tuple[str, ...] = ()
    written_by: str = __version__
    tables: TableMap | None = None

    def encode(self) -> bytes:
        data = {f: getattr(self, f) for f in self.__dataclass_fields__ if f != "tables"}
        if self.tables is not None:
            data["tables"] = self.tables.encode()
        return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def _from_dict(cls, data: dict[str, Any]) -> GroupMeta:
        tables = data.get("tables")
        meta = GroupMeta(
            num_shards=int(data["num_shards"]),
            table=str(data["table"]),
            created_at=float(data["created_at"]),
            format=int(data.get("format", FORMAT_VERSION)),
            sharding=str(data.get("sharding") or "bucket"),
            incarnation=str(data.get("incarnation") or ""),
            table_id=str(data.get("table_id") or ""),
            warehouse=str(data.get("warehouse") or ""),
            assignor=str(data.get("assignor") or "count"),
            features=tuple(str(f) for f in data.get("features") or ()),
            written_by=str(data.get("written_by") or ""),
            tables=None if tables is None else TableMap.decode(tables),
        )
        from paimon_group.protocol.assignor import ASSIGNORS
        from paimon_group.protocol.sharding import ShardRule

        if meta.assignor not in ASSIGNORS:  # written by a newer version, or damaged
            raise ValueError(f"unknown assignor {meta.assignor!r}")
        ShardRule.parse(meta.sharding)  # an unknown rule is a corrupt value
        if meta.num_shards < 1:
            raise ValueError("num_shards < 1")
        if meta.tables is not None and meta.tables.total_shards != meta.num_shards:
            raise ValueError(f"num_shards {meta.num_shards} is not the table map's "
                             f"{meta.tables.total_shards}")
        return meta


@dataclass(frozen=True)
class MemberInfo(_Record):
    """``groups/<group>/members/<id>``: who a live member is; ``version`` its
    release, ``features`` the group features it can follow (:data:`FEATURES`;
    absent in 0.1.0's records: none)."""

    member_id: str
    host: str
    pid: int
    version: str
    started_at: float
    session: str = ""
    features: tuple[str, ...] = ()

    @classmethod
    def _from_dict(cls, data: dict[str, Any]) -> MemberInfo:
        return MemberInfo(
            member_id=str(data["member_id"]), host=str(data["host"]), pid=int(data["pid"]),
            version=str(data["version"]), started_at=float(data["started_at"]),
            session=str(data.get("session") or ""),
            features=tuple(str(f) for f in data.get("features") or ()))


def check_can_follow(meta: GroupMeta, group: str) -> None:
    """Refuse a group that uses a feature this version cannot follow (one
    line, both versions): the member must not join it."""
    unknown = sorted(set(meta.features) - FEATURES)
    if unknown:
        by = f"paimon-group {meta.written_by}" if meta.written_by else "a newer version"
        raise IncompatibleVersion(
            f"group {group!r} uses feature{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(unknown)} (switched on by {by}), which this member, "
            f"paimon-group {__version__}, cannot follow: upgrade it to {by} or later")


def unable_to_follow(feature: str, members: list[MemberInfo]) -> list[str]:
    """The members that cannot follow ``feature``: it may be switched on
    (named in :attr:`GroupMeta.features`) only when there are none."""
    return sorted(m.member_id for m in members if feature not in m.features)


@dataclass(frozen=True)
class Assignment(_Record):
    """``groups/<group>/assignment``: published by the leader, guarded by its epoch."""

    generation: int
    leader: str
    leader_epoch: int
    shards: dict[str, list[int]] = field(default_factory=dict)
    published_at: float = 0.0
    # Static membership: the shards each member last held, kept while it is
    # away (with the wall time it left), so that a member restarting with the
    # same id gets exactly its own shards back and no other member's move.
    home: dict[str, list[int]] = field(default_factory=dict)
    away_since: dict[str, float] = field(default_factory=dict)
    # The load of each shard (index = shard) the leader of a group with the
    # load assignor computed this assignment with; empty for the count
    # assignor and in records stored before loads were published.
    loads: list[int] = field(default_factory=list)

    def shards_of(self, member_id: str) -> list[int]:
        return list(self.shards.get(member_id, []))

    def owner_of(self, shard: int) -> str | None:
        for member, shards in self.shards.items():
            if shard in shards:
                return member
        return None

    @classmethod
    def _from_dict(cls, data: dict[str, Any]) -> Assignment:
        # Every member decodes each new generation (with thousands of shards,
        # most of its cost): ``map`` rather than a generator per list.
        shards = {str(m): sorted(map(int, v)) for m, v in dict(data["shards"]).items()}
        return Assignment(
            generation=int(data["generation"]),
            leader=str(data["leader"]),
            leader_epoch=int(data["leader_epoch"]),
            shards=shards,
            published_at=float(data.get("published_at", 0.0)),
            home={str(m): sorted(map(int, v)) for m, v in dict(data.get("home", {})).items()},
            away_since={str(m): float(t) for m, t in dict(data.get("away_since", {})).items()},
            loads=[int(x) for x in data.get("loads") or []],
        )


@functools.lru_cache(maxsize=4)
def decoded_assignment(key: str, value: bytes) -> Assignment:
    """The assignment stored as ``value``, decoded once per process.

    Re-read on every control round and decoded only when it changed; shared
    by every member of the process, which read the same bytes (with 8,192
    shards the JSON is about 100 KB: 500 members of one process each
    decoding it put 5-7 s between a publication and the releases it asks
    for, docs/benchmarks.md (14)). Read-only: nobody changes a decoded one."""
    return Assignment.decode(key, value)


@functools.lru_cache(maxsize=4)
def decoded_meta(key: str, value: bytes) -> GroupMeta:
    """The group record stored as ``value``, decoded once per process.

    A member of a group of several tables reads it in every full control
    round (member/round_view.py); its table map is most of it (200 tables:
    about 2 ms to decode and check), and the members of a process read the
    same bytes. Read-only, as :func:`decoded_assignment`'s."""
    return GroupMeta.decode(key, value)


@dataclass(frozen=True)
class Owner(_Record):
    """``groups/<group>/owners/<shard>``: its create version is the shard's epoch.

    ``session`` is the coordinator session that created it, so a member whose
    create had an unknown outcome (a timeout after the write landed) can
    recognise and adopt its own key instead of leaving the shard stuck.
    """

    member_id: str
    generation: int
    session: str = ""


@dataclass(frozen=True)
class GroupStart(_Record):
    """``groups/<group>/start``: where every shard without a position starts.

    Resolved once for the whole group (from ``--start`` against the table)
    by the first member that needs it, and created if absent: every other
    member, and every later round, starts its shards from this same snapshot.
    On bucket-unaware tables a row's shard is the hash of its file, and a
    compaction moves rows into other files: shards started from different
    snapshots with a compaction in between would lose or repeat the rows it
    moved. ``full_scan`` is the snapshot to scan in full first (None:
    follow-ups only), ``next_snapshot`` where follow-ups begin; ``start`` the
    ``--start`` text it was resolved from.

    ``moves``: how many times the start moved forward since it was resolved
    (``--on-data-loss skip`` on a bucket-unaware table, when the full scan of
    ``moved_from`` expired before a shard delivered it:
    :func:`~paimon_group.protocol.group_start.move_group_start`); then
    ``resolved_at`` and ``resolved_by`` say when and by whom it moved. Every
    shard's position records the ``moves`` of the start its reading derives
    from (:attr:`Position.start_moves`): a shard of an earlier one scans the
    moved start again.
    """

    next_snapshot: int
    full_scan: int | None
    start: str
    resolved_at: float = 0.0
    resolved_by: str = ""
    moves: int = 0
    moved_from: int | None = None

    @classmethod
    def _from_dict(cls, data: dict[str, Any]) -> GroupStart:
        full = data.get("full_scan")
        moved_from = data.get("moved_from")
        return GroupStart(next_snapshot=int(data["next_snapshot"]),
                          full_scan=None if full is None else int(full),
                          start=str(data.get("start", "")),
                          resolved_at=float(data.get("resolved_at", 0.0)),
                          resolved_by=str(data.get("resolved_by", "")),
                          moves=int(data.get("moves") or 0),
                          moved_from=None if moved_from is None else int(moved_from))


@dataclass(frozen=True)
class RemovedMember(_Record):
    """``groups/<group>/removed/<id>``: an operator removed the member whose
    member key belonged to ``session`` (``members remove``), at ``removed_at``."""

    session: str
    removed_at: float = 0.0


@dataclass(frozen=True)
class OwnersForced(_Record):
    """``groups/<group>/forced``: the last operator commit that deleted
    owner keys (``reset --force``, ``members remove``), by ``actor`` at
    ``forced_at``. Members read only that it moved (its version), not its value."""

    actor: str
    forced_at: float = 0.0


@dataclass(frozen=True)
class Position(_Record):
    """``groups/<group>/positions/<shard>``: the next snapshot id to read."""

    next_snapshot: int
    epoch: int
    member_id: str
    committed_at: float
    # A full scan of this snapshot is pinned but not yet delivered: the next
    # owner scans exactly this snapshot again (so a replay is identical), and
    # then continues at ``next_snapshot``.
    full_scan: int | None = None
    # The ``moves`` of the group start this shard's reading derives from
    # (GroupStart.moves); None in positions written by an operator (reset) or
    # before starts moved: the next owner takes the group's current start's.
    start_moves: int | None = None

    @property
    def effective(self) -> int:
        """The oldest snapshot this shard still needs (for lag and expiration)."""
        return self.full_scan if self.full_scan is not None else self.next_snapshot

    @property
    def order(self) -> tuple[int, int, int]:
        """Where this position is in the order positions advance (see
        :func:`position_order`)."""
        return position_order(self.next_snapshot, self.full_scan, self.start_moves or 0)

    @classmethod
    def _from_dict(cls, data: dict[str, Any]) -> Position:
        full = data.get("full_scan")
        pos = Position(
            next_snapshot=int(data["next_snapshot"]),
            epoch=int(data["epoch"]),
            member_id=str(data["member_id"]),
            committed_at=float(data["committed_at"]),
            full_scan=None if full is None else int(full),
            start_moves=None if data.get("start_moves") is None else int(data["start_moves"]),
        )
        if pos.next_snapshot < 1:
            raise ValueError("next_snapshot < 1")
        return pos


def position_order(next_snapshot: int, full_scan: int | None,
                   start_moves: int = 0) -> tuple[int, int, int]:
    """Positions in the order they advance: by the moves of the group start
    they derive from (a shard re-pinned at a moved start is past everything
    it read from the earlier one, though it scans an earlier snapshot than it
    may have reached: :class:`GroupStart`), then by ``next_snapshot``, and at
    one ``next_snapshot`` a pending full scan before its delivery (a pinned
    start ``(n, full_scan=n-1)`` is followed by ``(n, None)`` once the scan
    is delivered)."""
    return (start_moves, next_snapshot, 0 if full_scan is not None else 1)
