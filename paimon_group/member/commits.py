"""Fenced commits of positions, coalesced per step (the commit lane).

:class:`Commits` is the one way a member writes a position: a commit
(:meth:`Commits.commit`) or a release with the last position
(:meth:`Commits.release`, :meth:`Commits.release_many`), each one atomic
coordinator commit guarded by each shard's epoch (invariant 1); a rejected
shard is dropped, an accepted one advances and is mirrored into its
consumer file (never ahead of the coordinator: invariant 5). A position
never moves backwards (invariant 2): each shard's
:class:`~paimon_group.member.state.OwnedShard` tells whether a write would
lower it, and a lower one is not written. A commit that raised has an
unknown outcome: the shard is ``uncertain`` and :meth:`Commits.read_back`
takes the stored position before it is used again. :class:`CommitLane`
coalesces the commits of one step's shards.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from coordinators.errors import CoordinatorError, SessionLost
from paimon_group.member.core import MemberCore
from paimon_group.member.state import Order, OwnedShard, OwnedShards, ShardState, Stop
from paimon_group.protocol.commit_size import SHARDS_PER_COMMIT, commit_chunks
from paimon_group.protocol.group import GroupClient
from paimon_group.protocol.records import position_order

log = logging.getLogger("paimon_group.member")

COMMIT_LINGER_S = 0.5
"""How long a finished shard's commit may wait for the other shards of its step."""


class CommitLane:
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

        lane = CommitLane(member.commits.commit, step.next_snapshot, riders=empty, expected=3)
        await lane.commit(owned_shard)   # after its handler returned
        lane.skipped()                   # a delivery that ended without a commit
        await lane.flush()               # whatever is left, riders included
    """

    def __init__(
        self,
        commit: Callable[[dict[int, OwnedShard], int], Awaitable[None]],
        next_snapshot: int,
        *,
        riders: dict[int, OwnedShard],
        expected: int,
        linger_s: float = COMMIT_LINGER_S,
    ) -> None:
        self._commit = commit
        self._next = next_snapshot
        self._riders = dict(riders)
        self._queued: dict[int, tuple[OwnedShard, asyncio.Future[None]]] = {}
        self._outstanding = expected  # deliveries neither queued nor skipped yet
        self._linger_s = linger_s
        self._timer: asyncio.TimerHandle | None = None
        self._lock = asyncio.Lock()
        self._flushes: set[asyncio.Task[None]] = set()

    async def commit(self, o: OwnedShard) -> None:
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
            riders = {s: o for s, o in self._riders.items() if o.active}
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


class Commits:
    """The member's one writer of positions: its fenced commits, its releases
    with a last position, and the read-back (see the module docstring).

    Its interface: :meth:`commit`, :meth:`read_back`, :meth:`release`,
    :meth:`release_many`, :meth:`mirror_write`, and :attr:`lanes`, the commit
    lanes of the steps being delivered (a revoke kicks them so a finished
    batch of a revoked shard commits now).

    Each shard's positions live in its :class:`OwnedShard`, which says
    whether a write would move the stored position backwards (invariant 2);
    every write and read-back here runs under one lock, so that deciding and
    sending never interleave with another write of this member: a release
    decided while a step's commit was in flight would otherwise write its
    older position over the one that landed (a step commits 9, then the
    release writes its 6).
    """

    def __init__(self, core: MemberCore, owned: OwnedShards) -> None:
        self._core = core
        self._owned = owned  # the ownership part's: only forget() a rejected shard here
        self.lanes: set[CommitLane] = set()  # commit lanes of steps being delivered
        self._lock = asyncio.Lock()  # one position write (or read-back) at a time
        # The most shards one coordinator commit of this member carries
        # (positions and releases alike); fewer than the default only to
        # exercise the split commits (the simulation draws it).
        self.shards_per_commit = SHARDS_PER_COMMIT

    def chunks(self, shards: Iterable[int]) -> list[list[int]]:
        """``shards`` cut into this member's commits (ascending)."""
        return commit_chunks(shards, self.shards_per_commit)

    async def commit(
        self, owned: dict[int, OwnedShard], next_snapshot: int, *, full_scan: int | None = None,
        start_moves: int | None = None,
    ) -> None:
        """Fenced commit of ``next_snapshot`` for ``owned`` (one atomic commit).

        With ``full_scan`` the position is a pinned start whose full scan of
        that snapshot is still to be delivered; ``start_moves``: the moves of
        the group start it derives from (a pin; else each shard's own). A
        shard's position lower than its owner's (:meth:`OwnedShard.lowers`)
        is not written: its epoch is still checked, and it is not a
        rejection (a rejection means "stale epoch", and would drop a shard
        still ours).
        """
        if not owned:
            return
        chunks, pin = self.chunks(owned), {"full_scan": full_scan, "start_moves": start_moves}
        if len(chunks) > 1:
            # More than one transaction may carry (etcd): several commits, in
            # turn, each fenced shard by shard. One that raises ends the
            # step's commit; the shards of the commits not sent keep their
            # last position and go with the next step.
            for chunk in chunks:
                await self.commit({s: owned[s] for s in chunk}, next_snapshot, **pin)
            return
        try:
            await self._core.wait_live(for_commit=True)
        except Stop:
            # Refused locally, never sent: the member is leaving and its
            # session is closed (a batch that finished after the graceful
            # leave stopped waiting for it). The next owner reads it again.
            self._record_commits(owned, next_snapshot, outcome="refused")
            raise
        moves = {s: o.start_moves if start_moves is None else start_moves for s, o in owned.items()}
        async with self._lock:
            ok, mirror_due = await self._commit_locked(owned, next_snapshot, full_scan, moves)
        if not ok and len(owned) > 1:
            # Find which shards are no longer ours; commit the others.
            for s, o in owned.items():
                await self.commit({s: o}, next_snapshot, **pin)
            return
        if mirror_due:
            # Written after the coordinator accepted them: never ahead of it.
            # (A pending full scan's snapshot is protected, marked as such: a
            # shard resuming from the file must scan it too.)
            mirrored = full_scan if full_scan is not None else next_snapshot
            await self._core.in_io(functools.partial(self._mirror_write_all, mirror_due, mirrored,
                                                full_scan is not None, moves))

    async def _commit_locked(self, owned: dict[int, OwnedShard], next_snapshot: int,
                             full_scan: int | None, moves: dict[int, int]
                             ) -> tuple[bool, list[int]]:
        """:meth:`commit`'s one coordinator commit, under the lock: whether it
        was accepted, and the shards whose consumer file is due a write."""
        group = self._core.group
        if group is None:
            raise SessionLost("no session")
        ended = {s: o for s, o in owned.items() if o.state is ShardState.REVOKED}
        if ended:
            # Its release went out (or was tried) with its last position: a
            # commit sent after it would land, were the release's outcome
            # unknown and the owner key still there, under the epoch this
            # member may hold the shard with again (acquire takes back a key
            # of its own session), behind the back of that new record, which
            # read the position when it acquired the shard. The next owner
            # reads the batch again.
            self._record_commits(ended, next_snapshot, outcome="refused")
            owned = {s: o for s, o in owned.items() if s not in ended}
            if not owned:
                return True, []
        orders = {s: position_order(next_snapshot, full_scan, moves[s]) for s in owned}
        unwritten = [s for s, o in owned.items() if await self._lowers(group, o, orders[s])]
        try:
            ok = await group.commit_positions(
                {s: (o.epoch, next_snapshot) for s, o in owned.items()}, self._core.member_id,
                full_scan={s: full_scan for s in owned} if full_scan is not None else None,
                start_moves=moves, unwritten=unwritten)
        except (CoordinatorError, asyncio.CancelledError) as err:
            # The outcome is unknown to us: each written position may have
            # landed (read back before it is used again); the attempt is
            # recorded so that a redelivery of this batch is explained. A
            # commit cancelled in flight (a leave ending the read loop) may
            # land too: the release that follows must not write the position
            # before it over it (invariant 2).
            for s, o in owned.items():
                if s not in unwritten:
                    o.raised(orders[s])
            self._record_commits(owned, next_snapshot, outcome="error",
                                 error=type(err).__name__)
            raise
        if not ok and len(owned) > 1:
            return False, []
        if ok and unwritten:
            # Still ours (its epoch checked), at a position ahead of this one.
            self._record_commits({s: owned[s] for s in unwritten}, next_snapshot,
                                 outcome="accepted", written=False)
            owned = {s: o for s, o in owned.items() if s not in unwritten}
        mirrored = full_scan if full_scan is not None else next_snapshot
        return ok, self._take_outcome(owned, ok, next_snapshot, full_scan, mirrored, moves)

    async def _lowers(self, group: GroupClient, o: OwnedShard, order: Order) -> bool:
        """Whether writing ``order`` would move ``o``'s stored position
        backwards; below what a commit of ours that raised may have left, the
        stored position is read back first (rare; the common path reads
        nothing)."""
        lowers = o.lowers(order)
        if lowers is None:
            await self._read_back_one(group, o)
            lowers = o.lowers(order)
        return bool(lowers)

    def _record_commits(self, owned: dict[int, OwnedShard], next_snapshot: int, *,
                        outcome: str, **details: Any) -> None:
        for s, o in owned.items():
            if outcome == "refused":
                self._core.stats.refused_commits += 1
            self._core.history.record("commit", shard=s, epoch=o.epoch, next_snapshot=next_snapshot,
                                outcome=outcome, **details)

    def _take_outcome(self, owned: dict[int, OwnedShard], ok: bool, next_snapshot: int,
                      full_scan: int | None, mirrored: int,
                      moves: dict[int, int]) -> list[int]:
        """Apply an accepted or rejected commit locally; the shards whose
        consumer file is due a write."""
        mirror_due: list[int] = []
        for s, o in owned.items():
            self._core.history.record("commit", shard=s, epoch=o.epoch, next_snapshot=next_snapshot,
                                outcome="accepted" if ok else "rejected",
                                start_moves=moves[s])
            if ok:
                self._core.stats.commits += 1
                o.landed(next_snapshot, full_scan, moves[s])
                if self._core.mirror is not None and self._core.mirror.due(
                        s, mirrored, full_scan_pending=full_scan is not None,
                        start_moves=moves[s]):
                    mirror_due.append(s)
            else:
                self._rejected(s, o)
        return mirror_due

    def _rejected(self, s: int, o: OwnedShard) -> None:
        self._core.stats.rejected_commits += 1
        self._core.log.warning(
            "shard %d: commit rejected, epoch %d is stale: another member owns it now",
            s, o.epoch, extra={"shard": s, "epoch": o.epoch})
        o.drop()
        if self._owned.forget(o):
            # Our current ownership of the shard is gone. (A commit of an
            # ownership dropped before, e.g. a batch that was in flight when
            # the session was lost, is rejected after the member may have
            # acquired the shard again under a new epoch: that ownership is
            # unaffected, and the old one's end was recorded when it was
            # dropped.)
            self._core.history.record("lost", shards=[s], epochs=[o.epoch], reason="stale epoch")
            self._core.notify("on_lost", [s])

    async def read_back(self, owned: list[OwnedShard]) -> None:
        """After a commit with an unknown outcome: take the stored positions.

        While we hold a shard's owner key nobody else writes its position (the
        writes are fenced by our epoch), so what is stored is what our own
        commits left: if the ambiguous commit landed, we continue after it
        (nothing is delivered twice) and a release never re-commits the older
        value; if it did not, the stored value is ``committed`` already. A
        commit of ours still in flight on the server (it raised, its outcome
        unknown) lands before anything we send later on the same session
        (ZooKeeper orders a session's requests), so a later landing of it is
        seen by this read; and under the lock no other write of ours is in
        flight while we read.
        """
        group = self._core.group
        if not owned or group is None:
            return
        async with self._lock:
            for o in owned:
                if o.dropped:
                    # Ended while an earlier shard was read back: a lost
                    # session's rejoin drops every shard, then closes the
                    # coordinator ``group`` talks to, and a call on a closed
                    # coordinator fails for good (not retriable): the member
                    # failed. Its position is of no use now: a new
                    # acquisition reads the stored one once its owner key exists.
                    continue
                await self._read_back_one(group, o)

    async def _read_back_one(self, group: GroupClient, o: OwnedShard) -> None:
        position, _ = await group.position(o.shard)
        o.take_stored(position, self._core.start_moves)

    async def release(self, group: GroupClient, o: OwnedShard, *, finished: bool) -> bool:
        """Delete ``o``'s owner key if it is still ours, with its last position
        when that is certain and its batch finished (one commit); True if
        that was done. Its position is ``committed``, never lower than what
        our commits stored, decided under the lock (a commit in flight lands
        first, and raises ``committed``); uncertain, it is read back first,
        and unreadable now, the key is deleted without a position."""
        async with self._lock:
            if o.uncertain:
                with contextlib.suppress(CoordinatorError):
                    await self._read_back_one(group, o)
            if o.committed is not None and o.full_scan is None and finished and not o.uncertain:
                return await group.commit_positions(
                    {o.shard: (o.epoch, o.committed)}, self._core.member_id, release=True,
                    start_moves={o.shard: o.start_moves})
            return await group.release(o.shard, o.epoch)

    async def release_many(self, group: GroupClient, pairs: list[tuple[OwnedShard, bool]]
                           ) -> bool:
        """Release every shard of ``pairs`` (each with whether its batch
        finished) in one commit, each with its last position where
        :meth:`release` would write it (none for an uncertain one); True if
        every owner key was still ours and all were deleted."""
        async with self._lock:
            positions = {o.shard: (o.epoch, o.committed) for o, finished in pairs
                         if o.committed is not None and o.full_scan is None and finished
                         and not o.uncertain}
            bare = {o.shard: o.epoch for o, _ in pairs if o.shard not in positions}
            return await group.release_many(positions, bare, self._core.member_id,
                                            {o.shard: o.start_moves for o, _ in pairs})

    def _mirror_write_all(self, shards: list[int], n: int, full_scan_pending: bool,
                          start_moves: dict[int, int]) -> None:
        assert self._core.mirror is not None
        failed = self._core.mirror.write_many(shards, n, full_scan_pending=full_scan_pending,
                                              start_moves=start_moves)
        for shard, err in failed.items():
            log.warning("shard %d: consumer file not written: %s", shard, err)

    def mirror_write(self, shard: int, n: int, force: bool,
                     full_scan_pending: bool, start_moves: int) -> None:
        assert self._core.mirror is not None
        try:
            self._core.mirror.write(shard, n, force=force, full_scan_pending=full_scan_pending,
                                    start_moves=start_moves)
        except Exception as err:
            log.warning("shard %d: consumer file not written: %s", shard, err)
