"""The control loop: leadership, and following the published assignment.

Level-triggered on the coordinator's watches (the group record, the member
list, the owner keys). Any member becomes leader when there is none; the
leader recomputes the sticky assignment whenever the live members change
and publishes it guarded by its leader epoch and the previous assignment's
version, so a deposed leader cannot publish. Every member follows the
published assignment: shards no longer ours are revoked (concurrently with
reading the others), shards newly ours are acquired.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging

from coordinators.errors import CoordinatorError, PaimonGroupError, SessionLost
from coordinators.protocol import SessionState
from paimon_group.errors import MemberRemoved
from paimon_group.member.balance import LeaderLoads, full_scan_pending, merged_loads
from paimon_group.member.core import MemberCore
from paimon_group.member.ownership import ShardOwnership
from paimon_group.member.publish_delay import PublishDelay
from paimon_group.member.round_view import RoundView, read_meta_value, read_round
from paimon_group.member.state import Leadership
from paimon_group.member.table_refresh import TableWatch, follow_map
from paimon_group.member.tables import MemberTables
from paimon_group.protocol.assignors import assign_over, assignor_named
from paimon_group.protocol.group import GroupClient
from paimon_group.protocol.group_start import read_group_start
from paimon_group.protocol.records import Assignment, decoded_meta
from paimon_group.protocol.sharding import Sharding, ShardRule
from paimon_group.protocol.sinks import publish as publish_sinks
from paimon_group.protocol.static_membership import VanishedMembers, same_assignment, sticky_basis
from paimon_group.reading.shard_load import MeasuredLoad, measure

log = logging.getLogger("paimon_group.member")


class Control:
    """The control loop (see the module docstring).

    Its interface: :meth:`run`, the loop itself, until the member stops or
    the session is lost (then it raises, and membership rejoins); and
    :meth:`reconcile`, one round of it (tests drive single rounds).
    """

    def __init__(self, core: MemberCore, ownership: ShardOwnership,
                 leadership: Leadership) -> None:
        self._core = core
        self._ownership = ownership
        # The leader epoch and the assignment followed: ours alone to change.
        self._state = leadership
        self._vanished = VanishedMembers()
        self._full_round_at = -1e18
        self._loads = LeaderLoads(clock=core.clock.monotonic)
        self._arrivals = PublishDelay(forming_quiet_s=core.config.forming_wait_s)
        # The sinks published in this session (protocol/sinks.py).
        self._published_sinks: set[str] = set()
        # A group of several tables: the leader's listing of the catalog,
        # and each table's last load measurement (by the first shard of its range).
        self._table_watch = TableWatch(core)
        self._table_loads: dict[int, MeasuredLoad] = {}
        self._meta_seen: bytes | None = None  # the group record's bytes, as last followed
        self._settled = SettledAssignment()
        # When the group record was last read, and after which assignment
        # (its version): see _read_round.
        self._map_read_at = -1e18
        self._map_read_after: int | None = None
        self._no_leader_seen = True

    async def run(self) -> None:
        fired: set[str] = {"start"}
        while not self._core.stopping:
            self._core.loop_ticked()
            coord = self._core.coordinator
            if coord is None:
                raise SessionLost("no session")
            if coord.session.state is SessionState.LOST:
                raise SessionLost(f"session {coord.session.id} lost")
            if coord.session.is_live(self._core.timing.margin_s, now=self._core.clock.monotonic()):
                try:
                    await self.reconcile(fired)
                except PaimonGroupError as err:
                    # Whether trying again may succeed is a fact of the error
                    # (``retriable``), not a list of classes: a ZooKeeper
                    # SessionSuspended mid-round is retried like a timeout,
                    # while SessionLost (rejoin) and MemberRemoved propagate.
                    if not err.retriable:
                        raise
                    # An acquisition or release may have landed unseen: the
                    # next ownership check lists every owner key and sweeps.
                    self._ownership.sweep_at_next_check()
                    self._core.log.warning("control round failed, retrying: %s", err)
            fired = await self._wait_for_change(timeout=self._core.timing.control_tick_s)

    async def _wait_for_change(self, timeout: float) -> set[str]:
        """Which of our watches fired ("group", "members", "owners"), or
        {"local"} / {"timeout"} for a local wake-up or the periodic tick
        (:class:`~paimon_group.member.watches.ControlWatches`: the members
        watch is open while we lead, the owners watch while we wait to
        acquire; one opened now counts as fired, the round re-reads)."""
        session = self._core.session
        watches = None if session is None else session.watches
        if watches is None:
            raise SessionLost("no session")
        opened = await watches.update(leading=self._state.leader_epoch is not None,
                                      acquiring=bool(self._ownership.pending_acquisitions()))
        if opened:
            return opened
        return await watches.wait(self._core.wake, timeout)

    async def reconcile(self, fired: set[str]) -> None:
        """One level-triggered round, doing only what the wake-up calls for.

        A change of owner keys alone (the most frequent event in a large group
        during a rebalance), or of members on a follower, only retries pending
        acquisitions; everything is re-read on a group change, a member change
        on the leader, a local wake-up and every tick.
        """
        group = self._core.group
        assert group is not None
        if self._ownership.releases:
            released = await self._ownership.releases.retry(group)
            if released:
                self._core.log.info("owner keys of shards %s released on retry", released)
        if self._owners_only(fired):
            await self._acquire(group, self._ownership.pending_acquisitions())
            if self._ownership.check_due():
                await self._ownership.check_ownership(group)
            return
        self._full_round_at = self._core.clock.monotonic()
        view = await self._read_round(group)
        self._ownership.observe_forced(view.forced)
        for table, start in view.starts.items():
            self._core.observe_start(start, table)
        if view.meta is not None and view.meta != self._meta_seen:
            # Decoded only when its bytes changed: a map of many tables is long.
            await follow_map(self._core, decoded_meta(group.keys.meta, view.meta))
            self._meta_seen = view.meta
        await self._check_member_key(group, view)
        await self._maybe_lead(group, view)
        await self._follow_assignment(group, view)
        await self._publish_sinks(group)

    async def _read_round(self, group: GroupClient) -> RoundView:
        """The round's keys (member/round_view.py); in a group of several
        tables, with the group record when it may have moved.

        The record carries the table map (about 20 KB at 200 tables), which
        only the leader changes, and always before it publishes an assignment
        that deals a changed map's shards. So a follower reads it when the
        assignment read is not the one it last read the record after (then in
        a second request: a record read after an assignment is at least as new
        as the map that assignment was dealt from), once per ``map_check_s``
        for a change no assignment follows, and in every round while it leads
        or saw no leader (it may lead in this round, and deals from the map)."""
        several = self._core.meta is not None and self._core.meta.tables is not None
        now = self._core.clock.monotonic()
        with_meta = several and (self._state.leader_epoch is not None or self._no_leader_seen
                                 or now - self._map_read_at >= self._core.timing.map_check_s)
        view = await read_round(group, self._core.member_id,
                                with_start=self._core.sharding is ShardRule.FILE and not several,
                                with_meta=with_meta,
                                starts=self._moving_starts() if several else ())
        self._no_leader_seen = view.leader is None
        if several and not with_meta and view.assignment_version != self._map_read_after:
            view = dataclasses.replace(view, meta=await read_meta_value(group))
            with_meta = True
        if with_meta:
            self._map_read_at, self._map_read_after = now, view.assignment_version
        return view

    def _moving_starts(self) -> list[int]:
        """The positions in the map of the bucket-unaware tables whose shards
        this member holds: their starts may move (member/moved_start.py)."""
        tables = self._core.tables
        if tables is None or not tables.any_file_rule:
            return []  # each round, with 80 shards held: not to be walked for nothing
        found = {t.index for s in self._core.owned if (t := tables.get(s)) is not None
                 and t.index is not None and t.gone is None
                 and ShardRule.parse(t.range.sharding) is ShardRule.FILE}
        return sorted(i for i in found if i is not None)

    async def _publish_sinks(self, group: GroupClient) -> None:
        """Publish the sinks this member's batches were written to, each
        once per session (:mod:`paimon_group.protocol.sinks`, for describe)."""
        fresh = [r for r in self._core.sinks.records() if r.name not in self._published_sinks]
        if fresh:
            await publish_sinks(group, fresh)
            self._published_sinks.update(r.name for r in fresh)

    def _owners_only(self, fired: set[str]) -> bool:
        """Whether this wake-up calls for pending acquisitions only."""
        # Owner changes can fire without pause in a large group; a full round
        # still runs at least once per tick, so nothing waits on a missed
        # wake-up for longer than that.
        now = self._core.clock.monotonic()
        recent = now - self._full_round_at < self._core.timing.control_tick_s
        # A change of the member list cannot wake a follower: the members
        # watch is the leader's alone (member/watches.py), so a join or leave
        # costs a group of N members one full round, not N.
        return recent and fired == {"owners"}

    async def _check_member_key(self, group: GroupClient, view: RoundView) -> None:
        """Raise if our member key is gone although our session looked live."""
        if not self._core.stopping and view.member_key is None:
            # Either an operator removed us (members remove records the
            # session it removed), or the session expired server-side before
            # we noticed (a paused coordinator or process): then this is a
            # lost session, and we rejoin like any other. The goodbye marker
            # cannot tell the two apart: the leader deletes it as soon as it
            # has moved our shards, which is usually before we look.
            if await group.removed_session(self._core.member_id) == group.coordinator.session.id:
                with contextlib.suppress(CoordinatorError):
                    await group.forget_removed(self._core.member_id)
                raise MemberRemoved(
                    f"member {self._core.member_id!r} was removed from group "
                    f"{self._core.group_name!r} "
                    "by an operator; its shards were handed to the others"
                )
            raise SessionLost(f"member key of {self._core.member_id!r} is gone: session expired")

    async def _follow_assignment(self, group: GroupClient, view: RoundView) -> None:
        """Take the published assignment; revoke what is not ours, acquire the rest."""
        assignment = view.assignment
        if self._state.leader_epoch is not None:
            # The leader may have published in this round: it follows its own
            # publication at once rather than at the wake-up it causes.
            assignment, _ = await group.read_assignment()
        current = self._state.assignment
        if assignment is not None and (
            current is None or assignment.generation != current.generation
        ):
            if self._state.assignment is not None:
                self._core.stats.rebalances += 1
            self._state.assignment = assignment
            self._core.log.info(
                "generation %d: shards %s",
                assignment.generation,
                assignment.shards_of(self._core.member_id),
                extra={"generation": assignment.generation},
                )
        if self._ownership.check_due():
            await self._ownership.check_ownership(group)
        current = self._state.assignment
        target = set(current.shards_of(self._core.member_id)) if current else set()
        to_revoke = [s for s, o in self._core.owned.items() if s not in target and not o.revoking]
        if to_revoke:
            for s in to_revoke:
                self._core.owned[s].revoke()
            # Revocations run concurrently with reading and acquiring others.
            t = asyncio.create_task(self._ownership.revoke(to_revoke, reason="reassigned"))
            self._core.add_task(t)
        await self._acquire(group, sorted(target - set(self._core.owned)))

    async def _acquire(self, group: GroupClient, shards: list[int]) -> None:
        """Acquire ``shards`` of the assignment followed; a leader whose forming
        burst is held acquires none, and a young group's leader stops once a
        member arrives (:mod:`paimon_group.member.publish_delay`): the next generation
        moves most of what a lone first member was given."""
        assignment = self._state.assignment
        if not shards or assignment is None:
            return
        leading = self._state.leader_epoch is not None
        if leading and self._arrivals.holding:
            return
        interrupt = None
        if leading and self._arrivals.young(self._core.clock.monotonic()):
            async def arrived() -> bool:
                return (self._arrivals.young(self._core.clock.monotonic())
                        and bool(set(await group.members()) - self._arrivals.members))
            interrupt = arrived
        await self._ownership.acquire(shards, assignment.generation, interrupt=interrupt)

    async def _maybe_lead(self, group: GroupClient, view: RoundView) -> None:
        leader = view.leader
        if leader is None:
            epoch = await group.try_lead(self._core.member_id)
            if epoch is not None:
                self._core.log.info("became leader (epoch %d)", epoch)
                self._state.leader_epoch = epoch
        elif leader[0] == self._core.member_id and leader[1] == self._state.leader_epoch:
            pass
        elif leader[0] == self._core.member_id and (
                epoch := await group.own_leader_epoch(self._core.member_id)) is not None:
            # A leader key our session created, though our create raised (its
            # outcome was unknown): we lead, at its create version.
            self._core.log.info("adopted leader key (epoch %d)", epoch)
            self._state.leader_epoch = epoch
        else:
            self._state.leader_epoch = None
        if self._state.leader_epoch is not None:
            await self._lead(group, self._state.leader_epoch)

    def forget_leadership(self) -> None:
        """A new session, or none: the leader key of the one before is not ours
        (and the sinks are published again: the coordinator may be new)."""
        self._state.leader_epoch = None
        self._published_sinks.clear()

    async def resign(self, group: GroupClient) -> None:
        """Delete our leader key, if we lead (a graceful leave)."""
        if self._state.leader_epoch is not None:
            with contextlib.suppress(CoordinatorError):
                await group.resign(self._state.leader_epoch)
            self._state.leader_epoch = None

    async def _lead(self, group: GroupClient, leader_epoch: int) -> None:
        # A group of several tables: tables created or dropped join or leave
        # its map first (member/table_refresh.py), so this round assigns them.
        await self._table_watch.refresh(group, leader_epoch)
        live = set(await group.members())
        previous, version = await group.read_assignment()
        leaving = await group.leaving()
        members = sorted(live | self._reserved_members(live, previous, leaving))
        # Forming: no live member holds shards of the published assignment
        # (or none is published), so nobody reads and nobody's rows wait.
        forming = previous is None or not any(previous.shards.get(m) for m in live)
        wait = self._arrivals.delay(members, now=self._core.clock.monotonic(), forming=forming)
        if wait > 0:
            # A burst of joins or leaves, or a forming group: one publication
            # once its arrivals pause (:mod:`paimon_group.member.publish_delay`).
            asyncio.get_running_loop().call_later(wait, self._core.wake.set)
            return
        for gone in leaving - live:
            # Forget a goodbye once an assignment without that member is out.
            if previous is None or not previous.shards.get(gone):
                await group.forget_leaving(gone)
        if self._settled.holds(version, members, self._core.meta):
            return
        basis, home, away = sticky_basis(previous, members, self._core.num_shards,
                                         now=self._core.clock.wall())
        wanted, loads = await self._assignment_for(group, members, basis, previous)
        if previous is not None and same_assignment(previous.shards, wanted):
            if not loads:
                self._settled.found(version, members, self._core.meta)
            return
        for m, shards in wanted.items():
            if shards:
                home[m] = shards
                away.pop(m, None)
        published = await group.publish(
            wanted,
            leader=self._core.member_id,
            leader_epoch=leader_epoch,
            previous=previous,
            previous_version=version,
            home=home,
            away_since=away,
            loads=loads,
        )
        if published is not None and loads:
            self._loads.published()
        if published is None:
            # Deposed, or another publish raced us: re-read on the next round.
            self._core.wake.set()
        else:
            self._core.log.info(
                "published generation %d for %d members", published.generation,
                len(members), extra={"generation": published.generation})

    async def _assignment_for(
        self, group: GroupClient, members: list[str], basis: dict[str, list[int]],
        previous: Assignment | None,
    ) -> tuple[dict[str, list[int]], dict[int, int]]:
        """The next assignment by the group's assignor, and the shard loads it
        used (``{}`` for the count assignor); see :mod:`paimon_group.member.balance`."""
        meta = self._core.meta
        assignor = assignor_named(meta.assignor if meta is not None else None)
        # A group of several tables deals its live tables' shards in spread
        # order (docs/many-tables.md); a dropped table's are nobody's.
        order = None if meta is None or meta.tables is None else meta.tables.spread_order()
        if not assignor.needs_loads or not members:
            return assign_over(assignor, order if order is not None
                               else range(self._core.num_shards), members, basis), {}
        await self._loads.refresh(functools.partial(self._measure_loads, group))
        return self._loads.assign(assignor, self._core.num_shards, members, basis, previous,
                                  order)

    async def _measure_loads(self, group: GroupClient) -> tuple[MeasuredLoad, set[int]] | None:
        """The shards' rows (from the manifests) and which of them still have
        their full scan ahead (from the positions and the group's start)."""
        table = self._core.table
        tables = self._core.tables
        if tables is not None and not tables.single:
            return await self._measure_tables(group, tables)
        if table is None:
            return None
        sharding = Sharding(self._core.sharding, self._core.num_shards)
        measured: MeasuredLoad | None = await self._core.in_io(functools.partial(
            measure, table, sharding, known=self._loads.measured,
            clock=self._core.clock.monotonic))
        if measured is None:
            return None
        positions = await group.positions()
        start = await read_group_start(group)
        return measured, full_scan_pending(self._core.num_shards, positions, start,
                                           self._core.config.start_position)

    async def _measure_tables(self, group: GroupClient, tables: MemberTables
                              ) -> tuple[MeasuredLoad, set[int]] | None:
        """:meth:`_measure_loads` for a group of several tables: each live
        table measured in its own shard numbers (its last measurement kept
        while it has no new snapshot), placed at its range."""
        parts: list[tuple[int, MeasuredLoad | None]] = []
        for table in tables:
            if table.gone is not None:
                continue
            sharding = Sharding(ShardRule.parse(table.range.sharding), table.range.shards)
            known = self._table_loads.get(table.first)
            measured = await self._core.in_io(functools.partial(
                measure, table.table, sharding, known=known, clock=self._core.clock.monotonic))
            if measured is not None:
                self._table_loads[table.first] = measured
            parts.append((table.first, measured))
        positions = await group.positions()
        now = self._core.clock.monotonic()
        return (merged_loads(parts, self._core.num_shards, now),
                full_scan_pending(self._core.num_shards, positions, None,
                                  self._core.config.start_position))

    def _reserved_members(
        self, live: set[str], previous: Assignment | None, leaving: set[str]
    ) -> set[str]:
        """Static membership (:class:`~paimon_group.protocol.static_membership.VanishedMembers`):
        members that vanished without a goodbye keep their shards for
        ``rebalance_delay_s``; the round is re-run when a delay runs out."""
        reserved, recheck_after = self._vanished.reserved(
            live, previous, leaving, delay=self._core.config.rebalance_delay_s,
            now=self._core.clock.monotonic())
        for after in recheck_after:
            asyncio.get_running_loop().call_later(after, self._core.wake.set)
        return reserved


class SettledAssignment:
    """What the leader's last round found already published, so that an idle
    leader does not deal every shard again at each tick to find the same
    assignment (1,600 shards in a group of 200 tables).

    The count assignor's answer depends only on the published assignment
    (its version), the members dealt to and the group record (its shard count
    and table map); the wall clock only ages the homes of static members that
    are away, which the basis of live members does not use. Loads change
    without any of these: a round that used loads is never taken as settled.
    """

    def __init__(self) -> None:
        self._version: int | None = None
        self._members: list[str] = []
        self._meta: object = None

    def found(self, version: int | None, members: list[str], meta: object) -> None:
        """The round with these inputs found nothing to publish."""
        self._version, self._members, self._meta = version, list(members), meta

    def holds(self, version: int | None, members: list[str], meta: object) -> bool:
        """Whether a round with these inputs would find the same again (the
        record compared by identity: each one read anew is a new object)."""
        return (version is not None and version == self._version
                and meta is self._meta and members == self._members)

