"""Offsets of the Spark source: per owned shard, the range of snapshots a micro-batch reads.

An offset (the JSON Spark writes to its checkpoint) is::

    {"v": 1, "group": "<incarnation>",
     "shards": {"<shard>": {"epoch": E, "next": N, "full": F or null, "to": T, "moves": M}},
     "ends": {"<shard>": T}, "end_moves": {"<shard>": M},
     "source": {"group": "<name>", "table_id": "<identity>", "num_shards": K,
                "sharding": "<rule>"}}

``source`` is what the Paimon sink of a query records of the source in the
target's marks, and the group's name, which they are kept under
(:mod:`paimon_group.spark.source.to_paimon`); offsets without it leave it
unknown.

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

``moves`` (absent: 0) is the number of moves of the group's start the
range derives from, ``end_moves`` the same for each end. On a
bucket-unaware table an expired start moves forward once for every shard
(:mod:`paimon_group.member.moved_start`), and a shard of an earlier start
scans the moved one again: positions advance in the order (moves, snapshot),
so an end of an earlier start never holds a shard back from the moved
start's full scan, nor is committed over it.

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
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from coordinators.errors import PaimonGroupError
from paimon_group.config.member import MemberConfig
from paimon_group.errors import BatchExpired, SnapshotExpired
from paimon_group.member.data_loss import LostRange, reset_command
from paimon_group.protocol.records import GroupStart
from paimon_group.protocol.sharding import ShardRule
from paimon_group.reading.expiry import missing_file_error
from paimon_group.reading.planner import PlannedTable
from paimon_group.reading.steps import StepPlan

log = logging.getLogger("paimon_group.spark_source")

__all__ = [
    "NO_CATCH_UP",
    "Caps",
    "Cursor",
    "MoveStart",
    "Piece",
    "Planner",
    "ShardRange",
    "after_start_move",
    "at_moved_start",
    "decode_end_moves",
    "decode_ends",
    "decode_offset",
    "encode_offset",
    "lost_what",
    "moved_past_gap",
    "past_expired_full_scans",
    "piece_gone",
    "plan_batch",
    "plan_ranges",
    "query_data_loss",
    "same_incarnation",
    "start_cursor",
    "start_move",
]

NO_CATCH_UP = 2**62
"""The planners of the source never take a catch-up step (see the module docstring)."""

OFFSET_VERSION = 1


class Planner(Protocol):
    """What plans a batch: a table's ShardPlanner, or one in the group's
    shard numbers (a table of a query over several)."""

    @property
    def table(self) -> PlannedTable: ...

    @property
    def rule(self) -> ShardRule: ...

    def plan_full(self, shards: Iterable[int], snapshot_id: int) -> StepPlan: ...

    def plan_next(self, shards: Iterable[int], next_snapshot: int) -> StepPlan | None: ...


@dataclass(frozen=True)
class Cursor:
    """Where a shard stands: ``next`` snapshot, after a pending full scan of ``full``."""

    next: int
    full: int | None = None
    moves: int = 0  # of the group's start the cursor derives from

    @property
    def done_before(self) -> int:
        """Every snapshot below this one is delivered for the shard."""
        return self.full if self.full is not None else self.next

    @property
    def order(self) -> tuple[int, int]:
        """How far the shard is: by the start's moves first, as positions advance."""
        return (self.moves, self.done_before)


@dataclass(frozen=True)
class ShardRange:
    """What one micro-batch reads for one shard (see the module docstring)."""

    shard: int
    epoch: int
    next: int
    full: int | None
    to: int
    moves: int = 0

    @property
    def empty(self) -> bool:
        return self.full is None and self.to <= self.next

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"epoch": self.epoch, "next": self.next, "full": self.full,
                               "to": self.to}
        if self.moves:
            out["moves"] = self.moves
        return out

    @classmethod
    def from_json(cls, shard: int, data: Mapping[str, Any]) -> ShardRange:
        full = data.get("full")
        return cls(shard=shard, epoch=int(data["epoch"]), next=int(data["next"]),
                   full=int(full) if full is not None else None, to=int(data["to"]),
                   moves=int(data.get("moves") or 0))


def encode_offset(ranges: Mapping[int, ShardRange], incarnation: str = "",
                  ends: Mapping[int, int] | None = None,
                  end_moves: Mapping[int, int] | None = None,
                  source: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The offset of ``ranges``; ``ends``: the query's furthest ends before
    this batch, of the starts ``end_moves`` (merged with the ranges' own
    ``to``: the furthest in the order (moves, snapshot)); ``source``: the
    source table's identity, the group's shard count and sharding rule,
    which a Paimon sink's marks record (``table_id``, ``num_shards``,
    ``sharding``; none: unknown)."""
    out: dict[str, Any] = {"v": OFFSET_VERSION,
                           "shards": {str(s): r.to_json() for s, r in sorted(ranges.items())}}
    if incarnation:
        out["group"] = incarnation
    if source:
        out["source"] = dict(source)
    merged = {s: ((end_moves or {}).get(s, 0), t) for s, t in (ends or {}).items()}
    for s, r in ranges.items():
        merged[s] = max(merged.get(s, (r.moves, r.to)), (r.moves, r.to))
    if merged:
        out["ends"] = {str(s): t for s, (_m, t) in sorted(merged.items())}
        moved = {str(s): m for s, (m, _t) in sorted(merged.items()) if m}
        if moved:
            out["end_moves"] = moved
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
    (its ``ends``, and its ranges' ``to`` for an offset written without them;
    furthest in the order (moves, snapshot): :func:`decode_end_moves`)."""
    return {s: t for s, (_m, t) in _ends(offset).items()}


def decode_end_moves(offset: Mapping[str, Any] | None) -> dict[int, int]:
    """Per shard, the moves of the group start its end (:func:`decode_ends`) derives from."""
    return {s: m for s, (m, _t) in _ends(offset).items()}


def _ends(offset: Mapping[str, Any] | None) -> dict[int, tuple[int, int]]:
    ends = {s: (r.moves, r.to) for s, r in decode_offset(offset).items()}
    moves = (offset or {}).get("end_moves") or {}
    for shard, to in ((offset or {}).get("ends") or {}).items():
        end = (int(moves.get(shard) or 0), int(to))
        ends[int(shard)] = max(ends.get(int(shard), end), end)
    return ends


def start_cursor(coordinator: Cursor, previous: ShardRange | None,
                 end: int | None = None, end_moves: int = 0) -> Cursor:
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
    there would deliver the same (shard, snapshot) under two batch ids of one
    query. When another member moved the shard further, its
    position wins: those rows are the group's, read by that member.

    "Further" is in the order (moves of the group start, snapshot): a
    coordinator's position re-pinned at a moved start (a bucket-unaware
    table's expired start, :mod:`paimon_group.member.moved_start`) is past
    every end of the earlier start, though it scans an earlier snapshot.
    """
    furthest = max((previous.moves, previous.to) if previous is not None else (0, 0),
                   (end_moves, end or 0))
    if furthest > coordinator.order:
        return Cursor(next=furthest[1], moves=furthest[0])
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
    planner: Planner,
    cursors: Mapping[int, Cursor],
    *,
    until: Mapping[int, int] | None = None,
    latest: int | None = None,
    caps: Caps = Caps(),
    fail_on_data_loss: bool = True,
    config: MemberConfig | None = None,
) -> tuple[dict[int, int], dict[int, list[Piece]]]:
    """Plan the reads from ``cursors``: returns (``to`` per shard, pieces per shard).

    ``until`` (a replay): per shard, stop before this snapshot; no caps.
    Otherwise read up to ``latest`` inclusive within ``caps``. Shards at the
    same cursor are planned together (one manifest read per step). Expiry:
    :func:`_past_expired`; an expired pending full scan: :func:`plan_batch`.
    """
    pieces: dict[int, list[Piece]] = defaultdict(list)
    steps, rows = _plan_full_scans(planner, cursors, pieces, fail=fail_on_data_loss,
                                   config=config)
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
            # Expired unread: stop, or skip (every shard in the gap).
            n = _past_expired(planner, reached, limit, n, err, fail=fail_on_data_loss,
                              config=config)
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


def _plan_full_scans(planner: Planner, cursors: Mapping[int, Cursor],
                     pieces: dict[int, list[Piece]], *, fail: bool,
                     config: MemberConfig | None) -> tuple[int, int]:
    """The pending full scans of ``cursors`` into ``pieces``: (steps, rows).
    A full scan whose snapshot expired (since :func:`past_expired_full_scans`
    looked) raises the one line when ``fail``, else SnapshotExpired."""
    steps = rows = 0
    fulls: dict[int, list[int]] = defaultdict(list)
    for shard, cursor in cursors.items():
        if cursor.full is not None:
            fulls[cursor.full].append(shard)
    for snapshot, shards in sorted(fulls.items()):
        try:
            full_step = planner.plan_full(shards, snapshot)
        except SnapshotExpired as err:
            earliest = planner.table.earliest_snapshot_id()
            if not fail or earliest is None or earliest <= snapshot:
                raise
            lost = LostRange(tuple(sorted(shards)), snapshot, earliest, full_scan=True)
            raise query_data_loss(planner.table.identifier, [lost], config) from err
        for shard in shards:
            pieces[shard].append(
                Piece(snapshot, full_step.kind.value, list(full_step.splits.get(shard, ()))))
            rows += full_step.estimated_rows(shard)
        steps += 1
    return steps, rows


MoveStart = Callable[[Sequence[LostRange], Mapping[int, Cursor]], Mapping[int, Cursor]]
"""The host's way to move the group's start past expired full scans of a
bucket-unaware table (``failOnDataLoss=false``): given what was lost and the
cursors, it moves the start once for every shard (or takes a move made
already) and returns the cursors to plan from (:func:`at_moved_start`)."""


def start_move(losts: Sequence[LostRange], cursors: Mapping[int, Cursor]
               ) -> tuple[int, dict[int, int]]:
    """What a host asks of its member to move the group's start past
    ``losts``: the moves of the start the lost full scans derive from, and
    where each of its shards of that start had read to (they read again from
    the moved start up to there)."""
    lost = {s for r in losts for s in r.shards}
    lineage = min((c.moves for s, c in cursors.items() if s in lost), default=0)
    return lineage, {s: c.next for s, c in cursors.items() if c.moves <= lineage}


def after_start_move(cursors: Mapping[int, Cursor], losts: Sequence[LostRange],
                     start: GroupStart | None) -> dict[int, Cursor]:
    """``cursors`` once the member moved the group's start to ``start``
    (:func:`at_moved_start`); None: the coordinator failed the move (logged),
    and the shards of ``losts`` wait for the next batch."""
    if start is None or start.full_scan is None:
        lost = {s for r in losts for s in r.shards}
        return {s: c for s, c in cursors.items() if s not in lost}
    return at_moved_start(cursors, Cursor(next=start.next_snapshot, full=start.full_scan,
                                          moves=start.moves))


def at_moved_start(cursors: Mapping[int, Cursor], start: Cursor) -> dict[int, Cursor]:
    """``cursors`` with every one of an earlier start than ``start`` (a moved
    group start: its next snapshot, full scan and moves) re-pinned at it: its
    full scan comes again, and the snapshots after it (a bucket-unaware
    table's shards all read from one full scan, member/moved_start.py)."""
    return {s: start if c.moves < start.moves else c for s, c in cursors.items()}


FULL_SCAN_ATTEMPTS = 3
"""Plans tried when a pending full scan's snapshot expires while it is planned."""


def plan_batch(
    planner: Planner,
    cursors: Mapping[int, Cursor],
    *,
    fail_on_data_loss: bool = True,
    config: MemberConfig | None = None,
    move_start: MoveStart | None = None,
    **kwargs: Any,
) -> tuple[dict[int, Cursor], dict[int, int], dict[int, list[Piece]]]:
    """:func:`plan_ranges` from ``cursors`` once the pending full scans whose
    snapshot expired are handled (:func:`past_expired_full_scans`); returns
    the cursors planned from (what the batch's offset records) with
    :func:`plan_ranges`' answer. ``kwargs``: ``until``, ``latest``, ``caps``."""
    moved: Mapping[int, Cursor] = cursors
    for attempt in range(FULL_SCAN_ATTEMPTS):
        moved = past_expired_full_scans(planner, moved, fail=fail_on_data_loss,
                                        config=config, move_start=move_start)
        try:
            reached, pieces = plan_ranges(planner, moved, fail_on_data_loss=fail_on_data_loss,
                                          config=config, **kwargs)
        except SnapshotExpired:
            # Without failOnDataLoss, only a full scan's snapshot that
            # expired since it was looked at gets here: look again.
            if fail_on_data_loss or attempt == FULL_SCAN_ATTEMPTS - 1:
                raise
            continue
        return moved, reached, pieces
    raise AssertionError("unreachable")


def past_expired_full_scans(planner: Planner, cursors: Mapping[int, Cursor], *,
                            fail: bool, config: MemberConfig | None = None,
                            move_start: MoveStart | None = None) -> dict[int, Cursor]:
    """``cursors`` with each pending full scan whose snapshot expired replaced
    by a full scan of the earliest retained snapshot, as a worker does under
    ``--on-data-loss skip`` (a WARNING names the shards and the snapshot);
    raises the one line naming them instead when ``fail``. On a
    bucket-unaware table the group's start moves instead, for every shard
    (``move_start``; without it, the line)."""
    out = dict(cursors)
    if all(c.full is None for c in cursors.values()):
        return out
    earliest = planner.table.earliest_snapshot_id()
    if earliest is None:
        return out
    expired: dict[int, list[int]] = defaultdict(list)
    for shard, cursor in cursors.items():
        if cursor.full is not None and cursor.full < earliest:
            expired[cursor.full].append(shard)
    losts = [LostRange(tuple(sorted(shards)), snapshot, earliest, full_scan=True)
             for snapshot, shards in sorted(expired.items())]
    if losts and not fail and planner.rule is ShardRule.FILE and move_start is not None:
        # A bucket-unaware table's shards all read from one full scan: a
        # shard re-pinned alone at a later one straddles the compactions
        # between them, and rows are lost that did not expire. The group's
        # start moves for every shard, as workers move it
        # (member/moved_start.py, which says it in one WARNING line).
        return dict(move_start(losts, cursors))
    if losts and (fail or planner.rule is ShardRule.FILE):
        raise query_data_loss(planner.table.identifier, losts, config,
                              file_rule=not fail)
    for lost in losts:
        log.warning("%s: scanning snapshot %d in full instead (failOnDataLoss=false)",
                    lost_what(planner.table.identifier, lost), earliest)
        out.update({s: Cursor(next=earliest + 1, full=earliest) for s in lost.shards})
    return out


def _past_expired(planner: Planner, positions: Mapping[int, int], limit: Mapping[int, int],
                  n: int, err: SnapshotExpired, *, fail: bool,
                  config: MemberConfig | None) -> int:
    """The earliest retained snapshot, where the shards go on after their
    expired snapshot ``n``: every shard whose next snapshot (``positions``)
    is in the gap and still to be read (below its ``limit``) skips it, with a
    WARNING naming the shards and their lost range (one per range); raises
    one line naming them all instead when ``fail``."""
    earliest = planner.table.earliest_snapshot_id()
    if earliest is None or earliest <= n:
        raise err
    by_first: dict[int, list[int]] = defaultdict(list)
    for shard, position in positions.items():
        if n <= position < earliest and position < limit[shard]:
            by_first[position].append(shard)
    losts = [LostRange(tuple(sorted(shards)), first, earliest)
             for first, shards in sorted(by_first.items())]
    if fail:
        raise query_data_loss(planner.table.identifier, losts, config) from None
    for lost in losts:
        log.warning("%s: skipping to snapshot %d (failOnDataLoss=false); the rows of %d "
                    "snapshots are lost to the query", lost_what(planner.table.identifier, lost),
                    earliest, lost.count)
    return earliest


def lost_what(table: str, lost: LostRange) -> str:
    """The shards and what they lost, as the lines of the query say them."""
    return f"{lost.shards_text()}: {lost.what(table)}"


def query_data_loss(table: str, losts: Sequence[LostRange],
                    config: MemberConfig | None = None, *,
                    file_rule: bool = False) -> SnapshotExpired:
    """The one line a query stops with (failOnDataLoss=true, or an expired
    start of a bucket-unaware table when the group's start cannot be moved
    from where it was found: ``file_rule``): the
    shards, the lost snapshots and what resumes them (docs/spark.md,
    failOnDataLoss)."""
    what = "; ".join(lost_what(table, lost) for lost in losts)
    shards = sorted({s for lost in losts for s in lost.shards})
    if config is not None:
        reset = (f"stop the group's members (this query has stopped) and run: "
                 f"{reset_command(config, shards, None if config.single_table else table)}")
    else:
        reset = "reset the group's positions (paimon-group reset --to-earliest)"
    skip = ("scans the earliest retained snapshot in full instead"
            if all(lost.full_scan for lost in losts) else "skips such gaps")
    if file_rule:
        skip = ("cannot skip it here: a bucket-unaware table's shards all read from one "
                "full scan, and this reader cannot move the group's start")
    return SnapshotExpired(
        f"{what}: their rows are lost to the query, so it stops (option failOnDataLoss=false "
        f"{skip}); to resume from the earliest retained snapshot, {reset}; then restart the "
        "query from its checkpoint (docs/spark.md, failOnDataLoss)")


def moved_past_gap(cursors: Mapping[int, Cursor], until: Mapping[int, int],
                   stored: Mapping[int, Cursor], earliest: int | None
                   ) -> tuple[dict[int, Cursor], dict[int, int], list[int]]:
    """A batch re-run from its offset whose range starts in expired snapshots,
    for the shards whose group position (``stored``: the coordinator's) has
    moved past the gap since (``paimon-group reset``, or a member that
    skipped it): the batch reads them from that position up to their ``to``
    (nothing when it is at or beyond). Returns the cursors and ``until`` to
    re-plan with, and the shards moved."""
    out, limit = dict(cursors), dict(until)
    moved: list[int] = []
    if earliest is None:
        return out, limit, moved
    for shard, cursor in cursors.items():
        group = stored.get(shard)
        if cursor.done_before >= earliest or group is None or group.done_before < earliest:
            continue
        moved.append(shard)
        if group.done_before >= limit[shard]:
            del out[shard], limit[shard]
        else:
            out[shard] = group
    return out, limit, sorted(moved)


def shards_of(pieces: Mapping[int, Sequence[Piece]]) -> list[int]:
    return sorted(s for s, p in pieces.items() if p)


def piece_gone(fail_on_data_loss: bool, table: Any, shard: int, piece: Piece,
               err: FileNotFoundError) -> None:
    """A file of ``piece`` is missing: snapshot ``piece.snapshot`` expired after
    the driver planned it (data loss: the query stops with one line, or with
    ``failOnDataLoss=false`` the piece's rows are skipped with a WARNING), or
    the file of a retained snapshot is gone (one line naming it)."""
    gone = missing_file_error(table, err, shards=(shard,), first=piece.snapshot,
                              last=piece.snapshot, full_scan=piece.kind == "initial")
    if not isinstance(gone, BatchExpired):
        raise gone from None
    lost = LostRange((shard,), piece.snapshot, gone.earliest, gone.full_scan)
    if fail_on_data_loss:
        raise query_data_loss(table.identifier, [lost]) from None
    log.warning("%s: skipping its rows in this micro-batch (failOnDataLoss=false): file %s "
                "is gone, so they are lost to the query", lost_what(table.identifier, lost),
                gone.file)
