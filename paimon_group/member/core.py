"""What every part of a member shares: its configuration, state and services.

:class:`MemberCore` holds the member's own state (its state and error,
stats, the stopping flag and wake-up of the session gate), the read-only
views of what its parts own (the joined session, a :class:`JoinedSession`
that membership replaces whole; the shards held, the ownership part's; the
leader epoch and the assignment, the control part's: each handed to its
owner when :class:`GroupMember` builds its parts, see
``paimon_group/member/__init__.py`` and docs/design.md, "Who owns which
state"), and the few services every part uses: the state transition, the
planning thread, the rebalance listener and the session gate.
:class:`GroupMember` holds a core of its own (private: its services are
for the parts, not for a member's user) and the parts built with it; it
shows its user the few read-only views listed in its class.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Protocol

from coordinators.protocol import Coordinator
from coordinators.registry import redact_url
from paimon_group.config.clock import SYSTEM_CLOCK, Clock
from paimon_group.config.member import MemberConfig
from paimon_group.member.head import HeadView
from paimon_group.member.history import HistoryRecorder, NullRecorder
from paimon_group.member.reachability import Reachability
from paimon_group.member.state import (
    Leadership,
    MemberState,
    OwnedShard,
    OwnedShards,
    SessionGate,
    may_move,
)
from paimon_group.member.tables import MemberTable, MemberTables, RoutedMirror
from paimon_group.member.watches import ControlWatches
from paimon_group.protocol.group import GroupClient
from paimon_group.protocol.records import Assignment, GroupMeta, GroupStart
from paimon_group.protocol.sharding import ShardRule
from paimon_group.protocol.sinks import SinkRegistry
from paimon_group.reading.batch import ShardBatch
from paimon_group.reading.discovery import TableListing
from paimon_group.reading.start import StartPosition
from paimon_group.reading.table import ShardedTable
from paimon_group.version import __version__

log = logging.getLogger("paimon_group.member")


class MemberLog(logging.LoggerAdapter[logging.Logger]):
    """The member's logger: every record carries its group and member id (the
    structured logs' ``group`` and ``member``), merged with the call's own
    ``extra`` (a shard, a generation)."""

    def process(
        self, msg: Any, kwargs: MutableMapping[str, Any]
    ) -> tuple[Any, MutableMapping[str, Any]]:
        kwargs["extra"] = {**(self.extra or {}), **kwargs.get("extra", {})}
        return msg, kwargs

VERSION = __version__  # what a member registers (MemberInfo.version)


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
class MemberStats:
    batches: int = 0
    rows: int = 0
    commits: int = 0
    rejected_commits: int = 0
    refused_commits: int = 0
    rebalances: int = 0
    handler_errors: int = 0
    # Snapshots expired before they were read and skipped (--on-data-loss
    # skip), summed over the shards that skipped them.
    skipped_snapshots: int = 0
    handler_seconds: list[float] = field(default_factory=list)
    # Shards that left this member, by how (as Kafka's cooperative protocol
    # tells them apart): "revoked" (a rebalance moved them, handed off),
    # "released" (this member left gracefully, handed off), "lost" (no clean
    # handoff: session lost, owner key gone, a stale commit).
    shards_moved: dict[str, int] = field(
        default_factory=lambda: {"revoked": 0, "released": 0, "lost": 0})


Handler = Callable[[ShardBatch], Any]


@dataclass(frozen=True)
class JoinedSession:
    """What one join of the group opened and learned, replaced whole by
    membership (:meth:`MemberCore.replace_session`) on a join, a rejoin and a
    close, so that no part ever sees the coordinator of one session with the
    group client or watches of another.

    ``meta`` and ``tables`` (each table's planner and consumer files' mirror,
    :mod:`paimon_group.member.tables`) outlive the session they were made in:
    a closed session (``coordinator``, ``group`` and ``watches`` None, while
    the member rejoins or after it left) keeps them, so the tables are still
    checked against the group's identities while the coordinator is
    unreachable, and each table's planner and mirror are made once per member."""

    meta: GroupMeta
    tables: MemberTables
    coordinator: Coordinator | None = None
    group: GroupClient | None = None
    watches: ControlWatches | None = None

    def closed(self) -> JoinedSession:
        """This session without its coordinator, group client and watches."""
        return replace(self, coordinator=None, group=None, watches=None)


class MemberCore:
    """The shared state of a member; see the module docstring."""

    start_position: StartPosition  # set by start()
    # A group of several tables: their catalog, its location and the tables
    # the start's listing loaded; the listing (set by opened_catalog).
    _catalog: tuple[Any, str, dict[str, tuple[str, Any]]] | None = None
    listing: TableListing | None = None

    def __init__(self, config: MemberConfig, *, listener: RebalanceListener | None = None,
                 auto_commit: bool = True, clock: Clock = SYSTEM_CLOCK) -> None:
        # The clock of every loop, deadline, lease check and history line.
        self.config, self.clock = config, clock
        # Every timing derived from the session timeout, built once.
        self.timing = config.timing
        self.member_id = config.id
        self.group_name = config.group
        self.log = MemberLog(log, {"group": self.group_name, "member": self.member_id})
        self.listener = listener
        self.auto_commit = auto_commit
        self.state = MemberState.CREATED
        self.stats = MemberStats()
        self.error: BaseException | None = None
        self.history: HistoryRecorder = (
            HistoryRecorder(config.history_path, self.member_id, clock)
            if config.history_path
            else NullRecorder()
        )
        self.table: ShardedTable | None = None
        # The joined session (None before the first join), replaced whole by
        # membership alone (replace_session).
        self._session: JoinedSession | None = None
        # The shards held: the ownership part's (handed to it, and to the
        # commits part that forgets a shard whose commit was rejected).
        self._owned = OwnedShards()
        # The leader epoch and the assignment followed: the control part's
        # (handed to it; shown here read-only).
        self._leadership = Leadership()
        self.session_changed = asyncio.Event()
        # The table head the leader publishes (member/head.py), and the event
        # that wakes the read loop when it shows a new snapshot.
        self.head = HeadView(clock=clock.monotonic)
        self.head_woken = asyncio.Event()
        # The sinks this member's batches were written to (handed to them
        # with each batch; the control part publishes them, for describe).
        self.sinks = SinkRegistry()
        # The starts as last read, by table (None: a group of one table; else
        # the table's position in the map): a shard of a start moved past
        # scans the moved one (member/read_loop.py, ReadLoop.settle).
        self._starts: dict[int | None, GroupStart] = {}
        # Also the wake-up and joined events.
        self._gate = SessionGate(config, lambda: self.coordinator, clock.monotonic)
        self._tasks: list[asyncio.Task[Any]] = []
        self._io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pg-plan")
        self._last_loop_tick = self.clock.monotonic()
        # Batches whose caller waits until their position is committed
        # (``commit(batch)`` in iterator mode), by ``id(batch)``; resolved by
        # the read loop once the batch's commit is done (see ReadLoop).
        self._durable: dict[int, asyncio.Future[None]] = {}
        self.reachability = Reachability(redact_url(config.coordinator_url),
                                          safety_margin_s=self.timing.margin_s)

    # -- what the parts own, handed to them once --------------------------

    def owned_record(self) -> OwnedShards:
        """The shards held, for their owner: the ownership part (and the
        commits part, which forgets a shard whose commit was rejected). Every
        other reader uses the read-only :attr:`owned`."""
        return self._owned

    def leadership_record(self) -> Leadership:
        """The leader epoch and the assignment, for their owner: the control
        part. Every other reader uses :attr:`leader_epoch` and :attr:`assignment`."""
        return self._leadership

    def opened(self, table: ShardedTable, start: StartPosition) -> None:
        """The member's table, opened by its start, and the start it was given."""
        table.clock = self.clock.monotonic
        self.table = table
        self.start_position = start

    def opened_catalog(self, catalog: Any, location: str, listing: TableListing,
                       start: StartPosition,
                       loaded: dict[str, tuple[str, Any]] | None = None) -> None:
        """A group of several tables: the catalog they are in (opened by the
        member's start, which listed ``listing``, loading the tables
        ``loaded``), and the start given."""
        self._catalog = (catalog, location, dict(loaded or {}))
        self.listing = listing
        self.start_position = start

    def catalog(self) -> Any:
        """The catalog of a group of several tables (:meth:`opened_catalog`)."""
        assert self._catalog is not None, "not a group of several tables"
        return self._catalog[0]

    def open_table(self, name: str, identity: str | None = None, *,
                   keep: bool = False) -> ShardedTable:
        """Table ``name`` of the catalog (TableNotFound if it is not there);
        on the planning thread. The table of ``identity`` the start's listing
        loaded is taken (once; ``keep``: left for the next opening too, as the
        creator of a group leaves it for its member's) rather than loaded again."""
        catalog = self.catalog()
        assert self._catalog is not None
        loaded = self._catalog[2].get(name) if keep else self._catalog[2].pop(name, None)
        if loaded is not None and identity is not None and loaded[0] == identity:
            return ShardedTable(loaded[1], warehouse=self._catalog[1], identifier=name)
        return ShardedTable.in_catalog(catalog, self._catalog[1], name)

    # -- the joined session (membership replaces it whole) -------------------

    @property
    def session(self) -> JoinedSession | None:
        """The joined session (:class:`JoinedSession`); None before the first join."""
        return self._session

    def replace_session(self, session: JoinedSession | None) -> None:
        """Put ``session`` in place of the current one, whole. Called by
        membership alone (join, rejoin, close): every part reads the session's
        coordinator, group client, meta and tables through the
        read-only views below, which all see the same record."""
        self._session = session

    @property
    def coordinator(self) -> Coordinator | None:
        """The open coordinator of the joined session (None while rejoining)."""
        return None if self._session is None else self._session.coordinator

    @property
    def group(self) -> GroupClient | None:
        """The group client of the joined session (None while rejoining)."""
        return None if self._session is None else self._session.group

    @property
    def meta(self) -> GroupMeta | None:
        """The group's record as the last join read it."""
        return None if self._session is None else self._session.meta

    @property
    def num_shards(self) -> int:
        """The group's shard count, as its record says (0 before the first
        join): the session's meta is its one holder."""
        meta = self.meta
        return meta.num_shards if meta is not None else 0

    @property
    def sharding(self) -> ShardRule:
        """The group's sharding rule, as its record says (``bucket`` before
        the first join)."""
        meta = self.meta
        return ShardRule.parse(meta.sharding) if meta is not None else ShardRule.BUCKET

    @property
    def incarnation(self) -> str:
        """The incarnation of the group joined (a group deleted and re-created
        under the same name has another); empty before joining, and for groups
        created before incarnations existed."""
        meta = self.meta
        return meta.incarnation if meta is not None else ""

    @property
    def tables(self) -> MemberTables | None:
        """The tables read, by range (:mod:`paimon_group.member.tables`);
        None before the first join."""
        return None if self._session is None else self._session.tables

    def table_of(self, shard: int) -> MemberTable:
        """The table holding group shard ``shard`` (joined: the session's tables)."""
        tables = self.tables
        assert tables is not None, "not joined"
        return tables.of(shard)

    @property
    def mirror(self) -> RoutedMirror | None:
        """The consumer files' mirror (positions written beside each table),
        in group shard numbers."""
        return None if self._session is None else self._session.tables.mirror

    # The session gate holds the stopping flag, and the joined and wake-up
    # events it waits on; the parts read them here.

    @property
    def stopping(self) -> bool:
        """Set once the member leaves or failed (by :meth:`fail` and the stop)."""
        return self._gate.stopping

    @property
    def joined(self) -> asyncio.Event:
        """Set while the member is registered (membership sets and clears it)."""
        return self._gate.joined

    @property
    def wake(self) -> asyncio.Event:
        """The member's local wake-up (any part may set it)."""
        return self._gate.wake

    async def wait_live(self, *, for_commit: bool = False) -> None:
        """:meth:`SessionGate.wait_live`."""
        await self._gate.wait_live(for_commit=for_commit)

    def add_task(self, task: asyncio.Task[Any]) -> None:
        """A task the stop cancels (a revocation under way)."""
        self._tasks.append(task)

    def set_tasks(self, tasks: list[asyncio.Task[Any]]) -> None:
        """The tasks of the current session (its control and head loops),
        in place of those of the one before; the stop cancels them."""
        self._tasks = tasks

    @property
    def tasks(self) -> tuple[asyncio.Task[Any], ...]:
        """The tasks the stop cancels: the session's loops and revocations under way."""
        return tuple(self._tasks)

    def begin_stop(self) -> None:
        """The member leaves: every part stops at its next check (woken now)."""
        self._gate.stopping = True
        self._gate.wake.set()

    def close_io(self) -> None:
        """End the planning thread (the last step of a stop); work queued on it is dropped."""
        self._io.shutdown(wait=False, cancel_futures=True)

    def await_durable(self, batch: ShardBatch) -> None:
        """A caller will wait until ``batch``'s commit is done (:meth:`durable_of`);
        the read loop resolves it (:meth:`take_durable`)."""
        self._durable[id(batch)] = asyncio.get_running_loop().create_future()

    def durable_of(self, batch: ShardBatch) -> asyncio.Future[None] | None:
        """The future resolved once ``batch``'s commit is done, if a caller waits for it."""
        return self._durable.get(id(batch))

    def loop_ticked(self) -> None:
        """The control loop runs (:meth:`loop_lag` measures from here)."""
        self._last_loop_tick = self.clock.monotonic()

    def take_durable(self, batch: ShardBatch) -> asyncio.Future[None] | None:
        """The future of a caller waiting until ``batch``'s commit is done, if any."""
        return self._durable.pop(id(batch), None)

    # -- state -----------------------------------------------------------

    def set_state(self, state: MemberState) -> None:
        """Move to ``state`` if :data:`~paimon_group.member.state.TRANSITIONS`
        allows it; the same state is a no-op, and FAILED is terminal."""
        if self.state is state:
            return
        if not may_move(self.state, state):
            if self.state is not MemberState.FAILED:
                self.log.debug("member state %s -> %s refused", self.state.value, state.value)
            return
        self.log.info("member state %s -> %s", self.state.value, state.value)
        self.state = state

    def fail(self, err: BaseException) -> None:
        if self.error is None:
            self.error = err
        self.log.error("member failed: %s", err)
        self.set_state(MemberState.FAILED)
        self.begin_stop()

    def raise_if_failed(self) -> None:
        if self.error is not None:
            raise self.error

    def forget_start(self) -> None:
        """A new session reads the group's starts again (a group re-created
        meanwhile starts over)."""
        self._starts.clear()

    def observe_start(self, start: GroupStart | None, table: int | None = None) -> None:
        """The start of the group (``table`` None), or of the table at that
        position of its map, as just read; wakes the read loop when it moved
        further than the start known so far (its shards of the earlier one
        scan the moved one)."""
        known = self._starts.get(table)
        if start is None or (known is not None and start.moves < known.moves):
            return
        self._starts[table] = start
        if known is None or start.moves > known.moves:
            self._gate.wake.set()

    def start_of(self, table: int | None = None) -> GroupStart | None:
        """The start last read of the group (``table`` None) or of one of its tables."""
        return self._starts.get(table)

    @property
    def group_start(self) -> GroupStart | None:
        """The group's start as last read (a group of one table; None: none read)."""
        return self._starts.get(None)

    def start_moves_of(self, table: int | None = None) -> int:
        """The moves of a start as last read (0: none read)."""
        start = self._starts.get(table)
        return 0 if start is None else start.moves

    @property
    def start_moves(self) -> int:
        """The moves of the group's start as last read (0: none read)."""
        return self.start_moves_of(None)

    # -- views -----------------------------------------------------------

    @property
    def owned(self) -> Mapping[int, OwnedShard]:
        """The shards held, by shard (read-only: the ownership part changes it)."""
        return MappingProxyType(self._owned)

    @property
    def owned_shards(self) -> list[int]:
        return sorted(s for s, o in self._owned.items() if not o.dropped)

    @property
    def assignment(self) -> Assignment | None:
        return self._leadership.assignment

    @property
    def leader_epoch(self) -> int | None:
        """The epoch of the leader key we hold (None: we do not lead)."""
        return self._leadership.leader_epoch

    @property
    def is_leader(self) -> bool:
        return self._leadership.leader_epoch is not None

    @property
    def ready(self) -> bool:
        """Joined, in the published assignment, and every shard it gives us is acquired.

        A member the leader has not published yet is not ready, though it has
        no shard to acquire: every assignor gives each live member an entry
        (``[]`` when it gets no shard), so being in the assignment is what
        tells that the leader has placed us. Before, a member joining a group
        whose assignment did not name it yet was ready at once, and a query
        under ``Trigger.AvailableNow`` planned its only batch with no shard."""
        assignment = self._leadership.assignment
        if self.state is not MemberState.RUNNING or assignment is None:
            return False
        if self.member_id not in assignment.shards:
            return False
        return set(assignment.shards_of(self.member_id)) <= set(self.owned_shards)

    @property
    def session_state(self) -> str:
        coord = self.coordinator
        return coord.session.state.value if coord else "none"

    def published_latest(self) -> int | None:
        """The table's latest snapshot id as the group's published head says it,
        while the head is fresh (:mod:`paimon_group.member.head`); else None."""
        record = self.head.record if self.head.fresh else None
        return None if record is None else record.latest

    def loop_lag(self) -> float:
        return self.clock.monotonic() - self._last_loop_tick

    # -- services --------------------------------------------------------

    def start_in_io(self, fn: Callable[[], Any]) -> asyncio.Future[Any]:
        """Start ``fn`` on the planning thread."""
        return asyncio.get_running_loop().run_in_executor(self._io, fn)

    async def in_io(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the planning thread."""
        return await self.start_in_io(fn)

    def notify(self, hook: str, shards: list[int]) -> None:
        if hook == "on_lost":
            self.stats.shards_moved["lost"] += len(shards)
        if self.listener is None:
            return
        fn = getattr(self.listener, hook, None)
        if fn is None:
            return
        try:
            fn(sorted(shards))
        except Exception:
            log.exception("rebalance listener %s raised", hook)
