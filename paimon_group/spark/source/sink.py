"""The documented idempotent sink of the source: Parquet, one partition per (shard, snapshot).

A source row belongs to exactly one (shard, snapshot) pair (``_pg_shard``,
``_pg_snapshot``: the metadata columns), and one micro-batch holds all rows
of each pair it holds (snapshots are never cut). So writing a micro-batch
by *replacing* the partitions of the pairs it holds makes any replay
harmless: a batch that Spark re-runs after a crash, or rows another query
re-reads after taking a shard over from a position behind what was written,
replace themselves instead of adding a copy. Rows of the same pair are
identical on every read (the planner is deterministic per snapshot), so
whichever write lands last holds the same rows.

**Two writers of one pair** (the query that lost a shard and the one that
took it over, writing the same batch at once) are fenced by epoch, as
:class:`~paimon_group.spark.sinks.ParquetBatchSink` is. Spark's dynamic
partition overwrite, which this sink used, deletes each partition directory
and then renames the new one in, with no lock: the interleaving A.delete,
B.delete, A.rename, B.rename renames B's directory *into* A's
(``_pg_snapshot=2/_pg_snapshot=2/part-...``), and the sink no longer reads.
Now Spark writes the micro-batch to a staging directory, and the driver
publishes each shard's partitions under that shard's lock of an
:class:`~paimon_group.spark.fence.EpochFence` (one rename aside, one rename
in, per partition): a writer whose epoch (``_pg_epoch``) is lower than one
that has published the shard is a former owner, and its partitions of that
shard are not written (one WARNING; :attr:`Replaced.refused`): the newer
owner writes the same rows. A stale writer therefore never replaces a newer
one's partition, and two publications of a shard never interleave.

The sink's state (staging, fence) lives in the hidden sibling directory
``.NAME.pg-sink`` of ``path``, on the same filesystem, so that the renames
are atomic; ``path`` holds published partitions only. ``path`` must be a
local path (or ``file://`` URI) that the Spark driver and executors see as
the same POSIX filesystem (local mode, or a shared mount); for object
stores use a table format (docs/spark.md).

Example (``foreachBatch``)::

    query = df.writeStream.foreachBatch(
        lambda batch, _: write_replacing(batch, "/data/out/orders")).start()
"""

from __future__ import annotations

import logging
import os
import shutil
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paimon_group.spark.fence import EpochFence, StaleSinkWrite, fsync_dir, state_dir_of

__all__ = ["PARTITION_COLUMNS", "Replaced", "read_sink", "write_replacing"]

PARTITION_COLUMNS = ("_pg_shard", "_pg_snapshot")
EPOCH_COLUMN = "_pg_epoch"
# The partitions name no group: one sink holds the rows of one group.
_FENCE_GROUP = "source"

log = logging.getLogger("paimon_group.spark_source")


@dataclass(frozen=True)
class Replaced:
    """What :func:`write_replacing` did: the (shard, snapshot) partitions it
    published, and those it did not write because a newer owner (a higher
    epoch) has published their shard."""

    published: tuple[tuple[int, int], ...] = ()
    refused: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class _Writer:
    group: str
    shard: int
    epoch: int


def write_replacing(df: Any, path: str) -> Replaced:
    """Write ``df`` (with the metadata columns) replacing its (shard, snapshot)
    partitions, fenced by epoch (see the module docstring)."""
    missing = [c for c in (*PARTITION_COLUMNS, EPOCH_COLUMN) if c not in df.columns]
    if missing:
        raise ValueError(f"write_replacing needs the metadata columns {missing}: read with "
                         '.option("metadata_columns", "true")')
    root = _local_root(path)
    state = state_dir_of(root)
    stage = state / "_staging" / f"write-{uuid.uuid4().hex}"
    stage.parent.mkdir(parents=True, exist_ok=True)
    try:
        # Not Path.as_uri(): Hadoop does not decode "%3D" back to "=".
        df.write.mode("error").partitionBy(*PARTITION_COLUMNS).parquet(f"file://{stage}")
        return _publish(root, stage, EpochFence(state / "_fence"))
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _local_root(path: str) -> Path:
    if "://" in path:
        if not path.startswith("file://"):
            raise ValueError(f"write_replacing writes a local or shared POSIX path, not {path!r}: "
                             "on an object store, use a table format (docs/spark.md)")
        path = path[len("file://"):]
    return Path(path).absolute()


def _publish(root: Path, stage: Path, fence: EpochFence) -> Replaced:
    """Each shard's staged partitions renamed into ``root`` under its lock."""
    by_shard: dict[int, list[tuple[int, Path]]] = {}
    for part in sorted(stage.glob("_pg_shard=*/_pg_snapshot=*")):
        shard = int(part.parent.name.partition("=")[2])
        by_shard.setdefault(shard, []).append((int(part.name.partition("=")[2]), part))
    published: list[tuple[int, int]] = []
    refused: list[tuple[int, int]] = []
    for shard, parts in sorted(by_shard.items()):
        epoch = max(_epoch(part) for _, part in parts)
        try:
            with fence.hold(_Writer(_FENCE_GROUP, shard, epoch)):
                for snapshot, part in parts:
                    _replace(root / part.parent.name / part.name, part, stage)
                    published.append((shard, snapshot))
        except StaleSinkWrite as stale:
            snapshots = [snapshot for snapshot, _ in parts]
            log.warning("%s: snapshots %s of shard %d not written to %s", stale, snapshots,
                        shard, root)
            refused += [(shard, snapshot) for snapshot in snapshots]
    return Replaced(tuple(published), tuple(refused))


def _replace(final: Path, part: Path, stage: Path) -> None:
    """``part`` renamed to ``final``; an earlier ``final`` moved aside first
    (a directory cannot be renamed over a non-empty one) and removed with
    the stage."""
    final.parent.mkdir(parents=True, exist_ok=True)
    if final.exists():
        os.rename(final, stage / f"old-{uuid.uuid4().hex}")
    os.rename(part, final)
    fsync_dir(final.parent)


def _epoch(part: Path) -> int:
    """The epoch of a staged partition's rows (the highest, if several)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    highest = -1
    for file in part.glob("*.parquet"):
        value = pc.max(pq.ParquetFile(file).read(columns=[EPOCH_COLUMN]).column(0)).as_py()
        if value is not None:
            highest = max(highest, int(value))
    return highest


def read_sink(spark: Any, path: str, columns: Sequence[str]) -> list[Any]:
    """The values of ``columns`` in the sink (one column: a flat list); [] if empty."""
    if not os.path.isdir(path) or not any(n.startswith("_pg_shard=") for n in os.listdir(path)):
        return []
    rows = spark.read.parquet(path).select(*columns).collect()
    if len(columns) == 1:
        return [r[0] for r in rows]
    return [tuple(r) for r in rows]
