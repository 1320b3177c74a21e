"""The group member behind a streaming query: one per query, in the source's driver process.

Spark calls the stream reader's methods (``latestOffset``, ``partitions``,
``commit``) synchronously, from one thread of the Python process that hosts
the reader on the driver. The member runs on an asyncio loop in a background
thread of that process (its control loop: leadership, assignment, acquiring
and handing off shards, session keep-alive); :class:`GroupDriver` calls into
that loop and waits for the answer.

The member does not read here (no ``run``/``batches``): the query plans and
reads. What the query holds of a shard between planning a batch and
Spark's commit of it is marked busy (the shard's idle event cleared), so a
revocation waits for that commit, then releases at the batch's end. Spark
commits a batch only at its next trigger (``latestOffset(start)`` tells
that ``start`` is complete; ``commit(end)`` follows the planning of the next
batch), so the wait is not bounded by ``revoke_timeout_s``, which ends a
worker's batch in flight: with a trigger longer than it, every rebalance
would release a completed batch at its start, and the new owner read it
again. The option ``hold_timeout_s`` bounds it (then a batch held
longer is abandoned, as a worker's is: released with the position the
coordinator has). Every commit is the member's fenced commit, under the
epoch it holds now: the coordinator rejects it if another member owns the
shard, and the member drops the shard (never committed over a new owner).
"""

from __future__ import annotations

import asyncio
import logging
import math
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Iterable, Mapping, Sequence
from typing import TypeVar

from paimon_group.member import GroupMember
from paimon_group.member.data_loss import LostRange
from paimon_group.protocol.sharding import ShardRule
from paimon_group.reading.planner import ShardPlanner
from paimon_group.spark.source.offsets import (
    NO_CATCH_UP,
    Cursor,
    after_start_move,
    start_move,
)
from paimon_group.spark.source.options import SourceOptions
from paimon_group.spark.source.tables import TablePlanner

__all__ = ["GroupDriver", "OwnedCursor"]

log = logging.getLogger("paimon_group.spark_source")

T = TypeVar("T")

OwnedCursor = tuple[int, Cursor]
"""(epoch, cursor) of a shard this member owns."""


def _leave_interrupts_to_the_query() -> None:
    """In the Python process Spark starts to host the source, ignore SIGINT and SIGTERM.

    That process hosts the member. Two signals would end it before the
    member leaves (its shards then wait for its session to expire):

    * Ctrl-C in a terminal reaches the whole foreground process group, this
      process included; the program's own Ctrl-C handling stops the query.
    * When a query stops, Spark closes its connection to this process (which
      makes Spark's runner call the reader's ``stop()``: the member leaves the
      group) and at once sends it SIGTERM.

    Ignoring both, the member leaves when the query stops, and the process
    then exits by itself (the leave is bounded by the shutdown timeout). Only
    in a process Spark started (its ``__main__`` is a ``pyspark`` runner) and
    only from the main thread: a program that builds a driver itself keeps
    its own signals.
    """
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if (threading.current_thread() is threading.main_thread() and spec is not None
            and str(spec.name).startswith("pyspark.")):
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


class GroupDriver:
    """A :class:`GroupMember` on a loop thread, driven by the stream reader's calls.

    Transitions: created -> :meth:`start` (table opened, group joined,
    waits up to ``ready_timeout_s`` until the group's published assignment
    names this member and its shards are held: a query's first batch plans
    with them) -> calls ->
    :meth:`stop` (graceful leave: shards released with their committed
    positions). A member that failed (table gone, removed, ...) makes every
    later call raise its error.
    """

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        _leave_interrupts_to_the_query()
        self.member = GroupMember(options.member_config(), auto_commit=False)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="pg-spark-member",
                                        daemon=True)
        self._thread.start()
        self._planner: ShardPlanner | None = None
        # A query over several tables: each table's planner, by its first group shard.
        self._table_planners: dict[int, TablePlanner] = {}
        self.source: dict[str, object] = {}  # set by start()
        # shard -> the next snapshot of the batch that holds it (see hold()).
        self._busy: dict[int, int] = {}
        self._stopped = False

    def __repr__(self) -> str:
        return f"GroupDriver({self.options.group!r}, member {self.member.member_id!r})"

    def _call(self, coro: Awaitable[T], timeout: float | None = None) -> T:
        async def wrapped() -> T:
            return await coro

        future = asyncio.run_coroutine_threadsafe(wrapped(), self._loop)
        return future.result(timeout)

    def start(self) -> None:
        """Join the group; wait (bounded) until the group placed us and the shards
        assigned to us are ours (a new member of a group whose published
        assignment does not name it yet waits for the one that does)."""
        try:
            self._call(self.member.start())
        except BaseException:
            self._close_loop()
            raise
        deadline = time.monotonic() + self.options.ready_timeout_s
        while not self.member.ready and time.monotonic() < deadline:
            self.member.raise_if_failed()
            time.sleep(0.05)
        if not self.member.ready:
            log.warning("member %s of group %s: not placed by the group, or its assigned shards "
                        "not all held, within ready_timeout_s=%g s: the query goes on with the "
                        "shards it holds (%s) and takes the others when they come",
                        self.member.member_id, self.options.group, self.options.ready_timeout_s,
                        self.member.owned_shards)
        log.info("member %s joined group %s (shards %s)", self.member.member_id,
                 self.options.group, self.member.owned_shards)
        table = self.member.table
        if table is None:
            # Several tables: planned per table (planners_of); what a Paimon
            # sink's marks would record of one source table does not apply.
            self.source = {"group": self.options.group, "tables": True}
            return
        self._planner = table.planner(
            self.member.num_shards, include_row_kind=self.options.include_row_kind,
            rule=self.member.sharding, catch_up_threshold=NO_CATCH_UP)
        from paimon_group.protocol.identity import table_identity

        # What a Paimon sink's marks record of the source (offsets carry it:
        # paimon_group.spark.source.to_paimon).
        self.source = {"group": self.options.group, "table_id": table_identity(table.table),
                       "num_shards": self.member.num_shards,
                       "sharding": self.member.sharding.value}

    @property
    def ready(self) -> bool:
        """The group's published assignment names this member, and it holds every
        shard the assignment gives it (:attr:`GroupMember.ready`)."""
        return self.member.ready

    @property
    def group(self) -> str:
        return self.options.group

    @property
    def incarnation(self) -> str:
        """The incarnation of the group joined (offsets record it)."""
        return self.member.incarnation

    @property
    def planner(self) -> ShardPlanner:
        assert self._planner is not None, "start() first"
        return self._planner

    def planners_of(self, shards: Iterable[int]) -> dict[TablePlanner, list[int]]:
        """A query over several tables: ``shards`` (group shards) by the
        planner of their table; a shard of a table not read any more
        (dropped or re-created) or not known yet is left out."""
        tables = self.member.core.tables
        out: dict[TablePlanner, list[int]] = {}
        for shard in shards:
            table = tables.get(shard) if tables is not None else None
            if table is None or table.gone is not None:
                continue
            planner = self._table_planners.get(table.first)
            if planner is None:
                planner = self._table_planners[table.first] = TablePlanner(
                    table.name, table.range.table_id, table.first, table.table.planner(
                        table.range.shards, include_row_kind=self.options.include_row_kind,
                        rule=ShardRule.parse(table.range.sharding),
                        catch_up_threshold=NO_CATCH_UP))
            out.setdefault(planner, []).append(shard)
        return out

    def all_planners(self) -> list[TablePlanner]:
        """A query over several tables: the planner of each table read now."""
        tables = self.member.core.tables
        return list(self.planners_of(t.first for t in (tables or ())))

    def owned(self) -> dict[int, OwnedCursor]:
        """The shards owned now with their epoch and the coordinator's cursor.

        Shards with no position yet get their start resolved and pinned in
        the coordinator first (fenced, as a worker does before reading).
        """
        self.member.raise_if_failed()
        return self._call(self._owned())

    async def _owned(self) -> dict[int, OwnedCursor]:
        settled = await self.member.settle_positions()
        return {s: (p.epoch, Cursor(next=p.next_snapshot, full=p.full_scan, moves=p.start_moves))
                for s, p in settled.items()}

    def move_start(self, losts: Sequence[LostRange], cursors: Mapping[int, Cursor]
                   ) -> dict[int, Cursor]:
        """The pending full scans of ``losts`` expired on a bucket-unaware
        table (failOnDataLoss=false): move the group's start for every shard
        (:meth:`~paimon_group.member.host_reads.HostReads.move_group_start`) and
        return ``cursors`` re-pinned at it (those of an earlier start)."""
        self.member.raise_if_failed()
        lineage, read_to = start_move(losts, cursors)
        start = self._call(self.member.host_reads.move_group_start(losts, lineage, read_to))
        return after_start_move(cursors, losts, start)

    def stored_cursors(self, shards: Sequence[int]) -> dict[int, Cursor]:
        """The group's stored positions of ``shards`` as cursors, whoever owns
        them (read from the coordinator; a shard without one is left out)."""
        self.member.raise_if_failed()
        stored = self._call(self.member.host_reads.stored_positions(shards))
        return {s: Cursor(next=p.next_snapshot, full=p.full_scan, moves=p.start_moves)
                for s, p in stored.items()}

    def hold(self, positions: Mapping[int, int]) -> None:
        """Mark shards busy until a commit reaches ``shard -> next snapshot``
        (the end of the batch just planned): a revocation waits for it, for
        as long as Spark takes to prove the batch done (its next trigger's
        ``latestOffset``, or ``commit``), or the query stops; or up to the
        option ``hold_timeout_s``."""
        self._call(self._hold(dict(positions)))

    async def _hold(self, positions: dict[int, int]) -> None:
        limit = self.options.hold_timeout_s
        for shard in self.member.mark_busy(positions,
                                           limit_s=math.inf if limit is None else limit):
            self._busy[shard] = positions[shard]

    def commit(self, positions: Mapping[int, int], incarnation: str = "",
               moves: Mapping[int, int] | None = None) -> dict[int, bool]:
        """Fenced commit of ``shard -> next snapshot`` for the shards still ours.

        Returns per shard whether the coordinator has the position now (False:
        not ours any more, or rejected). Positions only move forward: a shard
        whose coordinator position is already at or beyond is left alone.
        Busy marks are cleared afterwards, so a waiting revocation goes on.
        Positions planned in another ``incarnation`` of the group than the
        one joined now are not committed, and free nothing (all False).
        ``moves``: the moves of the group start each position derives from
        (one of a start the group moved past is not committed: False).
        """
        self.member.raise_if_failed()
        return self._call(self._commit(dict(positions), incarnation, moves))

    async def _commit(self, positions: dict[int, int], incarnation: str,
                      moves: Mapping[int, int] | None) -> dict[int, bool]:
        if not self.member.host_reads.of_this_incarnation(incarnation):
            return dict.fromkeys(positions, False)  # the busy marks are of this one's batches
        try:
            return await self.member.commit_positions(positions, incarnation=incarnation,
                                                      moves=moves)
        finally:
            # Spark commits batch N after planning batch N+1: only what was
            # held up to this commit's positions is free now.
            freed = [s for s, to in positions.items() if s in self._busy and self._busy[s] <= to]
            for shard in freed:
                del self._busy[shard]
            self.member.mark_idle(freed)

    async def _unhold_all(self) -> None:
        freed = list(self._busy)
        self._busy.clear()
        self.member.mark_idle(freed)

    def stop(self) -> None:
        """Leave the group gracefully (idempotent)."""
        if self._stopped:
            return
        self._stopped = True
        try:
            # A batch still held when the query stops was abandoned by Spark
            # (it is not in its commit log): release its shards with the
            # committed positions at once instead of waiting for a commit.
            self._call(self._unhold_all(), timeout=10)
            self._call(self.member.stop(), timeout=self.member.config.timing.host_stop_wait_s)
        except Exception as err:
            log.warning("leaving the group failed: %s", err)
        finally:
            self._close_loop()

    def _close_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
