"""Offsets of the Spark source: per owned shard, the range of snapshots a micro-batch reads.

An offset (the JSON Spark writes to its checkpoint) is::

    {"v": 1, "group": "<incarnation>",
     "shards": {"<shard>": {"epoch": E, "next": N, "full": F or null, "to": T}},
     "ends": {"<shard>": T}}

``ends`` (per shard, the furthest ``to`` this query has planned in this
incarnation of the group) is kept in every later offset, also while the
query does not hold the shard: a shard that left the query and comes back
starts at that end at the earliest (:func:`start_cursor`), so no (shard,
snapshot) is delivered under two batch ids of one query, whatever the group
did in between. Offsets without it take their ranges' ``to``.

``group`` is the incarnation of the group that planned it (a group deleted
and re-created under the same name is another incarnation: other shards, another
start): a checkpoint of an earlier incarnation never moves the new group's
positions (:func:`same_incarnation`). Offsets written before it was recorded
have none and are taken as the current incarnation's.

For each shard the micro-batch reads, in this order: the full content of
snapshot ``F`` (a pending full scan, when not null), then the increments of
snapshots ``N .. T-1``, one snapshot at a time. ``(N, F)`` is where the shard
stood when the batch was planned; ``T`` is the shard's next snapshot once the
batch is done (what :meth:`commit` writes to the coordinator). An end offset
therefore holds its own start: a batch Spark re-runs from its checkpoint
reads exactly the same rows, whoever owns the shards by then.

Snapshots are the unit of a batch, never cut: all rows one snapshot holds
for a shard are in one micro-batch, so a sink that replaces what it holds
for (shard, snapshot) makes replays harmless (docs/spark.md).

:func:`plan_ranges` is deterministic for a given table state: it plans
snapshot by snapshot (no catch-up union, whose extent would depend on the
latest snapshot at planning time), so re-planning a range on restart gives
the same splits.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from coordinators.errors import PaimonGroupError
from paimon_group.errors import SnapshotExpired
from paimon_group.member.data_loss import LostRange
from paimon_group.reading.planner import ShardPlanner

log = logging.getLogger("paimon_group.spark_source")

__all__ = [
    "NO_CATCH_UP",
    "Caps",
    "Cursor",
    "Piece",
    "ShardRange",
    "decode_ends",
    "decode_offset",
    "encode_offset",
    "plan_ranges",
    "same_incarnation",
    "start_cursor",
]

NO_CATCH_UP = 2**62
"""The planners of the source never take a catch-up step (see the module docstring)."""

OFFSET_VERSION = 1


@dataclass(frozen=True)
class Cursor:
    """Where a shard stands: ``next`` snapshot, after a pending full scan of ``full``."""

    next: int
    full: int | None = None

    @property
    def done_before(self) -> int:
        """Every snapshot below this one is delivered for the shard."""
        return self.full if self.full is not None else self.next


@dataclass(frozen=True)
class ShardRange:
    """What one micro-batch reads for one shard (see the module docstring)."""

    shard: int
    epoch: int
    next: int
    full: int | None
    to: int

    @property
    def empty(self) -> bool:
        return self.full is None and self.to <= self.next

    def to_json(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "next": self.next, "full": self.full, "to": self.to}

    @classmethod
    def from_json(cls, shard: int, data: Mapping[str, Any]) -> ShardRange:
        full = data.get("full")
        return cls(shard=shard, epoch=int(data["epoch"]), next=int(data["next"]),
                   full=int(full) if full is not None else None, to=int(data["to"]))


def encode_offset(ranges: Mapping[int, ShardRange], incarnation: str = "",
                  ends: Mapping[int, int] | None = None) -> dict[str, Any]:
    """The offset of ``ranges``; ``ends``: the query's furthest ends before
    this batch (merged with the ranges' own ``to``)."""
    out: dict[str, Any] = {"v": OFFSET_VERSION,
                           "shards": {str(s): r.to_json() for s, r in sorted(ranges.items())}}
    if incarnation:
        out["group"] = incarnation
    merged = dict(ends or {})
    for s, r in ranges.items():
        merged[s] = max(merged.get(s, r.to), r.to)
    if merged:
        out["ends"] = {str(s): t for s, t in sorted(merged.items())}
    return out


def same_incarnation(offset: Mapping[str, Any] | None, incarnation: str) -> bool:
    """Whether ``offset`` was planned by this incarnation of the group (an
    offset, or a group, that records none counts as the same)."""
    recorded = str((offset or {}).get("group") or "")
    return not recorded or not incarnation or recorded == incarnation


def decode_offset(offset: Mapping[str, Any] | None) -> dict[int, ShardRange]:
    """The ranges of an offset (empty for the initial offset); raises on a foreign one."""
    if not offset:
        return {}
    if offset.get("v") != OFFSET_VERSION or not isinstance(offset.get("shards"), Mapping):
        raise PaimonGroupError(
            f"checkpointed offset {offset!r} was not written by this paimon-group source "
            f"(version {OFFSET_VERSION}): start the query with a new checkpoint location")
    return {int(s): ShardRange.from_json(int(s), r) for s, r in offset["shards"].items()}


def decode_ends(offset: Mapping[str, Any] | None) -> dict[int, int]:
    """Per shard, the furthest end the query has planned up to ``offset``
    (its ``ends``, and its ranges' ``to`` for an offset written without them)."""
    ends = {s: r.to for s, r in decode_offset(offset).items()}
    for shard, to in ((offset or {}).get("ends") or {}).items():
        ends[int(shard)] = max(ends.get(int(shard), int(to)), int(to))
    return ends


def start_cursor(coordinator: Cursor, previous: ShardRange | None,
                 end: int | None = None) -> Cursor:
    """Where a new batch starts reading an owned shard.

    The coordinator's position is authoritative, except when the previous
    batch of this query (Spark's ``start`` offset, whose rows Spark has
    written before asking for the next batch) already got further: Spark
    commits a batch to the source only after it planned the next one, so a
    crash in between leaves the coordinator one batch behind the checkpoint.
    Starting from the coordinator's position there would deliver that batch
    twice; starting before it would lose nothing either, but the checkpoint
    proves those rows were written. Positions never go back.

    ``end``, the furthest end the query planned for the shard in any
    earlier batch (:func:`decode_ends`), counts the same way: a shard that
    left the query while a batch held it (a revocation, a lost session, a
    re-run batch of shards owned by others now) and came back before its
    new owner committed has the coordinator's older position, and starting
    there delivered the same (shard, snapshot) under two batch ids of one
    query (issue 43). When another member moved the shard further, its
    position wins: those rows are the group's, read by that member.
    """
    furthest = max(previous.to if previous is not None else 0, end or 0)
    if furthest > coordinator.done_before:
        return Cursor(next=furthest)
    return coordinator


@dataclass(frozen=True)
class Caps:
    """Per micro-batch: at most this many snapshot steps / rows (None: no cap).

    A batch always takes at least one step, so one snapshot with more rows
    than ``max_rows`` is read whole (snapshots are never cut).
    """

    max_snapshots: int | None = None
    max_rows: int | None = None


@dataclass
class Piece:
    """One snapshot of one shard: ``kind`` is initial (full scan) or the follow-up kind."""

    snapshot: int
    kind: str
    splits: list[Any] = field(default_factory=list)


def plan_ranges(
    planner: ShardPlanner,
    cursors: Mapping[int, Cursor],
    *,
    until: Mapping[int, int] | None = None,
    latest: int | None = None,
    caps: Caps = Caps(),
    fail_on_data_loss: bool = True,
) -> tuple[dict[int, int], dict[int, list[Piece]]]:
    """Plan the reads from ``cursors``: returns (``to`` per shard, pieces per shard).

    ``until`` (a replay): per shard, stop before this snapshot; no caps.
    Otherwise read up to ``latest`` inclusive within ``caps``. Shards at the
    same cursor are planned together (one manifest read per step). An
    expired next snapshot raises :class:`~paimon_group.errors.SnapshotExpired`,
    or without ``fail_on_data_loss`` is skipped (:func:`_past_expired`).
    """
    pieces: dict[int, list[Piece]] = defaultdict(list)
    steps, rows = _plan_full_scans(planner, cursors, pieces)
    limit = dict(until) if until is not None else {
        s: (latest + 1 if latest is not None else c.next) for s, c in cursors.items()}
    reached = {s: c.next for s, c in cursors.items()}
    if not cursors:
        return reached, dict(pieces)
    n = min(c.next for c in cursors.values())
    last = max(limit.values(), default=n)
    while n < last:
        active = [s for s, c in cursors.items() if c.next <= n < limit[s]]
        if not active:
            n += 1
            continue
        if until is None and steps > 0 and caps.max_snapshots is not None \
                and steps >= caps.max_snapshots:
            break
        try:
            step = planner.plan_next(active, n)
        except SnapshotExpired as err:
            # The shards' next snapshot expired unread: stop (failOnDataLoss,
            # the default), or move them on to the earliest retained one.
            n = _past_expired(planner, active, n, err, fail=fail_on_data_loss)
            reached.update({s: n for s in active})
            continue
        if step is None:
            break  # not committed yet (only when planning up to a stale latest)
        if step.next_snapshot != n + 1:
            raise PaimonGroupError(f"planned snapshot {n} as a step to {step.next_snapshot}")
        step_rows = sum(step.estimated_rows(s) for s in active)
        if until is None and steps > 0 and caps.max_rows is not None \
                and rows + step_rows > caps.max_rows:
            break
        for shard in active:
            splits = list(step.splits.get(shard, ()))
            if splits:
                pieces[shard].append(Piece(n, step.kind.value, splits))
            reached[shard] = n + 1
        rows += step_rows
        steps += 1
        n += 1
    return reached, dict(pieces)


def _plan_full_scans(planner: ShardPlanner, cursors: Mapping[int, Cursor],
                     pieces: dict[int, list[Piece]]) -> tuple[int, int]:
    """The pending full scans of ``cursors`` into ``pieces``: (steps, rows)."""
    steps = rows = 0
    fulls: dict[int, list[int]] = defaultdict(list)
    for shard, cursor in cursors.items():
        if cursor.full is not None:
            fulls[cursor.full].append(shard)
    for snapshot, shards in sorted(fulls.items()):
        full_step = planner.plan_full(shards, snapshot)
        for shard in shards:
            pieces[shard].append(
                Piece(snapshot, full_step.kind.value, list(full_step.splits.get(shard, ()))))
            rows += full_step.estimated_rows(shard)
        steps += 1
    return steps, rows


def _past_expired(planner: ShardPlanner, shards: list[int], n: int, err: SnapshotExpired, *,
                  fail: bool) -> int:
    """The earliest retained snapshot, where ``shards`` go on after their
    expired snapshot ``n`` (a WARNING names the lost range); raises one line
    naming it instead when ``fail``."""
    earliest = planner.table.earliest_snapshot_id()
    if earliest is None or earliest <= n:
        raise err
    lost = LostRange(tuple(sorted(shards)), n, earliest)
    what = f"{lost.shards_text()}: {lost.what(planner.table.identifier)}"
    if fail:
        raise SnapshotExpired(
            f"{what}: their rows are lost to the query, so it stops (option "
            "failOnDataLoss=false skips such gaps); to resume from the earliest retained "
            "snapshot, reset the group's positions (paimon-group reset --to-earliest, "
            "docs/operations.md) and restart the query") from None
    log.warning("%s: skipping to snapshot %d (failOnDataLoss=false); the rows of %d "
                "snapshots are lost to the query", what, earliest, lost.count)
    return earliest


def shards_of(pieces: Mapping[int, Sequence[Piece]]) -> list[int]:
    return sorted(s for s, p in pieces.items() if p)
