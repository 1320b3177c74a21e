"""What one step of reading is: its kind, its splits per shard, and which
snapshots a follow-up step reads.

A :class:`StepPlan` is what :class:`~paimon_group.reading.planner.ShardPlanner` makes
and what a :class:`~paimon_group.reading.batch.ShardBatch` is cut from. Which
snapshots a follow-up (delta or changelog) step scans is one rule,
:func:`follow_up_scans`, shared by the planner and by the lag estimate of
``describe`` (:mod:`paimon_group.ops.lag`), so that what is counted as unread
is what will be read.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from paimon_group.protocol.sharding import Sharding, ShardRule

__all__ = [
    "BatchKind",
    "PlannerStats",
    "Split",
    "StepPlan",
    "check_routing",
    "follow_up_scans",
    "increment_manifests",
]

Split = Any
"""A pypaimon ``DataSplit`` (pypaimon ships no type information)."""


class BatchKind(enum.Enum):
    """What a step (and the :class:`~paimon_group.reading.batch.ShardBatch` made of it) holds."""

    INITIAL = "initial"
    """The full content of one snapshot (merged view), read once at the start."""

    DELTA = "delta"
    """The files one snapshot added (``changelog-producer = none``)."""

    CHANGELOG = "changelog"
    """The changelog one snapshot produced (input / lookup / full-compaction)."""

    CATCH_UP = "catch-up"
    """The deltas or changelogs of every snapshot in a long gap, in one step."""

    def __str__(self) -> str:
        # ``str(batch.kind)`` and f-strings print "delta", not "BatchKind.DELTA".
        return self.value


def check_routing(
    splits: Mapping[int, Sequence[Split]],
    num_shards: int,
    rule: ShardRule = ShardRule.BUCKET,
) -> None:
    """Raise :class:`PlanInvariantViolated` unless every file of every split of
    shard ``k`` belongs to shard ``k`` under ``rule`` (invariant 4)."""
    Sharding(rule, num_shards).check(splits)


@dataclass(frozen=True)
class StepPlan:
    """One step of reading for a set of shards.

    ``snapshot_id`` is the last snapshot the step covers; ``next_snapshot`` the
    position to commit once the step is processed. ``splits`` has a key for
    EVERY requested shard (an empty tuple when the shard has no data in this
    step). ``num_shards``, when given (the planner always gives it), makes the
    constructor check the routing of every split, under ``rule`` (the
    group's sharding rule). ``first_snapshot`` is the first snapshot covered
    (``snapshot_id`` except for catch-up steps).

    Example::

        step = StepPlan(BatchKind.DELTA, snapshot_id=7, next_snapshot=8,
                        splits={0: (), 1: ()}, num_shards=2)
        assert step.is_empty
    """

    kind: BatchKind
    snapshot_id: int
    next_snapshot: int
    splits: Mapping[int, Sequence[Split]]
    num_shards: int | None = None
    first_snapshot: int | None = None
    rule: ShardRule = ShardRule.BUCKET

    def __post_init__(self) -> None:
        frozen = MappingProxyType({int(k): tuple(v) for k, v in self.splits.items()})
        object.__setattr__(self, "splits", frozen)
        if self.first_snapshot is None:
            object.__setattr__(self, "first_snapshot", self.snapshot_id)
        if self.num_shards is not None:
            check_routing(self.splits, self.num_shards, self.rule)

    @property
    def shards(self) -> tuple[int, ...]:
        return tuple(self.splits)

    @property
    def is_empty(self) -> bool:
        """True when no shard has anything to read in this step."""
        return not any(self.splits.values())

    def estimated_rows(self, shard: int) -> int:
        """Rows in the shard's splits according to file metadata (before merging)."""
        return sum(int(s.row_count) for s in self.splits.get(shard, ()))


@dataclass
class PlannerStats:
    """Metadata files a planner has read (for benchmarks and metrics)."""

    snapshots_read: int = 0
    manifest_lists_read: int = 0
    manifests_read: int = 0
    manifests_skipped: int = 0
    steps_planned: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **counts: int) -> None:
        with self._lock:
            for name, value in counts.items():
                setattr(self, name, getattr(self, name) + value)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {
                "snapshots_read": self.snapshots_read,
                "manifest_lists_read": self.manifest_lists_read,
                "manifests_read": self.manifests_read,
                "manifests_skipped": self.manifests_skipped,
                "steps_planned": self.steps_planned,
            }


def follow_up_scans(snapshot: Any, *, changelog: bool) -> bool:
    """Whether a follow-up step reads ``snapshot``: pypaimon's follow-up
    scanners' rule (Delta/ChangelogFollowUpScanner ``should_scan``).

    With a changelog producer (``changelog``), the snapshots that have a
    changelog; otherwise the APPEND snapshots (COMPACT and OVERWRITE ones are
    skipped, as Paimon's streaming reads skip them).
    """
    if changelog:
        return bool(snapshot.changelog_manifest_list)
    return bool(snapshot.commit_kind == "APPEND")


def increment_manifests(manifest_lists: Any, snapshot: Any, *, changelog: bool) -> list[Any]:
    """The manifests a follow-up step of ``snapshot`` reads: its changelog
    manifests (``changelog``) or its delta manifests, from a pypaimon
    ``ManifestListManager``."""
    if changelog:
        result: list[Any] = manifest_lists.read_changelog(snapshot)
    else:
        result = manifest_lists.read_delta(snapshot)
    return result
