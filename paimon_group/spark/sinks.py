"""Sinks that make a replayed batch replace its earlier attempt instead of adding to it.

Delivery is at-least-once: a member commits a batch's position (fenced by
its epoch) only after the handler returned, so a crash or a handoff in
between makes the next owner of the shard deliver the step again. A sink
becomes exactly-once when it writes every batch under a **batch key** and a
replay of the same step, which has the same key, **replaces** what the
earlier attempt wrote.

The batch key is ``(group, shard, first_snapshot)``: the position the step
started from. It is what a replay is guaranteed to share with the attempt it
repeats, because the next owner resumes exactly at the last committed
position:

* DELTA and CHANGELOG steps read one snapshot, ``first_snapshot ==
  snapshot_id``; the snapshot is immutable, so the replay reads the same rows.
* A CATCH_UP step reads every snapshot from ``first_snapshot`` to the latest
  at planning time, so a replay may end later (``snapshot_id`` differs) and
  hold more rows; keyed by its first snapshot, it replaces the shorter
  attempt, and the next step starts after the longer one.
* An INITIAL step (the full scan of a new group's shard, ``--start
  latest-full`` or ``earliest``) is planned again from scratch after a crash,
  at whatever snapshot is latest then: a different key and different rows.
  But nothing of a shard is ever committed before its initial batch, so an
  INITIAL batch **supersedes every other batch of its (group, shard)**: the
  sink drops them when it publishes it.

:class:`ParquetBatchSink` does all this for a Parquet directory on a local
or shared POSIX filesystem: each batch is written to a staging directory
and then renamed into ``pg_group=G/pg_shard=K/pg_snapshot=N`` (Hive-style,
so ``spark.read.parquet(root)`` and ``pyarrow.dataset`` see the key as
columns); a replay renames the old directory away and the new one in, under
a per-shard lock, so a reader never sees a batch twice or half of one.

**Stale writers** are refused with the batch's ``epoch``: epochs of a shard
strictly increase across owners, so :class:`EpochFence` records the highest
epoch that has published for each (group, shard) and refuses a publish with
a lower one (:class:`StaleSinkWrite`, a :class:`~paimon_group.errors.StaleEpoch`).
A paused or partitioned former owner that wakes up mid-write therefore
cannot overwrite what the new owner wrote. The refusal needs no coordination
with the member: the coordinator already holds an epoch at least as high,
so the former owner's commit of the same batch is rejected too.

For table formats with transactional overwrites (Delta Lake, Iceberg,
Paimon's Spark connector, a database) :func:`with_batch_key` and
:func:`batch_key_condition` give the columns and the predicate of an
atomic "replace where batch key" or MERGE; recipes in ``docs/spark.md``.

Example::

    from paimon_group.spark.sinks import ParquetBatchSink

    sink = ParquetBatchSink("/data/out/orders")

    def handle(df, batch):                   # paimon-group run --spark-handler mod:handle
        sink.write(df.where("amount > 0"), batch)

    # later: every source row once, whatever crashed or moved in between
    rows = sink.read_arrow()
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa

from paimon_group.reading.planner import BatchKind
from paimon_group.spark.fence import (
    EpochFence,
    Fenced,
    StaleSinkWrite,
    fsync_dir,
    state_dir_of,
)

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

__all__ = [
    "KEY_COLUMNS",
    "BatchKey",
    "BatchLike",
    "EpochFence",
    "ParquetBatchSink",
    "Publication",
    "StaleSinkWrite",
    "batch_key_condition",
    "with_batch_key",
]

KEY_COLUMNS = ("pg_group", "pg_shard", "pg_snapshot")
"""Columns (and Hive partition names) that hold a row's batch key."""


class BatchLike(Fenced, Protocol):
    """What a sink needs of a :class:`~paimon_group.reading.batch.ShardBatch`
    (its group, shard and epoch: :class:`~paimon_group.spark.fence.Fenced`)."""

    @property
    def kind(self) -> BatchKind: ...

    @property
    def first_snapshot(self) -> int: ...

    @property
    def snapshot_id(self) -> int: ...


@dataclass(frozen=True, order=True)
class BatchKey:
    """``(group, shard, snapshot)``: the position a step started from. See the module docstring.

    Example::

        >>> key = BatchKey("orders", 3, 42)
        >>> key.relative_path
        'pg_group=orders/pg_shard=3/pg_snapshot=42'
    """

    group: str
    shard: int
    snapshot: int

    @classmethod
    def of(cls, batch: BatchLike) -> BatchKey:
        return cls(batch.group, int(batch.shard), int(batch.first_snapshot))

    @property
    def shard_path(self) -> str:
        return f"pg_group={self.group}/pg_shard={self.shard}"

    @property
    def relative_path(self) -> str:
        return f"{self.shard_path}/pg_snapshot={self.snapshot}"


def batch_key_condition(batch: BatchLike) -> Column:
    """The Spark predicate selecting what a replay of ``batch`` must replace.

    ``pg_group = G AND pg_shard = K AND pg_snapshot = N``; for an INITIAL
    batch every snapshot of the shard (it supersedes them all).

    Example (Iceberg, or any table supporting overwrite by filter)::

        with_batch_key(df, batch).writeTo("cat.db.out").overwrite(batch_key_condition(batch))
    """
    from pyspark.sql import functions as F

    key = BatchKey.of(batch)
    condition = (F.col("pg_group") == F.lit(key.group)) & (F.col("pg_shard") == F.lit(key.shard))
    if batch.kind is not BatchKind.INITIAL:
        condition = condition & (F.col("pg_snapshot") == F.lit(key.snapshot))
    return condition


def with_batch_key(df: DataFrame, batch: BatchLike, *, epoch_column: bool = False) -> DataFrame:
    """``df`` with the batch key as columns ``pg_group`` (string), ``pg_shard``,
    ``pg_snapshot`` (bigint), and ``pg_epoch`` (bigint) if ``epoch_column``.

    Example::

        keyed = with_batch_key(df, batch)
        keyed.write.format("delta").mode("overwrite") \\
            .option("replaceWhere", f"pg_group = '{batch.group}' AND pg_shard = {batch.shard} "
                                    f"AND pg_snapshot = {batch.first_snapshot}").save(path)
    """
    from pyspark.sql import functions as F

    key = BatchKey.of(batch)
    columns: dict[str, Column] = {
        "pg_group": F.lit(key.group).cast("string"),
        "pg_shard": F.lit(key.shard).cast("bigint"),
        "pg_snapshot": F.lit(key.snapshot).cast("bigint"),
    }
    if epoch_column:
        columns["pg_epoch"] = F.lit(int(batch.epoch)).cast("bigint")
    return df.withColumns(columns)


# ---------------------------------------------------------------------------
# Parquet sink (its epoch fence: paimon_group/spark/fence.py)


@dataclass(frozen=True)
class Publication:
    """One published batch: what :meth:`ParquetBatchSink.write` returns and logs.

    ``replaced``: an earlier attempt of the same key was replaced (a replay).
    ``superseded``: snapshots of other batches of the shard an INITIAL batch
    dropped (earlier initial attempts).
    """

    key: BatchKey
    epoch: int
    kind: str
    snapshot_id: int
    replaced: bool
    superseded: tuple[int, ...] = ()

    def to_json(self) -> str:
        return json.dumps({
            "group": self.key.group, "shard": self.key.shard, "snapshot": self.key.snapshot,
            "epoch": self.epoch, "kind": self.kind, "snapshot_id": self.snapshot_id,
            "replaced": self.replaced, "superseded": list(self.superseded), "time": time.time(),
        }, sort_keys=True)


class ParquetBatchSink:
    """A Parquet directory with one atomically replaced sub-directory per batch key.

    Layout::

        path/pg_group=G/pg_shard=K/pg_snapshot=N/part-*.parquet   published batches only
        path/../.NAME.pg-sink/_staging/...                        attempts being written
        path/../.NAME.pg-sink/_fence/...                          EpochFence, per-shard locks
        path/../.NAME.pg-sink/_log/pg_group=G/pg_shard=K.jsonl    one line per publication

    ``path`` holds nothing but published batches, so any reader of it
    (``pyarrow.dataset.dataset(path, partitioning="hive")``,
    ``spark.read.parquet(path)``, DuckDB, pandas) sees only committed files
    and is never disturbed by a writer at work: a new batch appears in one
    rename of a complete directory. The sink's own state lives in the
    hidden sibling ``.NAME.pg-sink`` (:attr:`state_dir`), on the same
    filesystem so that the publishing rename is atomic. Pyarrow's discovery
    lists a tree recursively *before* it drops names starting with ``_``,
    so state kept inside ``path`` (as sinks created by earlier versions do,
    and still do when ``path/_fence`` exists) makes a concurrent pyarrow
    reader fail when an attempt directory vanishes under its listing.

    ``path`` must be a local path that the Spark driver and executors see as
    the same POSIX filesystem (local mode, or a shared mount): the publish
    is a directory rename done by the driver process. For object stores use
    a table format and :func:`batch_key_condition` instead.

    Example::

        sink = ParquetBatchSink("/data/out/orders")
        sink.write(df, batch)               # from a --spark-handler
        sink.write_arrow(batch.to_arrow(), batch)   # from a plain --handler
        table = sink.read_arrow()           # with pg_group, pg_shard, pg_snapshot
    """

    def __init__(self, path: str | os.PathLike[str], *, fence: bool = True) -> None:
        self.root = Path(path).absolute()
        self.state_dir = state_dir_of(self.root)
        # The fence's lock serialises publications of a shard even without
        # the epoch check (two renames into one place must not interleave).
        self.fence = EpochFence(self.state_dir / "_fence")
        self.check_epochs = fence

    def __repr__(self) -> str:
        return f"ParquetBatchSink({str(self.root)!r}, fence={self.check_epochs})"

    # -- layout ----------------------------------------------------------

    def path_of(self, key: BatchKey) -> Path:
        return self.root / key.relative_path

    def _staging_dir(self, key: BatchKey) -> Path:
        return self.state_dir / "_staging" / key.shard_path

    def _new_stage(self, key: BatchKey) -> Path:
        staging = self._staging_dir(key)
        staging.mkdir(parents=True, exist_ok=True)
        return staging / f"attempt-{key.snapshot}-{uuid.uuid4().hex}"

    def _log_path(self, key: BatchKey) -> Path:
        return self.state_dir / "_log" / f"pg_group={key.group}" / f"pg_shard={key.shard}.jsonl"

    # -- writing ---------------------------------------------------------

    def write(self, df: DataFrame, batch: BatchLike) -> Publication:
        """Write ``df`` (a Spark DataFrame) as the output of ``batch``; replaces an earlier attempt.

        Raises :class:`StaleSinkWrite` (nothing published) when a newer
        owner of the shard has written.
        """
        if self.check_epochs:
            self.fence.check(batch)  # fail fast; the binding check is at publish
        key = BatchKey.of(batch)
        stage = self._new_stage(key)
        try:
            # Not Path.as_uri(): Hadoop does not decode "%3D" back to "=".
            df.write.mode("error").parquet(f"file://{stage}")
            return self._publish(stage, batch)
        finally:
            shutil.rmtree(stage, ignore_errors=True)

    def write_arrow(
        self,
        data: pa.Table | Iterable[pa.RecordBatch],
        batch: BatchLike,
        *,
        schema: pa.Schema | None = None,
    ) -> Publication:
        """Write an Arrow table, or record batches of ``schema`` (streamed), as ``batch``'s output.

        Example (a plain handler copying its batches, bounded memory)::

            sink.write_arrow(batch.iter_batches(), batch, schema=batch.schema)
        """
        import pyarrow.parquet as pq

        if self.check_epochs:
            self.fence.check(batch)
        key = BatchKey.of(batch)
        stage = self._new_stage(key)
        try:
            stage.mkdir()
            target = stage / "part-00000.parquet"
            if isinstance(data, pa.Table):
                pq.write_table(data, target)
            else:
                if schema is None:
                    raise ValueError("write_arrow of record batches needs their schema")
                with pq.ParquetWriter(target, schema) as writer:
                    for record_batch in data:
                        writer.write_batch(record_batch)
            return self._publish(stage, batch)
        finally:
            shutil.rmtree(stage, ignore_errors=True)

    def _publish(self, stage: Path, batch: BatchLike) -> Publication:
        """Rename ``stage`` into the batch's place (under the fence lock)."""
        key = BatchKey.of(batch)
        final = self.path_of(key)
        doomed: list[Path] = []
        with self.fence.hold(batch, check_epoch=self.check_epochs):
            final.parent.mkdir(parents=True, exist_ok=True)
            staging = self._staging_dir(key)
            # Old attempts a crashed publisher moved aside (never attempt-*
            # directories: other writers may be filling theirs right now).
            for leftover in staging.glob("old-*"):
                shutil.rmtree(leftover, ignore_errors=True)
            replaced = False
            superseded: list[int] = []
            # A directory cannot be renamed over a non-empty one: move the old
            # attempt aside first. A reader may miss the batch for that
            # instant, never see it twice; a crash in between leaves it
            # missing until the replay the crash itself causes (the position
            # was not committed) publishes it again.
            if final.exists():
                doomed.append(staging / f"old-{uuid.uuid4().hex}")
                os.rename(final, doomed[-1])
                replaced = True
            if batch.kind is BatchKind.INITIAL:
                for other in sorted(final.parent.iterdir()):
                    if other.name.startswith("pg_snapshot=") and other != final:
                        doomed.append(staging / f"old-{uuid.uuid4().hex}")
                        os.rename(other, doomed[-1])
                        superseded.append(int(other.name.partition("=")[2]))
            os.rename(stage, final)
            fsync_dir(final.parent)
            publication = Publication(
                key=key,
                epoch=int(batch.epoch),
                kind=batch.kind.value,
                snapshot_id=int(batch.snapshot_id),
                replaced=replaced,
                superseded=tuple(superseded),
            )
            log_path = self._log_path(key)
            log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(log_path, "a") as log_file:
                log_file.write(publication.to_json() + "\n")
        for path in doomed:
            shutil.rmtree(path, ignore_errors=True)
        return publication

    def clean_staging(self, older_than_s: float = 24 * 3600.0) -> int:
        """Remove attempts left in ``_staging`` by killed writers; returns how many.

        An attempt directory is only ever renamed into place by the process
        writing it, so one older than the longest batch can go. Returns the
        number of directories removed.
        """
        cutoff = time.time() - older_than_s
        removed = 0
        for attempt in (self.state_dir / "_staging").glob("pg_group=*/pg_shard=*/*"):
            try:
                if attempt.stat().st_mtime < cutoff:
                    shutil.rmtree(attempt, ignore_errors=True)
                    removed += 1
            except FileNotFoundError:
                continue
        return removed

    # -- reading ---------------------------------------------------------

    def batch_keys(self) -> list[BatchKey]:
        """Keys of the published batches, sorted."""
        keys: list[BatchKey] = []
        for group_dir in sorted(self.root.glob("pg_group=*")):
            group = group_dir.name.partition("=")[2]
            for shard_dir in group_dir.glob("pg_shard=*"):
                shard = int(shard_dir.name.partition("=")[2])
                for snap_dir in shard_dir.glob("pg_snapshot=*"):
                    keys.append(BatchKey(group, shard, int(snap_dir.name.partition("=")[2])))
        return sorted(keys)

    def publications(self) -> list[dict[str, Any]]:
        """Every publication logged so far (replays included), oldest first per shard."""
        out: list[dict[str, Any]] = []
        for path in sorted((self.state_dir / "_log").glob("pg_group=*/pg_shard=*.jsonl")):
            out.extend(json.loads(line) for line in path.read_text().splitlines() if line)
        return out

    def read_arrow(self) -> pa.Table:
        """All published rows, with the batch key as ``pg_group``, ``pg_shard``, ``pg_snapshot``.

        A consistent view while writers work: every shard's lock is held in
        shared mode while its published files are listed and read, so a
        replay's rename-aside (the one moment a published directory
        changes) waits for the read instead of pulling a file from under it.
        Locks are taken in one sorted order; a writer holds only one, so
        readers and writers cannot deadlock.
        """
        import pyarrow.dataset as ds

        keys = self.batch_keys()
        if not keys:
            return pa.table({})
        partitioning = ds.partitioning(
            pa.schema([("pg_group", pa.string()), ("pg_shard", pa.int64()),
                       ("pg_snapshot", pa.int64())]),
            flavor="hive",
        )
        shards = sorted({(k.group, k.shard) for k in keys})
        with contextlib.ExitStack() as held:
            for group, shard in shards:
                held.enter_context(self.fence.shared(group, shard))
            files = [str(f) for group, shard in shards
                     for f in sorted(self.root.glob(
                         f"{BatchKey(group, shard, 0).shard_path}/pg_snapshot=*/*.parquet"))]
            if not files:
                return pa.table({})
            dataset = ds.dataset(files, format="parquet", partitioning=partitioning,
                                 partition_base_dir=str(self.root))
            return dataset.to_table()
