"""The group member a user holds: :class:`GroupMember` (start, stop, run,
batches, commit), built of a private :class:`MemberCore` and the parts."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import signal
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from types import TracebackType
from typing import Generic, Never, Self, TypeVar, overload

import tenacity

from coordinators.errors import CoordinatorError
from paimon_group.config.clock import SYSTEM_CLOCK, Clock
from paimon_group.config.member import MemberConfig
from paimon_group.config.projection import check_columns
from paimon_group.errors import AlreadyWritten, StaleEpoch
from paimon_group.member.commits import Commits
from paimon_group.member.control import Control
from paimon_group.member.core import Handler, MemberCore, RebalanceListener
from paimon_group.member.handler_errors import HandlerErrors
from paimon_group.member.handler_retry import HandlerRetries
from paimon_group.member.handler_slot import HandlerSlot
from paimon_group.member.host_reads import HostReads, ShardPosition
from paimon_group.member.membership import Membership
from paimon_group.member.ownership import ShardOwnership
from paimon_group.member.read_loop import Process, ReadLoop
from paimon_group.member.signals import subscribe as subscribe_stop_signals
from paimon_group.member.state import MemberState, Stop
from paimon_group.member.table_refresh import open_subscription
from paimon_group.protocol.records import GroupStart
from paimon_group.reading.batch import ShardBatch
from paimon_group.reading.table import ShardedTable

log = logging.getLogger("paimon_group.member")

T = TypeVar("T")


class _CoreView(Generic[T]):
    """A read-only attribute of :class:`GroupMember`: ``read`` of its core
    (:class:`MemberCore`), whose state the parts change and a member's user
    reads. Assigning raises AttributeError, as a property without a setter
    does."""

    def __init__(self, read: Callable[[MemberCore], T], doc: str | None = None) -> None:
        self._read = read
        self._name = ""
        self.__doc__ = doc

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    @overload
    def __get__(self, member: None, owner: type | None = None) -> Self: ...

    @overload
    def __get__(self, member: GroupMember, owner: type | None = None) -> T: ...

    def __get__(self, member: GroupMember | None, owner: type | None = None) -> T | Self:
        if member is None:
            return self
        return self._read(member._core)  # the one reader of the core outside its owner

    def __set__(self, member: GroupMember, value: Never) -> None:
        raise AttributeError(f"GroupMember.{self._name} is read-only")


class GroupMember:
    """A member of a consumer group over one Paimon table.

    See :mod:`paimon_group.member` for what it does and how it is built.
    """

    def __init__(
        self,
        config: MemberConfig,
        *,
        listener: RebalanceListener | None = None,
        auto_commit: bool = True,
        table: ShardedTable | None = None,
        handle_signals: bool = True,
        clock: Clock | None = None,
    ) -> None:
        """``table``: the config's table, already opened (a check made before
        the start, as ``paimon-group run`` makes): the first start uses it
        instead of opening the table again (on an object store, requests);
        None: the start opens it. ``handle_signals``: as ``async with``,
        SIGTERM and SIGINT stop the member gracefully (its shards handed off,
        :meth:`batches` ends) while they have their default handlers
        (:mod:`paimon_group.member.signals`); False: leave them alone.
        ``clock``: the monotonic and wall clock every loop, deadline, lease
        and history line of this member reads (for tests and simulations;
        None: the system's, :mod:`paimon_group.config.clock`)."""
        # The core: the state every part reads and the services they share.
        # Private: a member's user sees the read-only views below.
        self._core = core = MemberCore(config, listener=listener, auto_commit=auto_commit,
                                             clock=clock or SYSTEM_CLOCK)
        # The parts, each built with the core, the state it owns (the shards
        # held: ownership's, which commits may forget; the leadership:
        # control's) and the sibling parts it calls.
        owned, leadership = core.owned_record(), core.leadership_record()
        self.commits = Commits(core, owned)
        self.ownership = ShardOwnership(core, self.commits, owned)
        self.control = Control(core, self.ownership, leadership)
        self.membership = Membership(core, self.ownership, self.control)
        self.read_loop = ReadLoop(core, self.commits)
        self.host_reads = HostReads(core, self.commits, self.read_loop)
        self._supervisor: asyncio.Task[None] | None = None
        self._opened_table = table
        self._queue: asyncio.Queue[tuple[ShardBatch, asyncio.Future[bool]]] = asyncio.Queue(1)
        self._acked: dict[int, asyncio.Future[bool]] = {}
        self._stop_task: asyncio.Future[None] | None = None
        self._handle_signals = handle_signals
        self._unsubscribe: Callable[[], None] | None = None
        self._signalled: asyncio.Future[None] | None = None
        self._retry_handler = tenacity.AsyncRetrying(
            stop=tenacity.stop_after_attempt(max(1, config.max_handler_attempts)),
            wait=tenacity.wait_exponential(multiplier=config.handler_backoff_s, max=30),
            reraise=True,
        )

    # -- lifecycle -------------------------------------------------------

    async def __aenter__(self) -> Self:
        self._signalled = None
        if self._handle_signals:
            self._unsubscribe = subscribe_stop_signals(asyncio.get_running_loop(),
                                                       self._on_stop_signal)
        try:
            await self.start()
        except BaseException:
            # __aexit__ is not run when __aenter__ raises: stop here, or the
            # executor's threads outlive the member.
            with contextlib.suppress(Exception):
                await self.stop(timeout=0)
            self._restore_signals()
            raise
        if self._signalled is not None:  # a signal came while joining
            self._signalled = asyncio.ensure_future(self.stop())
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            await self.stop()
        finally:
            self._restore_signals()

    def _on_stop_signal(self, signum: int) -> None:
        """SIGTERM or SIGINT under ``async with``: leave gracefully, as
        ``paimon-group run`` does; :meth:`batches` then ends."""
        if self._signalled is not None:
            return  # a stop is under way (stop() bounds it)
        self._core.log.info("%s: handing shards off", signal.Signals(signum).name)
        if self._core.state is MemberState.JOINING:
            # Stopped once the start returns (__aenter__), not in the middle of it.
            self._signalled = asyncio.get_running_loop().create_future()
        else:
            self._signalled = asyncio.ensure_future(self.stop())

    def _restore_signals(self) -> None:
        unsubscribe, self._unsubscribe = self._unsubscribe, None
        if unsubscribe is not None:
            unsubscribe()

    async def start(self) -> None:
        """Open the table, join the group; reading starts when a handler or iterator runs."""
        self._stop_task = None
        core = self._core
        core.set_state(MemberState.JOINING)
        cfg = core.config
        try:
            if cfg.single_table:
                table, self._opened_table = self._opened_table, None
                if table is None:
                    table = await core.in_io(
                        lambda: ShardedTable.open(cfg.warehouse, cfg.table, cfg.catalog_options))
                check_columns(table.table.field_names, cfg.columns)
                core.opened(table, cfg.start_position)
            else:
                await core.in_io(functools.partial(open_subscription, core))
            await self.membership.join(first=True)
        except BaseException:
            # A start that fails keeps nothing open for a caller that never
            # calls stop(): not the session (its member key would stand in the
            # group for a session timeout, assigned shards nobody reads), not
            # the history file (a long-lived process restarting members
            # leaked one descriptor per failed start). stop() still works.
            await self.membership.close_coordinator()
            core.history.close()
            raise
        if core.stopping:
            # stop() ran while we were joining: it found nothing to leave.
            # Registered now, with no control loop to follow, we would be
            # assigned shards nobody reads: end the session (and so the
            # member key) at once.
            await self.membership.close_coordinator()
            core.set_state(MemberState.STOPPED)
            return
        self._supervisor = asyncio.create_task(self.membership.supervise(), name="pg-supervisor")

    async def stop(self, *, timeout: float | None = None) -> None:
        """Leave gracefully: stop reading, commit, release every shard, close.

        Finishes within ``timeout`` (default ``shutdown_timeout_s``): a batch
        still in flight then is abandoned (not committed; the next owner
        re-reads it). A stop while one is under way (a signal handler and a
        context manager both stopping) waits for that one instead of leaving
        and closing a second time.
        """
        task = self._stop_task
        if task is None or task.cancelled():  # none yet, or one whose caller gave up
            task = self._stop_task = asyncio.ensure_future(self._stop(timeout))
            await task
        else:
            await asyncio.shield(task)

    async def _stop(self, timeout: float | None) -> None:
        core = self._core
        if core.state in (MemberState.STOPPED, MemberState.CREATED):
            core.set_state(MemberState.STOPPED)
            return
        timeout = core.config.shutdown_timeout_s if timeout is None else timeout
        core.begin_stop()
        if core.state is not MemberState.FAILED:
            core.set_state(MemberState.LEAVING)
        try:
            await asyncio.wait_for(self.membership.leave(), timeout=max(0.1, timeout))
        except (TimeoutError, CoordinatorError) as err:
            log.warning("graceful leave incomplete: %s", err)
        tasks = [*core.tasks, *([self._supervisor] if self._supervisor else [])]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(BaseException):
                await t
        await self.membership.close_coordinator()
        core.close_io()
        core.history.close()
        if core.state is not MemberState.FAILED:
            core.set_state(MemberState.STOPPED)

    # -- consuming -------------------------------------------------------

    async def run(self, handler: Handler) -> None:
        """Call ``handler(batch)`` (in a worker thread) for every batch until stopped.

        The batch's position is committed (fenced) after the handler returns.
        A raising handler is retried with exponential backoff; after
        ``max_handler_attempts`` on one batch the member fails: no other
        batch reaches the handler, the other batches' retries stop at once,
        the member releases its shards and this raises
        :class:`~paimon_group.errors.HandlerFailed`
        (:mod:`paimon_group.member.handler_retry`). A batch whose files are gone
        (``batch.lost``, set by its read) is not retried: the read loop
        handles it (data loss as ``--on-data-loss`` says, or one line).
        """
        attempts = self._core.config.max_handler_attempts
        errors = HandlerErrors(attempts)  # a traceback once
        retries = HandlerRetries(self._retry_handler, attempts)  # the first batch out of them

        async def process(batch: ShardBatch, slot: HandlerSlot) -> None:
            # Not retried: a batch whose files are gone, one a sink holds
            # already (AlreadyWritten: the read loop commits its position), and
            # one a sink refused for a newer owner (StaleEpoch: the member's
            # own commit of it is rejected for the same reason).
            retrying = retries.for_batch(tenacity.retry_if_exception(
                lambda e: isinstance(e, Exception)
                and not isinstance(e, AlreadyWritten | StaleEpoch) and batch.lost is None))
            try:
                async for attempt in retrying:
                    await slot.hold()  # again for a retry
                    retries.check()  # a batch gave up: the member fails, no call more
                    with attempt:
                        try:
                            result = await asyncio.to_thread(handler, batch)
                            if asyncio.iscoroutine(result):
                                await result
                            # The output the handler's sinks hold for the
                            # batch, committed together before its position;
                            # the slot is the next shard's meanwhile.
                            await _seal(batch, slot)
                        except Exception as raised:
                            batch.drop_output()  # an attempt's parts: none committed
                            if batch.lost is None and not isinstance(
                                    raised, AlreadyWritten | StaleEpoch):
                                self._core.stats.handler_errors += 1
                                errors.raised(raised, shard=batch.shard,
                                              snapshot=batch.snapshot_id,
                                              attempt=attempt.retry_state.attempt_number)
                            raise
            except StaleEpoch as err:
                if batch.lost is not None:
                    raise
                log.warning("shard %d: the handler's sink refused the batch at snapshot %d "
                            "of epoch %d: %s", batch.shard, batch.snapshot_id, batch.epoch, err)
            except Exception as err:
                if (batch.lost is not None or isinstance(err, AlreadyWritten)
                        or err is retries.failed):
                    raise
                await self._give_up(retries, err, batch)

        await self._consume(process)

    async def _give_up(self, retries: HandlerRetries, err: Exception,
                       batch: ShardBatch) -> Never:
        """The batch used up its attempts: the member fails. A handler that
        gave up on a table dropped or re-created under it (its batch read
        with the old table's schema) failed because of that, and the member
        says so (TableNotFound, TableReplaced), not "handler failed"."""
        with contextlib.suppress(OSError, RuntimeError):
            await self._core.in_io(self.read_loop.check_table_in_place)
        retries.give_up(err, shard=batch.shard, snapshot=batch.snapshot_id)

    async def _consume(self, process: Process) -> None:
        reader = asyncio.create_task(self.read_loop.run(process), name="pg-read")
        try:
            while not reader.done():
                # A failed member stops reading at once; a leaving one lets the
                # reader finish its batch in flight (stop() waits for it).
                if (self._supervisor is not None and self._supervisor.done()
                        and self._core.state is MemberState.FAILED):
                    break
                if self._supervisor is not None and self._supervisor.done():
                    await asyncio.wait([reader])
                    break
                await asyncio.wait([reader, *( [self._supervisor] if self._supervisor else [])],
                                   return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not reader.done():
                reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Stop):
                await reader
        self._core.raise_if_failed()

    async def batches(self) -> AsyncIterator[ShardBatch]:
        """Iterate over batches. With ``auto_commit`` a batch is committed when
        the next one is requested; otherwise call :meth:`commit`."""
        async def process(batch: ShardBatch, slot: HandlerSlot) -> None:
            loop = asyncio.get_running_loop()
            done: asyncio.Future[bool] = loop.create_future()
            if not self._core.auto_commit:
                self._core.await_durable(batch)
            await self._queue.put((batch, done))
            try:
                await done
            except BaseException:
                batch.drop_output()
                raise
            # The output the loop body's sinks hold for the batch, committed
            # together before its position.
            try:
                # Not with the step: the loop body takes one batch at a time,
                # and may wait in commit(batch) for this one's position.
                await _seal(batch, slot, with_step=False)
            except StaleEpoch as err:
                log.warning("shard %d: a sink refused the batch at snapshot %d of epoch %d: "
                            "%s", batch.shard, batch.snapshot_id, batch.epoch, err)

        reader = asyncio.create_task(self._consume(process), name="pg-consume")
        current: asyncio.Future[bool] | None = None
        getter: asyncio.Future[tuple[ShardBatch, asyncio.Future[bool]]] | None = None
        try:
            while True:
                getter = asyncio.ensure_future(self._queue.get())
                await asyncio.wait([getter, reader], return_when=asyncio.FIRST_COMPLETED)
                if not getter.done():
                    break
                batch, done = getter.result()
                getter = None
                current = done
                self._acked[id(batch)] = done
                yield batch
                if self._core.auto_commit and not done.done():
                    done.set_result(True)
        finally:
            await _end_iteration(getter, current, reader)
        self._core.raise_if_failed()

    async def commit(self, batch: ShardBatch, *, wait: bool = True) -> None:
        """Commit ``batch``'s position (iterator mode without auto commit).

        As Kafka's ``commitSync``: when this returns, the position after the
        batch is durable in the coordinator (one fenced commit), so a handler
        that wrote the batch to an external system may acknowledge it there.
        It raises :class:`~paimon_group.errors.StaleEpoch` (or
        :class:`~paimon_group.errors.NotOwner`) when the shard moved to another
        member first: the position was not committed and the next owner reads
        the batch again. The cost: one coordinator round trip, and the shards
        of one step share one commit, so it may wait up to
        ``COMMIT_LINGER_S`` (0.5 s) for the step's other shards.

        ``wait=False`` only acknowledges the batch (the position is committed
        soon after, with the step's other shards), and returns at once.
        """
        key = id(batch)
        durable = self._core.durable_of(batch)
        done = self._acked.pop(key, None)
        if done is not None and not done.done():
            done.set_result(True)
        if wait and durable is not None:
            await durable
        else:
            await asyncio.sleep(0)

    @property
    def core(self) -> MemberCore:
        """The member's core: the state its parts share and the services they
        use (its coordinator, its group client, the joined session). A seam for
        tests and tooling that drive or inspect the parts, not a stable API: a
        member's user reads the views below."""
        return self._core

    # -- what a user may read (views of the core; the parts change them) ----
    # Read-only: assigning one raises AttributeError.

    config = _CoreView(lambda core: core.config)
    timing = _CoreView(lambda core: core.timing, "Every timing derived from the session timeout.")
    member_id = _CoreView(lambda core: core.member_id)
    group_name = _CoreView(lambda core: core.group_name)
    listener = _CoreView(lambda core: core.listener)
    auto_commit = _CoreView(lambda core: core.auto_commit)
    state = _CoreView(lambda core: core.state)
    error = _CoreView(lambda core: core.error, "What failed the member (FAILED), else None.")
    stats = _CoreView(lambda core: core.stats)
    history = _CoreView(lambda core: core.history)
    table = _CoreView(lambda core: core.table, "The member's table, once started.")
    num_shards = _CoreView(lambda core: core.num_shards)
    sharding = _CoreView(lambda core: core.sharding)
    group_start = _CoreView(lambda core: core.group_start,
                            "The group's start as last read (None: none stored, or not read).")
    start_moves = _CoreView(lambda core: core.start_moves,
                            "The moves of the group's start as last read (0: none read).")
    owned_shards = _CoreView(lambda core: core.owned_shards)
    assignment = _CoreView(lambda core: core.assignment)
    is_leader = _CoreView(lambda core: core.is_leader)
    ready = _CoreView(lambda core: core.ready,
                      "Joined, and every shard assigned to us is acquired.")
    session_state = _CoreView(lambda core: core.session_state)

    def shard_positions(self) -> dict[int, int | None]:
        """Per owned shard, the oldest snapshot it still needs as committed in the
        coordinator (a pending full scan's snapshot, else the next snapshot),
        or None before its first commit."""
        return {shard: o.position for shard, o in self._core.owned.items() if not o.dropped}

    def published_latest(self) -> int | None:
        """The table's latest snapshot id as the group's published head says it,
        while the head is fresh (:mod:`paimon_group.member.head`); else None."""
        return self._core.published_latest()

    def loop_lag(self) -> float:
        """Seconds since the control loop last ran."""
        return self._core.loop_lag()

    def observe_start(self, start: GroupStart | None) -> None:
        """:meth:`MemberCore.observe_start <paimon_group.member.core.MemberCore.observe_start>`."""
        self._core.observe_start(start)

    def raise_if_failed(self) -> None:
        """Raise what failed the member, if it failed."""
        self._core.raise_if_failed()

    # -- driven by a host that reads by itself (member/host_reads.py) -----

    incarnation = _CoreView(lambda core: core.incarnation,
                            "The group's incarnation as the last join read it ('' before).")

    def held_shards(self) -> list[int]:
        """:meth:`HostReads.held_shards <paimon_group.member.host_reads.HostReads.held_shards>`."""
        return self.host_reads.held_shards()

    async def settle_positions(self) -> dict[int, ShardPosition]:
        """:meth:`HostReads.settle_positions
        <paimon_group.member.host_reads.HostReads.settle_positions>`."""
        return await self.host_reads.settle_positions()

    def mark_busy(self, shards: Iterable[int], *, limit_s: float | None = None) -> list[int]:
        """:meth:`HostReads.mark_busy <paimon_group.member.host_reads.HostReads.mark_busy>`."""
        return self.host_reads.mark_busy(shards, limit_s=limit_s)

    def mark_idle(self, shards: Iterable[int]) -> None:
        """:meth:`HostReads.mark_idle <paimon_group.member.host_reads.HostReads.mark_idle>`."""
        self.host_reads.mark_idle(shards)

    async def commit_positions(self, positions: Mapping[int, int], *,
                               incarnation: str = "",
                               moves: Mapping[int, int] | None = None) -> dict[int, bool]:
        """:meth:`HostReads.commit_positions
        <paimon_group.member.host_reads.HostReads.commit_positions>`."""
        return await self.host_reads.commit_positions(positions, incarnation=incarnation,
                                                   moves=moves)


async def _seal(batch: ShardBatch, slot: HandlerSlot, *, with_step: bool = True) -> None:
    """``batch``'s handler returned: give its slot to the step's next shard,
    wait for the step's other handlers (``with_step``: their batches' output
    is sealed at once and shares a target commit), seal the output the sinks
    hold for it and wait for every sink's commit; raise the first sink's
    error once all are done."""
    if with_step:
        await slot.handled()
    else:
        slot.release()
    # In a worker thread: a seal writes the parts' last files (and commits,
    # at a sink's interval 0).
    sealed: list[concurrent.futures.Future[None]] = await asyncio.to_thread(batch.seal_output)
    errors = [r for r in await asyncio.gather(*(asyncio.wrap_future(f) for f in sealed),
                                              return_exceptions=True)
              if isinstance(r, BaseException)]
    if errors:
        raise errors[0]


async def _end_iteration(
        getter: asyncio.Future[tuple[ShardBatch, asyncio.Future[bool]]] | None,
        current: asyncio.Future[bool] | None, reader: asyncio.Task[None]) -> None:
    """The end of a loop over :meth:`GroupMember.batches` (finished, broken
    out of or cancelled): the batch yielded last and not finished is not
    handled (its shard reads it again), and the reader stops. The wait for
    the next batch must not outlive the loop: left pending it would take the
    next loop's first batch off the queue, and that batch would never be
    yielded nor finished, its shard waiting for it for good."""
    if getter is not None:
        if getter.done() and not getter.cancelled() and getter.exception() is None:
            getter.result()[1].cancel()  # taken, never yielded: not handled
        getter.cancel()
    if current is not None and not current.done():
        current.cancel()
    if not reader.done():
        reader.cancel()
    with contextlib.suppress(BaseException):
        await reader
