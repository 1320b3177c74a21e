"""Each shard's load, measured from the table's manifests, for the load assignor.

The manifests say, for free, how many rows every data file holds and which
shard every file belongs to (the group's sharding rule). The leader of a
group started with ``--assignor load`` measures, per shard:

* ``live``: the rows of the table's live files at the latest snapshot (what a
  full scan of the shard reads: the initial backlog), and
* ``recent``: the rows the last :data:`RECENT_SNAPSHOTS` snapshots a
  follow-up step reads (APPEND snapshots, or those with a changelog) added:
  the rate at which the shard receives rows, per that window.

:func:`shard_loads` combines them into the load the assignor balances: the
recent rows of every shard, plus the live rows of each shard whose full scan
is still ahead (no position yet, or a pinned full scan). Once a shard is past
its full scan only its rate counts. :func:`measure` does the I/O (one read
of the latest snapshot's manifests, and of the recent snapshots' delta or
changelog manifests); :func:`shard_loads` is pure.

Example::

    measured = measure(table, sharding)          # in the I/O thread
    loads = shard_loads(measured, full_scan_pending={0, 3})
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any

from paimon_group.protocol.sharding import Sharding
from paimon_group.reading.steps import follow_up_scans, increment_manifests

__all__ = ["RECENT_SNAPSHOTS", "MeasuredLoad", "measure", "shard_loads"]

#: How many of the latest snapshots make the "recent" rate.
RECENT_SNAPSHOTS = 20


@dataclass(frozen=True)
class MeasuredLoad:
    """Rows per shard (index = shard) at ``snapshot_id``, measured at ``measured_at``
    (monotonic clock)."""

    snapshot_id: int
    live: tuple[int, ...]
    recent: tuple[int, ...]
    measured_at: float


def shard_loads(measured: MeasuredLoad, full_scan_pending: Collection[int]) -> dict[int, int]:
    """The load of every shard: its recent rows, plus its live rows if its
    full scan is still ahead.

        >>> m = MeasuredLoad(9, live=(100, 40, 0), recent=(5, 1, 0), measured_at=0.0)
        >>> shard_loads(m, full_scan_pending={1})
        {0: 5, 1: 41, 2: 0}
    """
    return {
        shard: measured.recent[shard] + (measured.live[shard] if shard in full_scan_pending else 0)
        for shard in range(len(measured.live))
    }


def measure(table: Any, sharding: Sharding, *, recent: int = RECENT_SNAPSHOTS,
            changelog: bool | None = None, known: MeasuredLoad | None = None,
            clock: Callable[[], float] = time.monotonic) -> MeasuredLoad | None:
    """Rows per shard of ``table`` (a :class:`~paimon_group.reading.table.ShardedTable`)
    at its latest snapshot; None when the table has no snapshot yet.

    ``changelog`` (default: whether the table has a changelog producer) picks
    the manifests a follow-up step reads, as the planner does. ``known`` is
    the last measurement: while the table has no newer snapshot it is
    returned again, re-stamped, without reading a manifest. ``clock``: the
    measuring member's monotonic clock, which stamps it."""
    from pypaimon.manifest.manifest_file_manager import ManifestFileManager
    from pypaimon.manifest.manifest_list_manager import ManifestListManager

    latest = table.latest_snapshot_id()
    snapshot = None if latest is None else table.snapshot(latest)
    if latest is None or snapshot is None:
        return None
    if known is not None and known.snapshot_id == latest and (
            len(known.live) == sharding.num_shards):
        return dataclasses.replace(known, measured_at=clock())
    if changelog is None:
        changelog = table.changelog_producer != "none"
    lists = ManifestListManager(table.table)
    files = ManifestFileManager(table.table)
    live = _rows_by_shard(files.read_entries_parallel(lists.read_all(snapshot), max_workers=2),
                          sharding)
    added = [0] * sharding.num_shards
    earliest = table.earliest_snapshot_id() or latest
    for snapshot_id in range(max(earliest, latest - recent + 1), latest + 1):
        step = snapshot if snapshot_id == latest else table.snapshot(snapshot_id)
        if step is None or not follow_up_scans(step, changelog=changelog):
            continue  # expired meanwhile, or a snapshot follow-ups skip
        manifests = increment_manifests(lists, step, changelog=changelog)
        entries = files.read_entries_parallel(manifests, max_workers=2)
        for shard, rows in enumerate(_rows_by_shard(entries, sharding)):
            added[shard] += rows
    return MeasuredLoad(latest, tuple(live), tuple(added), clock())


def _rows_by_shard(entries: Iterable[Any], sharding: Sharding) -> list[int]:
    rows = [0] * sharding.num_shards
    for entry in entries:
        if entry.kind != 0 or int(entry.bucket) < 0:
            continue  # a deleted file, or a postponed bucket nobody reads yet
        rows[sharding.shard_of_entry(entry)] += int(entry.file.row_count)
    return rows
