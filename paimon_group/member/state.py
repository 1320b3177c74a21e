"""The member's lifecycle, a held shard's lifecycle, and the session gate.

Member states, and every transition :meth:`MemberCore.set_state` allows
(:data:`TRANSITIONS`; any other is refused and logged)::

    CREATED ──start()──> JOINING ──registered──> RUNNING
    CREATED ──stop() before start()──> STOPPED
    JOINING ──stop() after start() raised──> LEAVING
    RUNNING ──session LOST──> REJOINING ──registered again──> RUNNING
    RUNNING / REJOINING ──stop()──> LEAVING ──released, closed──> STOPPED
    any ──fatal error──> FAILED            (terminal; stop() then re-raises it)

A rejoin that completes while the member is leaving does not take it back
to RUNNING: it stays LEAVING until it is STOPPED.

A held shard (:class:`OwnedShard`) moves through :class:`ShardState`::

    ACTIVE ──no longer assigned to us──> REVOKING ──released or lost──> REVOKED
    ACTIVE ──session lost, owner key gone, commit rejected──> LOST

REVOKED and LOST are terminal: the record is out of the member's owned
shards (a new acquisition of the shard is a new record).

An :class:`OwnedShard` is also the one home of its shard's positions (as
aiokafka's ``TopicPartitionState`` is a partition's): where reading
continues, the committed position, and what a commit of unknown outcome may
have left (see the class). The commits part
(:class:`~paimon_group.member.commits.Commits`) alone writes positions, and
asks it whether a write would move the position backwards.

The session gate (:class:`SessionGate`): nothing is delivered and nothing is
committed unless the session is confirmed live (invariant 3).
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar

from coordinators.protocol import Coordinator
from paimon_group.config.member import MemberConfig
from paimon_group.protocol.records import Assignment, Position, position_order

Order = tuple[int, ...]
"""A position in the order positions advance (:func:`position_order`)."""

_UNKNOWN: Order = (sys.maxsize,)  # uncertain, at a position not known: above any


class MemberState(enum.Enum):
    CREATED = "created"
    JOINING = "joining"
    RUNNING = "running"
    REJOINING = "rejoining"
    LEAVING = "leaving"
    STOPPED = "stopped"
    FAILED = "failed"


_S = MemberState
TRANSITIONS: MappingProxyType[MemberState, frozenset[MemberState]] = MappingProxyType({
    _S.CREATED: frozenset({_S.JOINING, _S.STOPPED, _S.FAILED}),
    _S.JOINING: frozenset({_S.RUNNING, _S.LEAVING, _S.FAILED}),
    _S.RUNNING: frozenset({_S.REJOINING, _S.LEAVING, _S.FAILED}),
    _S.REJOINING: frozenset({_S.RUNNING, _S.LEAVING, _S.FAILED}),
    _S.LEAVING: frozenset({_S.STOPPED, _S.FAILED}),
    # A fatal error reported after the graceful stop (a handler that failed
    # in a reader still running) still fails the member.
    _S.STOPPED: frozenset({_S.FAILED}),
    _S.FAILED: frozenset(),
})
"""The states each state may move to (moving to the same state is a no-op)."""


def may_move(current: MemberState, target: MemberState) -> bool:
    """Whether ``current -> target`` is a transition of :data:`TRANSITIONS`."""
    return target in TRANSITIONS[current]


class ShardState(enum.Enum):
    ACTIVE = "active"  # ours, read by the read loop
    REVOKING = "revoking"  # no longer assigned to us: the batch in flight ends, then release
    REVOKED = "revoked"  # ended after its revocation began (released, or lost meanwhile)
    LOST = "lost"  # ended without a revocation (session lost, key gone, commit rejected)


_CHANGES = itertools.count(1)  # the numbers of OwnedShard.last_change


@dataclass
class OwnedShard:
    """One ownership of one shard: its epoch, where it reads, what is committed.

    Positions never move backwards (invariant 2). Only the owner writes its
    shard's position (every write is fenced by its epoch), so this record
    knows a lower bound of what is stored without reading it: ``committed``
    (with ``full_scan`` and ``start_moves``: :attr:`order`), the highest
    position a commit of ours landed with, read at acquisition, or read back;
    and ``unsure``, the highest position a commit of ours that raised may have
    left (it may or may not have landed). :meth:`lowers` tells whether a
    write would move the stored position backwards; :meth:`landed`,
    :meth:`raised` and :meth:`take_stored` take a commit's outcome and a
    read-back. The commits part alone calls them, under its lock (and the
    acquisition, :meth:`take_stored` of the position it read before the
    record is held).
    """

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
    # The moves of the group start this position derives from (GroupStart.moves).
    start_moves: int = 0
    # A commit of this ownership raised: it may have landed or not, so the
    # stored position may be ahead of ``committed``, up to this one. It is
    # read back before ``committed`` is used again (the next step, a release,
    # a lower write): committing the older value would move the position
    # backwards (invariant 2), and reading on from it would deliver the
    # batch that landed again. None: every commit's outcome is known.
    unsure: Order | None = None
    state: ShardState = ShardState.ACTIVE
    # Set while no batch of this shard is in flight; a revoke waits for it.
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    # While a host that plans itself holds the shard for a batch (the Spark
    # source, until Spark proves the batch done): how long a revocation
    # (not a leave) waits for it instead of revoke_timeout_s; inf: no limit.
    hold_limit_s: float | None = None

    # The number of the last change made to any ownership in this process (a
    # field set, at creation too) or to any member's held set: a read round
    # that found nothing new is skipped while it stands
    # (member/idle_round.py). Each change draws a number of its own (a draw
    # is atomic), so the last one stored differs from any taken before it,
    # whichever thread stores last.
    last_change: ClassVar[int] = 0

    def __post_init__(self) -> None:
        self.idle.set()

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)
        OwnedShard.last_change = next(_CHANGES)

    @property
    def active(self) -> bool:
        return self.state is ShardState.ACTIVE

    @property
    def position(self) -> int | None:
        """The oldest snapshot the shard still needs as committed in the
        coordinator (a pending full scan's snapshot, else the next snapshot),
        or None before its first commit."""
        return self.full_scan if (self.full_scan is not None and self.committed) else self.committed

    @property
    def uncertain(self) -> bool:
        """A commit of this ownership raised and was not read back yet
        (``unsure``); set True, it is taken as of a position not known."""
        return self.unsure is not None

    @uncertain.setter
    def uncertain(self, value: bool) -> None:
        self.unsure = _UNKNOWN if value else None

    @property
    def order(self) -> Order | None:
        """``committed`` in the order positions advance; None before the first."""
        if self.committed is None:
            return None
        return position_order(self.committed, self.full_scan, self.start_moves)

    def lowers(self, order: Order) -> bool | None:
        """Whether writing ``order`` would move the stored position backwards:
        True (below ``committed``), False, or None when only the stored
        position can tell (below what a commit that raised may have left)."""
        known = self.order
        if known is not None and order < known:
            return True
        if self.unsure is not None and order < self.unsure:
            return None
        return False

    def landed(self, next_snapshot: int, full_scan: int | None, start_moves: int) -> None:
        """A commit of this position was accepted (it is not below ``committed``:
        the commits part asked :meth:`lowers` first). A commit that raised
        before it, if it lands at all, lands before it (see
        :meth:`~paimon_group.member.commits.Commits.read_back`): no longer
        unsure at or below it."""
        if self.unsure is not None and position_order(
                next_snapshot, full_scan, start_moves) >= self.unsure:
            self.unsure = None
        self.next_snapshot = self.committed = next_snapshot
        self.full_scan = full_scan
        self.start_moves = start_moves

    def raised(self, order: Order) -> None:
        """A commit of ``order`` raised: it may have landed or not."""
        if self.unsure is None or order > self.unsure:
            self.unsure = order

    def take_stored(self, stored: Position | None, start_moves: int) -> None:
        """The stored position, read back (None: none stored, a pin that did
        not land: the shard stays unresolved). Taken if it is ahead of
        ``committed``, reading continues from it; ``start_moves``: the moves
        of a position stored without them (an operator's reset)."""
        self.unsure = None
        if stored is None:
            return
        known = self.order
        if known is None or stored.order > known:
            self.next_snapshot = self.committed = stored.next_snapshot
            self.full_scan = stored.full_scan
            self.start_moves = start_moves if stored.start_moves is None else stored.start_moves

    @property
    def revoking(self) -> bool:
        """Its revocation began (REVOKING, or REVOKED after it)."""
        return self.state in (ShardState.REVOKING, ShardState.REVOKED)

    @property
    def dropped(self) -> bool:
        """Ended (REVOKED or LOST): not ours any more."""
        return self.state in (ShardState.REVOKED, ShardState.LOST)

    def revoke(self) -> None:
        """ACTIVE -> REVOKING (a no-op once the revocation began or it ended)."""
        if self.state is ShardState.ACTIVE:
            self.state = ShardState.REVOKING

    def drop(self) -> None:
        """End this ownership: REVOKING -> REVOKED, ACTIVE -> LOST."""
        if self.state is ShardState.REVOKING:
            self.state = ShardState.REVOKED
        elif self.state is ShardState.ACTIVE:
            self.state = ShardState.LOST


@dataclass
class Leadership:
    """The control part's own state (:class:`~paimon_group.member.control.Control`
    alone changes it; the core shows it read-only): the epoch of the leader
    key this member holds (None: it does not lead), and the assignment it
    follows (the last generation it read)."""

    leader_epoch: int | None = None
    assignment: Assignment | None = None


class OwnedShards(dict[int, OwnedShard]):
    """The shards a member holds, by shard: the ownership part's
    (:class:`~paimon_group.member.ownership.ShardOwnership` adds and removes
    them); the other parts read them through the core's read-only view
    (``MemberCore.owned``). The one other change is :meth:`forget`, by the
    commits part, of a shard whose commit was rejected."""

    # Every change of the held set is one of OwnedShard.last_change's.
    def __setitem__(self, shard: int, o: OwnedShard) -> None:
        super().__setitem__(shard, o)
        OwnedShard.last_change = next(_CHANGES)

    def __delitem__(self, shard: int) -> None:
        super().__delitem__(shard)
        OwnedShard.last_change = next(_CHANGES)

    def pop(self, shard: int, *default: Any) -> Any:
        got = super().pop(shard, *default)
        OwnedShard.last_change = next(_CHANGES)
        return got

    def popitem(self) -> tuple[int, OwnedShard]:
        got = super().popitem()
        OwnedShard.last_change = next(_CHANGES)
        return got

    def setdefault(self, shard: int, o: OwnedShard) -> OwnedShard:
        got = super().setdefault(shard, o)
        OwnedShard.last_change = next(_CHANGES)
        return got

    def update(self, *args: Any, **kwargs: Any) -> None:
        super().update(*args, **kwargs)
        OwnedShard.last_change = next(_CHANGES)

    def clear(self) -> None:
        super().clear()
        OwnedShard.last_change = next(_CHANGES)

    def holds(self, o: OwnedShard) -> bool:
        """Whether ``o`` is the current ownership of its shard."""
        return self.get(o.shard) is o

    def forget(self, o: OwnedShard) -> bool:
        """End ``o`` here if it is still the current ownership of its shard
        (True); an ownership dropped before (its shard acquired again since,
        under a new epoch) is left alone (False)."""
        if not self.holds(o):
            return False
        del self[o.shard]
        return True


class Stop(Exception):
    """Internal: the read loop should stop (member leaving)."""


class SessionGate:
    """Holds work back until the member's session is confirmed live.

    ``coordinator`` gives the member's open coordinator (None while it
    rejoins), ``stopping`` is set once the member leaves or failed; ``config.timing.margin_s``
    is the safety margin before the session's local deadline. ``joined`` is set
    while the member is registered; ``wake`` is the member's local wake-up.
    """

    def __init__(self, config: MemberConfig,
                 coordinator: Callable[[], Coordinator | None],
                 monotonic: Callable[[], float]) -> None:
        self._margin_s = config.timing.margin_s
        self._monotonic = monotonic  # the member's clock: its lease is judged on it
        self._coordinator = coordinator
        self.stopping = False
        self.joined = asyncio.Event()
        self.wake = asyncio.Event()

    async def wait_live(self, *, for_commit: bool = False) -> None:
        """Return when the session is confirmed live.

        While the member is leaving, no *new* work starts (:class:`Stop`), but
        the commit of a batch that already finished still goes through, so a
        graceful stop finishes the batch in flight instead of abandoning it.
        """
        while True:
            if self.stopping and not for_commit:
                raise Stop()
            coord = self._coordinator()
            if for_commit and coord is None and self.stopping:
                raise Stop()
            if coord is not None and coord.session.is_live(self._margin_s, now=self._monotonic()):
                return
            if not self.joined.is_set() or coord is None:
                # Rejoining: the control loop, which clears the wake-up event,
                # is not running. A wake-up set before now (the session loss,
                # a revoke ending) would end every wait below at once and the
                # loop would spin until the join; only a new one (stop) counts.
                # stopping was checked above, with no await since.
                self.wake.clear()
                waiter = asyncio.ensure_future(self.joined.wait())
                stop = asyncio.ensure_future(self.wake.wait())
                await asyncio.wait([waiter, stop], timeout=0.5,
                                   return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                stop.cancel()
                continue
            await asyncio.sleep(0.02)
