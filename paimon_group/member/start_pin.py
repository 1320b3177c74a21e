"""The start of shards without a position: resolved once for the group, pinned.

A shard with no committed position and no consumer file starts where the
group start says (:func:`~paimon_group.protocol.group_start.group_start`:
resolved once, by the first member that needs it, and stored), and that
start is pinned in the coordinator before anything is read from it.
"""

from __future__ import annotations

import functools
import logging

from coordinators.errors import SessionLost
from paimon_group.member.commits import Commits
from paimon_group.member.core import MemberCore
from paimon_group.member.state import OwnedShard
from paimon_group.member.tables import MemberTable
from paimon_group.protocol.group_start import group_start
from paimon_group.protocol.records import GroupStart
from paimon_group.reading.consumer_meta import carried_start, record_start
from paimon_group.reading.start import ResolvedStart

log = logging.getLogger("paimon_group.member")

__all__ = ["pin_start"]


async def pin_start(core: MemberCore, commits: Commits, owned: list[OwnedShard]) -> None:
    """Where shards with no committed position and no consumer file start:
    for each table, resolved once for all of its shards (so shards acquired
    together start from the same snapshot) and pinned in one commit."""
    tables = core.tables
    assert tables is not None
    for table, shards in tables.by_table(o.shard for o in owned).items():
        chosen = set(shards)
        await _pin_table(core, commits, table, [o for o in owned if o.shard in chosen])


async def _pin_table(core: MemberCore, commits: Commits, member_table: MemberTable,
                     owned: list[OwnedShard]) -> None:
        table, group, index = member_table.table, core.group, member_table.index
        if group is None:
            raise SessionLost("no session")

        meta = member_table.meta
        file_io, path, name = table.table.file_io, table.table_path, core.group_name

        async def resolve() -> GroupStart:
            # A group re-created over its consumer files (a wiped or switched
            # coordinator) keeps the start they were read from: a shard that
            # had no file yet starts where its peers did.
            carried: GroupStart | None = await core.in_io(
                functools.partial(carried_start, file_io, path, name, meta))
            if carried is not None:
                return carried
            found = await core.in_io(lambda: table.resolve_start(core.start_position))
            return GroupStart(next_snapshot=found.next_snapshot,
                              full_scan=found.full_scan_snapshot,
                              start=str(core.start_position), resolved_at=core.clock.wall(),
                              resolved_by=core.member_id)

        # One start for the whole table: resolved once, by the
        # first member that needs it, and stored; every shard without a
        # position starts from it, whichever member and round pins it. On a
        # bucket-unaware table two shards pinned at different snapshots with a
        # compaction between them would lose or repeat the rows it moved.
        start = await group_start(group, resolve, index)
        core.observe_start(start, index)
        # Beside the consumer files too, once the coordinator holds it
        # (so it outlives a wipe as they do); before anything is pinned.
        try:
            await core.in_io(functools.partial(record_start, file_io, path, name, meta, start))
        except Exception as err:  # as a consumer file that cannot be written
            log.warning("group start not recorded beside the consumer files: %s", err)
        resolved = ResolvedStart(next_snapshot=start.next_snapshot,
                                 full_scan_snapshot=start.full_scan)
        # Pin the resolved start before reading anything: a later owner then
        # continues from it (instead of resolving "latest" again and skipping
        # what was committed in between), and a pending full scan is replayed
        # on exactly the same snapshot, so a replay is identical. Local state
        # is set by the accepted commit only: a pin that raises leaves the
        # shards unresolved (and uncertain), so the next round reads back
        # what landed, or resolves and pins again; nothing is read from a
        # start that was never pinned.
        await commits.commit({o.shard: o for o in owned}, resolved.next_snapshot,
                           full_scan=resolved.full_scan_snapshot, start_moves=start.moves)
