"""A simulated member driven as the Spark source drives one.

:class:`paimon_group.spark.source.driver.GroupDriver` runs its member on a
loop of its own, in a thread, and blocks on it: it cannot run on the
simulation's virtual time. So :func:`drive` does on the run's loop what the
source's micro-batch cycle does through it (``GroupPointSource.latestOffset``,
``partitions``, ``commit``), with the same library pieces: a
``GroupMember(auto_commit=False)`` that never runs its read loop; each cycle
commits the previous batch's ends through the member's fenced commit
(``commit_positions``, then ``mark_idle`` of what it held), settles the held
shards' positions (``settle_positions``: a start is pinned here),
starts each shard from the coordinator's position or the previous batch's
end, whichever is further (``start_cursor``), plans every shard up to the
latest snapshot in one batch (``plan_batch``, with ``NO_CATCH_UP`` as the
source does: an expired pending full scan stops with the line or is scanned
at the earliest snapshot, as ``failOnDataLoss`` says; on a bucket-unaware
table the group's start moves, ``move_group_start``, and the shards of an
earlier start are re-pinned at it, ``at_moved_start``), marks the planned
shards busy (``mark_busy``: a revocation waits for the commit) and reads
the pieces (the executors' read path: ``planner.read_arrow`` of the splits;
a file found missing goes through the executors' ``piece_gone``). A crash loses the previous batch's
ends (a query restarted without its checkpoint), so what it read and did
not commit is read again by the next owner: at least once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from paimon_group.member.data_loss import LostRange
from paimon_group.spark.source.offsets import (
    NO_CATCH_UP,
    Cursor,
    ShardRange,
    after_start_move,
    piece_gone,
    plan_batch,
    start_cursor,
    start_move,
)


class _MoveStart(Exception):
    """The plan found expired full scans of a bucket-unaware table: the
    group's start is moved on the loop (the source's driver blocks on its
    own loop for it; here the plan is left and made again)."""

    def __init__(self, losts: Sequence[LostRange], cursors: Mapping[int, Cursor]) -> None:
        super().__init__("move the group's start")
        self.losts, self.cursors = list(losts), dict(cursors)


def _ask_move(losts: Sequence[LostRange], cursors: Mapping[int, Cursor]) -> dict[int, Cursor]:
    raise _MoveStart(losts, cursors)


async def _moved(member: Any, ask: _MoveStart) -> dict[int, Cursor]:
    """As ``GroupDriver.move_start``."""
    lineage, read_to = start_move(ask.losts, ask.cursors)
    start = await member.host_reads.move_group_start(ask.losts, lineage, read_to)
    return after_start_move(ask.cursors, ask.losts, start)

POLL_S = 0.5  # the trigger interval between micro-batches with nothing new


async def drive(member: Any, record: Callable[[dict[str, Any]], None],
                crashed: Callable[[], bool]) -> None:
    """Micro-batches until cancelled; ``record`` gets one delivery per shard
    and batch (its ``next_snapshot`` is the end the batch commits)."""
    table = member.table
    planner = table.planner(member.num_shards, rule=member.sharding,
                            catch_up_threshold=NO_CATCH_UP)
    previous: dict[int, ShardRange] = {}
    while member.error is None:
        if previous:
            # Spark commits batch N when it plans batch N+1.
            ends = {s: r.to for s, r in previous.items()}
            try:
                await member.commit_positions(ends, moves={s: r.moves
                                                           for s, r in previous.items()})
            finally:
                member.mark_idle(ends)
        settled = await member.settle_positions()
        cursors = {s: start_cursor(Cursor(next=p.next_snapshot, full=p.full_scan,
                                          moves=p.start_moves), previous.get(s))
                   for s, p in settled.items()}
        latest = planner.table.latest_snapshot_id()
        fail = member.config.on_data_loss != "skip"
        for _attempt in range(3):
            try:
                cursors, reached, pieces = plan_batch(planner, cursors, latest=latest,
                                                      fail_on_data_loss=fail,
                                                      config=member.config, move_start=_ask_move)
                break
            except _MoveStart as ask:
                cursors = await _moved(member, ask)
        else:
            raise AssertionError("the group's start moved three times in one plan")
        ranges = {s: ShardRange(shard=s, epoch=settled[s].epoch, next=c.next, full=c.full,
                                to=reached[s], moves=c.moves) for s, c in cursors.items()}
        ranges = {s: r for s, r in ranges.items() if not r.empty}
        if not ranges:
            previous = {}
            await asyncio.sleep(POLL_S)
            continue
        member.mark_busy(ranges)
        for s, r in sorted(ranges.items()):
            tables = []
            parts: list[list[Any]] = []  # [snapshot, kind, rows, next] of each piece read
            for p in pieces.get(s, ()):
                try:
                    tables += [planner.read_arrow(p.splits)] if p.splits else []
                    if p.splits:
                        parts.append([p.snapshot, p.kind, tables[-1].num_rows, p.snapshot + 1])
                except FileNotFoundError as err:  # an executor's read
                    piece_gone(fail, planner.table, s, p, err)
            kinds = {p.kind for p in pieces.get(s, ())}
            await asyncio.sleep(0)  # the executors' read
            if crashed():
                await asyncio.Event().wait()  # a dead process does nothing more
            ids: list[int] = []
            vs: list[int] = []
            extra: list[Any] = []
            for t in tables:
                ids += t.column("id").to_pylist()
                vs += t.column("v").to_pylist()
                extra += t.column("extra").to_pylist() if "extra" in t.column_names \
                    else [None] * t.num_rows
            record({"shard": s, "epoch": r.epoch, "snapshot": r.full if r.full is not None
                    else r.next, "next_snapshot": r.to,
                    "kind": kinds.pop() if len(kinds) == 1 else "mixed",
                    "pieces": parts,
                    "ids": ids, "vs": vs, "extra": extra})
        previous = ranges
