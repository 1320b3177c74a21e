"""Names: group names, member ids, the coordinator key layout, consumer ids.

Everything that becomes part of a coordinator key or a file name is validated
here, once, against ``[A-Za-z0-9._-]{1,128}`` (and may not be ``.`` or ``..``),
so that no user input can escape its directory in etcd, ZooKeeper, SQLite or
the table's ``consumer/`` directory.

Key layout of one group (relative to the coordinator's prefix or chroot)::

    groups/<group>                  persistent  group metadata: shard count, table
    groups/<group>/members/<id>     ephemeral   one per live member (its session)
    groups/<group>/leader           ephemeral   the leader; create version = leader epoch
    groups/<group>/assignment       persistent  generation + shards per member
    groups/<group>/owners/<shard>   ephemeral   ownership; create version = shard epoch
    groups/<group>/positions/<shard> persistent next snapshot to read (fenced writes)
    groups/<group>/leaving/<id>     persistent  a graceful goodbye, for static membership
    groups/<group>/removed/<id>     persistent  an operator removed the member's session
    groups/<group>/forced           persistent  bumped by each operator commit deleting owner keys

Example::

    >>> keys = GroupKeys("orders")
    >>> keys.owner(3)
    'groups/orders/owners/3'
    >>> consumer_id("orders", 3)
    'pg-orders-shard-3'
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from coordinators.errors import ConfigError

_NAME = re.compile(r"[A-Za-z0-9._-]{1,128}")


def validate_name(value: str, what: str) -> str:
    """``value`` if it is a valid group name / member id, else one-line ConfigError."""
    if not isinstance(value, str) or not _NAME.fullmatch(value) or value in (".", ".."):
        raise ConfigError(
            f"invalid {what} {value!r}: use 1 to 128 characters from A-Z a-z 0-9 . _ -"
        )
    return value


def validate_group(group: str) -> str:
    return validate_name(group, "group name")


def validate_member_id(member_id: str) -> str:
    return validate_name(member_id, "member id")


CONSUMER_ID_PREFIX = "pg-"


def origin_path(table_path: str, group: str) -> str:
    """``<table>/consumer/paimon-group-<group>.json``: which incarnation of the
    group wrote its consumer files (:mod:`paimon_group.reading.consumer_meta`)."""
    return f"{str(table_path).rstrip('/')}/consumer/paimon-group-{group}.json"


def consumer_id(group: str, shard: int) -> str:
    """The Paimon consumer id mirroring ``shard`` of ``group``: ``pg-<group>-shard-<k>``.

    Stable (a pure function of the group name and the shard), unique per shard,
    and valid as a Paimon consumer id (no path separators). The consumer file
    is ``<table>/consumer/consumer-pg-<group>-shard-<k>``.
    """
    validate_group(group)
    if shard < 0:
        raise ConfigError(f"invalid shard {shard}")
    return f"{CONSUMER_ID_PREFIX}{group}-shard-{shard}"


def consumer_id_pattern(group: str) -> str:
    """A regular expression matching every consumer id of ``group``."""
    return re.escape(f"{CONSUMER_ID_PREFIX}{validate_group(group)}-shard-") + r"\d+$"


@dataclass(frozen=True)
class GroupKeys:
    """The coordinator keys of one group."""

    group: str

    def __post_init__(self) -> None:
        validate_group(self.group)

    @staticmethod
    def all_groups() -> str:
        return "groups/"

    @property
    def root(self) -> str:
        return f"groups/{self.group}"

    @property
    def meta(self) -> str:
        return self.root

    @property
    def dir(self) -> str:
        return f"{self.root}/"

    @property
    def members_dir(self) -> str:
        return f"{self.root}/members/"

    def member(self, member_id: str) -> str:
        return f"{self.members_dir}{validate_member_id(member_id)}"

    @property
    def leader(self) -> str:
        return f"{self.root}/leader"

    @property
    def assignment(self) -> str:
        return f"{self.root}/assignment"

    @property
    def owners_dir(self) -> str:
        return f"{self.root}/owners/"

    def owner(self, shard: int) -> str:
        return f"{self.owners_dir}{shard}"

    @property
    def positions_dir(self) -> str:
        return f"{self.root}/positions/"

    def position(self, shard: int) -> str:
        return f"{self.positions_dir}{shard}"

    @property
    def leaving_dir(self) -> str:
        return f"{self.root}/leaving/"

    def leaving(self, member_id: str) -> str:
        return f"{self.leaving_dir}{validate_member_id(member_id)}"

    @property
    def removed_dir(self) -> str:
        return f"{self.root}/removed/"

    def removed(self, member_id: str) -> str:
        return f"{self.removed_dir}{validate_member_id(member_id)}"

    @property
    def forced(self) -> str:
        """Written by every operator commit that deletes owner keys
        (``reset --force``, ``members remove``): a member re-reads its own
        owner keys when this key moves (member/ownership.py), rather than
        on every check."""
        return f"{self.root}/forced"

    @property
    def head_dir(self) -> str:
        return f"{self.root}/table/"

    @property
    def head(self) -> str:
        """The table's latest snapshot id as the leader last polled it
        (:mod:`paimon_group.member.head`): a hint, never a position."""
        return f"{self.head_dir}head"

    @property
    def sinks_dir(self) -> str:
        return f"{self.root}/sinks/"

    def sink(self, name: str) -> str:
        """A target the group's output goes to (:mod:`paimon_group.protocol.sinks`)."""
        return f"{self.sinks_dir}{name}"

    @property
    def start(self) -> str:
        """The group's start: where every shard without a position begins."""
        return f"{self.root}/start"

    def table_dir(self, index: int) -> str:
        """The keys of the table at position ``index`` of a group of several
        tables' map (docs/many-tables.md)."""
        return f"{self.root}/tables/{index}/"

    @property
    def creating(self) -> str:
        """Held (ephemeral) by the member preparing a new group of several
        tables: the others wait for its record rather than each vetting every
        table's consumer files (member/membership.py)."""
        return f"{self.root}/creating"

    def table_start(self, index: int) -> str:
        """The start of the table at position ``index`` of a group of several
        tables' map (docs/many-tables.md): where its shards without a position
        begin. Ranges are never reused, so the key never changes table."""
        return f"{self.table_dir(index)}start"

    def start_of(self, index: int | None) -> str:
        """The start key of a table: the group's own (:attr:`start`) for a
        group of one table (``index`` None), else :meth:`table_start`."""
        return self.start if index is None else self.table_start(index)

    @staticmethod
    def last_segment(key: str) -> str:
        return key.rsplit("/", 1)[-1]

    @staticmethod
    def shard_of(key: str) -> int | None:
        """The shard an owner or position key is of (None: no shard's key)."""
        last = GroupKeys.last_segment(key)
        return int(last) if last.isdigit() else None
