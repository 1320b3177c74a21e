"""Exactly-once from a query of the source into a Paimon table: :class:`PaimonBatchSink`.

An instance is the ``foreachBatch`` function of a query that reads
``format("paimon-group")`` with ``metadata_columns=true``; it writes each
micro-batch into a Paimon table with the guarantees of the worker's sink
(:class:`~paimon_group.sink.PaimonSink`, whose marks and judging it uses):
each (shard, snapshot) once, a batch Spark re-runs after a restart or a
query that lost shards (a former owner) writes nothing twice, a
primary-key target orders a key's rows by source snapshot, and deletes
are applied (``include_row_kind=true``: ``_row_kind``, as the worker's sink).

**What a micro-batch is to the marks.** The rows carry their shard,
snapshot and epoch; the micro-batch's exact ranges (per shard: the epoch,
the pending full scan, the first and the next snapshot, the moves of the
group start) and the group's incarnation and source are in its end offset,
which Spark writes to the query's offset log
(``<checkpointLocation>/offsets/<batch id>``) before it runs the batch, and
which holds its own start (:mod:`paimon_group.spark.source.offsets`): the
sink reads it there. Each shard's range becomes a run of batches
(:func:`shard_batches`): its full scan, then one batch from each snapshot
that has rows to the next one (the first from the range's start, the last
to its end), each judged as the worker's sink judges a batch, in order,
against the marks the ones before it leave (:func:`judge_batches`): a
snapshot the shard's mark covers is not written (a re-run batch, or
another query wrote it), a full scan follows the marks' rules (the file
rule's included), and a former owner's shard (a lower epoch of the same
incarnation than the mark's) writes nothing and is logged as a WARNING; the
query goes on. Every shard's rows to write go into the target in **one**
commit per micro-batch (:meth:`PaimonSink.write_many
<paimon_group.sink.paimon.PaimonSink.write_many>`: judged and committed in
one step, on the snapshot judged), the shards' marks then at their ranges'
ends.

Example::

    sink = PaimonBatchSink("/data/wh", "db.orders_copy", checkpoint="/ckpt/q1")
    (df.writeStream.foreachBatch(sink)
       .option("checkpointLocation", "/ckpt/q1").start())
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from paimon_group.errors import ConfigError, PaimonGroupError
from paimon_group.reading.planner import BatchKind
from paimon_group.sink.marks import GroupMarks, Source, Verdict
from paimon_group.sink.paimon import PaimonSink
from paimon_group.sink.pending import judge_step
from paimon_group.spark.source.offsets import ShardRange, decode_offset
from paimon_group.spark.source.options import METADATA_COLUMNS

__all__ = ["BatchWritten", "PaimonBatchSink", "RangeBatch", "batch_offset", "judge_batches",
           "shard_batches"]

log = logging.getLogger("paimon_group.spark_source")

_SHARD, _SNAPSHOT, _EPOCH = METADATA_COLUMNS


@dataclass(frozen=True)
class RangeBatch:
    """One run of one shard's range in a micro-batch: what the sink reads of a
    batch (:class:`~paimon_group.sink.paimon.SourceBatch`)."""

    group: str
    shard: int
    epoch: int
    kind: BatchKind
    first_snapshot: int
    snapshot_id: int
    next_snapshot: int
    incarnation: str = ""
    start_moves: int = 0
    table_id: str = ""
    num_shards: int = 0
    sharding: str = ""

    @property
    def first(self) -> int:
        """The position the batch starts from: a full scan is before every delta (0)."""
        return 0 if self.kind is BatchKind.INITIAL else self.first_snapshot

    @property
    def full_scan(self) -> int | None:
        return self.snapshot_id if self.kind is BatchKind.INITIAL else None

    @property
    def source(self) -> Source:
        return Source(self.table_id, self.num_shards, self.sharding)


def shard_batches(group: str, r: ShardRange, snapshots: Iterable[int], *,
                  incarnation: str = "", source: Source | None = None) -> list[RangeBatch]:
    """The batches one shard's range ``r`` of a micro-batch is judged as:
    its full scan (if any), then a delta batch from each of ``snapshots``
    (those with rows) in ``[r.next, r.to)`` to the next one, the first from
    ``r.next``, the last to ``r.to``."""
    source = source or Source()
    common = {"group": group, "shard": r.shard, "epoch": r.epoch, "incarnation": incarnation,
              "start_moves": r.moves, "table_id": source.table_id,
              "num_shards": source.num_shards, "sharding": source.sharding}
    out: list[RangeBatch] = []
    if r.full is not None:
        out.append(RangeBatch(kind=BatchKind.INITIAL, first_snapshot=r.full,
                              snapshot_id=r.full, next_snapshot=max(r.next, r.full + 1),
                              **common))  # type: ignore[arg-type]
    starts = sorted({r.next, *(s for s in snapshots if r.next <= s < r.to)})
    for i, start in enumerate(starts):
        end = starts[i + 1] if i + 1 < len(starts) else r.to
        if start < end:
            out.append(RangeBatch(kind=BatchKind.DELTA, first_snapshot=start,
                                  snapshot_id=start, next_snapshot=end,
                                  **common))  # type: ignore[arg-type]
    return out


def judge_batches(marks: GroupMarks, batches: Sequence[RangeBatch]
                  ) -> tuple[list[Verdict], GroupMarks]:
    """Each batch's verdict, in order, each against the marks the ones
    before it leave, and the marks once the batches to write are in: what
    :meth:`PaimonSink.write_many <paimon_group.sink.paimon.PaimonSink.write_many>`
    decides against the target's marks (pure)."""
    verdicts = []
    for batch in batches:
        verdict, marks = judge_step(marks, batch)
        verdicts.append(verdict)
    return verdicts, marks


@dataclass(frozen=True)
class BatchWritten:
    """What one micro-batch did: the (shard, snapshot) pairs with rows written,
    those the target held already, and those refused (a former owner)."""

    written: tuple[tuple[int, int], ...] = ()
    already: tuple[tuple[int, int], ...] = ()
    refused: tuple[tuple[int, int], ...] = ()


def batch_offset(checkpoint: str, batch_id: int) -> dict[str, Any]:
    """The end offset of the source in micro-batch ``batch_id`` of the query
    checkpointed at ``checkpoint`` (its offset log: a version line, the
    batch's metadata, then one line per source). One line if it is not there."""
    path = f"{checkpoint.rstrip('/')}/offsets/{batch_id}"
    try:
        text = _read_text(path)
    except (FileNotFoundError, OSError) as err:
        raise ConfigError(
            f"PaimonBatchSink: no offsets of micro-batch {batch_id} at {path} ({err}): give it "
            "the query's checkpointLocation (the same path as "
            '.option("checkpointLocation", ...))') from None
    ours = []
    for line in text.splitlines()[2:]:
        try:
            offset = json.loads(line)
        except ValueError:
            continue  # "-" (a source without an offset) or another source's
        if isinstance(offset, Mapping) and isinstance(offset.get("shards"), Mapping):
            ours.append(dict(offset))
    if len(ours) != 1:
        raise ConfigError(
            f"PaimonBatchSink: micro-batch {batch_id} at {path} has {len(ours)} paimon-group "
            "source offsets: it writes a query that reads one paimon-group source")
    return ours[0]


def _read_text(path: str) -> str:
    if "://" not in path or path.startswith("file:"):
        local = path.split(":", 1)[1] if path.startswith("file:") else path
        with open("/" + local.lstrip("/") if path.startswith("file:") else local) as f:
            return f.read()
    from pyarrow import fs

    filesystem, inner = fs.FileSystem.from_uri(path)
    with filesystem.open_input_stream(inner) as stream:
        data: bytes = stream.read()
    return data.decode()


class PaimonBatchSink:
    """The ``foreachBatch`` function writing a query's micro-batches into the
    Paimon table ``table`` of ``warehouse`` once (see the module docstring).

    ``checkpoint``: the query's ``checkpointLocation``, where the sink reads
    each micro-batch's ranges. The target is opened here: a missing table,
    or one the sink cannot write once (a primary-key target without a fixed
    bucket count or a ``BIGINT`` ``sequence.field``), is one line before the
    query starts. The metadata columns are not written (unless the target
    has such columns). ``group``: the source's group, for offsets that do
    not name it (checkpoints of an earlier release).
    """

    def __init__(self, warehouse: str, table: str, checkpoint: str, *,
                 catalog_options: Mapping[str, str] | None = None,
                 group: str | None = None) -> None:
        self.warehouse = warehouse
        self.group = group
        self.table = table
        self.checkpoint = checkpoint
        self.catalog_options = dict(catalog_options or {})
        self._sink: PaimonSink | None = self._open()

    def _open(self) -> PaimonSink:
        return PaimonSink(self.warehouse, self.table, catalog_options=self.catalog_options,
                          commit_interval_s=0)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_sink": None}  # opened again where it runs

    @property
    def sink(self) -> PaimonSink:
        """The worker's sink this one commits through (one commit per write)."""
        if self._sink is None:
            self._sink = self._open()
        return self._sink

    def __call__(self, df: Any, batch_id: int) -> BatchWritten:
        missing = [c for c in METADATA_COLUMNS if c not in df.columns]
        if missing:
            raise ConfigError(
                f"PaimonBatchSink needs the metadata columns {', '.join(missing)} in each "
                'micro-batch: read with .option("metadata_columns", "true") and keep them')
        offset = batch_offset(self.checkpoint, batch_id)
        return self.write(df.toArrow(), offset, batch_id)

    def write(self, rows: pa.Table, offset: Mapping[str, Any], batch_id: int = -1
              ) -> BatchWritten:
        """Write ``rows`` (Arrow, with the metadata columns), the micro-batch
        whose end offset is ``offset``."""
        ranges = {s: r for s, r in decode_offset(offset).items() if not r.empty}
        group = str(offset.get("group") or "")
        known = offset.get("source") or {}
        if known.get("tables"):
            raise ConfigError(
                "PaimonBatchSink writes a query of one table, and this one reads several "
                "(option tables or pattern): its marks are per source shard of one table; run "
                "one query per table, or key another sink by (_pg_table, _pg_shard, "
                "_pg_snapshot) (docs/spark.md, a query over several tables)")
        source = Source(str(known.get("table_id") or ""), int(known.get("num_shards") or 0),
                        str(known.get("sharding") or ""))
        slices = _slices(rows, ranges, batch_id)
        if not ranges:
            # A micro-batch of no shard (the query's member holds none yet):
            # nothing to judge, write or commit.
            return BatchWritten()
        keep = [c for c in rows.column_names
                if c not in METADATA_COLUMNS or c in self.sink.target.current().fields]
        items: list[tuple[pa.Table, RangeBatch]] = []
        name = self.group_name(offset)
        for shard, r in sorted(ranges.items()):
            snapshots = {s for (k, s) in slices if k == shard}
            for batch in shard_batches(name, r, snapshots, incarnation=group, source=source):
                part = slices.get((shard, batch.snapshot_id))
                items.append((rows.schema.empty_table().select(keep) if part is None
                              else part.select(keep), batch))
        verdicts = self.sink.write_many(items)
        return _report(name, batch_id, items, verdicts, slices)

    def group_name(self, offset: Mapping[str, Any]) -> str:
        """The group the marks are kept for in the target (as the worker's
        sink keeps them: a query and a worker of one group share them): the
        offset's, or ``group`` for offsets that do not record it."""
        name = str((offset.get("source") or {}).get("group") or self.group or "")
        if not name:
            raise ConfigError(
                "PaimonBatchSink: the micro-batch's offset does not name its group (a "
                "checkpoint of an earlier paimon-group): pass group=<the source's group>")
        return name


def _slices(rows: pa.Table, ranges: Mapping[int, ShardRange], batch_id: int
            ) -> dict[tuple[int, int], pa.Table]:
    """``rows`` by (shard, snapshot), each in the order Spark gave them; one
    line for rows the micro-batch's offset does not hold."""
    if rows.num_rows == 0:
        return {}
    order = pc.sort_indices(rows, sort_keys=[(_SHARD, "ascending"), (_SNAPSHOT, "ascending")])
    rows = rows.take(order)
    shards = rows.column(_SHARD).to_numpy()
    snapshots = rows.column(_SNAPSHOT).to_numpy()
    epochs = rows.column(_EPOCH).to_numpy()
    import numpy as np

    cuts = np.flatnonzero((shards[1:] != shards[:-1]) | (snapshots[1:] != snapshots[:-1])) + 1
    out: dict[tuple[int, int], pa.Table] = {}
    for start, end in zip([0, *cuts.tolist()], [*cuts.tolist(), rows.num_rows], strict=True):
        shard, snapshot = int(shards[start]), int(snapshots[start])
        r = ranges.get(shard)
        if (r is None or (snapshot != r.full and not r.next <= snapshot < r.to)
                or bool((epochs[start:end] != r.epoch).any())):
            raise PaimonGroupError(
                f"PaimonBatchSink: micro-batch {batch_id} has rows of shard {shard}, snapshot "
                f"{snapshot} that its offset ({'no range' if r is None else r}) does not hold: "
                "is the sink's checkpoint the query's checkpointLocation?")
        out[(shard, snapshot)] = rows.slice(start, end - start)
    return out


def _report(group: str, batch_id: int, items: Sequence[tuple[pa.Table, RangeBatch]],
            verdicts: Sequence[Verdict], slices: Mapping[tuple[int, int], pa.Table]
            ) -> BatchWritten:
    by: dict[str, list[tuple[int, int]]] = {"write": [], "already": [], "stale": []}
    stale: dict[int, int] = {}
    for (_, batch), verdict in zip(items, verdicts, strict=True):
        key = (batch.shard, batch.snapshot_id)
        if key in slices:
            by[verdict.kind].append(key)
        if verdict.kind == "stale":
            stale[batch.shard] = batch.epoch
    for shard, epoch in sorted(stale.items()):
        log.warning("micro-batch %d: shard %d: a newer owner than epoch %d has written to the "
                    "target (this query lost the shard): its rows are not written", batch_id,
                    shard, epoch)
    return BatchWritten(tuple(by["write"]), tuple(by["already"]), tuple(by["stale"]))
