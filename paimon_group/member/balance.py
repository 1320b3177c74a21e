"""The leader's side of the load assignor: measured loads, and when to use them.

A group created with ``--assignor load`` has its leader call
:func:`paimon_group.protocol.load_assignor.assign_by_load` instead of the count
assignor, with each shard's load measured from the table's manifests
(:mod:`paimon_group.reading.shard_load`). :class:`LeaderLoads` keeps the last
measurement and says when a new one is due, and whether a round may move
shards for balance:

* a measurement is refreshed at most every :data:`REFRESH_S` seconds (and
  only then: a leader does not read every manifest on every tick);
* a round where the members are the same as in the published assignment
  and no shard is orphaned (nothing but balance to gain) moves shards only
  with a measurement newer than the one the last publish used: at most one
  capped set of balancing moves per refresh, never a storm of handovers;
* a round with a join or a leave places the orphaned shards and makes its
  capped balancing moves at once (a member that joined gets load without
  waiting for a refresh).

A measurement that fails (the table unreachable a moment) keeps the last
one; with none at all the count assignor decides, as it does for an empty
table.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence

from paimon_group.protocol.assignors import Assignor, assign_over
from paimon_group.protocol.load_assignor import DEFAULT_MAX_MOVE_SHARE
from paimon_group.protocol.records import Assignment, GroupStart, Position
from paimon_group.reading.shard_load import MeasuredLoad, shard_loads
from paimon_group.reading.start import StartKind, StartPosition

log = logging.getLogger("paimon_group.member")

#: Seconds between two measurements of the shards' loads by the leader.
REFRESH_S = 30.0


class LeaderLoads:
    """The leader's last measurement of the shards' loads (see the module docstring)."""

    def __init__(self, *, refresh_s: float = REFRESH_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.refresh_s = refresh_s
        self.measured: MeasuredLoad | None = None
        # Shards whose full scan was ahead when the loads were measured
        # (read with them, not every round: a leader's round stays cheap).
        self.pending: set[int] = set()
        self._tried_at = -1e18
        self._published_at = -1e18

    async def refresh(
        self, measure: Callable[[], Awaitable[tuple[MeasuredLoad, set[int]] | None]]
    ) -> None:
        """Measure again (the loads, and the shards whose full scan is ahead)
        if the last try is older than ``refresh_s``."""
        now = self._clock()
        if now - self._tried_at < self.refresh_s:
            return
        self._tried_at = now
        try:
            fresh = await measure()
        except Exception as err:  # a hint for balance only: keep the last one
            log.warning("shard loads not measured (%s): the last measurement is kept", err)
            return
        if fresh is not None:
            self.measured, self.pending = fresh

    def assign(
        self, assignor: Assignor, num_shards: int, members: Sequence[str],
        basis: Mapping[str, list[int]], previous: Assignment | None,
        shards: Sequence[int] | None = None,
    ) -> tuple[dict[str, list[int]], dict[int, int]]:
        """The assignment by ``assignor`` with the last measurement (and the
        loads it was given; ``{}``: none, when not every shard was measured,
        and the load assignor assigns by count). ``shards``: the shards to
        assign, in dealing order (a group of several tables: its live
        tables' shards in spread order; None: ``0..num_shards-1``)."""
        order = list(range(num_shards)) if shards is None else list(shards)
        covered = self.measured is not None and len(self.measured.live) == num_shards
        if not covered:
            return assign_over(assignor, order, members, basis, loads=None), {}
        assert self.measured is not None  # covered
        loads = shard_loads(self.measured, self.pending)
        held = {s for m in members for s in basis.get(m, ())}
        only_balance = (previous is not None and set(previous.shards) == set(members)
                        and held >= set(order))
        fresh = self.measured.measured_at > self._published_at
        share = DEFAULT_MAX_MOVE_SHARE if fresh or not only_balance else 0.0
        return assign_over(assignor, order, members, basis, loads=loads,
                           max_move_share=share), loads

    def published(self) -> None:
        """The last measurement went out with a published assignment."""
        if self.measured is not None:
            self._published_at = self.measured.measured_at


def full_scan_pending(
    num_shards: int, positions: Mapping[int, Position], start: GroupStart | None,
    start_position: StartPosition,
) -> set[int]:
    """Shards whose full scan is still ahead: a pinned full scan, or no
    position yet where the group's start (stored, else ``--start``, parsed) scans."""
    if start is not None:
        scans = start.full_scan is not None
    else:
        scans = start_position.kind in (StartKind.LATEST_FULL, StartKind.EARLIEST)
    pending = set()
    for shard in range(num_shards):
        position = positions.get(shard)
        if (position is None and scans) or (position is not None
                                             and position.full_scan is not None):
            pending.add(shard)
    return pending


def merged_loads(parts: Sequence[tuple[int, MeasuredLoad | None]], total: int,
                 measured_at: float) -> MeasuredLoad:
    """One measurement of a group of several tables from its tables' own
    (``(first, measured)``, each in its table's shard numbers, placed at its
    range): shards of a table not measured (empty, dropped) weigh 0."""
    live, recent = [0] * total, [0] * total
    for first, measured in parts:
        if measured is None:
            continue
        for local, rows in enumerate(measured.live):
            live[first + local] = rows
        for local, rows in enumerate(measured.recent):
            recent[first + local] = rows
    return MeasuredLoad(-1, tuple(live), tuple(recent), measured_at)

