"""A group start whose full scan expired, moved forward once for every shard.

Under the file rule (bucket-unaware append tables) a row's shard is the hash
of its file, and a compaction moves rows into other files, hence other
shards; follow-up steps skip compactions. So every shard of the group reads
from one full scan (the group's start): a shard that scanned
``F`` and then read follow-ups never sees the rows a compaction after ``F``
moved into its files from another shard's, and a shard that scans a later
``L`` instead finds them no longer in its own files.

When the full scan of the start ``F`` expired before a shard delivered it
(``--on-data-loss skip``), re-pinning that one shard at a later snapshot
would straddle such a compaction. Instead:

* the member that finds it moves ``groups/<g>/start`` forward once, to a
  full scan of the latest snapshot ``L`` (one compare-and-set of the start's
  version, :func:`~paimon_group.protocol.group_start.move_group_start`: of
  two members that find it at once one moves it, and both use that move);
  the record counts its ``moves`` and says where it moved from;
* every shard's position carries the ``moves`` of the start it derives from
  (:attr:`~paimon_group.protocol.records.Position.start_moves`); a shard of
  an earlier start is re-pinned at a full scan of ``L`` before anything more
  of it is read (:func:`repin_stale`, from the read loop's settle), also a
  shard that scanned ``F`` already: its rows are delivered again (at least
  once), none is lost. Members learn of the move from their control rounds
  (:func:`~paimon_group.member.round_view.read_round` reads the start under
  the file rule) and when they acquire a shard (its position's moves);
* positions advance in the order (start moves, next snapshot, scan done):
  a re-pin at ``L`` is past everything read from ``F``, even where that
  shard had read follow-ups past ``L`` before it learned of the move.

Bucket tables are left as they were: rows never change buckets, so one
shard re-pinned at the earliest retained snapshot is consistent with the
others (the read loop's per-shard skip).
"""

from __future__ import annotations

import functools
import logging

from coordinators.errors import SessionLost
from paimon_group.member.commits import Commits
from paimon_group.member.core import MemberCore
from paimon_group.member.data_loss import LostRange
from paimon_group.member.state import OwnedShard
from paimon_group.member.tables import MemberTable
from paimon_group.protocol.group_start import move_group_start
from paimon_group.protocol.records import GroupStart
from paimon_group.protocol.sharding import ShardRule
from paimon_group.reading.consumer_meta import record_start

log = logging.getLogger("paimon_group.member")


def moves_group_wide(table: MemberTable) -> bool:
    """Whether a skipped full scan of ``table`` moves its start, for every
    shard of it (the file rule)."""
    return ShardRule.parse(table.range.sharding) is ShardRule.FILE


async def move_start(core: MemberCore, member_table: MemberTable, lost: LostRange,
                     lineage: int) -> GroupStart:
    """The pinned full scan ``lost.first`` of ``lost.shards`` expired: move the group's
    start to a full scan of the latest snapshot (or take the move a
    concurrent member made) and say so in one WARNING line. The shards held
    here are re-pinned at it by the read loop's next settle
    (:func:`repin_stale`), when no commit of a step is in flight: a rider of
    a step's commit lane re-pinned now would then be committed at the step's
    end (a full scan that expired while its batch was held).
    ``lineage``: the moves of the start the lost full scan derives from.
    Returns the start as moved. ``member_table``: the table of ``lost``
    (a group of several tables moves that table's start)."""
    group, table, index = core.group, member_table.table, member_table.index
    if group is None:
        raise SessionLost("no session")
    latest = max(lost.earliest, await core.in_io(functools.partial(
        table.latest_snapshot_id, fresh=True)) or 0)
    known = core.start_of(index)
    proposed = GroupStart(next_snapshot=latest + 1, full_scan=latest,
                          start=known.start if known is not None else str(core.config.start),
                          resolved_at=core.clock.wall(), resolved_by=core.member_id,
                          moves=lineage + 1, moved_from=lost.first)
    moved = await move_group_start(group, lineage, proposed, index)
    core.observe_start(moved, index)
    extra = {"group": core.group_name, "member": core.member_id}
    how = ("moves to" if moved == proposed
           else f"moved already (by member {moved.resolved_by}) to")
    log.warning("%s: %s: the group's start %s a full scan of snapshot %s for every shard "
                "(--on-data-loss skip; a bucket-unaware table's shards all read from one full "
                "scan, so those that read the earlier one read their rows again)",
                lost.shards_text(), lost.what(member_table.name), how, moved.full_scan,
                extra=extra)
    core.history.record("skip", shards=list(lost.shards), first=lost.first,
                        earliest=lost.earliest, full_scan=True, moved_to=moved.full_scan,
                        start_moves=moved.moves, moved=moved == proposed)
    await record_moved_start(core, member_table, moved)
    return moved


async def record_moved_start(core: MemberCore, member_table: MemberTable,
                             start: GroupStart) -> None:
    """Copy a moved start beside the consumer files (the origin), as the
    first one was: a group re-created over them carries it."""
    table, meta = member_table.table, member_table.meta
    try:
        await core.in_io(functools.partial(record_start, table.table.file_io, table.table_path,
                                            core.group_name, meta, start))
    except Exception as err:  # as a consumer file that cannot be written
        log.warning("moved group start not recorded beside the consumer files: %s", err)


async def repin_stale(core: MemberCore, commits: Commits, held: list[OwnedShard]) -> None:
    """Re-pin, at a full scan of its table's start, each held shard whose
    position derives from an earlier start (and no batch of which is in
    flight); one fenced commit a table."""
    tables = core.tables
    if tables is None or not tables.any_file_rule:
        return  # only a bucket-unaware table's start moves
    by_table: dict[MemberTable, list[OwnedShard]] = {}
    for o in held:
        by_table.setdefault(tables.of(o.shard), []).append(o)
    for table, owned in by_table.items():
        await _repin_table(core, commits, table, owned)


async def _repin_table(core: MemberCore, commits: Commits, table: MemberTable,
                       held: list[OwnedShard]) -> None:
    start = core.start_of(table.index)
    if not moves_group_wide(table) or start is None or start.full_scan is None:
        return
    stale = {o.shard: o for o in held
             if o.active and not o.uncertain and o.idle.is_set() and o.next_snapshot is not None
             and core.owned.get(o.shard) is o and o.start_moves < start.moves}
    if not stale:
        return
    core.log.info(
        "shards %s: re-pinned at the group's moved start, a full scan of snapshot %d "
        "(moved from %s)", sorted(stale), start.full_scan, start.moved_from)
    # ``read_to``: where each shard had read to. It reads the moved start's
    # full scan and the deltas after it again, up to there (docs/reliability.md).
    core.history.record("repin", shards=sorted(stale), full_scan=start.full_scan,
                        start_moves=start.moves,
                        read_to={str(s): o.next_snapshot for s, o in sorted(stale.items())})
    await commits.commit(stale, start.next_snapshot, full_scan=start.full_scan,
                         start_moves=start.moves)
    if core.mirror is not None:
        # Forced: the pending full scan must protect its snapshot now (an
        # unforced write may be throttled after the shard's last one).
        for shard, o in stale.items():
            if o.full_scan == start.full_scan and o.start_moves == start.moves:
                await core.in_io(functools.partial(commits.mirror_write, shard,
                                                    start.full_scan, True, True, start.moves))
