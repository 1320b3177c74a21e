"""The sharding rule of a group: which shard holds which rows of the table.

A rule is chosen once, when the group is created, from the table's bucket
mode, its partitioning and its options; it is stored in the group's metadata
beside the shard count (:class:`~paimon_group.protocol.records.GroupMeta`) and never
changes for that group. A group stored without a rule (created before rules
existed) keeps :attr:`ShardRule.BUCKET`. The planner, the batch's routing
check, describe/lag and metrics all route through :class:`Sharding`, so a
row is counted, planned and checked in the same shard everywhere.

The rules, for ``S`` shards:

* :attr:`ShardRule.BUCKET` -- ``bucket % S``. Non-partitioned bucketed
  tables (fixed or dynamic buckets), and every group stored without a rule.
* :attr:`ShardRule.PARTITION_BUCKET` -- ``(h(partition) % S + bucket) % S``,
  Paimon's own Flink source assignment (``read.shuffle-bucket-with-partition``,
  on by default), with ``h`` a stable hash (:func:`partition_hash`), so that
  the same bucket number of different partitions lands on different shards.
  Partitioned tables with buckets (fixed, dynamic or postpone). A table that sets
  ``read.shuffle-bucket-with-partition = false`` gets :attr:`ShardRule.BUCKET`.
* :attr:`ShardRule.FILE` -- ``h(partition, file name) % S``
  (:func:`file_hash`). Bucket-unaware append tables: every file is in bucket
  0, so files are the unit. The rows of one file stay in order; there is no
  order across files (as in Paimon's own unordered append reads).

Every rule keeps each primary key in one shard: Paimon never moves a key
between buckets (nor partitions, for the tables accepted here), and a
file-sharded table has no key. The hash is blake2b of the partition's
values, never Python's ``hash()`` (salted per process).

Example::

    sharding = Sharding(ShardRule.PARTITION_BUCKET, num_shards=8)
    shard = sharding.shard_of(("2024-01-01",), bucket=1, file_name="data-1.parquet")
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from coordinators.errors import ConfigError
from paimon_group.errors import PlanInvariantViolated, UnsupportedTable
from paimon_group.store.files import is_object_store
from paimon_group.store.handed_over import HandedOverFileIO

__all__ = [
    "DEFAULT_SHARDS",
    "ShardRule",
    "Sharding",
    "TableKind",
    "check_shard_count",
    "choose_rule",
    "default_shards",
    "file_hash",
    "idle_shards_note",
    "partition_hash",
    "plan_new_group",
    "table_kind",
]

DEFAULT_SHARDS = 4
"""Shard count of a new group on a table without a fixed bucket count
(dynamic-bucket, bucket-unaware and postpone-bucket tables)."""

SHUFFLE_OPTION = "read.shuffle-bucket-with-partition"


class TableKind(enum.Enum):
    """A table's bucket mode, as far as sharding is concerned."""

    FIXED = "fixed"
    """``bucket > 0``: primary-key tables and append tables with a bucket key."""

    DYNAMIC = "dynamic"
    """Primary-key table with ``bucket = -1``: buckets appear as partitions grow."""

    UNAWARE = "unaware"
    """Append table with ``bucket = -1``: every file is in bucket 0."""

    POSTPONE = "postpone"
    """Primary-key table with ``bucket = -2``: rows wait for compaction to get a bucket."""


class ShardRule(enum.Enum):
    """How a group maps rows to shards (stored by value in the group metadata)."""

    BUCKET = "bucket"
    PARTITION_BUCKET = "partition-bucket"
    FILE = "file"

    @classmethod
    def parse(cls, value: str | None) -> ShardRule:
        """The stored rule; a record without one keeps :attr:`BUCKET`."""
        if value is None or value == "":
            return cls.BUCKET
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"unknown sharding rule {value!r}") from None

    @property
    def formula(self) -> str:
        return _FORMULAS[self]


_FORMULAS = {
    ShardRule.BUCKET: "bucket % shards",
    ShardRule.PARTITION_BUCKET: "(hash(partition) % shards + bucket) % shards",
    ShardRule.FILE: "hash(partition, file name) % shards",
}


def _changelog_producer(table: Any) -> str:
    producer = table.options.changelog_producer()
    return str(getattr(producer, "value", producer) or "none")


def table_kind(table: Any, identifier: str) -> TableKind:
    """The kind of the pypaimon ``table``; :class:`UnsupportedTable` (one line,
    naming the reason) for the variants a group cannot read shard by shard."""
    bucket = int(table.options.bucket())
    is_pk = bool(table.is_primary_key_table)
    if bucket > 0:
        return TableKind.FIXED
    if bucket == -1 and not is_pk:
        return TableKind.UNAWARE
    if bucket == -1:
        if bool(table.cross_partition_update):
            raise UnsupportedTable(
                f"table {identifier} is a dynamic-bucket primary-key table whose key does not "
                "contain its partition keys (cross-partition update): a key moves between "
                "partitions through a global index that pypaimon cannot read, so its versions "
                "could not be kept in one shard; add the partition keys to the primary key"
            )
        return TableKind.DYNAMIC
    if bucket == -2:
        if _changelog_producer(table) not in ("lookup", "full-compaction"):
            raise UnsupportedTable(
                f"table {identifier} uses postpone buckets (bucket = -2) without a "
                "compaction-made changelog: new rows wait in a pending bucket that no reader "
                "sees until a compaction assigns them a bucket, and that compaction commits "
                "them in COMPACT snapshots, which a streaming read skips, so the group would "
                "deliver nothing; set 'changelog-producer' to 'lookup' (or use a fixed "
                "'bucket' count, or bucket = -1)"
            )
        return TableKind.POSTPONE
    raise UnsupportedTable(f"table {identifier} has unsupported bucket option {bucket}")


def choose_rule(table: Any, kind: TableKind) -> ShardRule:
    """The rule a NEW group on ``table`` gets (see the module docstring)."""
    if kind is TableKind.UNAWARE:
        return ShardRule.FILE
    partitioned = bool(table.partition_keys)
    shuffle = str(table.table_schema.options.get(SHUFFLE_OPTION, "true")).lower() != "false"
    if partitioned and shuffle:
        return ShardRule.PARTITION_BUCKET
    return ShardRule.BUCKET


def default_shards(kind: TableKind, num_buckets: int | None) -> int:
    """Shard count of a new group when ``--shards`` is not given: the bucket
    count of a fixed-bucket table, else :data:`DEFAULT_SHARDS`."""
    if kind is TableKind.FIXED and num_buckets:
        return num_buckets
    return DEFAULT_SHARDS


def check_shard_count(
    identifier: str, kind: TableKind, rule: ShardRule, num_shards: int,
    num_buckets: int | None, partitioned: bool, max_buckets: int | None = None,
) -> None:
    """Refuse (one line, :class:`ConfigError`) a NEW group whose shards the
    table can never all fill: under ``bucket % S`` on a non-partitioned
    fixed-bucket table, shards ``>= buckets`` would stay empty for ever; the
    same on a non-partitioned dynamic-bucket table capped by
    ``dynamic-bucket.max-buckets``."""
    if (
        kind is TableKind.DYNAMIC
        and rule is ShardRule.BUCKET
        and not partitioned
        and max_buckets is not None
        and 0 < max_buckets < num_shards
    ):
        raise ConfigError(
            f"--shards {num_shards} is more than the at most {max_buckets} buckets of table "
            f"{identifier} ('dynamic-bucket.max-buckets'): shards "
            f"{max_buckets}..{num_shards - 1} would never get a row; use --shards "
            f"{max_buckets} or fewer"
        )
    if (
        kind is TableKind.FIXED
        and rule is ShardRule.BUCKET
        and num_buckets is not None
        and num_shards > num_buckets
        and not partitioned
    ):
        raise ConfigError(
            f"--shards {num_shards} is more than the {num_buckets} buckets of table "
            f"{identifier}: shards {num_buckets}..{num_shards - 1} would never get a row; "
            f"use --shards {num_buckets} or fewer"
        )


def plan_new_group(table: Any, shards: int | None) -> tuple[int, ShardRule]:
    """Shard count and rule of a new group on ``table`` (a
    :class:`~paimon_group.reading.table.ShardedTable`), ``shards`` being ``--shards``
    or None; refuses counts the table can never fill (:func:`check_shard_count`)."""
    rule: ShardRule = table.default_rule
    count = int(shards) if shards is not None else int(table.default_shards)
    max_buckets = table.table.options.dynamic_bucket_max_buckets()
    check_shard_count(
        table.identifier, table.kind, rule, count, table.num_buckets, table.partitioned,
        None if max_buckets is None else int(max_buckets),
    )
    return count, rule


def idle_shards_note(table: Any, sharding: Sharding) -> str | None:
    """One line when the files of ``table``'s latest snapshot (a
    :class:`~paimon_group.reading.table.ShardedTable`) reach fewer shards than the
    group has, saying why; None when every shard has rows (or the table is
    empty). Reads the latest snapshot's manifests once: for a new group."""
    from pypaimon.manifest.manifest_file_manager import ManifestFileManager
    from pypaimon.manifest.manifest_list_manager import ManifestListManager

    latest = table.latest_snapshot_id()
    snapshot = None if latest is None else table.snapshot(latest)
    if snapshot is None:
        return None
    lists, files = ManifestListManager(table.table), ManifestFileManager(table.table)
    handed_over = getattr(table, "handed_over", None)
    if handed_over is not None and is_object_store(table.table.file_io):
        # Kept for the group's first plan, which reads the same manifests.
        lists.file_io = files.file_io = HandedOverFileIO(
            table.table.file_io, handed_over, table.manifest_dir(), keep=True)
    manifests = lists.read_all(snapshot)
    entries = files.read_entries_parallel(manifests, max_workers=2)
    live = [e for e in entries if int(e.bucket) >= 0]
    if not live:
        return None
    used = {sharding.shard_of_entry(e) for e in live}
    if len(used) >= sharding.num_shards:
        return None
    partitions = len({_values(e.partition) for e in live})
    if table.kind is TableKind.UNAWARE:
        why = f"{len(live)} data file(s) so far; each goes to one shard"
    else:
        pairs = len({(_values(e.partition), int(e.bucket)) for e in live})
        why = f"{partitions} partition(s) with {pairs} bucket(s) in all so far"
        if table.kind is TableKind.DYNAMIC:
            target = table.table.options.dynamic_bucket_target_row_num()
            why += f", a new bucket every {target} keys"
    return (
        f"{len(used)} of {sharding.num_shards} shards have rows in table {table.identifier} "
        f"now ({why}); the other shards get rows as the table grows"
    )


def _values(partition: Any) -> tuple[Any, ...]:
    if partition is None:
        return ()
    if isinstance(partition, tuple | list):
        return tuple(partition)
    return tuple(getattr(partition, "values", ()) or ())


def _digest(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def partition_hash(partition: Any) -> int:
    """A stable, non-negative hash of a partition (a pypaimon row or a tuple of
    values); 0 for the empty partition of a non-partitioned table."""
    values = _values(partition)
    return _digest(repr(values)) if values else 0


def file_hash(partition: Any, file_name: str) -> int:
    """A stable, non-negative hash of a data file (its partition and name)."""
    return _digest(f"{_values(partition)!r}/{file_name}")


@dataclass(frozen=True)
class Sharding:
    """A group's rule and shard count: routes buckets, files, entries and splits.

    Example::

        s = Sharding(ShardRule.BUCKET, 4)
        assert s.shard_of((), 6, "f") == 2
    """

    rule: ShardRule
    num_shards: int

    def __post_init__(self) -> None:
        if self.num_shards < 1:
            raise ValueError(f"num_shards must be >= 1, not {self.num_shards}")

    def describe(self) -> str:
        return f"{self.rule.value}: {self.rule.formula}"

    @property
    def by_bucket_only(self) -> bool:
        """True when the shard depends on the bucket alone (manifests can be
        pruned by their bucket range, entries filtered by bucket)."""
        return self.rule is ShardRule.BUCKET

    def shard_of(self, partition: Any, bucket: int, file_name: str) -> int:
        """The shard of a file of ``bucket`` in ``partition``."""
        n = self.num_shards
        if self.rule is ShardRule.BUCKET:
            return bucket % n
        if self.rule is ShardRule.PARTITION_BUCKET:
            return (partition_hash(partition) % n + bucket) % n
        return file_hash(partition, file_name) % n

    def shard_of_entry(self, entry: Any) -> int:
        """The shard of a manifest entry."""
        return self.shard_of(entry.partition, int(entry.bucket), str(entry.file.file_name))

    def bucket_filter(self, shard_set: frozenset[int]) -> Callable[[int], bool]:
        """What can be decided from a bucket alone: a negative bucket (postpone)
        is never read; other rules need the partition or file, so keep all."""
        n = self.num_shards
        if not self.by_bucket_only or len(shard_set) == n:
            return lambda bucket: bucket >= 0
        return lambda bucket: bucket >= 0 and bucket % n in shard_set

    def split_shards(self, split: Any) -> dict[int, Any]:
        """``{shard: split}``: ``split`` itself when all its files are in one
        shard, else one split per shard made of that shard's files (only the
        file rule can put a split's files in several shards)."""
        bucket = int(split.bucket)
        if bucket < 0:
            raise PlanInvariantViolated(
                f"split of bucket {bucket}: only rows with a real bucket can be sharded"
            )
        if self.rule is not ShardRule.FILE:
            return {self.shard_of(split.partition, bucket, ""): split}
        shards = {self.shard_of(split.partition, bucket, f.file_name) for f in split.files}
        if len(shards) <= 1:
            return {shards.pop() if shards else 0: split}
        filter_file = getattr(split, "filter_file", None)
        if filter_file is None:
            raise PlanInvariantViolated(
                f"a split of {type(split).__name__} holds files of shards {sorted(shards)} "
                "and cannot be cut per shard"
            )
        out: dict[int, Any] = {}
        for shard in sorted(shards):
            part = filter_file(
                lambda f, s=shard: self.shard_of(split.partition, bucket, f.file_name) == s
            )
            if part is not None:
                out[shard] = part
        return out

    def route(
        self, splits: Iterable[Any], shard_set: Iterable[int]
    ) -> dict[int, list[Any]]:
        """Splits of the shards in ``shard_set`` (others dropped), in input order."""
        routed: dict[int, list[Any]] = {k: [] for k in sorted(shard_set)}
        for split in splits:
            for shard, part in self.split_shards(split).items():
                if shard in routed:
                    routed[shard].append(part)
        return routed

    def check(self, splits: Mapping[int, Sequence[Any]]) -> None:
        """Raise :class:`PlanInvariantViolated` unless every file of every split
        of shard ``k`` belongs to shard ``k`` (invariant 4)."""
        n = self.num_shards
        for shard, shard_splits in splits.items():
            if not 0 <= shard < n:
                raise PlanInvariantViolated(f"plan names shard {shard}, outside 0..{n - 1}")
            for split in shard_splits:
                bucket = int(split.bucket)
                if bucket < 0:
                    raise PlanInvariantViolated(
                        f"bucket {bucket} routed to shard {shard} of {n}: only real buckets "
                        "can be sharded; refusing to deliver it"
                    )
                for f in split.files if self.rule is ShardRule.FILE else (None,):
                    name = "" if f is None else str(f.file_name)
                    owner = self.shard_of(split.partition, bucket, name)
                    if owner != shard:
                        what = f"file {name}" if f is not None else f"bucket {bucket}"
                        raise PlanInvariantViolated(
                            f"{what} routed to shard {shard} of {n} ({self.rule.value} rule): "
                            f"it belongs to shard {owner}; refusing to deliver it"
                        )
