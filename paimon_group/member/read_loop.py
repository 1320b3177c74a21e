"""The read loop: plan each step once for the shards at one position, deliver, commit.

For every group of owned shards at the same position, the next step is
planned once (one read of the snapshot's manifests for all of them), each
shard's batch goes to the handler (up to ``max_parallel_shards`` at a time;
one shard never has two batches in flight), and the step's shards are
committed together through a :class:`~paimon_group.member.commits.CommitLane`.
The step after is planned while this one is in the handler. Nothing is
delivered unless the session is confirmed live (the session gate), and the
table is checked now and then to still be the one the group was created on.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, NoReturn

from coordinators.errors import CoordinatorError, PaimonGroupError, SessionLost
from paimon_group.errors import (
    AlreadyWritten,
    BatchExpired,
    DataFileMissing,
    HandlerFailed,
    NotOwner,
    SnapshotExpired,
    StaleEpoch,
)
from paimon_group.member.commits import CommitLane, Commits
from paimon_group.member.core import MemberCore
from paimon_group.member.data_loss import LostRange, data_loss_error, skip_warning
from paimon_group.member.handler_slot import HandlerSlot, StepHandlers
from paimon_group.member.head import TABLE_CHECK_S
from paimon_group.member.idle_round import IdleRounds
from paimon_group.member.moved_start import move_start, moves_group_wide, repin_stale
from paimon_group.member.sink_holds import check_held
from paimon_group.member.start_pin import pin_start
from paimon_group.member.state import OwnedShard, Stop
from paimon_group.member.table_check import check_table, check_table_in_place
from paimon_group.member.tables import MemberTable, TableGone
from paimon_group.member.watches import first_of
from paimon_group.reading.batch import ShardBatch
from paimon_group.reading.planner import StepPlan

log = logging.getLogger("paimon_group.member")

Process = Callable[[ShardBatch, HandlerSlot], Awaitable[None]]
Prefetched = dict[tuple[tuple[int, ...], int], asyncio.Future[Any]]


class ReadLoop:
    """The read loop (see the module docstring).

    Its interface: :meth:`run` (the loop, until the member stops or fails),
    and for a host that plans itself (:mod:`paimon_group.member.host_reads`)
    :meth:`settle` and :meth:`check_table`.
    """

    def __init__(self, core: MemberCore, commits: Commits) -> None:
        self._core = core
        self._commits = commits
        # Next steps' plans, started while the current ones are delivered:
        # (shards, position) -> the planning thread's future.
        self._prefetched: Prefetched = {}
        # Set once a batch's output went to a sink that commits at most once
        # per interval: a step then reads every unread snapshot (a catch-up
        # from two on), so the interval bounds the target's snapshots, not
        # what the member reads; planned fresh, not prefetched (a plan made
        # an interval earlier would hold less).
        self._paced = False
        self._idle_rounds = IdleRounds()
        self._planned = False  # the current round went past the head for a group

    async def run(self, process: Process) -> None:
        while not self._core.stopping:
            coord = self._core.coordinator
            try:
                await self._read_loop(process)
            except Stop:
                return
            except SessionLost:
                # The supervisor rejoins; wait for it and carry on.
                self._core.wake.set()
                await asyncio.sleep(0.05)
                continue
            except HandlerFailed as err:
                self._core.fail(err)
                return
            except PaimonGroupError as err:
                if self._core.stopping and isinstance(err, CoordinatorError):
                    # The member is leaving: it has released its shards and
                    # closes its coordinator under a round still in flight
                    # (a pin of shards acquired just before the stop). The
                    # round's call fails as "closed": the end of reading, not
                    # a failure (seen once the release became one commit and
                    # the leave reached the close sooner).
                    self._core.log.info("read round ended by the leave: %s", err)
                    return
                if (isinstance(err, CoordinatorError) and not err.retriable
                        and coord is not None and self._core.coordinator is not coord):
                    # A call of a round begun before a rejoin, on the
                    # connection the rejoin has closed since: every backend
                    # refuses it for good, but it is not this member's
                    # failure (say, the group start created on the closed
                    # connection). The round runs again on the new connection.
                    self._core.log.info("a read round spanned a rejoin (%s): reading again", err)
                    continue
                if not err.retriable:
                    self._core.fail(err)
                    return
                log.warning("coordinator unavailable while reading: %s", err)
                await asyncio.sleep(0.5)
            except asyncio.CancelledError:
                raise
            except BaseException as err:
                self._core.fail(err)
                return

    async def _read_loop(self, process: Process) -> None:
        poll = self._core.config.poll_interval_ms / 1000.0
        table_checked = self._core.clock.monotonic()
        while True:
            try:
                # Not asyncio.wait_for: on Python 3.11 it runs the gate in a
                # task of its own and, when a cancel of this loop (batches()
                # closed, run() cancelled: _consume cancels it and waits)
                # reaches it just as that task is done, returns the gate's
                # result and drops the cancel; the loop then read on, and the
                # close waited for it for ever. asyncio.timeout waits here,
                # in this task: the cancel reaches this await or the next.
                async with asyncio.timeout(TABLE_CHECK_S):
                    await self._core.wait_live()
            except TimeoutError:
                # Not live for that long (the coordinator unreachable, a
                # rejoin pending): the table is checked all the same, from
                # the warehouse itself, so a dropped or re-created table
                # stops the member within its bound whatever the coordinator
                # does meanwhile.
                table_checked = self._core.clock.monotonic()
                await self._core.in_io(self.check_table_in_place)
                continue
            self._core.raise_if_failed()
            progressed = await self._read_round(process)
            if self._core.clock.monotonic() - table_checked > TABLE_CHECK_S:
                # An idle table and a dropped table look alike to the planner
                # (no new snapshot), and a re-created one looks like a table
                # whose next snapshot is not there yet, until it gets there:
                # check now and then, busy or idle, that the table exists and
                # is the one the group was created on (TableNotFound,
                # TableReplaced), so neither is an endless wait or a skip.
                table_checked = self._core.clock.monotonic()
                await self._core.in_io(self.check_table)
            if not progressed:
                await self._idle_wait(poll)

    async def _idle_wait(self, poll: float) -> None:
        """Until a wake-up, a new snapshot in the published head, or ``poll``."""
        await first_of([asyncio.ensure_future(self._core.wake.wait()),
                        asyncio.ensure_future(self._core.head_woken.wait())], poll)
        self._core.wake.clear()
        self._core.head_woken.clear()

    def check_table(self) -> None:
        """:func:`~paimon_group.member.table_check.check_table` of this member."""
        check_table(self._core)

    def check_table_in_place(self, shards: Iterable[int] = ()) -> None:
        """:func:`~paimon_group.member.table_check.check_table_in_place` of this member."""
        check_table_in_place(self._core, shards)

    async def _read_round(self, process: Process) -> bool:
        idle_key = IdleRounds.key(self._core.tables, self._core.head)
        if self._idle_rounds.skip(idle_key, self._core.head):
            return False  # as the last round: nothing new (member/idle_round.py)
        active = [o for o in self._core.owned.values() if o.active]
        if not active:
            return False
        # Plans prefetched in the previous round; what this round does not use
        # is dropped at its end (the shards moved, or were re-grouped).
        prefetched, self._prefetched = self._prefetched, {}
        try:
            self._planned = False
            progressed = await self._read_groups(active, prefetched, process)
            self._idle_rounds.ran(idle_key, active,
                                  looked_only=not (progressed or self._planned))
            return progressed
        except FileNotFoundError:
            # A file the plan names is gone: most likely the table was dropped
            # (or re-created) since the last check, which says so in one line
            # (TableNotFound, TableReplaced); else the error stands.
            await self._core.in_io(self.check_table_in_place)
            raise
        finally:
            for future in prefetched.values():
                # Unused: retrieve its outcome so an error is not reported as lost.
                future.add_done_callback(lambda f: None if f.cancelled() else f.exception())

    async def settle(self, held: list[OwnedShard]) -> None:
        """Read back positions of uncertain commits, and resolve and pin the
        start of shards without a position (before anything is planned); the
        shards of a table found gone are left as they are (nothing of it is read)."""
        await self._commits.read_back([o for o in held if o.uncertain and not o.dropped])
        tables = self._core.tables
        if tables is not None and not tables.single:
            held = [o for o in held if (t := tables.get(o.shard)) is not None and t.gone is None]
        # Shards of a start the group moved past scan the moved one (file rule).
        await repin_stale(self._core, self._commits, held)
        unresolved = [o for o in held if o.next_snapshot is None and not o.dropped]
        if unresolved:
            await pin_start(self._core, self._commits, unresolved)

    async def _read_groups(self, active: list[OwnedShard], prefetched: Prefetched,
                           process: Process) -> bool:
        """One step for every group of active shards of one table at the same position."""
        tables = self._core.tables
        assert tables is not None
        await self.settle(active)
        by_position: dict[tuple[int, int, int | None], list[OwnedShard]] = defaultdict(list)
        for o in active:
            if o.next_snapshot is not None and not o.dropped:
                table = tables.of(o.shard)
                if table.gone is None:
                    by_position[(table.first, o.next_snapshot, o.full_scan)].append(o)
        progressed = False
        for (first, position, full_scan), owned in sorted(
                by_position.items(), key=lambda kv: (kv[0][1], kv[0][2] or 0, kv[0][0])):
            table = tables.of(first)
            shards = [o.shard for o in owned]
            if full_scan is None and self._nothing_new(table, position):
                # The leader polled the table moments ago: nothing at
                # `position` yet (member/head.py); no request to the store.
                continue
            self._planned = True
            await self._core.wait_live()
            try:
                if full_scan is not None:
                    step: StepPlan | None = await self._core.in_io(functools.partial(
                        table.plan_full, [table.local(s) for s in shards], full_scan))
                else:
                    step = await self._plan_next(table, shards, position, prefetched)
            except SnapshotExpired as err:
                await self._on_expired(owned, full_scan or position, full_scan is not None, err)
                progressed = True
                continue
            except Exception:  # of several tables, one found gone stops only itself
                if tables.single or not await self._went(first):
                    raise
                continue
            if step is None or not (tables.single or await self._core.in_io(table.in_place)):
                continue  # (of several tables, one re-created since is read no more)
            progressed = True
            # Plan the step after this one while this one's batches are in the
            # handler, so that the next step starts as soon as this one ends.
            self._prefetch_plan(table, shards, step.next_snapshot)
            deliveries, empty = self._batches(table, owned, step)
            await self._deliver_all(deliveries, empty, step, process)
        return progressed

    async def _on_expired(self, owned: list[OwnedShard], first: int, full_scan: bool,
                          err: SnapshotExpired) -> None:
        """Shards whose next snapshot ``first`` expired: stop with one line
        (``--on-data-loss fail``), or move them on to the earliest retained
        snapshot (``skip``); see :mod:`paimon_group.member.data_loss`."""
        table = self._core.table_of(owned[0].shard)
        earliest = await self._core.in_io(table.table.earliest_snapshot_id)
        if earliest is None or earliest <= first:
            raise err  # not a gap this member can name (the table changed under it)
        lost = LostRange(tuple(sorted(o.shard for o in owned)), first, earliest, full_scan)
        extra = {"group": self._core.group_name, "member": self._core.member_id}
        if self._core.config.on_data_loss != "skip":
            raise data_loss_error(self._core.config, lost, table.name) from None
        if full_scan and moves_group_wide(table):
            # Bucket-unaware: the group's start moves, once for every shard
            # (member/moved_start.py); under the bucket rules a shard alone
            # re-pinned at the earliest snapshot is consistent with the rest.
            await move_start(self._core, table, lost, min(o.start_moves for o in owned))
            return
        log.warning(skip_warning(self._core.config, lost, table.name), extra=extra)
        self._core.history.record("skip", shards=list(lost.shards), first=first, earliest=earliest,
                            full_scan=full_scan)
        if full_scan:
            # A full scan of the earliest snapshot instead: the table as it
            # is there, nothing of it skipped.
            await self._commits.commit({o.shard: o for o in owned}, earliest + 1,
                                       full_scan=earliest)
            return
        # Counted once committed: the shards really moved past the gap.
        await self._commits.commit({o.shard: o for o in owned}, earliest)
        self._core.stats.skipped_snapshots += lost.count * len(lost.shards)

    def _batches(self, table: MemberTable, owned: list[OwnedShard], step: StepPlan
                 ) -> tuple[list[tuple[OwnedShard, ShardBatch]], dict[int, OwnedShard]]:
        """The step's batch of each shard still active and ours, and the
        shards without rows in the step. ``step`` is in ``table``'s shard
        numbers; a batch says its table's shard (``shard``) and the group's
        (``group_shard``)."""
        empty: dict[int, OwnedShard] = {}
        deliveries: list[tuple[OwnedShard, ShardBatch]] = []
        for o in owned:
            if not o.active or self._core.owned.get(o.shard) is not o:
                continue
            local = table.local(o.shard)
            splits = step.splits.get(local, ())
            if not splits:
                empty[o.shard] = o
                continue
            deliveries.append((o, ShardBatch(
                group=self._core.group_name,
                member_id=self._core.member_id,
                shard=local,
                num_shards=table.range.shards,
                epoch=o.epoch,
                plan=step,
                planner=table.planner,
                incarnation=self._core.incarnation,
                start_moves=o.start_moves,
                table_id=table.range.table_id,
                sinks=self._core.sinks,
                table=table.name,
                group_shard=o.shard,
            )))
        return deliveries, empty

    def _nothing_new(self, table: MemberTable, position: int) -> bool:
        """Whether the group's fresh head says ``table`` has no snapshot
        ``position`` yet (member/head.py): no request to the store."""
        if table.index is None:
            return self._core.head.nothing_new_at(position)
        return self._core.head.nothing_new_in(table.first, position)

    def _prefetch_plan(self, table: MemberTable, shards: list[int], position: int) -> None:
        """Start planning ``plan_next(shards, position)`` in the planning thread."""
        if self._paced or self._nothing_new(table, position):
            return  # the published head wakes the read loop when it is there
        self._prefetched[(tuple(shards), position)] = self._core.start_in_io(
            functools.partial(table.plan_next, [table.local(s) for s in shards],
                              position))

    async def _plan_next(
        self,
        table: MemberTable,
        shards: list[int],
        position: int,
        prefetched: Prefetched,
    ) -> StepPlan | None:
        """The next step of ``table``'s ``shards`` (group numbers; the plan in
        the table's), from the prefetched plan when it is the one asked for.

        A prefetched None (the snapshot did not exist yet then) or error is
        not trusted: the step is planned again now, so an error is raised
        fresh and a snapshot committed since is seen.
        """
        future = prefetched.pop((tuple(shards), position), None)
        if future is not None:
            try:
                step: StepPlan | None = await future
            except Exception:
                step = None
            if step is not None:
                return step
        head = self._core.head.record if self._core.head.fresh and table.index is None else None
        planned: StepPlan | None = await self._core.in_io(functools.partial(
            table.plan_next, [table.local(s) for s in shards], position,
            known_latest=None if head is None else head.latest,
            catch_up_threshold=1 if self._paced else None))
        return planned

    async def _deliver_all(
        self,
        deliveries: list[tuple[OwnedShard, ShardBatch]],
        empty: dict[int, OwnedShard],
        step: StepPlan,
        process: Process,
    ) -> None:
        """Deliver one step's batches, up to ``max_parallel_shards`` handlers at
        a time, and commit every shard of the step.

        Batches of *different* shards may be in the handler at once (reading
        releases the GIL in pyarrow); one shard never has two batches in
        flight. The gate bounds handlers only (a handler may start while an
        earlier shard's commit is in flight); commits are coalesced by a
        :class:`CommitLane`, normally one for the whole step, and shards
        without rows ride along. A shard is idle (a revoke may take it) once
        its own commit is done.
        Every started delivery is awaited before an error is re-raised, so a
        failure of one shard never abandons another shard's finished batch.
        Batches whose files expired while their handler held them are the
        step's data loss, handled once all are back (:meth:`_on_lost_batches`).
        """
        lane = CommitLane(self._commits.commit, step.next_snapshot, riders=empty,
                          expected=len(deliveries))
        if not deliveries:
            await lane.flush()
            return
        gate = asyncio.Semaphore(max(1, self._core.config.max_parallel_shards))
        handlers = StepHandlers(len(deliveries))
        lost: list[tuple[OwnedShard, BatchExpired]] = []
        self._commits.lanes.add(lane)
        try:
            try:
                results = await asyncio.gather(
                    *(self._deliver_one(o, b, step, process, lane,
                                        HandlerSlot(gate, handlers), lost)
                      for o, b in deliveries), return_exceptions=True)
            finally:
                self._commits.lanes.discard(lane)
            if lost:
                await self._on_lost_batches(lost)
        finally:
            for o, _ in lost:
                o.idle.set()
        self._paced = self._paced or any(b.output_sealed for _, b in deliveries)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            # The most important first: a failed handler, then anything
            # else, and a plain stop last.
            errors.sort(key=lambda e: 0 if isinstance(e, HandlerFailed)
                        else 2 if isinstance(e, Stop) else 1)
            raise errors[0]
        await lane.flush()

    async def _deliver_one(self, o: OwnedShard, batch: ShardBatch, step: StepPlan,
                           process: Process, lane: CommitLane, slot: HandlerSlot,
                           lost: list[tuple[OwnedShard, BatchExpired]]) -> None:
        """One shard's batch of :meth:`_deliver_all`: handled, then committed
        through the step's lane; a batch whose files expired goes to ``lost``
        (the shard stays busy until :meth:`_on_lost_batches` is done)."""
        o.idle.clear()
        queued = written_committed = False
        gone: BaseException | None = None
        dropped: TableGone | None = None
        written: AlreadyWritten | None = None
        try:
            async with slot:
                if not o.active:
                    return  # revoked while waiting: the next owner reads it
                try:
                    await self._handle(o, batch, step, process, slot)
                except BatchExpired as err:
                    gone = err
                    lost.append((o, err))
                    return
                except TableGone as err:
                    dropped = err  # not committed: the table is not read any more
                    return
                except AlreadyWritten as err:
                    written = err
                if written is None and batch.sink_holds is not None:
                    written = AlreadyWritten("a sink holds the batch", shard=o.shard,
                                             next_snapshot=batch.sink_holds)
            if written is not None:
                await self._commit_written(o, batch, written)
                written_committed = True
                return
            # Commit even if the shard was lost meanwhile (session lost and
            # rejoined): the coordinator, not this process, decides, and it
            # rejects a stale epoch. (One abandoned by a revoke that ended is
            # refused by the commits part: Commits.commit says why.)
            queued = True
            await self._commit_batch(lane, o, batch, step)
        finally:
            slot.close()  # (also if cancelled waiting for it: the step's others go on)
            batch.close_output()  # a no-op once sealed; else nothing of it is committed
            if not queued:
                lane.skipped()
                self._resolve_durable(batch, None if written_committed else gone or written
                                      or dropped or NotOwner(f"shard {o.shard} was revoked"))
            if gone is None:
                o.idle.set()

    async def _commit_written(self, o: OwnedShard, batch: ShardBatch,
                              written: AlreadyWritten) -> None:
        """The handler's sink already holds ``batch`` up to
        ``written.next_snapshot``: commit that position for the shard alone
        (fenced as any commit; the step's lane goes on without it), so the
        next step reads on from what the sink holds, once it is found
        credible (:func:`~paimon_group.member.sink_holds.check_held`)."""
        await check_held(self._core, o, batch, written)
        self._core.log.info(
            "shard %d: the sink already holds snapshots up to %d: the position moves "
            "there", o.shard, written.next_snapshot - 1,
            extra={"shard": o.shard, "epoch": o.epoch})
        self._core.history.record("already_written", shard=o.shard, epoch=o.epoch,
                                  snapshot=batch.snapshot_id, next_snapshot=written.next_snapshot)
        await self._commits.commit({o.shard: o}, written.next_snapshot)

    async def _on_lost_batches(self, lost: list[tuple[OwnedShard, BatchExpired]]) -> None:
        """Shards of one step whose batch's files Paimon's expiry deleted while
        the handler held it: data loss, as when the step's snapshot had
        expired before it was planned (:meth:`_on_expired`, once for them
        all: one line names every shard, or they skip together)."""
        err = lost[0][1]
        await self._on_expired([o for o, _ in lost], err.first, err.full_scan, err)

    async def _commit_batch(self, lane: CommitLane, o: OwnedShard, batch: ShardBatch,
                            step: StepPlan) -> None:
        """Commit ``batch``'s shard through the step's lane, and tell a caller
        waiting in ``commit(batch)`` whether its position is now durable."""
        try:
            await lane.commit(o)
        except BaseException as err:
            self._resolve_durable(batch, err)
            raise
        self._resolve_durable(batch, None if self._advanced(o, step) else StaleEpoch(
            f"shard {o.shard}: the position after snapshot {step.snapshot_id} was not "
            "committed: this member no longer owns the shard (the next owner reads "
            "the batch again)"))

    @staticmethod
    def _advanced(o: OwnedShard, step: StepPlan) -> bool:
        """Whether ``o``'s committed position now covers ``step``."""
        return (not o.dropped and o.full_scan is None and o.next_snapshot is not None
                and o.next_snapshot >= step.next_snapshot)

    def _resolve_durable(self, batch: ShardBatch, error: BaseException | None) -> None:
        """Tell a caller waiting in ``commit(batch)`` how the batch's commit ended."""
        waiter = self._core.take_durable(batch)
        if waiter is None or waiter.done():
            return
        if error is None:
            waiter.set_result(None)
        elif isinstance(error, asyncio.CancelledError):
            waiter.cancel()
        else:
            waiter.set_exception(error)
            waiter.add_done_callback(lambda f: f.exception())  # retrieved if nobody waits

    async def _files_gone(self, err: BatchExpired | DataFileMissing, shard: int) -> NoReturn:
        """Raise what a batch whose files are gone means, once the table is
        found in place (else TableNotFound, TableReplaced, or in a group of
        several TableGone, say so: a dropped table's files are gone too, a
        re-created one's snapshots say nothing of the old one's): data loss
        (BatchExpired, handled by :meth:`_deliver_all`), or one line."""
        if await self._went(shard):
            raise TableGone(f"shard {shard}: its table is gone") from err
        raise err

    async def _went(self, shard: int) -> bool:
        """Whether the table of ``shard`` is found gone now (a group of several)."""
        await self._core.in_io(functools.partial(self.check_table_in_place, (shard,)))
        return self._core.tables is not None and self._core.tables.gone(shard) is not None

    async def _handle(self, o: OwnedShard, batch: ShardBatch, step: StepPlan,
                      process: Process, slot: HandlerSlot) -> None:
        """Run the handler on one batch (nothing is committed here)."""
        await self._core.wait_live()
        started = self._core.clock.monotonic()
        try:
            await process(batch, slot)
        except Exception:
            if batch.lost is None:
                raise
        if batch.lost is not None:
            # Its files are gone (raised by its read, whatever the handler
            # did with the error): never a handler failure, never retried.
            await self._files_gone(batch.lost, o.shard)
        self._core.stats.handler_seconds.append(self._core.clock.monotonic() - started)
        if len(self._core.stats.handler_seconds) > 10_000:
            # Bounded: readers (metrics) start over on a new list.
            self._core.stats.handler_seconds = []
        self._core.stats.batches += 1
        rows = int(getattr(batch, "rows_read", 0) or 0)
        self._core.stats.rows += rows
        self._core.log.debug(
            "delivered shard %d %s snapshots %s..%d: %d rows in %.3f s", o.shard,
            step.kind.value, getattr(batch, "first_snapshot", "?"), step.snapshot_id,
            rows, self._core.clock.monotonic() - started,
            extra={"shard": o.shard, "epoch": o.epoch})
        self._core.history.record("deliver", shard=o.shard, epoch=o.epoch,
                            snapshot=step.snapshot_id, next_snapshot=step.next_snapshot,
                            kind=step.kind.value)
