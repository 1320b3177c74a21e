"""What a member takes of a sink's word that it already holds a batch.

A sink that finds a batch in its target raises
:class:`~paimon_group.errors.AlreadyWritten` naming the source position it
holds the shard up to; the read loop then commits that position instead of
the batch's own. This checks the word first: the position must be ahead of
the shard's (or the shard's pending full scan is the batch), and never past
the table's latest snapshot (a target's marks of another table, say one
dropped and re-created under the same name, would skip every row of the new
table below them). Refused in one line, an ``AlreadyWritten`` that stops the
member; nothing is committed and nothing skipped.
"""

from __future__ import annotations

import functools

from paimon_group.errors import AlreadyWritten
from paimon_group.member.core import MemberCore
from paimon_group.member.state import OwnedShard
from paimon_group.reading.batch import ShardBatch


async def check_held(core: MemberCore, o: OwnedShard, batch: ShardBatch,
                     written: AlreadyWritten) -> None:
    """Raise unless shard ``o`` may commit ``written.next_snapshot`` for ``batch``."""
    if written.shard != batch.shard or (written.next_snapshot <= (o.next_snapshot or 0)
                                    and o.full_scan is None):
        raise AlreadyWritten(f"shard {o.shard}: a sink says {written} of the batch at "
                             f"snapshot {batch.snapshot_id}, which is not ahead of the "
                             "shard's position", shard=o.shard,
                             next_snapshot=written.next_snapshot) from written
    if written.next_snapshot <= batch.next_snapshot:
        return  # within the batch: not past the latest snapshot
    table = core.table_of(o.shard).table
    latest = await core.in_io(functools.partial(table.latest_snapshot_id, fresh=True))
    if latest is None or written.next_snapshot > latest + 1:
        raise AlreadyWritten(
            f"shard {o.shard}: a sink says it holds the batch at snapshot {batch.snapshot_id} "
            f"up to snapshot {written.next_snapshot - 1}, past the table's latest snapshot "
            f"{latest}: its marks are not of this table (re-created under the same name?); "
            "nothing is skipped: clear the group's marks in the target (docs/paimon-sink.md)",
            shard=o.shard, next_snapshot=written.next_snapshot) from written
