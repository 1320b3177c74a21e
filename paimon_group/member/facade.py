"""The facade: :class:`GroupMember` (start, stop, run, batches, commit)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterable, Mapping
from types import TracebackType
from typing import Self

import tenacity

from coordinators.errors import CoordinatorError
from paimon_group.config.member import MemberConfig
from paimon_group.config.projection import check_columns
from paimon_group.errors import HandlerFailed
from paimon_group.member.commits import Commits
from paimon_group.member.control import Control
from paimon_group.member.core import Handler, MemberCore, RebalanceListener
from paimon_group.member.driving import Driving, ShardPosition
from paimon_group.member.membership import Membership
from paimon_group.member.ownership import ShardOwnership
from paimon_group.member.reader import Process, ReadLoop
from paimon_group.member.state import MemberState, Stop
from paimon_group.reading.batch import ShardBatch
from paimon_group.reading.start import parse_start
from paimon_group.reading.table import ShardedTable

log = logging.getLogger("paimon_group.member")


class GroupMember(MemberCore):
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
    ) -> None:
        """``table``: the config's table, already opened (a check made before
        the start, as ``paimon-group run`` makes): the first start uses it
        instead of opening the table again (on an object store, requests);
        None: the start opens it."""
        super().__init__(config, listener=listener, auto_commit=auto_commit)
        # The parts, each built with the member's core (this object: the
        # state every part reads) and the sibling parts it calls.
        self.commits = Commits(self, self._owned)
        self.ownership = ShardOwnership(self, self.commits, self._owned)
        self.control = Control(self, self.ownership, self._leadership)
        self.membership = Membership(self, self.ownership, self.control)
        self.reading = ReadLoop(self, self.commits)
        self.driving = Driving(self, self.commits, self.reading)
        self._opened_table = table
        self._queue: asyncio.Queue[tuple[ShardBatch, asyncio.Future[bool]]] = asyncio.Queue(1)
        self._acked: dict[int, asyncio.Future[bool]] = {}
        self._stop_task: asyncio.Future[None] | None = None
        self._retry_handler = tenacity.AsyncRetrying(
            stop=tenacity.stop_after_attempt(max(1, config.max_handler_attempts)),
            wait=tenacity.wait_exponential(multiplier=config.handler_backoff_s, max=30),
            reraise=True,
        )

    # -- lifecycle -------------------------------------------------------

    async def __aenter__(self) -> Self:
        try:
            await self.start()
        except BaseException:
            # __aexit__ is not run when __aenter__ raises: stop here, or the
            # executor's threads outlive the member.
            with contextlib.suppress(Exception):
                await self.stop(timeout=0)
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def start(self) -> None:
        """Open the table, join the group; reading starts when a handler or iterator runs."""
        self._stop_task = None
        self.set_state(MemberState.JOINING)
        cfg = self.config
        loop = asyncio.get_running_loop()
        try:
            table, self._opened_table = self._opened_table, None
            if table is None:
                table = await loop.run_in_executor(
                    self._io,
                    lambda: ShardedTable.open(cfg.warehouse, cfg.table, cfg.catalog_options))
            self.table = table
            check_columns(table.table.field_names, cfg.columns)
            self.start_position = parse_start(cfg.start)
            await self.membership.join(first=True)
        except BaseException:
            # A start that fails keeps nothing open for a caller that never
            # calls stop(): not the session (its member key would stand in the
            # group for a session timeout, assigned shards nobody reads), not
            # the history file (a long-lived process restarting members
            # leaked one descriptor per failed start). stop() still works.
            await self.membership.close_coordinator()
            self.history.close()
            raise
        if self.stopping:
            # stop() ran while we were joining: it found nothing to leave.
            # Registered now, with no control loop to follow, we would be
            # assigned shards nobody reads: end the session (and so the
            # member key) at once.
            await self.membership.close_coordinator()
            self.set_state(MemberState.STOPPED)
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
        if self.state in (MemberState.STOPPED, MemberState.CREATED):
            self.set_state(MemberState.STOPPED)
            return
        timeout = self.config.shutdown_timeout_s if timeout is None else timeout
        self._gate.stopping = True
        self.wake.set()
        if self.state is not MemberState.FAILED:
            self.set_state(MemberState.LEAVING)
        try:
            await asyncio.wait_for(self.membership.leave(), timeout=max(0.1, timeout))
        except (TimeoutError, CoordinatorError) as err:
            log.warning("graceful leave incomplete: %s", err)
        for t in [*self._tasks, *( [self._supervisor] if self._supervisor else [])]:
            t.cancel()
        for t in [*self._tasks, *([self._supervisor] if self._supervisor else [])]:
            with contextlib.suppress(BaseException):
                await t
        await self.membership.close_coordinator()
        self._io.shutdown(wait=False, cancel_futures=True)
        self.history.close()
        if self.state is not MemberState.FAILED:
            self.set_state(MemberState.STOPPED)

    # -- consuming -------------------------------------------------------

    async def run(self, handler: Handler) -> None:
        """Call ``handler(batch)`` (in a worker thread) for every batch until stopped.

        The batch's position is committed (fenced) after the handler returns.
        A raising handler is retried with exponential backoff; after
        ``max_handler_attempts`` the member releases its shards and this
        raises :class:`HandlerFailed`. A batch whose files are gone
        (``batch.lost``, set by its read) is not retried: the read loop
        handles it (data loss as ``--on-data-loss`` says, or one line).
        """
        async def process(batch: ShardBatch) -> None:
            retrying = self._retry_handler.copy(retry=tenacity.retry_if_exception(
                lambda e: isinstance(e, Exception) and batch.lost is None))
            try:
                async for attempt in retrying:
                    with attempt:
                        try:
                            result = await asyncio.to_thread(handler, batch)
                            if asyncio.iscoroutine(result):
                                await result
                        except Exception:
                            if batch.lost is None:
                                self.stats.handler_errors += 1
                                log.warning("handler raised on shard %d snapshot %d",
                                            batch.shard, batch.snapshot_id, exc_info=True)
                            raise
            except Exception as err:
                if batch.lost is not None:
                    raise
                raise HandlerFailed(
                    f"handler failed {self.config.max_handler_attempts} times on shard "
                    f"{batch.shard} snapshot {batch.snapshot_id}: {type(err).__name__}: {err}"
                ) from err

        await self._consume(process)

    async def _consume(self, process: Process) -> None:
        reader = asyncio.create_task(self.reading.run(process), name="pg-read")
        try:
            while not reader.done():
                # A failed member stops reading at once; a leaving one lets the
                # reader finish its batch in flight (stop() waits for it).
                if (self._supervisor is not None and self._supervisor.done()
                        and self.state is MemberState.FAILED):
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
        self.raise_if_failed()

    async def batches(self) -> AsyncIterator[ShardBatch]:
        """Iterate over batches. With ``auto_commit`` a batch is committed when
        the next one is requested; otherwise call :meth:`commit`."""
        async def process(batch: ShardBatch) -> None:
            loop = asyncio.get_running_loop()
            done: asyncio.Future[bool] = loop.create_future()
            if not self.auto_commit:
                self._durable[id(batch)] = loop.create_future()
            await self._queue.put((batch, done))
            await done

        reader = asyncio.create_task(self._consume(process), name="pg-consume")
        current: asyncio.Future[bool] | None = None
        try:
            while True:
                getter = asyncio.ensure_future(self._queue.get())
                await asyncio.wait([getter, reader], return_when=asyncio.FIRST_COMPLETED)
                if not getter.done():
                    getter.cancel()
                    break
                batch, done = getter.result()
                current = done
                self._acked[id(batch)] = done
                yield batch
                if self.auto_commit and not done.done():
                    done.set_result(True)
        finally:
            if current is not None and not current.done():
                current.cancel()
            if not reader.done():
                reader.cancel()
            with contextlib.suppress(BaseException):
                await reader
        self.raise_if_failed()

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
        durable = self._durable.get(key)
        done = self._acked.pop(key, None)
        if done is not None and not done.done():
            done.set_result(True)
        if wait and durable is not None:
            await durable
        else:
            await asyncio.sleep(0)

    # -- driven by a host that reads itself (member/driving.py) -----------

    @property
    def incarnation(self) -> str:
        """:attr:`Driving.incarnation <paimon_group.member.driving.Driving.incarnation>`."""
        return self.driving.incarnation

    def held_shards(self) -> list[int]:
        """:meth:`Driving.held_shards <paimon_group.member.driving.Driving.held_shards>`."""
        return self.driving.held_shards()

    async def settle_positions(self) -> dict[int, ShardPosition]:
        """:meth:`Driving.settle_positions
        <paimon_group.member.driving.Driving.settle_positions>`."""
        return await self.driving.settle_positions()

    def mark_busy(self, shards: Iterable[int], *, limit_s: float | None = None) -> list[int]:
        """:meth:`Driving.mark_busy <paimon_group.member.driving.Driving.mark_busy>`."""
        return self.driving.mark_busy(shards, limit_s=limit_s)

    def mark_idle(self, shards: Iterable[int]) -> None:
        """:meth:`Driving.mark_idle <paimon_group.member.driving.Driving.mark_idle>`."""
        self.driving.mark_idle(shards)

    async def commit_positions(self, positions: Mapping[int, int], *,
                               incarnation: str = "",
                               moves: Mapping[int, int] | None = None) -> dict[int, bool]:
        """:meth:`Driving.commit_positions
        <paimon_group.member.driving.Driving.commit_positions>`."""
        return await self.driving.commit_positions(positions, incarnation=incarnation,
                                                   moves=moves)
