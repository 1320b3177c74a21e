"""One member of a consumer group: membership, leadership, ownership, reading.

State machine (every transition goes through :meth:`GroupMember._set_state`)::

    CREATED ──start()──> JOINING ──registered──> RUNNING
    RUNNING ──session LOST──> REJOINING ──registered again──> RUNNING
    RUNNING / REJOINING ──stop()──> LEAVING ──released, closed──> STOPPED
    any ──fatal error──> FAILED            (terminal; stop() then re-raises it)

What happens in RUNNING, as three cooperating asyncio tasks:

* the **control loop** (level-triggered on coordinator watches): becomes leader
  when there is none; as leader, recomputes the sticky assignment whenever the
  live members change and publishes it guarded by its leader epoch; as any
  member, follows the published assignment: shards no longer ours are
  **revoked** (the batch in flight finishes or, after ``revoke_timeout_s``, is
  abandoned; the position is committed and the owner key deleted in one
  commit), shards newly ours are **acquired** as soon as their owner key is
  absent (the previous owner released it or its session expired). Only moved
  shards pause: the others keep reading.
* the **read loop**: for every group of owned shards at the same position,
  plans the next step once (one read of the snapshot's manifests for all of
  them), hands each shard's batch to the handler, then commits the shard's new
  position with a fenced commit. Shards without rows in a step advance in one
  batched commit.
* the coordinator's own **session keep-alive** (inside the backend).

Safety (the project's invariants): nothing is delivered and nothing is
committed unless the session is CONNECTED and its local monotonic deadline
minus ``safety_margin_s`` has not passed; and every commit is guarded by the
shard's epoch in the coordinator, so a member that was paused, partitioned or
expired can never commit over the new owner (a rejected commit drops the
shard locally and is counted).

Example (runnable; needs a Paimon table)::

    import asyncio
    from paimon_group import GroupMember, MemberConfig

    async def main() -> None:
        cfg = MemberConfig(group="orders", warehouse="/tmp/wh", table="db.orders",
                           coordinator="sqlite:///tmp/wh-coord.sqlite")
        async with GroupMember(cfg) as member:
            async for batch in member.batches():
                print(batch.shard, batch.snapshot_id, batch.to_arrow().num_rows)

    asyncio.run(main())
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import functools
import logging
import os
import socket
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Protocol, Self

import tenacity

from coordinators.base import Coordinator, SessionState, Watch
from coordinators.errors import (
    CoordinatorError,
    PaimonGroupError,
    SessionLost,
)
from coordinators.registry import open_coordinator
from paimon_group.assignor import assign
from paimon_group.batch import ShardBatch
from paimon_group.config import MemberConfig
from paimon_group.consumer_meta import (
    ConsumerFilesOrigin,
    adopt_winner,
    prepare_new_group,
    resume_allowed,
)
from paimon_group.errors import HandlerFailed, MemberIdInUse, MemberRemoved
from paimon_group.group import GroupClient
from paimon_group.history import HistoryRecorder, NullRecorder
from paimon_group.identity import check_table_identity, table_identity
from paimon_group.mirror import ConsumerMirror
from paimon_group.planner import ShardPlanner, StepPlan
from paimon_group.projection import check_columns
from paimon_group.records import Assignment, GroupMeta, MemberInfo, position_order
from paimon_group.releasing import PendingReleases
from paimon_group.sharding import Sharding, ShardRule, idle_shards_note, plan_new_group
from paimon_group.start import parse_start
from paimon_group.table import ShardedTable

log = logging.getLogger("paimon_group.member")

VERSION = "0.1.0"
TABLE_CHECK_S = 5.0  # how often a member checks that its table still exists and is the same


class MemberState(enum.Enum):
    CREATED = "created"
    JOINING = "joining"
    RUNNING = "running"
    REJOINING = "rejoining"
    LEAVING = "leaving"
    STOPPED = "stopped"
    FAILED = "failed"


class RebalanceListener(Protocol):
    """Hooks called on the member's event loop (like Kafka's rebalance listener).

    ``on_assigned`` after shards were acquired (their reading starts next);
    ``on_revoked`` after shards were handed off cleanly (position committed);
    ``on_lost`` when shards were lost without a clean handoff (session lost,
    or a commit rejected because another member owns the shard now).
    """

    def on_assigned(self, shards: list[int]) -> None: ...

    def on_revoked(self, shards: list[int]) -> None: ...

    def on_lost(self, shards: list[int]) -> None: ...


@dataclass
class _OwnedShard:
    shard: int
    epoch: int
    generation: int
    next_snapshot: int | None = None  # where reading continues; None: not resolved yet
    # The last position the coordinator accepted for this shard (or read from
    # it at acquisition). Only this value is ever mirrored into the consumer
    # file or re-committed on release: a resolved start that was not committed
    # yet (a pending full scan) must never leak (invariant 5).
    committed: int | None = None
    full_scan: int | None = None  # a full scan of this snapshot is due first
    # A commit of this ownership raised: it may have landed or not, so the
    # stored position may be ahead of ``committed``. It is read back before
    # ``committed`` is used again (the next step, a release): committing the
    # older value on release would move the position backwards (invariant 2).
    uncertain: bool = False
    revoking: bool = False
    dropped: bool = False
    idle: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.idle.set()


@dataclass(frozen=True)
class ShardPosition:
    """A held shard's settled position, under the epoch we hold it with.

    ``next_snapshot`` is where reading continues; with ``full_scan`` a full
    scan of that snapshot is still due first (a pinned start).
    """

    shard: int
    epoch: int
    next_snapshot: int
    full_scan: int | None


@dataclass
class MemberStats:
    batches: int = 0
    rows: int = 0
    commits: int = 0
    rejected_commits: int = 0
    refused_commits: int = 0
    rebalances: int = 0
    handler_errors: int = 0
    handler_seconds: list[float] = field(default_factory=list)


Handler = Callable[[ShardBatch], Any]


class _Stop(Exception):
    """Internal: the read loop should stop (member leaving)."""


class GroupMember:
    """A member of a consumer group over one Paimon table. See the module docstring."""

    def __init__(
        self,
        config: MemberConfig,
        *,
        listener: RebalanceListener | None = None,
        auto_commit: bool = True,
    ) -> None:
        self.config = config
        self.member_id = config.id
        self.group_name = config.group
        self.listener = listener
        self.auto_commit = auto_commit
        self.state = MemberState.CREATED
        self.stats = MemberStats()
        self.error: BaseException | None = None
        self.history: HistoryRecorder = (
            HistoryRecorder(config.history_path, self.member_id)
            if config.history_path
            else NullRecorder()
        )
        self.table: ShardedTable | None = None
        self.num_shards = 0
        self.sharding = ShardRule.BUCKET
        self._meta: GroupMeta | None = None
        self._planner: ShardPlanner | None = None
        self._mirror: ConsumerMirror | None = None
        self._coord: Coordinator | None = None
        self._group: GroupClient | None = None
        self._owned: dict[int, _OwnedShard] = {}
        self._leader_epoch: int | None = None
        self._assignment: Assignment | None = None
        self._vanished: dict[str, float] = {}
        # Listing every owner key is O(shards): at most once per interval.
        self._ownership_check_s = max(2.0, config.session_timeout_s)
        self._ownership_checked_at = -1e18
        self._full_round_at = -1e18
        self._wake = asyncio.Event()
        self._session_changed = asyncio.Event()
        self._stopping = False
        self._tasks: list[asyncio.Task[Any]] = []
        self._supervisor: asyncio.Task[None] | None = None
        self._watches: list[Watch] = []
        self._io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pg-plan")
        self._handler: Handler | None = None
        self._queue: asyncio.Queue[tuple[ShardBatch, asyncio.Future[bool]]] = asyncio.Queue(1)
        self._acked: dict[int, asyncio.Future[bool]] = {}
        self._lanes: set[_CommitLane] = set()  # commit lanes of steps being delivered
        self._releases = PendingReleases()  # owner keys still to delete (revoke failed)
        # Next steps' plans, started while the current ones are delivered:
        # (shards, position) -> the planning thread's future.
        self._prefetched: dict[tuple[tuple[int, ...], int], asyncio.Future[Any]] = {}
        self._joined = asyncio.Event()
        self._last_loop_tick = time.monotonic()
        self._first_generation_seen = False
        self._retry_handler = tenacity.AsyncRetrying(
            stop=tenacity.stop_after_attempt(max(1, config.max_handler_attempts)),
            wait=tenacity.wait_exponential(multiplier=config.handler_backoff_s, max=30),
            reraise=True,
        )

    # -- state -----------------------------------------------------------

    def _set_state(self, state: MemberState) -> None:
        if self.state is MemberState.FAILED or self.state is state:
            return
        log.info(
            "member state %s -> %s",
            self.state.value,
            state.value,
            extra={"group": self.group_name, "member": self.member_id},
        )
        self.state = state

    @property
    def owned_shards(self) -> list[int]:
        return sorted(s for s, o in self._owned.items() if not o.dropped)

    def shard_positions(self) -> dict[int, int | None]:
        """Per owned shard, the oldest snapshot it still needs as committed in the
        coordinator (a pending full scan's snapshot, else the next snapshot),
        or None before its first commit."""
        out: dict[int, int | None] = {}
        for shard, o in list(self._owned.items()):
            if o.dropped:
                continue
            out[shard] = o.full_scan if (o.full_scan is not None and o.committed) else o.committed
        return out

    # -- driving a member without its read loop --------------------------
    #
    # A host that plans and reads itself (the Spark source's driver) joins
    # with start(), never calls run() or batches(), and uses these instead.
    # Call them on the member's event loop. The member keeps its control
    # loop: it acquires, revokes and releases shards as the assignment says.

    def held_shards(self) -> list[int]:
        """The shards owned now and not being revoked: the ones that may be read."""
        return sorted(s for s, o in self._owned.items() if not o.dropped and not o.revoking)

    async def settle_positions(self) -> dict[int, ShardPosition]:
        """The positions of the held shards, settled as the read loop settles
        them before planning a step.

        A shard whose last commit had an unknown outcome gets the stored
        position read back; shards without a position get their start
        resolved once and pinned in one fenced commit. A shard that could not
        be settled (the coordinator failed; logged) is left out, as is one
        dropped or acquired anew meanwhile: the next call tries again.
        """
        held = [o for o in self._owned.values() if not o.dropped and not o.revoking]
        try:
            # A commit whose outcome was unknown: take what the coordinator stored.
            await self._read_back([o for o in held if o.uncertain])
            unresolved = [o for o in held if o.next_snapshot is None and not o.dropped]
            if unresolved:
                await self._resolve_start(unresolved)
        except PaimonGroupError as err:
            # Those shards stay out (unresolved or uncertain) this time.
            log.warning("positions not settled this round: %s", err,
                        extra={"group": self.group_name, "member": self.member_id})
        out: dict[int, ShardPosition] = {}
        for o in held:
            if (o.dropped or o.uncertain or o.next_snapshot is None
                    or self._owned.get(o.shard) is not o):
                continue
            out[o.shard] = ShardPosition(o.shard, o.epoch, o.next_snapshot, o.full_scan)
        return out

    def mark_busy(self, shards: Iterable[int]) -> list[int]:
        """Mark owned shards busy, as a batch in the handler does: a revocation
        of one waits (up to ``revoke_timeout_s``) until :meth:`mark_idle`.
        Returns the shards marked (those owned now)."""
        marked: list[int] = []
        for shard in shards:
            o = self._owned.get(shard)
            if o is not None:
                o.idle.clear()
                marked.append(shard)
        return marked

    def mark_idle(self, shards: Iterable[int]) -> None:
        """End :meth:`mark_busy` for ``shards`` (a waiting revocation goes on)."""
        for shard in shards:
            o = self._owned.get(shard)
            if o is not None:
                o.idle.set()

    async def commit_positions(self, positions: Mapping[int, int]) -> dict[int, bool]:
        """Fenced commit of ``shard -> next snapshot`` for the shards still ours,
        one coordinator commit per distinct position.

        Returns per shard whether the coordinator has that position now
        (False: not ours any more, rejected, or the commit failed; logged).
        Positions only move forward: a shard already at or beyond its
        position is left alone and reported True.
        """
        result: dict[int, bool] = {}
        by_position: dict[int, dict[int, _OwnedShard]] = {}
        for shard, to in positions.items():
            o = self._owned.get(shard)
            if o is None or o.dropped or o.next_snapshot is None:
                result[shard] = False
                continue
            done = o.full_scan if o.full_scan is not None else o.next_snapshot
            if to <= done:
                result[shard] = True
                continue
            by_position.setdefault(to, {})[shard] = o
        for to, owned in sorted(by_position.items()):
            try:
                await self._commit(owned, to)
            except Exception as err:  # coordinator errors, or leaving: not committed
                # Not committing only means that the next owner of these
                # shards reads them again.
                log.warning("commit of shards %s at %d failed: %s", sorted(owned), to, err,
                            extra={"group": self.group_name, "member": self.member_id})
            for shard, o in owned.items():
                result[shard] = (not o.dropped and o.committed == to)
        return result

    @property
    def assignment(self) -> Assignment | None:
        return self._assignment

    @property
    def is_leader(self) -> bool:
        return self._leader_epoch is not None

    @property
    def ready(self) -> bool:
        """Joined, and every shard assigned to us is acquired."""
        if self.state is not MemberState.RUNNING or self._assignment is None:
            return False
        return set(self._assignment.shards_of(self.member_id)) <= set(self.owned_shards)

    @property
    def session_state(self) -> str:
        return self._coord.session.state.value if self._coord else "none"

    def loop_lag(self) -> float:
        return time.monotonic() - self._last_loop_tick

    # -- lifecycle -------------------------------------------------------

    async def __aenter__(self) -> Self:
        await self.start()
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
        self._set_state(MemberState.JOINING)
        cfg = self.config
        loop = asyncio.get_running_loop()
        self.table = await loop.run_in_executor(
            self._io, lambda: ShardedTable.open(cfg.warehouse, cfg.table, cfg.catalog_options)
        )
        check_columns(self.table.table.field_names, cfg.columns)
        self._start_position = parse_start(cfg.start)
        await self._join(first=True)
        if self._stopping:
            # stop() ran while we were joining: it found nothing to leave.
            # Registered now, with no control loop to follow, we would be
            # assigned shards nobody reads: end the session (and so the
            # member key) at once.
            await self._close_coordinator()
            self._set_state(MemberState.STOPPED)
            return
        self._supervisor = asyncio.create_task(self._supervise(), name="pg-supervisor")

    async def _open_coordinator(self) -> Coordinator:
        coord = open_coordinator(self.config.coordinator_url, self.config.connect_options())
        await coord.connect()
        coord.session.add_listener(self._on_session_state)
        return coord

    def _on_session_state(self, state: SessionState) -> None:
        # Called from the backend (on the loop thread); only wake the loops up.
        self._session_changed.set()
        self._wake.set()

    async def _join(self, *, first: bool) -> None:
        """Connect, create or check the group, register our member key."""
        assert self.table is not None
        coord = await self._open_coordinator()
        group = GroupClient(coord, self.group_name)
        try:
            meta = await self._ensure_meta(group, first=first)
            self._meta = meta
            self.num_shards = meta.num_shards
            self.sharding = ShardRule.parse(meta.sharding)
            info = MemberInfo(
                member_id=self.member_id,
                host=socket.gethostname(),
                pid=os.getpid(),
                version=VERSION,
                started_at=time.time(),
                session=coord.session.id,
            )
            await self._register(group, info)
        except BaseException:
            with contextlib.suppress(Exception):
                await coord.close()
            raise
        self._coord, self._group = coord, group
        if self._planner is None:
            self._planner = self.table.planner(
                self.num_shards, include_row_kind=self.config.include_row_kind,
                rule=self.sharding, projection=self.config.columns,
            )
            self._mirror = ConsumerMirror(
                self.table.table.file_io,
                self.table.table_path,
                self.group_name,
                self.config.mirror_interval_s,
            )
        self._watches = [
            coord.watch(group.keys.dir),
            coord.watch(group.keys.members_dir),
            coord.watch(group.keys.owners_dir),
        ]
        self._leader_epoch = None
        self._set_state(MemberState.RUNNING)
        self._joined.set()
        self._wake.set()

    async def _ensure_meta(self, group: GroupClient, *, first: bool) -> GroupMeta:
        """The group's metadata; a new group gets the shard count and sharding
        rule of :func:`paimon_group.sharding.plan_new_group` (checked before
        anything is created)."""
        assert self.table is not None
        table = self.table
        # The identity of what is at the table's path now (read afresh, not
        # from the table loaded at start): a re-created table is refused here.
        table_id: str = await self._in_io(functools.partial(table_identity, table.table))
        if not first:
            meta = await group.ensure_meta(None, table.identifier, table_id=table_id)
            return self._with_table_id(meta, table_id)
        existing = await group.read_meta()
        if existing is not None:
            # An existing group keeps its shard count and rule; an explicit
            # --shards that contradicts the count is refused by ensure_meta.
            meta = await group.ensure_meta(self.config.shards, table.identifier,
                                           table_id=table_id)
            if self.config.shards is None:
                log.info("group %s keeps its stored shard count %d (sharding %s)",
                         self.group_name, meta.num_shards, meta.sharding)
            return self._with_table_id(meta, table_id)
        shards, rule = plan_new_group(table, self.config.shards)
        origin = await self._vet_consumer_files(shards, rule.value)
        # Without --shards the planned count is a default only: if another
        # member created the group meanwhile, its stored count wins.
        meta = await group.ensure_meta(shards, table.identifier, sharding=rule.value,
                                       incarnation=origin.incarnation, table_id=table_id,
                                       explicit=self.config.shards is not None)
        if meta.num_shards != shards:
            log.info("group %s keeps its stored shard count %d (sharding %s): another member "
                     "created it meanwhile", self.group_name, meta.num_shards, meta.sharding)
        if meta.incarnation != origin.incarnation:
            with contextlib.suppress(Exception):  # then the winner's shards start as configured
                await self._in_io(functools.partial(
                    adopt_winner, table.table.file_io, table.table_path, origin, meta))
        try:
            note = await self._in_io(lambda: idle_shards_note(
                table, Sharding(ShardRule.parse(meta.sharding), meta.num_shards)))
        except Exception as err:  # a hint only: never a reason not to start
            log.debug("shards with rows not counted: %s", err)
            note = None
        if note:
            log.warning("group %s: %s", self.group_name, note)
        return self._with_table_id(meta, table_id)

    def _with_table_id(self, meta: GroupMeta, table_id: str) -> GroupMeta:
        """A group created before table identities were stored is checked
        against the identity its member saw at its first join."""
        if not meta.table_id:
            known = self._meta.table_id if self._meta is not None else ""
            meta = dataclasses.replace(meta, table_id=known or table_id)
        check_table_identity(meta, self.group_name, table_id)
        return meta

    async def _vet_consumer_files(self, num_shards: int, sharding: str) -> ConsumerFilesOrigin:
        """A new group's origin (its new incarnation id), after its consumer
        files were vetted (:func:`paimon_group.consumer_meta.prepare_new_group`)."""
        assert self.table is not None
        table = self.table
        incarnation = uuid.uuid4().hex
        origin = ConsumerFilesOrigin(self.group_name, incarnation, num_shards, sharding)
        mirror = ConsumerMirror(table.table.file_io, table.table_path, self.group_name)
        try:
            note = await self._in_io(functools.partial(
                prepare_new_group, mirror, table.table.file_io, table.table_path, origin))
        except Exception as err:
            # Then the origin does not name this incarnation: no shard resumes
            # from a consumer file, each starts as configured.
            log.warning("group %s: consumer files not vetted (%s): shards without a "
                        "coordinator position start as configured", self.group_name, err)
            return origin
        if note:
            log.warning("%s", note)
        return origin

    async def _register(self, group: GroupClient, info: MemberInfo) -> None:
        """Register; if our id is held, wait for a dead holder's session to expire.

        A process that crashed leaves its member key until its session times
        out; a restart with the same id (static membership) waits that long.
        A key still held after that belongs to a *live* process: refuse.
        """
        deadline = time.monotonic() + self.config.session_timeout_s * 1.5 + 1.0
        while True:
            if await group.register(info) is not None:
                # Back after a goodbye: we are a member again, not leaving. A
                # removal record names an older session of this id: not ours.
                await group.forget_leaving(self.member_id)
                await group.forget_removed(self.member_id)
                return
            if time.monotonic() > deadline:
                raise MemberIdInUse(
                    f"member id {self.member_id!r} is held by another live process in group "
                    f"{self.group_name!r}; stop it or choose another --member-id"
                )
            watch = group.coordinator.watch(group.keys.members_dir)
            try:
                await watch.wait(timeout=0.5)
            finally:
                await watch.close()

    async def _supervise(self) -> None:
        """Runs the control loop; on a lost session rejoins with a new one."""
        while not self._stopping:
            control = asyncio.create_task(self._control_loop(), name="pg-control")
            self._tasks = [control]
            try:
                await control
            except SessionLost:
                if self._stopping:
                    return
                try:
                    await self._rejoin()
                except asyncio.CancelledError:
                    raise
                except BaseException as err:
                    # A rejoin that cannot succeed (the table re-created, an
                    # error that is not retriable, a coordinator down past the
                    # retries) fails the member; escaping here instead left it
                    # REJOINING for ever, with no error and no exit.
                    self._fail(err)
                    return
            except asyncio.CancelledError:
                raise
            except BaseException as err:
                self._fail(err)
                return

    def _fail(self, err: BaseException) -> None:
        if self.error is None:
            self.error = err
        log.error("member failed: %s", err, extra={"group": self.group_name,
                                                    "member": self.member_id})
        self._set_state(MemberState.FAILED)
        self._stopping = True
        self._wake.set()

    async def _rejoin(self) -> None:
        lost = self.owned_shards
        epochs = [self._owned[shard].epoch for shard in lost]
        for o in self._owned.values():
            o.dropped = True
        self._owned.clear()
        self._releases.clear()  # the lost session's keys are gone with it
        if lost:
            self.history.record("lost", shards=lost, epochs=epochs, reason="session lost")
            self._notify("on_lost", lost)
        self._set_state(MemberState.REJOINING)
        self._joined.clear()
        await self._close_coordinator()
        retry = tenacity.AsyncRetrying(
            # A new session lost before the join ended (expired while its
            # keys were created) needs only another new session: retried too.
            retry=tenacity.retry_if_exception(
                lambda e: isinstance(e, SessionLost)
                or (isinstance(e, PaimonGroupError) and e.retriable)
            ),
            wait=tenacity.wait_exponential(multiplier=0.2, max=5),
            stop=tenacity.stop_after_delay(max(60.0, self.config.session_timeout_s * 6)),
            reraise=True,
        )
        async for attempt in retry:
            with attempt:
                await self._join(first=False)

    async def _close_coordinator(self) -> None:
        for w in self._watches:
            with contextlib.suppress(Exception):
                await w.close()
        self._watches = []
        if self._coord is not None:
            with contextlib.suppress(Exception):
                await self._coord.close()
        self._coord, self._group = None, None
        self._leader_epoch = None

    async def stop(self, *, timeout: float | None = None) -> None:
        """Leave gracefully: stop reading, commit, release every shard, close.

        Finishes within ``timeout`` (default ``shutdown_timeout_s``): a batch
        still in flight then is abandoned (not committed; the next owner
        re-reads it).
        """
        if self.state in (MemberState.STOPPED, MemberState.CREATED):
            self._set_state(MemberState.STOPPED)
            return
        timeout = self.config.shutdown_timeout_s if timeout is None else timeout
        self._stopping = True
        self._wake.set()
        if self.state is not MemberState.FAILED:
            self._set_state(MemberState.LEAVING)
        try:
            await asyncio.wait_for(self._leave(), timeout=max(0.1, timeout))
        except (TimeoutError, CoordinatorError) as err:
            log.warning("graceful leave incomplete: %s", err)
        for t in [*self._tasks, *( [self._supervisor] if self._supervisor else [])]:
            t.cancel()
        for t in [*self._tasks, *([self._supervisor] if self._supervisor else [])]:
            with contextlib.suppress(BaseException):
                await t
        await self._close_coordinator()
        self._io.shutdown(wait=False, cancel_futures=True)
        self.history.close()
        if self.state is not MemberState.FAILED:
            self._set_state(MemberState.STOPPED)

    async def _leave(self) -> None:
        group = self._group
        if group is None:
            return
        # Leave the member list first so the leader rebalances at once, while
        # we finish the batches in flight.
        with contextlib.suppress(CoordinatorError):
            await group.deregister(self.member_id)
        for o in list(self._owned.values()):
            o.revoking = True
        await self._revoke(list(self._owned), reason="leaving")
        if self._leader_epoch is not None:
            with contextlib.suppress(CoordinatorError):
                await group.resign(self._leader_epoch)
            self._leader_epoch = None

    def raise_if_failed(self) -> None:
        if self.error is not None:
            raise self.error

    # -- control loop -----------------------------------------------------

    async def _control_loop(self) -> None:
        fired: set[str] = {"start"}
        while not self._stopping:
            self._last_loop_tick = time.monotonic()
            coord = self._coord
            if coord is None:
                raise SessionLost("no session")
            if coord.session.state is SessionState.LOST:
                raise SessionLost(f"session {coord.session.id} lost")
            if coord.session.is_live(self.config.margin):
                try:
                    await self._reconcile(fired)
                except PaimonGroupError as err:
                    # Whether trying again may succeed is a fact of the error
                    # (``retriable``), not a list of classes: a ZooKeeper
                    # SessionSuspended mid-round is retried like a timeout,
                    # while SessionLost (rejoin) and MemberRemoved propagate.
                    if not err.retriable:
                        raise
                    log.warning("control round failed, retrying: %s", err,
                                extra={"group": self.group_name, "member": self.member_id})
            fired = await self._wait_for_change(
                timeout=max(0.2, self.config.session_timeout_s / 4))

    WATCH_NAMES = ("group", "members", "owners")

    async def _wait_for_change(self, timeout: float) -> set[str]:
        """Which of our watches fired ("group", "members", "owners"), or
        {"local"} / {"timeout"} for a local wake-up or the periodic tick."""
        waiters = [asyncio.ensure_future(w.wait(timeout)) for w in self._watches]
        local = asyncio.ensure_future(self._wake.wait())
        try:
            done, _ = await asyncio.wait([*waiters, local], timeout=timeout,
                                         return_when=asyncio.FIRST_COMPLETED)
            fired = {name for name, w in zip(self.WATCH_NAMES, waiters, strict=False)
                     if w in done and not w.cancelled() and w.exception() is None
                     and w.result()}
            if local in done:
                fired.add("local")
            return fired or {"timeout"}
        finally:
            for w in [*waiters, local]:
                w.cancel()
            self._wake.clear()

    async def _reconcile(self, fired: set[str]) -> None:
        """One level-triggered round, doing only what the wake-up calls for.

        A change of owner keys alone (the most frequent event in a large group
        during a rebalance), or of members on a follower, only retries pending
        acquisitions; everything is re-read on a group change, a member change
        on the leader, a local wake-up and every tick.
        """
        group = self._group
        assert group is not None
        if self._releases:
            released = await self._releases.retry(group)
            if released:
                log.info("owner keys of shards %s released on retry", released,
                         extra={"group": self.group_name, "member": self.member_id})
        # Owner changes can fire without pause in a large group; a full round
        # still runs at least once per tick, so nothing waits on a missed
        # wake-up for longer than that.
        tick = max(0.2, self.config.session_timeout_s / 4)
        recent = time.monotonic() - self._full_round_at < tick
        # A change of the member list matters to the leader alone (it computes
        # the assignment); a follower learns the outcome when the assignment
        # or the leader changes (the group watch). In a group of N members a
        # join or leave then costs one full round, not N.
        owners_only = recent and (fired == {"owners"} or (
            fired <= {"owners", "members"} and self._leader_epoch is None))
        if owners_only:
            pending = self._pending_acquisitions()
            if pending and self._assignment is not None:
                await self._acquire(pending, self._assignment.generation)
            if time.monotonic() - self._ownership_checked_at > self._ownership_check_s:
                await self._check_ownership(group)
            return
        self._full_round_at = time.monotonic()
        if not self._stopping and await group.coordinator.get(
                group.keys.member(self.member_id)) is None and not self._stopping:
            # Our member key is gone although our session looked live. Either
            # an operator removed us (members remove records the session it
            # removed), or the session expired server-side before we noticed
            # (a paused coordinator or process): then this is a lost session,
            # and we rejoin like any other. The goodbye marker cannot tell the
            # two apart: the leader deletes it as soon as it has moved our
            # shards, which is usually before we look.
            if await group.removed_session(self.member_id) == group.coordinator.session.id:
                with contextlib.suppress(CoordinatorError):
                    await group.forget_removed(self.member_id)
                raise MemberRemoved(
                    f"member {self.member_id!r} was removed from group {self.group_name!r} "
                    "by an operator; its shards were handed to the others"
                )
            raise SessionLost(f"member key of {self.member_id!r} is gone: session expired")
        await self._maybe_lead(group)
        assignment, _ = await group.read_assignment()
        if assignment is not None and (
            self._assignment is None or assignment.generation != self._assignment.generation
        ):
            if self._assignment is not None:
                self.stats.rebalances += 1
            self._assignment = assignment
            log.info(
                "generation %d: shards %s",
                assignment.generation,
                assignment.shards_of(self.member_id),
                extra={"group": self.group_name, "member": self.member_id,
                       "generation": assignment.generation},
            )
        if time.monotonic() - self._ownership_checked_at > self._ownership_check_s:
            await self._check_ownership(group)
        target = set(self._assignment.shards_of(self.member_id)) if self._assignment else set()
        to_revoke = [s for s, o in self._owned.items() if s not in target and not o.revoking]
        if to_revoke:
            for s in to_revoke:
                self._owned[s].revoking = True
            # Revocations run concurrently with reading and acquiring others.
            t = asyncio.create_task(self._revoke(to_revoke, reason="reassigned"))
            self._tasks.append(t)
        to_acquire = sorted(target - set(self._owned))
        if to_acquire and self._assignment is not None:
            await self._acquire(to_acquire, self._assignment.generation)

    def _pending_acquisitions(self) -> list[int]:
        target = set(self._assignment.shards_of(self.member_id)) if self._assignment else set()
        return sorted(target - set(self._owned))

    async def _check_ownership(self, group: GroupClient) -> None:
        """Drop shards whose owner key is no longer ours (deleted by an operator:
        ``members remove``, ``reset --force``). Our commits would be rejected
        anyway; this makes the member notice at once instead of at its next
        commit, which on an idle table can be much later. The same listing
        sweeps owner keys that are ours but not owned (:mod:`paimon_group.releasing`)."""
        self._ownership_checked_at = time.monotonic()
        held = [o for o in self._owned.values() if not o.dropped and not o.revoking]
        owners = await group.owners()
        assigned = set(self._assignment.shards_of(self.member_id)) if self._assignment else set()
        await self._releases.sweep(
            group, self.member_id, owned={s: o.epoch for s, o in self._owned.items()},
            assigned=assigned, owners=owners)
        lost: list[int] = []
        epochs: list[int] = []
        for o in held:
            view = owners.get(o.shard)
            if view is None or view.epoch != o.epoch:
                o.dropped = True
                if self._owned.get(o.shard) is o:
                    self._owned.pop(o.shard)
                lost.append(o.shard)
                epochs.append(o.epoch)
        if lost:
            log.warning("shards %s: owner key gone or re-created by another member", lost,
                        extra={"group": self.group_name, "member": self.member_id})
            self.history.record("lost", shards=lost, epochs=epochs, reason="owner key gone")
            self._notify("on_lost", lost)

    async def _maybe_lead(self, group: GroupClient) -> None:
        leader = await group.leader()
        if leader is None:
            epoch = await group.try_lead(self.member_id)
            if epoch is not None:
                log.info("became leader (epoch %d)", epoch,
                         extra={"group": self.group_name, "member": self.member_id})
                self._leader_epoch = epoch
        elif leader[0] == self.member_id and leader[1] == self._leader_epoch:
            pass
        elif leader[0] == self.member_id and (
                epoch := await group.own_leader_epoch(self.member_id)) is not None:
            # A leader key our session created, though our create raised (its
            # outcome was unknown): we lead, at its create version.
            log.info("adopted leader key (epoch %d)", epoch,
                     extra={"group": self.group_name, "member": self.member_id})
            self._leader_epoch = epoch
        else:
            self._leader_epoch = None
        if self._leader_epoch is not None:
            await self._lead(group, self._leader_epoch)

    async def _lead(self, group: GroupClient, leader_epoch: int) -> None:
        live = set(await group.members())
        previous, version = await group.read_assignment()
        leaving = await group.leaving()
        members = sorted(live | self._reserved_members(live, previous, leaving))
        for gone in leaving - live:
            # Forget a goodbye once an assignment without that member is out.
            if previous is None or not previous.shards.get(gone):
                await group.forget_leaving(gone)
        basis, home, away = _sticky_basis(previous, members, self.num_shards)
        wanted = assign(self.num_shards, members, basis)
        if previous is not None and _same(previous.shards, wanted):
            return
        for m, shards in wanted.items():
            if shards:
                home[m] = shards
                away.pop(m, None)
        published = await group.publish(
            wanted,
            leader=self.member_id,
            leader_epoch=leader_epoch,
            previous=previous,
            previous_version=version,
            home=home,
            away_since=away,
        )
        if published is None:
            # Deposed, or another publish raced us: re-read on the next round.
            self._wake.set()
        else:
            log.info("published generation %d for %d members", published.generation,
                     len(members), extra={"group": self.group_name, "member": self.member_id,
                                          "generation": published.generation})

    def _reserved_members(
        self, live: set[str], previous: Assignment | None, leaving: set[str]
    ) -> set[str]:
        """Static membership: members that vanished without a goodbye keep their
        shards for ``rebalance_delay_s`` (counted from when this leader first saw
        them gone), so a restart with the same id gets its own shards back and
        no other member's shards move. A graceful leave moves shards at once.
        """
        delay = self.config.rebalance_delay_s
        now = time.monotonic()
        if delay <= 0 or previous is None:
            self._vanished.clear()
            return set()
        reserved: set[str] = set()
        for member, shards in previous.shards.items():
            if member in live or member in leaving or not shards:
                self._vanished.pop(member, None)
                continue
            first_seen = self._vanished.setdefault(member, now)
            if now - first_seen < delay:
                reserved.add(member)
                # Re-check when the delay runs out even if nothing else changes.
                asyncio.get_running_loop().call_later(
                    delay - (now - first_seen) + 0.05, self._wake.set)
        for member in list(self._vanished):
            if member in live:
                del self._vanished[member]
        return reserved

    async def _acquire(self, shards: list[int], generation: int) -> None:
        group = self._group
        assert group is not None and self._mirror is not None
        acquired: list[int] = []
        for shard in shards:
            if not self._coord or not self._coord.session.is_live(self.config.margin):
                break
            sent = time.monotonic()  # the history's lower bound of when the create went out
            epoch = await group.acquire(shard, self.member_id, generation)
            if epoch is None:
                continue  # the previous owner has not released yet: its release wakes us
            self._releases.discard(shard)  # a key of ours still pending release: ours again
            owned = _OwnedShard(shard=shard, epoch=epoch, generation=generation)
            # Read the position only after the owner key exists: every commit of
            # the previous owner is then visible (or was rejected).
            position, _ = await group.position(shard)
            if position is not None:
                owned.next_snapshot = position.next_snapshot
                owned.committed = position.next_snapshot
                owned.full_scan = position.full_scan
            else:
                mirrored = await self._in_io(functools.partial(self._resume_from_file, shard))
                if mirrored is not None:
                    owned.next_snapshot = mirrored
            self._owned[shard] = owned
            acquired.append(shard)
            self.history.record("acquire", shard=shard, epoch=epoch, generation=generation,
                                next_snapshot=owned.next_snapshot, sent=sent)
        if acquired:
            log.info("acquired shards %s", acquired,
                     extra={"group": self.group_name, "member": self.member_id,
                            "generation": generation})
            self._notify("on_assigned", acquired)
            self._wake.set()

    def _resume_from_file(self, shard: int) -> int | None:
        """The next snapshot in the shard's consumer file, if the group may
        resume from it (:func:`paimon_group.consumer_meta.resume_allowed`:
        written under this group's shard count and rule, by this incarnation
        or one it vetted); else None, and the shard starts as configured."""
        assert self._mirror is not None and self.table is not None and self._meta is not None
        mirrored = self._mirror.read(shard)
        if mirrored is None:
            return None
        origin = ConsumerFilesOrigin.read(self.table.table.file_io, self.table.table_path,
                                          self.group_name)
        if resume_allowed(self._meta, origin):
            return mirrored
        log.warning("shard %d: consumer file (next snapshot %d) not resumed from: it was not "
                    "written under this group's %d shards by this group; starting as "
                    "configured (%s)", shard, mirrored, self.num_shards, self.config.start,
                    extra={"group": self.group_name, "member": self.member_id, "shard": shard})
        return None

    async def _revoke(self, shards: list[int], *, reason: str) -> None:
        """Finish (or abandon) in-flight batches, then commit+release in one commit."""
        async def wait_idle(o: _OwnedShard) -> bool:
            try:
                await asyncio.wait_for(o.idle.wait(), timeout=self.config.revoke_timeout_s)
                return True
            except TimeoutError:
                return False

        owned = [self._owned[s] for s in shards if s in self._owned]
        for lane in list(self._lanes):
            lane.kick()  # a finished batch of a revoked shard commits now
        results = await asyncio.gather(*(wait_idle(o) for o in owned))
        group = self._group
        released: list[int] = []
        lost: list[int] = []
        for o, finished in zip(owned, results, strict=True):
            if o.dropped:
                continue
            if not finished:
                log.warning("shard %d: batch in flight abandoned after %.1fs", o.shard,
                            self.config.revoke_timeout_s)
            ok = False
            # Whether the owner key may still be ours: until a release
            # commit returns (True: deleted; False: not ours any more).
            undecided = True
            if group is not None and self._coord is not None and self._coord.session.is_live(
                self.config.margin
            ):
                try:
                    if o.uncertain:
                        # Never release with a value older than what may have
                        # landed; unreadable now: release without a position.
                        with contextlib.suppress(CoordinatorError):
                            await self._read_back([o])
                    if (o.committed is not None and o.full_scan is None and finished
                            and not o.uncertain):
                        ok = await group.commit_positions(
                            {o.shard: (o.epoch, o.committed)}, self.member_id, release=True
                        )
                    else:
                        ok = await group.release(o.shard, o.epoch)
                    undecided = False
                except CoordinatorError as err:
                    log.warning("shard %d: release failed: %s", o.shard, err)
            o.dropped = True
            self._owned.pop(o.shard, None)
            if undecided:
                # Left bound to our live session, the key would hold the
                # shard from its new assignee for ever: retried every round.
                log.warning("shard %d: owner key (epoch %d) not released yet; retrying every "
                            "control round until it is gone", o.shard, o.epoch,
                            extra={"group": self.group_name, "member": self.member_id,
                                   "shard": o.shard, "epoch": o.epoch})
                self._releases.add(o.shard, o.epoch)
            self.history.record("release", shard=o.shard, epoch=o.epoch, ok=ok, reason=reason,
                                next_snapshot=o.committed)
            (released if ok else lost).append(o.shard)
            if ok and o.committed is not None and self._mirror is not None:
                n = o.full_scan if o.full_scan is not None else o.committed
                await self._in_io(functools.partial(self._mirror_write, o.shard, n, True))
        if released:
            log.info("released shards %s (%s)", released, reason,
                     extra={"group": self.group_name, "member": self.member_id})
            self._notify("on_revoked", released)
        if lost:
            self._notify("on_lost", lost)
        self._wake.set()

    def _mirror_write_all(self, shards: list[int], n: int) -> None:
        for shard in shards:
            self._mirror_write(shard, n, False)

    def _mirror_write(self, shard: int, n: int, force: bool) -> None:
        assert self._mirror is not None
        try:
            self._mirror.write(shard, n, force=force)
        except Exception as err:
            log.warning("shard %d: consumer file not written: %s", shard, err)

    def _notify(self, hook: str, shards: list[int]) -> None:
        if self.listener is None:
            return
        fn = getattr(self.listener, hook, None)
        if fn is None:
            return
        try:
            fn(sorted(shards))
        except Exception:
            log.exception("rebalance listener %s raised", hook)

    # -- reading ---------------------------------------------------------

    async def _in_io(self, fn: Callable[[], Any]) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._io, fn)

    async def _wait_live(self, *, for_commit: bool = False) -> None:
        """Return when the session is confirmed live.

        While the member is leaving, no *new* work starts (``_Stop``), but the
        commit of a batch that already finished still goes through, so a
        graceful stop finishes the batch in flight instead of abandoning it.
        """
        while True:
            if self._stopping and not for_commit:
                raise _Stop()
            if for_commit and self._coord is None and self._stopping:
                raise _Stop()
            coord = self._coord
            if coord is not None and coord.session.is_live(self.config.margin):
                return
            if not self._joined.is_set() or coord is None:
                # Rejoining: the control loop, which clears the wake-up event,
                # is not running. A wake-up set before now (the session loss,
                # a revoke ending) would end every wait below at once and the
                # loop would spin until the join; only a new one (stop) counts.
                # _stopping was checked above, with no await since.
                self._wake.clear()
                waiter = asyncio.ensure_future(self._joined.wait())
                stop = asyncio.ensure_future(self._wake.wait())
                await asyncio.wait([waiter, stop], timeout=0.5,
                                   return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                stop.cancel()
                continue
            await asyncio.sleep(0.02)

    async def _read_loop(self, process: Callable[[ShardBatch], Awaitable[None]]) -> None:
        poll = self.config.poll_interval_ms / 1000.0
        table_checked = time.monotonic()
        while True:
            await self._wait_live()
            self.raise_if_failed()
            progressed = await self._read_round(process)
            if time.monotonic() - table_checked > TABLE_CHECK_S:
                # An idle table and a dropped table look alike to the planner
                # (no new snapshot), and a re-created one looks like a table
                # whose next snapshot is not there yet, until it gets there:
                # check now and then, busy or idle, that the table exists and
                # is the one the group was created on (TableNotFound,
                # TableReplaced), so neither is an endless wait or a skip.
                table_checked = time.monotonic()
                await self._in_io(self._check_table)
            if not progressed:
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout=poll)
                except TimeoutError:
                    pass
                self._wake.clear()

    def _check_table(self) -> None:
        """Raise TableNotFound if the table is gone, TableReplaced if it was
        dropped and re-created since the group was created."""
        cfg = self.config
        reopened = ShardedTable.open(cfg.warehouse, cfg.table, cfg.catalog_options)
        if self._meta is not None:
            check_table_identity(self._meta, self.group_name, table_identity(reopened.table))

    async def _read_round(self, process: Callable[[ShardBatch], Awaitable[None]]) -> bool:
        active = [o for o in self._owned.values() if not o.revoking and not o.dropped]
        if not active:
            return False
        # Plans prefetched in the previous round; what this round does not use
        # is dropped at its end (the shards moved, or were re-grouped).
        prefetched, self._prefetched = self._prefetched, {}
        try:
            return await self._read_groups(active, prefetched, process)
        finally:
            for future in prefetched.values():
                # Unused: retrieve its outcome so an error is not reported as lost.
                future.add_done_callback(lambda f: None if f.cancelled() else f.exception())

    async def _read_groups(
        self,
        active: list[_OwnedShard],
        prefetched: dict[tuple[tuple[int, ...], int], asyncio.Future[Any]],
        process: Callable[[ShardBatch], Awaitable[None]],
    ) -> bool:
        """One step for every group of active shards at the same position."""
        planner = self._planner
        assert planner is not None
        await self._read_back([o for o in active if o.uncertain and not o.dropped])
        unresolved = [o for o in active if o.next_snapshot is None and not o.dropped]
        if unresolved:
            await self._resolve_start(unresolved)
        by_position: dict[tuple[int, int | None], list[_OwnedShard]] = defaultdict(list)
        for o in active:
            if o.next_snapshot is not None and not o.dropped:
                by_position[(o.next_snapshot, o.full_scan)].append(o)
        progressed = False
        for (position, full_scan), owned in sorted(by_position.items(),
                                                   key=lambda kv: (kv[0][0], kv[0][1] or 0)):
            shards = [o.shard for o in owned]
            await self._wait_live()
            if full_scan is not None:
                step: StepPlan | None = await self._in_io(
                    functools.partial(planner.plan_full, shards, full_scan))
            else:
                step = await self._plan_next(shards, position, prefetched)
            if step is None:
                continue
            progressed = True
            # Plan the step after this one while this one's batches are in the
            # handler, so that the next step starts as soon as this one ends.
            self._prefetch_plan(shards, step.next_snapshot)
            empty: dict[int, _OwnedShard] = {}
            deliveries: list[tuple[_OwnedShard, ShardBatch]] = []
            for o in owned:
                if o.dropped or o.revoking or self._owned.get(o.shard) is not o:
                    continue
                splits = step.splits.get(o.shard, ())
                if not splits:
                    empty[o.shard] = o
                    continue
                deliveries.append((o, ShardBatch(
                    group=self.group_name,
                    member_id=self.member_id,
                    shard=o.shard,
                    num_shards=self.num_shards,
                    epoch=o.epoch,
                    plan=step,
                    planner=planner,
                )))
            await self._deliver_all(deliveries, empty, step, process)
        return progressed

    def _prefetch_plan(self, shards: list[int], position: int) -> None:
        """Start planning ``plan_next(shards, position)`` in the planning thread."""
        planner = self._planner
        assert planner is not None
        self._prefetched[(tuple(shards), position)] = asyncio.get_running_loop().run_in_executor(
            self._io, functools.partial(planner.plan_next, shards, position))

    async def _plan_next(
        self,
        shards: list[int],
        position: int,
        prefetched: dict[tuple[tuple[int, ...], int], asyncio.Future[Any]],
    ) -> StepPlan | None:
        """The next step, from the prefetched plan when it is the one asked for.

        A prefetched None (the snapshot did not exist yet then) or error is
        not trusted: the step is planned again now, so an error is raised
        fresh and a snapshot committed since is seen.
        """
        planner = self._planner
        assert planner is not None
        future = prefetched.pop((tuple(shards), position), None)
        if future is not None:
            try:
                step: StepPlan | None = await future
            except Exception:
                step = None
            if step is not None:
                return step
        planned: StepPlan | None = await self._in_io(
            functools.partial(planner.plan_next, shards, position))
        return planned

    async def _read_back(self, owned: list[_OwnedShard]) -> None:
        """After a commit with an unknown outcome: take the stored positions.

        While we hold a shard's owner key nobody else writes its position (the
        writes are fenced by our epoch), so what is stored is what our own
        commits left: if the ambiguous commit landed, we continue after it
        (nothing is delivered twice) and a release never re-commits the older
        value; if it did not, the stored value is ``committed`` already.
        """
        group = self._group
        if not owned or group is None:
            return
        for o in owned:
            position, _ = await group.position(o.shard)
            o.uncertain = False
            if position is None:
                continue  # a pin that did not land: still unresolved
            stored = position.order
            if o.committed is None or stored > position_order(o.committed, o.full_scan):
                o.next_snapshot = o.committed = position.next_snapshot
                o.full_scan = position.full_scan

    async def _resolve_start(self, owned: list[_OwnedShard]) -> None:
        """Where shards with no committed position and no consumer file start.

        Resolved once for all of them (so shards acquired together start from
        the same snapshot) and pinned in one commit.
        """
        table = self.table
        assert table is not None
        resolved = await self._in_io(lambda: table.resolve_start(self._start_position))
        # Pin the resolved start before reading anything: a later owner then
        # continues from it (instead of resolving "latest" again and skipping
        # what was committed in between), and a pending full scan is replayed
        # on exactly the same snapshot, so a replay is identical. Local state
        # is set by the accepted commit only: a pin that raises leaves the
        # shards unresolved (and uncertain), so the next round reads back
        # what landed, or resolves and pins again; nothing is read from a
        # start that was never pinned.
        await self._commit({o.shard: o for o in owned}, resolved.next_snapshot,
                           full_scan=resolved.full_scan_snapshot)

    async def _deliver_all(
        self,
        deliveries: list[tuple[_OwnedShard, ShardBatch]],
        empty: dict[int, _OwnedShard],
        step: StepPlan,
        process: Callable[[ShardBatch], Awaitable[None]],
    ) -> None:
        """Deliver one step's batches, up to ``max_parallel_shards`` handlers at
        a time, and commit every shard of the step.

        Batches of *different* shards may be in the handler at once (reading
        releases the GIL in pyarrow); one shard never has two batches in
        flight. The gate bounds handlers only (a handler may start while an
        earlier shard's commit is in flight); commits are coalesced by a
        :class:`_CommitLane`, normally one for the whole step, and shards
        without rows ride along. A shard is idle (a revoke may take it) once
        its own commit is done.
        Every started delivery is awaited before an error is re-raised, so a
        failure of one shard never abandons another shard's finished batch.
        """
        lane = _CommitLane(self._commit, step.next_snapshot, riders=empty,
                           expected=len(deliveries))
        if not deliveries:
            await lane.flush()
            return
        gate = asyncio.Semaphore(max(1, self.config.max_parallel_shards))

        async def one(o: _OwnedShard, batch: ShardBatch) -> None:
            o.idle.clear()
            queued = False
            try:
                async with gate:
                    if o.dropped or o.revoking:
                        return  # revoked while waiting: the next owner reads it
                    await self._handle(o, batch, step, process)
                # Commit even if the shard was dropped meanwhile (session lost
                # and rejoined, or abandoned by a revoke): the coordinator, not
                # this process, decides, and it rejects a stale epoch.
                queued = True
                await lane.commit(o)
            finally:
                if not queued:
                    lane.skipped()
                o.idle.set()

        self._lanes.add(lane)
        try:
            results = await asyncio.gather(*(one(o, b) for o, b in deliveries),
                                           return_exceptions=True)
        finally:
            self._lanes.discard(lane)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            # The most important first: a failed handler, then anything
            # else, and a plain stop last.
            errors.sort(key=lambda e: 0 if isinstance(e, HandlerFailed)
                        else 2 if isinstance(e, _Stop) else 1)
            raise errors[0]
        await lane.flush()

    async def _handle(
        self,
        o: _OwnedShard,
        batch: ShardBatch,
        step: StepPlan,
        process: Callable[[ShardBatch], Awaitable[None]],
    ) -> None:
        """Run the handler on one batch (nothing is committed here)."""
        await self._wait_live()
        started = time.monotonic()
        await process(batch)
        self.stats.handler_seconds.append(time.monotonic() - started)
        if len(self.stats.handler_seconds) > 10_000:
            # Bounded: readers (metrics) start over on a new list.
            self.stats.handler_seconds = []
        self.stats.batches += 1
        rows = int(getattr(batch, "rows_read", 0) or 0)
        self.stats.rows += rows
        log.debug("delivered shard %d %s snapshots %s..%d: %d rows in %.3f s", o.shard,
                  step.kind.value, getattr(batch, "first_snapshot", "?"), step.snapshot_id,
                  rows, time.monotonic() - started,
                  extra={"group": self.group_name, "member": self.member_id,
                         "shard": o.shard, "epoch": o.epoch})
        self.history.record("deliver", shard=o.shard, epoch=o.epoch,
                            snapshot=step.snapshot_id, next_snapshot=step.next_snapshot,
                            kind=step.kind.value)

    async def _commit(
        self, owned: dict[int, _OwnedShard], next_snapshot: int, *, full_scan: int | None = None
    ) -> None:
        """Fenced commit of ``next_snapshot`` for ``owned`` (one atomic commit).

        With ``full_scan`` the position is a pinned start whose full scan of
        that snapshot is still to be delivered.
        """
        if not owned:
            return
        try:
            await self._wait_live(for_commit=True)
        except _Stop:
            # Refused locally, never sent: the member is leaving and its
            # session is closed (a batch that finished after the graceful
            # leave stopped waiting for it). The next owner reads it again.
            for o in owned.values():
                self.stats.refused_commits += 1
                self.history.record("commit", shard=o.shard, epoch=o.epoch,
                                    next_snapshot=next_snapshot, outcome="refused")
            raise
        group = self._group
        if group is None:
            raise SessionLost("no session")
        updates = {s: (o.epoch, next_snapshot) for s, o in owned.items()}
        try:
            ok = await group.commit_positions(
                updates, self.member_id,
                full_scan={s: full_scan for s in owned} if full_scan is not None else None)
        except CoordinatorError as err:
            # The outcome is unknown to us; record the attempt so that a
            # redelivery of this batch is explained in the history.
            for s, o in owned.items():
                o.uncertain = True
                self.history.record("commit", shard=s, epoch=o.epoch,
                                    next_snapshot=next_snapshot, outcome="error",
                                    error=type(err).__name__)
            raise
        if not ok and len(owned) > 1:
            # Find which shards are no longer ours; commit the others.
            for s, o in owned.items():
                await self._commit({s: o}, next_snapshot, full_scan=full_scan)
            return
        # Protect the pending full scan's snapshot, if any.
        mirrored = full_scan if full_scan is not None else next_snapshot
        mirror_due: list[int] = []
        for s, o in owned.items():
            self.history.record("commit", shard=s, epoch=o.epoch, next_snapshot=next_snapshot,
                                outcome="accepted" if ok else "rejected")
            if ok:
                self.stats.commits += 1
                o.uncertain = False
                o.next_snapshot = next_snapshot
                o.committed = next_snapshot
                o.full_scan = full_scan
                if self._mirror is not None and self._mirror.due(s, mirrored):
                    mirror_due.append(s)
            else:
                self.stats.rejected_commits += 1
                log.warning(
                    "shard %d: commit rejected, epoch %d is stale: another member owns it now",
                    s, o.epoch, extra={"group": self.group_name, "member": self.member_id,
                                       "shard": s, "epoch": o.epoch})
                o.dropped = True
                if self._owned.get(s) is o:
                    # Our current ownership of the shard is gone. (A commit of
                    # an ownership dropped before, e.g. a batch that was in
                    # flight when the session was lost, is rejected after the
                    # member may have acquired the shard again under a new
                    # epoch: that ownership is unaffected, and the old one's
                    # end was recorded when it was dropped.)
                    self._owned.pop(s)
                    self.history.record("lost", shards=[s], epochs=[o.epoch],
                                        reason="stale epoch")
                    self._notify("on_lost", [s])
        if mirror_due:
            # Written after the coordinator accepted them: never ahead of it.
            await self._in_io(functools.partial(self._mirror_write_all, mirror_due, mirrored))

    # -- consuming -------------------------------------------------------

    async def run(self, handler: Handler) -> None:
        """Call ``handler(batch)`` (in a worker thread) for every batch until stopped.

        The batch's position is committed (fenced) after the handler returns.
        A raising handler is retried with exponential backoff; after
        ``max_handler_attempts`` the member releases its shards and this
        raises :class:`HandlerFailed`.
        """
        async def process(batch: ShardBatch) -> None:
            try:
                async for attempt in self._retry_handler.copy():
                    with attempt:
                        try:
                            result = await asyncio.to_thread(handler, batch)
                            if asyncio.iscoroutine(result):
                                await result
                        except Exception:
                            self.stats.handler_errors += 1
                            log.warning("handler raised on shard %d snapshot %d",
                                        batch.shard, batch.snapshot_id, exc_info=True)
                            raise
            except Exception as err:
                raise HandlerFailed(
                    f"handler failed {self.config.max_handler_attempts} times on shard "
                    f"{batch.shard} snapshot {batch.snapshot_id}: {type(err).__name__}: {err}"
                ) from err

        await self._consume(process)

    async def _consume(self, process: Callable[[ShardBatch], Awaitable[None]]) -> None:
        reader = asyncio.create_task(self._read_loop_supervised(process), name="pg-read")
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
            with contextlib.suppress(asyncio.CancelledError, _Stop):
                await reader
        self.raise_if_failed()

    async def _read_loop_supervised(self, process: Callable[[ShardBatch], Awaitable[None]]) -> None:
        while not self._stopping:
            try:
                await self._read_loop(process)
            except _Stop:
                return
            except SessionLost:
                # The supervisor rejoins; wait for it and carry on.
                self._wake.set()
                await asyncio.sleep(0.05)
                continue
            except HandlerFailed as err:
                self._fail(err)
                return
            except PaimonGroupError as err:
                if not err.retriable:
                    self._fail(err)
                    return
                log.warning("coordinator unavailable while reading: %s", err)
                await asyncio.sleep(0.5)
            except asyncio.CancelledError:
                raise
            except BaseException as err:
                self._fail(err)
                return

    async def batches(self) -> AsyncIterator[ShardBatch]:
        """Iterate over batches. With ``auto_commit`` a batch is committed when
        the next one is requested; otherwise call :meth:`commit`."""
        async def process(batch: ShardBatch) -> None:
            done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
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

    async def commit(self, batch: ShardBatch) -> None:
        """Explicitly acknowledge ``batch`` (iterator mode without auto commit)."""
        done = self._acked.pop(id(batch), None)
        if done is not None and not done.done():
            done.set_result(True)
        await asyncio.sleep(0)


COMMIT_LINGER_S = 0.5
"""How long a finished shard's commit may wait for the other shards of its step."""


class _CommitLane:
    """The commits of one step's shards, coalesced (a group commit).

    A shard whose batch is done queues its commit. Everything queued is
    committed in one fenced commit (one coordinator round trip, whatever the
    number of shards) as soon as one of these holds:

    * every delivery of the step is done (committed, skipped or failed): the
      usual case, one commit per step instead of one per shard;
    * a queued shard is being revoked (:meth:`kick` from the revoke): a
      handoff never waits for the other shards of the step;
    * ``linger_s`` passed since the first shard queued: a slow handler on one
      shard holds the others' positions back for no longer than that.

    ``riders`` (shards without rows in the step) go with the first commit,
    or in :meth:`flush`; unlike delivered shards they are left out once
    dropped or revoking. :meth:`commit` returns once its shard's commit is
    done, and raises that commit's error.

    Example (inside the member's read round)::

        lane = _CommitLane(member._commit, step.next_snapshot, riders=empty, expected=3)
        await lane.commit(owned_shard)   # after its handler returned
        lane.skipped()                   # a delivery that ended without a commit
        await lane.flush()               # whatever is left, riders included
    """

    def __init__(
        self,
        commit: Callable[[dict[int, _OwnedShard], int], Awaitable[None]],
        next_snapshot: int,
        *,
        riders: dict[int, _OwnedShard],
        expected: int,
        linger_s: float = COMMIT_LINGER_S,
    ) -> None:
        self._commit = commit
        self._next = next_snapshot
        self._riders = dict(riders)
        self._queued: dict[int, tuple[_OwnedShard, asyncio.Future[None]]] = {}
        self._outstanding = expected  # deliveries neither queued nor skipped yet
        self._linger_s = linger_s
        self._timer: asyncio.TimerHandle | None = None
        self._lock = asyncio.Lock()
        self._flushes: set[asyncio.Task[None]] = set()

    async def commit(self, o: _OwnedShard) -> None:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queued[o.shard] = (o, done)
        self._outstanding -= 1
        if self._outstanding <= 0 or o.revoking:
            self.kick()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._linger_s, self.kick)
        await done

    def skipped(self) -> None:
        """A delivery ended without queueing a commit (skipped or failed)."""
        self._outstanding -= 1
        if self._outstanding <= 0 and self._queued:
            self.kick()

    def kick(self) -> None:
        """Commit what is queued now (in a task; waiters learn the outcome)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._queued:
            task = asyncio.ensure_future(self._flush_quietly())
            self._flushes.add(task)
            task.add_done_callback(self._flushes.discard)

    async def _flush_quietly(self) -> None:
        with contextlib.suppress(BaseException):
            await self.flush()  # the error reached every waiter of the batch

    async def flush(self) -> None:
        async with self._lock:
            riders = {s: o for s, o in self._riders.items() if not o.dropped and not o.revoking}
            self._riders = {}
            # A revoke of a rider waits for this commit (it waits for idle):
            # otherwise it could commit the rider's older position and release
            # while this commit of a newer one is still in flight, and the
            # position would move back (invariant 2).
            for o in riders.values():
                o.idle.clear()
            waiters = [done for _, done in self._queued.values()]
            batch = {**riders, **{s: o for s, (o, _) in self._queued.items()}}
            self._queued = {}
            try:
                if batch:
                    await self._commit(batch, self._next)
            except BaseException as err:
                for done in waiters:
                    if done.done():
                        continue
                    if isinstance(err, asyncio.CancelledError):
                        done.cancel()
                    else:
                        done.set_exception(err)
                raise
            finally:
                for o in riders.values():
                    o.idle.set()
            for done in waiters:
                if not done.done():
                    done.set_result(None)


HOME_RETENTION_S = 3600.0


def _sticky_basis(
    previous: Assignment | None, members: list[str], num_shards: int
) -> tuple[dict[str, list[int]], dict[str, list[int]], dict[str, float]]:
    """The "previous" assignment handed to the assignor, with static members' homes.

    A member that comes back (it holds nothing now but has a recorded home)
    is treated as still holding its home shards, taken back from whoever held
    them meanwhile. The sticky assignor then moves exactly those shards back
    and nothing else: a rolling restart never shuffles the survivors' shards.
    Homes of members away for more than an hour are forgotten.
    """
    if previous is None:
        return {}, {}, {}
    now = time.time()
    basis = {m: list(s) for m, s in previous.shards.items()}
    home = {m: list(s) for m, s in previous.home.items()}
    away = dict(previous.away_since)
    live = set(members)
    for m in list(home):
        if m not in live:
            away.setdefault(m, now)
            if now - away[m] > HOME_RETENTION_S:
                home.pop(m, None)
                away.pop(m, None)
    for m in members:
        if basis.get(m) or not home.get(m):
            continue
        mine = {s for s in home[m] if s < num_shards}
        for other in basis:
            basis[other] = [s for s in basis[other] if s not in mine]
        basis[m] = sorted(mine)
    return basis, home, away


def _same(a: dict[str, list[int]], b: dict[str, list[int]]) -> bool:
    def norm(d: dict[str, list[int]]) -> dict[str, list[int]]:
        return {k: sorted(v) for k, v in d.items() if v or k in d}

    return norm(a) == norm(b)


def run_member(config: MemberConfig, handler: Handler,
               listener: RebalanceListener | None = None,
               stop_signals: Iterable[int] = ()) -> None:
    """Synchronous wrapper: run a member with ``handler`` until a stop signal."""
    import signal

    async def main() -> None:
        member = GroupMember(config, listener=listener)
        await member.start()
        loop = asyncio.get_running_loop()
        runner = asyncio.create_task(member.run(handler))
        stop = asyncio.Event()
        for sig in stop_signals or (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        stopper = asyncio.create_task(stop.wait())
        await asyncio.wait([runner, stopper], return_when=asyncio.FIRST_COMPLETED)
        await member.stop()
        if not runner.done():
            runner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await runner
        member.raise_if_failed()

    asyncio.run(main())
