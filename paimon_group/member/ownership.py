"""Owning shards: acquire, revoke (finish, commit and release in one commit), check.

A shard newly assigned to us is acquired as soon as its owner key is absent
(the previous owner released it, or its session expired); its position is
read only after our owner key exists, so every commit of the previous owner
is visible (invariant 2). A shard no longer ours is revoked: the batch in
flight finishes (or is abandoned after ``revoke_timeout_s``), then the final
position and the deletion of the owner key land in one commit. A release
that cannot be made then is retried every control round
(:mod:`paimon_group.protocol.releasing`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from coordinators.errors import CoordinatorError
from paimon_group.member.commits import Commits
from paimon_group.member.core import MemberCore
from paimon_group.member.state import OwnedShard, OwnedShards
from paimon_group.protocol.group import GroupClient
from paimon_group.protocol.group_start import group_start
from paimon_group.protocol.records import GroupStart
from paimon_group.protocol.releasing import PendingReleases, is_ours
from paimon_group.reading.consumer_meta import ConsumerFilesOrigin, resume_allowed
from paimon_group.reading.mirror import MirroredPosition

log = logging.getLogger("paimon_group.member")

T = TypeVar("T")


RECHECK_S = 0.5
"""How long a member acquires shards in turn before it looks whether a newer
generation was published meanwhile (then it stops, and its next round
follows that generation)."""


async def one_by_one(calls: Sequence[Callable[[], Awaitable[T]]], *,
                     stop: Callable[[], Awaitable[bool]] | None = None,
                     ) -> tuple[list[T], BaseException | None]:
    """Run ``calls`` in turn until one raises, or ``stop`` (awaited before
    each call) says so: the results of those run, and the exception (None if
    none raised), so that what was done is told (logged, the listener
    called) before the error ends the round.

    In turn, not concurrently: measured at 200 members x 2,048 shards in two
    processes (docs/benchmarks.md (14)), 16 moves at a time made the start
    of the group slower on etcd (the last ``start()`` returned after 7.7 s,
    2.4 s in turn) and on ZooKeeper (88 s, 14 s in turn), and joins and
    leaves no faster: the bound is the members' event loops, not round trips."""
    done: list[T] = []
    for call in calls:
        try:
            if stop is not None and await stop():
                break
            done.append(await call())
        except Exception as err:
            return done, err
    return done, None


class ShardOwnership:
    """Acquiring, revoking and checking the shards we own.

    Its interface: :meth:`pending_acquisitions`, :meth:`acquire`,
    :meth:`revoke`, :meth:`check_ownership` (when :meth:`check_due`, told
    of the group's ``forced`` key by :meth:`observe_forced`); :attr:`releases`
    (owner keys still to delete), :attr:`sweep_due` (:meth:`sweep_at_next_check`).
    """

    def __init__(self, core: MemberCore, commits: Commits, owned: OwnedShards) -> None:
        self._core = core
        self._commits = commits
        # The shards held: ours to add and remove (the others read them
        # through the core's read-only view, MemberCore.owned).
        self._owned = owned
        self.releases = PendingReleases()  # owner keys still to delete (revoke failed)
        # The ownership check reads our own owner keys. Only an operator
        # deletes an owner key of a live member without its member key (which
        # every round reads), and each such commit also writes the group's
        # ``forced`` key (protocol/admin.py), which every round reads too: the
        # check runs when that key moved, when a sweep is due, and otherwise
        # once per ``check_s`` (several sessions), for a deletion made some
        # other way. Our commits are fenced whatever the check last saw.
        self.check_s = core.timing.ownership_check_s
        self.checked_at = -1e18
        self._forced_seen: tuple[int, int, bytes] | None = None
        self._forced_moved = True  # the first round's is new to us
        # Listing every owner key is O(shards) (most of an idle member's CPU
        # in a group of thousands of shards, were it run on every check): the sweep
        # that needs it runs only when an orphan can have been left, namely
        # once per session (keys of our member id from an older session) and
        # after a control round that failed (an acquisition or release whose
        # outcome is unknown).
        self.sweep_due = True
        # The acquisitions under way (at most one control round's), and
        # whether the leave ended them (:meth:`stop_acquiring`).
        self._acquiring = 0
        self._no_acquisition = asyncio.Event()
        self._no_acquisition.set()
        self._closed = False

    def pending_acquisitions(self) -> list[int]:
        core = self._core
        target = set(core.assignment.shards_of(core.member_id)) if core.assignment else set()
        return sorted(target - set(self._owned))

    async def acquire(self, shards: list[int], generation: int, *,
                      interrupt: Callable[[], Awaitable[bool]] | None = None) -> None:
        """Acquire ``shards`` in turn (:func:`one_by_one`); a shard still held
        by its previous owner is left for its release to wake us.

        Every :data:`RECHECK_S` of acquiring, the assignment is read again and
        the acquisitions stop if a newer generation is out: the next round
        follows it at once. Without this, the first member of a starting
        group, given every shard, went on acquiring shards the arrivals
        since had taken (thousands of round trips), and then released them.
        ``interrupt`` is asked as often: true, the acquisitions stop too.
        """
        if self._closed or self._core.stopping:
            return
        self._acquiring += 1
        self._no_acquisition.clear()
        try:
            await self._acquire_in_turn(shards, generation, interrupt)
        finally:
            self._acquiring -= 1
            if not self._acquiring:
                self._no_acquisition.set()

    async def stop_acquiring(self) -> None:
        """No acquisition starts from now on, and the one under way (an owner
        key being created, a position being read) ends first: what it
        acquired is then among the owned shards, which a leave releases.
        Without this a leave would release the shards held when it began, and
        a shard acquired by a round still running would be neither released
        nor reported until the session closed."""
        self._closed = True
        await self._no_acquisition.wait()

    async def _acquire_in_turn(self, shards: list[int], generation: int,
                               interrupt: Callable[[], Awaitable[bool]] | None) -> None:
        """:meth:`acquire`, under way."""
        last_look = self._core.clock.monotonic()

        async def superseded() -> bool:
            nonlocal last_look
            if self._closed or self._core.stopping:
                return True  # the member leaves: what was acquired is told below
            if self._core.clock.monotonic() - last_look < RECHECK_S:
                return False
            if interrupt is not None and await interrupt():
                self._core.wake.set()
                return True
            group = self._core.group
            assert group is not None
            assignment, _ = await group.read_assignment()
            last_look = self._core.clock.monotonic()
            if assignment is None or assignment.generation == generation:
                return False
            self._core.wake.set()  # the next round follows it at once
            return True

        outcomes, error = await one_by_one(
            [functools.partial(self._acquire_one, shard, generation) for shard in shards],
            stop=superseded)
        acquired = [s for s in outcomes if s is not None]
        if acquired:
            self._core.log.info(
                "acquired shards %s", acquired,
                extra={"generation": generation})
            self._core.notify("on_assigned", acquired)
            self._core.wake.set()
        if error is not None:
            raise error  # the round failed: retried (the shards acquired stay ours)

    async def _acquire_one(self, shard: int, generation: int) -> int | None:
        """The shard if we acquired it; None if its previous owner still holds
        it (its release wakes us) or our session may be about to expire."""
        group, tables = self._core.group, self._core.tables
        assert group is not None and tables is not None
        table = tables.get(shard)
        if table is None or table.gone is not None:
            # Of a table this member has not opened yet (the map grew since
            # it read it: it opens the table first), or one found gone.
            return None
        coord = self._core.coordinator
        if not coord or not coord.session.is_live(self._core.timing.margin_s,
                                                  now=self._core.clock.monotonic()):
            return None
        sent = self._core.clock.monotonic()  # the history's lower bound of when the create went out
        epoch = await group.acquire(shard, self._core.member_id, generation)
        if epoch is None:
            return None  # the previous owner has not released yet: its release wakes us
        self.releases.discard(shard)  # a key of ours still pending release: ours again
        owned = OwnedShard(shard=shard, epoch=epoch, generation=generation)
        # Read the position only after the owner key exists: every commit of
        # the previous owner is then visible (or was rejected).
        position, _ = await group.position(shard)
        if position is not None:
            # A position an operator wrote (reset) is taken as of the current start.
            owned.take_stored(position, self._core.start_moves_of(table.index))
        else:
            resumed = await self._core.in_io(functools.partial(self._resume_from_file, shard))
            mirrored = None if resumed is None else resumed[0]
            if mirrored is not None and mirrored.full_scan_pending:
                # A pinned start whose full scan was still due: resume
                # with that full scan, then the snapshots after it.
                owned.next_snapshot = mirrored.next_snapshot + 1
                owned.full_scan = mirrored.next_snapshot
            elif mirrored is not None:
                owned.next_snapshot = mirrored.next_snapshot
            if resumed is not None:
                owned.start_moves = resumed[1]
                await self._carry_moved_start(group, resumed[2], table.index)
        self._owned[shard] = owned
        self._core.history.record("acquire", shard=shard, epoch=epoch, generation=generation,
                            next_snapshot=owned.next_snapshot, sent=sent)
        return shard

    async def _carry_moved_start(self, group: GroupClient, carried: GroupStart | None,
                                 index: int | None) -> None:
        """A group re-created over its consumer files whose start had moved
        (``carried``, beside the files): store it, unless a start is stored
        already, and learn it. A shard resumed from a file of the start
        before is re-pinned at it by the read loop's settle, as its peers
        are; without it no member of the new coordinator learns of a move
        made just before the switch unless one of its shards needs a start."""
        if carried is None or carried.moves == 0:
            return

        async def resolve() -> GroupStart:
            return carried

        self._core.observe_start(await group_start(group, resolve, index), index)

    def _resume_from_file(self, shard: int
                          ) -> tuple[MirroredPosition, int, GroupStart | None] | None:
        """The shard's consumer file (with its pending full scan, if marked), if
        the group may resume from it (:func:`paimon_group.reading.consumer_meta.resume_allowed`:
        written under this group's shard count and rule, by this incarnation
        or one it vetted), with the moves of the group start it derives from
        (:func:`file_start_moves`) and that start; else None, and the shard
        starts as configured."""
        core = self._core
        assert core.mirror is not None
        table = core.table_of(shard)
        mirrored = core.mirror.read_position(shard)
        if mirrored is None:
            return None
        origin = ConsumerFilesOrigin.read(table.table.table.file_io, table.table.table_path,
                                          core.group_name)
        if resume_allowed(table.meta, origin):
            carried = None if origin is None else origin.start
            return mirrored, file_start_moves(mirrored, carried), carried
        core.log.warning(
            "shard %d: consumer file (next snapshot %d) not resumed from: it was not "
            "written under this group's %d shards by this group; starting as "
            "configured (%s)", shard, mirrored.next_snapshot, table.range.shards,
            self._core.config.start,
            extra={"shard": shard})
        return None

    def _to_acquire(self) -> set[int]:
        """The shards assigned to this member that an acquisition may take:
        not those of a table found gone (nothing of it is acquired)."""
        core = self._core
        assigned = set(core.assignment.shards_of(core.member_id)) if core.assignment else set()
        tables = core.tables
        if tables is None or tables.single:
            return assigned
        return {s for s in assigned if tables.gone(s) is None}

    def observe_forced(self, forced: tuple[int, int, bytes] | None) -> None:
        """The group's ``forced`` key as a round read it (RoundView.forced)."""
        if forced != self._forced_seen:
            self._forced_seen = forced
            self._forced_moved = True

    def check_due(self) -> bool:
        """Whether :meth:`check_ownership` should run now (see ``check_s``)."""
        return (self.sweep_due or self._forced_moved
                or self._core.clock.monotonic() - self.checked_at > self.check_s)

    def sweep_at_next_check(self) -> None:
        """The next ownership check lists every owner key and sweeps (an
        acquisition or release may have landed unseen)."""
        self.sweep_due = True

    def lose_all(self) -> tuple[list[int], list[int]]:
        """The session was lost: every shard held ends here (dropped, not
        released), and so do the releases still pending (the lost session's
        keys are gone with it). The shards that were held and their epochs."""
        lost = sorted(s for s, o in self._owned.items() if not o.dropped)
        epochs = [self._owned[shard].epoch for shard in lost]
        for o in self._owned.values():
            o.drop()
        self._owned.clear()
        self.releases.clear()  # the lost session's keys are gone with it
        self.sweep_due = True  # but keys of our member id may outlive it: sweep once
        return lost, epochs

    async def release_all(self) -> None:
        """The member leaves: revoke every shard held, each handed off with
        its last position (:meth:`revoke`)."""
        for o in list(self._owned.values()):
            o.revoke()
        await self.revoke(list(self._owned), reason="leaving")

    async def revoke(self, shards: list[int], *, reason: str) -> None:
        """Finish (or abandon) in-flight batches, then commit+release in one commit."""
        owned = [self._owned[s] for s in shards if s in self._owned]
        for lane in list(self._commits.lanes):
            lane.kick()  # a finished batch of a revoked shard commits now
        results = await asyncio.gather(*(self._wait_idle(o, leaving=reason == "leaving")
                                         for o in owned))
        group = self._core.group
        releasing = [(o, finished) for o, finished in zip(owned, results, strict=True)
                     if not o.dropped]
        for o, finished in releasing:
            if not finished:
                log.warning("shard %d: batch in flight abandoned after %.1fs", o.shard,
                            self._core.config.revoke_timeout_s)
        outcomes, error = await self._release_all(group, releasing, reason=reason)
        released = [s for s, ok in outcomes if ok]
        lost = [s for s, ok in outcomes if not ok]
        if released:
            # A graceful leave releases; a rebalance revokes. Both hand the
            # shards off cleanly (last position committed, owner key deleted).
            how = "released" if reason == "leaving" else "revoked"
            self._core.stats.shards_moved[how] += len(released)
            self._core.log.info("%s shards %s (%s)", how, released, reason)
            self._core.notify("on_revoked", released)
        if lost:
            self._core.log.warning(
                "lost shards %s: their release was not confirmed (%s); the next "
                "owner resumes from the last committed position", lost, reason)
            self._core.notify("on_lost", lost)
        self._core.wake.set()
        if error is not None:
            raise error

    async def _wait_idle(self, o: OwnedShard, *, leaving: bool) -> bool:
        """Wait until the batch in flight of ``o`` ends: True, or False when
        it is abandoned (after ``revoke_timeout_s``; or, for a shard a host
        holds, after its ``hold_limit_s``, with a WARNING at every
        ``revoke_timeout_s`` meanwhile; a leave never waits longer than
        ``revoke_timeout_s``)."""
        step = self._core.config.revoke_timeout_s
        limit = step if leaving or o.hold_limit_s is None else o.hold_limit_s
        waited = 0.0
        while True:
            wait = min(step, limit - waited)
            try:
                await asyncio.wait_for(o.idle.wait(), timeout=wait)
                return True
            except TimeoutError:
                waited += wait
            if waited >= limit or o.dropped:
                return False
            self._core.log.warning(
                "shard %d: its revocation waits for the batch its host planned "
                "(%.0fs so far; a Spark query completes it at its next trigger)",
                o.shard, waited, extra={"shard": o.shard})

    async def _release_all(self, group: GroupClient | None,
                           releasing: list[tuple[OwnedShard, bool]], *, reason: str
                           ) -> tuple[list[tuple[int, bool]], BaseException | None]:
        """Release ``releasing`` (each shard with whether its batch finished):
        ``commits.shards_per_commit`` shards per commit, and a commit that is
        refused or raises is done again shard by shard (:meth:`_release`),
        which tells which shards were not ours and leaves a release of
        unknown outcome to be retried. A shard whose
        last commit had an unknown outcome is released alone (its position is
        read back first). ``(shard, released)`` for each shard tried, and the
        error that ended the releases, if any.

        Why in one commit: a member that held many shards (the first members
        of a starting group hold them all) released them one commit each, a
        round trip apiece through an event loop shared with the other work
        (docs/benchmarks.md (14), the start of 200 members)."""
        by_shard = {o.shard: (o, finished) for o, finished in releasing}
        alone = [o.shard for o, _ in releasing if o.uncertain]
        together = self._commits.chunks(s for s in by_shard if s not in set(alone))
        done: list[tuple[int, bool]] = []
        for chunk in [*together, *([s] for s in alone)]:
            pairs = [by_shard[s] for s in chunk]
            if len(chunk) > 1 and await self._release_chunk(group, pairs, reason=reason):
                done += [(s, True) for s in chunk]
                continue
            outcomes, error = await one_by_one([
                functools.partial(self._release, group, o, finished=finished, reason=reason)
                for o, finished in pairs])
            done += list(zip(chunk, outcomes, strict=False))
            if error is not None:
                return done, error
        return done, None

    async def _release_chunk(self, group: GroupClient | None,
                             pairs: list[tuple[OwnedShard, bool]], *, reason: str) -> bool:
        """One commit releasing every shard of ``pairs``, each with its last
        position where :meth:`_release` would commit it; True if it was
        accepted (then the shards are no longer ours), False if it was
        refused, raised or could not be sent (nothing is changed here: the
        caller releases them one by one)."""
        coord = self._core.coordinator
        margin_s = self._core.timing.margin_s
        if group is None or coord is None or not coord.session.is_live(
                margin_s, now=self._core.clock.monotonic()):
            return False
        try:
            if not await self._commits.release_many(group, pairs):
                return False
        except CoordinatorError as err:
            # It may have landed: the shard-by-shard releases then find the
            # keys gone (not ours: reported lost, which is safe) or deleted.
            self._core.log.warning(
                "shards %s: release in one commit failed (%s); one by one",
                sorted(o.shard for o, _ in pairs), err)
            return False
        mirrored: list[tuple[int, int, bool, int]] = []
        for o, _ in pairs:
            o.drop()
            self._owned.pop(o.shard, None)
            self._core.history.record("release", shard=o.shard, epoch=o.epoch, ok=True,
                                      reason=reason, next_snapshot=o.committed,
                                      start_moves=o.start_moves)
            if o.committed is not None:
                n = o.full_scan if o.full_scan is not None else o.committed
                mirrored.append((o.shard, n, o.full_scan is not None, o.start_moves))
        if mirrored and self._core.mirror is not None:
            await self._core.in_io(functools.partial(self._mirror_all, mirrored))
        return True

    def _mirror_all(self, mirrored: list[tuple[int, int, bool, int]]) -> None:
        for shard, n, full_scan_pending, start_moves in mirrored:
            self._commits.mirror_write(shard, n, True, full_scan_pending, start_moves)

    async def _release(self, group: GroupClient | None, o: OwnedShard, *, finished: bool,
                       reason: str) -> bool:
        """Commit the last position (when it is certain and the batch finished)
        and delete the owner key, in one commit; True if that was done."""
        ok = False
        # Whether the owner key may still be ours: until a release
        # commit returns (True: deleted; False: not ours any more).
        undecided = True
        coord = self._core.coordinator
        if group is not None and coord is not None and coord.session.is_live(
            self._core.timing.margin_s, now=self._core.clock.monotonic()
        ):
            try:
                # Never with a value older than what may have landed (read
                # back first; unreadable now: without a position).
                ok = await self._commits.release(group, o, finished=finished)
                undecided = False
            except CoordinatorError as err:
                log.warning("shard %d: release failed: %s", o.shard, err)
        o.drop()
        self._owned.pop(o.shard, None)
        if undecided:
            # Left bound to our live session, the key would hold the
            # shard from its new assignee for ever: retried every round.
            self._core.log.warning(
                "shard %d: owner key (epoch %d) not released yet; retrying every "
                "control round until it is gone", o.shard, o.epoch,
                extra={"shard": o.shard, "epoch": o.epoch})
            self.releases.add(o.shard, o.epoch)
        self._core.history.record("release", shard=o.shard, epoch=o.epoch, ok=ok, reason=reason,
                            next_snapshot=o.committed, start_moves=o.start_moves)
        if ok and o.committed is not None and self._core.mirror is not None:
            n = o.full_scan if o.full_scan is not None else o.committed
            await self._core.in_io(functools.partial(self._commits.mirror_write, o.shard, n, True,
                                                     o.full_scan is not None, o.start_moves))
        return ok

    async def check_ownership(self, group: GroupClient) -> None:
        """Drop shards whose owner key is no longer ours (deleted by an operator:
        ``members remove``, ``reset --force``). Our commits would be rejected
        anyway; this makes the member notice at once instead of at its next
        commit, which on an idle table can be much later.

        Reads only the owner keys of the shards held (O(own shards)); when a
        sweep is due (see ``sweep_due``) it lists every owner key instead and
        also releases those that are ours but not owned
        (:mod:`paimon_group.protocol.releasing`)."""
        checked_at = self._core.clock.monotonic()
        held = [o for o in self._owned.values() if o.active]
        if self.sweep_due:
            owners = await group.owners()
            assigned = self._to_acquire()
            await self.releases.sweep(
                group, self._core.member_id,
                owned={s: o.epoch for s, o in self._owned.items()},
                assigned=assigned, owners=owners)
            # A key of ours left for the next acquisition to adopt (one whose
            # create landed unseen) is swept again at the next check unless
            # adopted by then: the shard may leave the assignment, or its
            # table be found gone, before any acquisition adopts it, and no
            # other sweep would come to release it.
            session = group.coordinator.session.id
            self.sweep_due = any(
                v.shard in assigned and v.shard not in self._owned
                and is_ours(v, session, self._core.member_id) for v in owners.values())
        else:
            owners = await group.owners_of(o.shard for o in held)
        # Read after the round that saw the forced key move: every deletion it
        # tells of is in what was read (a check that raised runs again).
        self.checked_at, self._forced_moved = checked_at, False
        lost: list[int] = []
        epochs: list[int] = []
        for o in held:
            view = owners.get(o.shard)
            if view is None or view.epoch != o.epoch:
                o.drop()
                self._owned.forget(o)
                lost.append(o.shard)
                epochs.append(o.epoch)
        if lost:
            self._core.log.warning(
                "shards %s: owner key gone or re-created by another member", lost)
            self._core.history.record("lost", shards=lost, epochs=epochs, reason="owner key gone")
            self._core.notify("on_lost", lost)



def file_start_moves(mirrored: MirroredPosition, start: GroupStart | None) -> int:
    """The moves of the group start a consumer file's position derives from:
    recorded in the file (:data:`paimon_group.reading.mirror.START_MOVES_FIELD`),
    or, in a file without them (an operator's reset, an earlier version),
    judged against the start carried beside the files (``start``: its full
    scan ``L`` after ``m`` moves): a pending full scan of ``L``, or a position
    past ``L``, is of that start; any other is of the one before, so the shard
    scans ``L`` as its peers do. (Judged, a position of the start before that
    reached past ``L`` cannot be told apart: docs/operations.md, "Time to data
    loss".)"""
    if mirrored.start_moves is not None:
        return mirrored.start_moves
    if start is None or start.full_scan is None or start.moves == 0:
        return 0 if start is None else start.moves
    of_it = (mirrored.next_snapshot == start.full_scan if mirrored.full_scan_pending
             else mirrored.next_snapshot > start.full_scan)
    return start.moves if of_it else start.moves - 1
