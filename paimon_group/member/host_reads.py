"""A member driven by a host that plans and reads itself (the Spark source).

Such a host joins with ``start()`` and never calls ``run()`` or
``batches()``; the member keeps its control loop (leadership, acquiring,
revoking and releasing shards as the assignment says). The host asks for the
settled positions of the shards held now (:meth:`HostReads.settle_positions`),
marks the shards of a batch it planned busy until that batch is committed
(:meth:`HostReads.mark_busy`, :meth:`HostReads.mark_idle`), so a revocation
waits for the commit as it waits for a worker's batch in flight, and commits
positions through the member's fenced commit
(:meth:`HostReads.commit_positions`). Call these on the member's event loop.

Example (on the member's loop)::

    positions = await member.settle_positions()      # {shard: ShardPosition}
    member.mark_busy(positions)                      # a batch planned from them
    ...                                              # the host reads the batch
    ok = await member.commit_positions({s: 7 for s in positions})
    member.mark_idle(positions)
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from coordinators.errors import CoordinatorError, PaimonGroupError
from paimon_group.errors import TableNotFound, TableReplaced
from paimon_group.member.commits import Commits
from paimon_group.member.core import MemberCore
from paimon_group.member.data_loss import LostRange
from paimon_group.member.head import TABLE_CHECK_S
from paimon_group.member.moved_start import move_start
from paimon_group.member.read_loop import ReadLoop
from paimon_group.member.state import OwnedShard, Stop
from paimon_group.protocol.records import GroupStart

log = logging.getLogger("paimon_group.member")


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
    start_moves: int = 0  # of the group start it derives from (member/moved_start.py)


class HostReads:
    """The public hooks of a member used without its read loop (the member
    offers them as its own methods)."""

    def __init__(self, core: MemberCore, commits: Commits, reading: ReadLoop) -> None:
        self._core = core
        self._commits = commits
        self._reading = reading
        # When a driven member last checked its table (None: not yet; start checked it).
        self._driven_table_checked: float | None = None

    def of_this_incarnation(self, incarnation: str) -> bool:
        """Whether positions planned in ``incarnation`` are of the group
        joined now (either empty: taken as the same, as before incarnations
        were recorded)."""
        joined = self._core.incarnation
        return not incarnation or not joined or incarnation == joined

    def held_shards(self) -> list[int]:
        """The shards owned now and not being revoked: the ones that may be read."""
        return sorted(s for s, o in self._core.owned.items() if o.active)

    async def settle_positions(self) -> dict[int, ShardPosition]:
        """The positions of the held shards, settled as the read loop settles
        them before planning a step.

        A shard whose last commit had an unknown outcome gets the stored
        position read back; shards without a position get their start
        resolved once and pinned in one fenced commit. A shard that could not
        be settled (the coordinator failed; logged) is left out, as is one
        dropped or acquired anew meanwhile: the next call tries again.
        """
        await self._check_table_now_and_then()
        held = [o for o in self._core.owned.values() if o.active]
        try:
            await self._reading.settle(held)
        except Stop:
            # Leaving: no shard may be read any more (the host learns it from
            # an empty answer, as when nothing is held; the internal Stop
            # must not reach the host).
            return {}
        except PaimonGroupError as err:
            # Those shards stay out (unresolved or uncertain) this time.
            self._core.log.warning("positions not settled this round: %s", err)
        out: dict[int, ShardPosition] = {}
        for o in held:
            if (o.dropped or o.uncertain or o.next_snapshot is None
                    or self._core.owned.get(o.shard) is not o):
                continue
            out[o.shard] = ShardPosition(o.shard, o.epoch, o.next_snapshot, o.full_scan,
                                         o.start_moves)
        return out

    async def _check_table_now_and_then(self) -> None:
        """The read loop's table check, for a host that plans itself and so
        never runs the read loop: a dropped table looks to its planner like
        an idle one, and a re-created one like a table whose next snapshot is
        not there yet, until it is (then the old positions would be read on
        the new table). Every ``TABLE_CHECK_S`` (start checked the table):
        the member fails with TableNotFound or TableReplaced, raised here."""
        now = self._core.clock.monotonic()
        if self._driven_table_checked is None:
            self._driven_table_checked = now
        if now - self._driven_table_checked < TABLE_CHECK_S:
            return
        self._driven_table_checked = now
        try:
            await self._core.in_io(self._reading.check_table)
        except (TableNotFound, TableReplaced) as err:
            self._core.fail(err)
            raise

    async def stored_positions(self, shards: Iterable[int]) -> dict[int, ShardPosition]:
        """The stored positions of ``shards``, whoever owns them (one read of
        the coordinator; ``epoch`` is the one that wrote each, 0 for a reset).
        A host re-running a batch planned earlier reads them to see whether
        the group moved past snapshots that expired meanwhile."""
        group = self._core.group
        if group is None:
            raise PaimonGroupError("not joined: no group positions to read")
        wanted = set(shards)
        return {s: ShardPosition(s, p.epoch, p.next_snapshot, p.full_scan, p.start_moves or 0)
                for s, p in (await group.positions()).items() if s in wanted}

    def mark_busy(self, shards: Iterable[int], *, limit_s: float | None = None) -> list[int]:
        """Mark owned shards busy, as a batch in the handler does: a revocation
        of one waits until :meth:`mark_idle`, up to ``revoke_timeout_s``, or
        up to ``limit_s`` when given (``math.inf``: until then; a leave still
        waits ``revoke_timeout_s`` at most). Returns the shards marked (those
        owned now)."""
        marked: list[int] = []
        for shard in shards:
            o = self._core.owned.get(shard)
            if o is not None:
                o.idle.clear()
                o.hold_limit_s = limit_s
                marked.append(shard)
        return marked

    def mark_idle(self, shards: Iterable[int]) -> None:
        """End :meth:`mark_busy` for ``shards`` (a waiting revocation goes on)."""
        for shard in shards:
            o = self._core.owned.get(shard)
            if o is not None:
                o.hold_limit_s = None
                o.idle.set()

    async def move_group_start(self, losts: Iterable[LostRange], lineage: int,
                               read_to: Mapping[int, int]) -> GroupStart | None:
        """The host found the pending full scans of ``losts`` expired on a
        bucket-unaware table and skips them: move the group's start to a full
        scan of the latest snapshot, once for every shard (or take the move
        made already; one WARNING line says it, as a worker says it:
        :func:`~paimon_group.member.moved_start.move_start`). ``lineage``:
        the moves of the start the lost scans derive from. The host re-pins
        its shards of an earlier start at the returned one (``read_to``:
        where each had read to, recorded: it reads the snapshots from the
        moved start up to there again); the member re-pins those it holds
        idle at its next settle. None: the coordinator failed the move
        (logged); the host leaves those shards for its next batch."""
        moved: GroupStart | None = None
        try:
            for lost in losts:
                moved = await move_start(self._core, self._core.table_of(lost.shards[0]),
                                         lost, lineage)
        except CoordinatorError as err:
            self._core.log.warning(
                "the group's start was not moved this time (%s): the shards wait for "
                "the next batch", err)
            return None
        if moved is None or moved.full_scan is None:
            return None
        if read_to:
            self._core.history.record("repin", shards=sorted(read_to), full_scan=moved.full_scan,
                                      start_moves=moved.moves,
                                      read_to={str(s): n for s, n in sorted(read_to.items())})
        return moved

    async def commit_positions(self, positions: Mapping[int, int], *,
                               incarnation: str = "",
                               moves: Mapping[int, int] | None = None) -> dict[int, bool]:
        """Fenced commit of ``shard -> next snapshot`` for the shards still ours,
        one coordinator commit per distinct position.

        Returns per shard whether the coordinator has that position now
        (False: not ours any more, rejected, or the commit failed; logged).
        Positions only move forward: a shard already at or beyond its
        position is left alone and reported True. ``incarnation``: the
        incarnation of the group the positions were planned in (empty: not
        known); positions of another one are not committed (all False): a
        group deleted and re-created has other shards or another start, and
        a position of the old one written "forward" over a pinned full scan
        skips rows.

        ``moves``: per shard, the moves of the group start the position
        derives from (absent: the shard's own). One of an earlier start than
        the shard's is not committed (False): the shard was re-pinned at a
        moved start since, whose full scan it must read first (a position of
        the earlier start written over it skips that scan). One of a later
        start (the host re-pinned its cursor at a moved start the member has
        not re-pinned the shard at) is committed with it.
        """
        if not self.of_this_incarnation(incarnation):
            self._core.log.info(
                "positions of another incarnation of group %s not committed: %s",
                self._core.group_name, dict(positions))
            return dict.fromkeys(positions, False)
        result: dict[int, bool] = {}
        by_position: dict[tuple[int, int], dict[int, OwnedShard]] = {}
        for shard, to in positions.items():
            o = self._core.owned.get(shard)
            if o is None or o.dropped or o.next_snapshot is None:
                result[shard] = False
                continue
            lineage = o.start_moves if moves is None else moves.get(shard, o.start_moves)
            if lineage < o.start_moves:
                self._core.log.info(
                    "shard %d: position %d of an earlier group start not committed: the "
                    "shard scans the moved start first", shard, to)
                result[shard] = False
                continue
            done = o.full_scan if o.full_scan is not None else o.next_snapshot
            if to <= done and lineage == o.start_moves:
                result[shard] = True
                continue
            by_position.setdefault((to, lineage), {})[shard] = o
        for (to, lineage), owned in sorted(by_position.items()):
            try:
                await self._commits.commit(owned, to, start_moves=lineage)
            except Exception as err:  # coordinator errors, or leaving: not committed
                # Not committing only means that the next owner of these
                # shards reads them again.
                self._core.log.warning(
                    "commit of shards %s at %d failed: %s", sorted(owned), to, err)
            for shard, o in owned.items():
                result[shard] = (not o.dropped and o.committed == to
                                 and o.start_moves == lineage)
        return result
