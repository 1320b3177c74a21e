"""A sink's batch on its way into the target, and what the sink reads of a source batch.

:class:`Pending` is one batch's written files (or its open writer) waiting
for the committer's verdict; the functions read a source batch's position,
incarnation, start moves and source as the marks need them
(:mod:`paimon_group.sink.marks`), a batch without them read as unknown.
Split from :mod:`paimon_group.sink.paimon`, which judges and commits.
"""

from __future__ import annotations

import concurrent.futures
import threading
from dataclasses import dataclass, field
from typing import Any, Protocol

import pyarrow as pa

from paimon_group.errors import AlreadyWritten, PaimonGroupError, StaleSinkWrite
from paimon_group.reading.planner import BatchKind
from paimon_group.sink.marks import GroupMarks, Source, Verdict, judge, mark_after, marks_key
from paimon_group.sink.target import PartsWriter


@dataclass
class Pending:
    """A batch's written files, waiting for the committer's verdict."""

    group: str
    shard: int
    epoch: int
    incarnation: str
    start_moves: int
    first: int
    full_scan: int | None
    next_snapshot: int
    snapshot_id: int
    messages: list[Any]
    rows: int
    batch: Any = None
    source: Source = field(default_factory=Source)
    table: str = ""  # the source table its marks are kept for ("": the group's own)
    future: concurrent.futures.Future[None] = field(default_factory=concurrent.futures.Future)
    # A member's batch written in parts: their one writer, until sealed.
    writer: PartsWriter | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def of(cls, batch: Any, rows: int) -> Pending:
        """``batch``'s entry (``rows`` of output), its files still to come."""
        return cls(batch.group, batch.shard, batch.epoch, incarnation_of(batch),
                   start_moves_of(batch), first_of(batch), full_scan_of(batch),
                   batch.next_snapshot, batch.snapshot_id, [], rows, batch, source_of(batch),
                   marks_table_of(batch))

    @property
    def key(self) -> str:
        """The key its marks are kept under (:func:`~paimon_group.sink.marks.marks_key`)."""
        return marks_key(self.group, self.table)

    def finish(self, error: BaseException | None = None) -> None:
        """Answer the batch's waiter (once): committed, or ``error``."""
        if self.future.done():
            return
        if error is None:
            self.future.set_result(None)
        else:
            self.future.set_exception(error)


def first_of(batch: Any) -> int:
    """The source position a batch starts from: an initial full scan is
    before every delta (0)."""
    return 0 if batch.kind is BatchKind.INITIAL else batch.first_snapshot


def incarnation_of(batch: Any) -> str:
    """The group's incarnation the batch was read in ("": unknown)."""
    return str(getattr(batch, "incarnation", "") or "")


def start_moves_of(batch: Any) -> int:
    """The moves of the group start the batch's position derives from."""
    return int(getattr(batch, "start_moves", 0) or 0)


def source_of(batch: Any) -> Source:
    """The source the batch was read from (:class:`~paimon_group.sink.marks.Source`)."""
    return Source(str(getattr(batch, "table_id", "") or ""),
                  int(getattr(batch, "num_shards", 0) or 0),
                  str(getattr(batch, "sharding", "") or ""))


def marks_table_of(batch: Any) -> str:
    """The source table whose own marks the batch is judged against and
    moves, or "" for its group's marks (docs/paimon-sink.md, "A group of
    several tables"). A batch whose ``shard`` is not its ``group_shard`` is
    of a table of a group of several tables, numbered from 0 in that table
    (its range of the group's shards does not start at 0): its marks are
    its source table's. Any other batch's are the group's, as ever: a group
    of one table, and the table of a group of several whose range starts at
    0 (its shard numbers are the group's, its marks where a group of that
    table alone keeps them). A table's range never moves, so its batches
    always use the same marks. One line for a batch of a group of several
    tables that does not name its table."""
    group_shard = getattr(batch, "group_shard", None)
    if group_shard is None or group_shard == batch.shard:
        return ""
    table = str(getattr(batch, "table", "") or "")
    if not table:
        raise PaimonGroupError(
            f"group {batch.group} shard {group_shard}: the batch is of a table's shard "
            f"{batch.shard} and does not say which table (ShardBatch(table=...)): the sink "
            "keeps a group's marks per source table")
    return table


def full_scan_of(batch: Any) -> int | None:
    """The snapshot an initial full scan reads (None: a delta batch)."""
    return batch.snapshot_id if batch.kind is BatchKind.INITIAL else None


def tell_batch(batch: Any, verdict: Verdict) -> None:
    """Mark ``batch`` (a ShardBatch) as held by the target up to the
    verdict's snapshot, so its member commits that position even if the
    caller swallows :class:`AlreadyWritten`."""
    if verdict.kind == "already" and hasattr(batch, "sink_holds"):
        batch.sink_holds = verdict.next_snapshot


def raise_unless_write(verdict: Verdict, group: str, shard: int, epoch: int,
                       table: str = "") -> None:
    where = f"group {group} table {table} shard {shard}" if table else \
        f"group {group} shard {shard}"
    if verdict.kind == "stale":
        raise StaleSinkWrite(f"{where}: a newer owner than epoch {epoch} "
                             "has written to the target; nothing was written")
    if verdict.kind == "already":
        assert verdict.next_snapshot is not None
        raise AlreadyWritten(
            f"{where}: the target already holds this batch, up to "
            f"snapshot {verdict.next_snapshot - 1}", shard=shard,
            next_snapshot=verdict.next_snapshot)


def as_arrow(rows: Any) -> pa.Table:
    if isinstance(rows, pa.Table):
        return rows
    if isinstance(rows, pa.RecordBatch):
        return pa.Table.from_batches([rows])
    to_arrow = getattr(rows, "toArrow", None)  # a Spark DataFrame (PySpark >= 4)
    if to_arrow is not None:
        table: pa.Table = to_arrow()
        return table
    raise TypeError(f"the sink writes Arrow tables, record batches or Spark DataFrames, "
                    f"not {type(rows).__name__}")


class Judged(Protocol):
    """What :func:`judge_step` reads of a batch (a :class:`~paimon_group.sink.pending.Pending`)."""

    @property
    def shard(self) -> int: ...
    @property
    def epoch(self) -> int: ...
    @property
    def incarnation(self) -> str: ...
    @property
    def start_moves(self) -> int: ...
    @property
    def first(self) -> int: ...
    @property
    def full_scan(self) -> int | None: ...
    @property
    def next_snapshot(self) -> int: ...
    @property
    def source(self) -> Source: ...


def judge_step(marks: GroupMarks, batch: Judged) -> tuple[Verdict, GroupMarks]:
    """The verdict on ``batch`` against its group's ``marks``
    (:func:`~paimon_group.sink.marks.judge`), and the marks once it is in
    the target (``marks`` as they are unless it is to be written). Pure: a
    commit's batches are judged in order, each against the marks the ones
    before it leave."""
    known = marks.for_batch(batch.source).get(batch.shard)
    verdict = judge(known, first=batch.first, epoch=batch.epoch,
                    incarnation=batch.incarnation, full_scan=batch.full_scan,
                    start_moves=batch.start_moves, rows_move=batch.source.rows_move)
    if verdict.kind != "write":
        return verdict, marks
    return verdict, marks.written(batch.source, {batch.shard: mark_after(
        known, epoch=batch.epoch, next_snapshot=batch.next_snapshot,
        incarnation=batch.incarnation, start_moves=batch.start_moves,
        full_scan=batch.full_scan)})
