"""A sink that commits each source batch's output into a Paimon table once.

Delivery is at-least-once: a member commits a batch's position (fenced by
its epoch) after the handler returned, so a crash or a handoff in between
makes the next owner deliver the batch again. :class:`PaimonSink` makes the
output exactly-once with what Paimon already has: every commit into the
target carries, in its snapshot properties, each source shard's **mark**
(the epoch that wrote last and the source position after its last batch,
:mod:`paimon_group.sink.marks`). A replay finds its batch in the target and
the member commits the position that was written instead
(:class:`~paimon_group.errors.AlreadyWritten`); a former owner's batch is
refused (:class:`~paimon_group.errors.StaleSinkWrite`).

How one batch goes in:

1. ``write(rows, batch)`` (in the handler's thread) checks the batch against
   the marks it knows, writes the rows' data files with pypaimon (a writer
   of its own, so each batch's files can be committed or dropped alone),
   and queues them;
2. the committer thread commits everything queued in **one** target commit,
   at most once per ``commit_interval_s`` (as Flink commits once per
   checkpoint), once the writes under way have queued their files (for at
   most one interval): a member's shards share snapshots;
3. that commit is made on top of the newest snapshot whose marks it has just
   judged every queued batch against: Paimon's commit is a compare-and-set
   on the next snapshot id, and it is tried once (``commit.max-retries`` 0):
   a lost race reads the new marks and judges again, so the check and the
   commit are one atomic step for every writer of the target;
4. ``write`` returns once its batch is in, or raises what the judgement said.
   The member then commits the batch's position; a crash in between is the
   replay of step 1, found in the marks.

On a primary-key target a key's later source version must win whoever wrote
it, and Paimon's own sequence numbers are counted per writer: the target
needs ``'sequence.field'`` naming a column the sink fills with the batch's
source snapshot (:attr:`PaimonSink.sequence_column`), so Paimon orders a
key's rows by source position.

Example (a ``paimon-group run`` handler)::

    from paimon_group.sink import PaimonSink

    sink = PaimonSink("/data/wh", "db.orders_enriched")

    def handle(batch):
        rows = batch.to_arrow()
        sink.write(enrich(rows), batch)     # returns once it is in the target
"""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import pyarrow as pa
import tenacity

from coordinators import retry
from paimon_group.errors import AlreadyWritten, ConfigError, PaimonGroupError, StaleSinkWrite
from paimon_group.protocol.sinks import SinkRecord, register, unregister
from paimon_group.reading.planner import BatchKind
from paimon_group.sink.marks import (
    NONCE_PROPERTY,
    GroupMarks,
    ShardMark,
    Source,
    Verdict,
    encode,
    judge,
    mark_after,
    property_key,
)
from paimon_group.sink.target import PartsWriter, TargetTable

log = logging.getLogger("paimon_group.sink")

COMMIT_INTERVAL_S = 1.0
COMMIT_ROWS = 1_000_000
# How long the committer gathers the batches of one step, delivered at once
# by the member's parallel handlers, before the first commit after a pause.
GATHER_S = 0.05
# The sink's commits are paced by a bucket of this many credits, one earned
# per interval: after a quiet period the first commits come at once (a
# drain's first steps are not held an interval each).
COMMIT_BURST = 3


class SourceBatch(Protocol):
    """What the sink needs of a batch (a :class:`~paimon_group.reading.batch.ShardBatch`;
    its ``incarnation``, ``start_moves``, ``table_id``, ``num_shards`` and
    ``sharding`` too, read as empty and 0 (unknown) where a batch has none)."""

    group: str
    shard: int
    epoch: int
    kind: BatchKind
    first_snapshot: int
    snapshot_id: int
    next_snapshot: int


@dataclass
class _Pending:
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
    future: concurrent.futures.Future[None] = field(default_factory=concurrent.futures.Future)
    # A member's batch written in parts: their one writer, until sealed.
    writer: PartsWriter | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def finish(self, error: BaseException | None = None) -> None:
        """Answer the batch's waiter (once): committed, or ``error``."""
        if self.future.done():
            return
        if error is None:
            self.future.set_result(None)
        else:
            self.future.set_exception(error)


def _first_of(batch: SourceBatch) -> int:
    """The source position a batch starts from: an initial full scan is
    before every delta (0)."""
    return 0 if batch.kind is BatchKind.INITIAL else batch.first_snapshot


def _incarnation_of(batch: SourceBatch) -> str:
    """The group's incarnation the batch was read in ("": unknown)."""
    return str(getattr(batch, "incarnation", "") or "")


def _start_moves_of(batch: SourceBatch) -> int:
    """The moves of the group start the batch's position derives from."""
    return int(getattr(batch, "start_moves", 0) or 0)


def _source_of(batch: SourceBatch) -> Source:
    """The source the batch was read from (:class:`~paimon_group.sink.marks.Source`)."""
    return Source(str(getattr(batch, "table_id", "") or ""),
                  int(getattr(batch, "num_shards", 0) or 0),
                  str(getattr(batch, "sharding", "") or ""))


def _full_scan_of(batch: SourceBatch) -> int | None:
    """The snapshot an initial full scan reads (None: a delta batch)."""
    return batch.snapshot_id if batch.kind is BatchKind.INITIAL else None


class PaimonSink:
    """Writes each source batch's output rows into a Paimon table, once.

    ``commit_interval_s``: the least time between two target commits of this
    sink (its batches wait for the next one: a handler returns once its rows
    are in); 0: every write commits at once, in its caller's thread.
    ``commit_rows``: commit sooner once this many rows wait.
    Thread-safe: one sink serves every shard of a member.
    """

    def __init__(
        self,
        warehouse: str,
        table: str,
        *,
        catalog_options: Mapping[str, str] | None = None,
        commit_interval_s: float = COMMIT_INTERVAL_S,
        commit_rows: int = COMMIT_ROWS,
    ) -> None:
        if commit_interval_s < 0 or commit_rows < 1:
            raise ConfigError("commit_interval_s must be >= 0 and commit_rows >= 1")
        self.target = TargetTable.open(warehouse, table, catalog_options)
        # The members of this process publish it in each group it writes for
        # (protocol/sinks.py, for describe).
        self._record = SinkRecord("paimon", self.target.warehouse, table)
        self._groups: set[str] = set()  # the groups it registered for, until closed
        self.commit_interval_s = commit_interval_s
        self.commit_rows = commit_rows
        self.commit_user = f"paimon-group-sink-{uuid.uuid4().hex[:12]}"
        self._identifiers = itertools.count(1)
        self._sleep = time.sleep  # between lost races (injectable)
        self._cond = threading.Condition()
        self._queue: list[_Pending] = []
        # A member's batches whose parts are being written: held until the
        # member seals them (after the handler) or drops them.
        self._open: dict[int, _Pending] = {}
        self._writing = 0  # writes judged or writing files, not queued yet
        self._closed = False
        self._last_commit = 0.0
        self._credit = float(COMMIT_BURST)  # as of _last_commit
        self.commits = 0  # target commits made
        # commit_interval_s 0: each write commits in its caller's thread (one
        # at a time), no committer thread: a snapshot per batch.
        self._inline = threading.Lock() if commit_interval_s == 0 else None
        self._committer = threading.Thread(target=self._commit_loop, daemon=True,
                                           name=f"pg-sink-{table}")
        if self._inline is None:
            self._committer.start()

    @property
    def sequence_column(self) -> str | None:
        """The column the sink fills with the source snapshot (the target's
        ``sequence.field``), or None (an append target)."""
        return self.target.sequence_column

    # -- writing (handler threads) -----------------------------------------

    def write(self, rows: Any, batch: SourceBatch) -> None:
        """Write ``rows`` (an Arrow table or record batch, or a Spark
        DataFrame) as the output of ``batch``.

        A batch a member delivered (a
        :class:`~paimon_group.reading.batch.ShardBatch`) may be written in
        several parts, say one per record batch of ``batch.iter_batches()``:
        each call writes its part's data files and returns; the member
        commits all parts of the batch together once the handler returned
        (before it commits the batch's position), and drops them if the
        handler raised. Any other batch is written whole by one call, which
        returns once it is committed.

        Raises :class:`~paimon_group.errors.AlreadyWritten` when the target
        already holds the batch (the member commits the position it names),
        :class:`~paimon_group.errors.StaleSinkWrite` when a newer owner
        of the shard wrote (nothing written); for a member's batch these
        may also come when the member seals it.
        """
        if batch.group not in self._groups:
            self._groups.add(batch.group)
            register(batch.group, self._record, self)
        hold = getattr(batch, "hold_output", None)
        if hold is not None:
            self._write_part(rows, batch, hold)
            return
        if self._inline is not None:
            pending = self._written(rows, batch)
            with self._inline:
                if self._closed:
                    raise PaimonGroupError("the sink is closed")
                self._commit_reporting([pending])
        else:
            pending = self._queue_written(rows, batch)
            self._enqueue(pending)
        pending.future.result()

    def _write_part(self, rows: Any, batch: SourceBatch, hold: Any) -> None:
        """One part of a member's batch: the first is judged against the
        marks known (an early answer; the commit judges again) and opens
        the batch's entry and its writer (:class:`PartsWriter`: one for
        every part, so a key's changes keep their order across parts), held
        until :meth:`seal` or :meth:`drop`; later parts go to that writer."""
        key = id(batch)
        with self._cond:
            if self._closed:
                raise PaimonGroupError("the sink is closed")
            opened = self._open.get(key)
            if opened is None:
                self._writing += 1
        if opened is None:
            try:
                part = self._written(rows, batch, parts=True)
                with self._cond:
                    if key in self._open:
                        raise PaimonGroupError(
                            f"{batch!r} was written from two threads at once: write a "
                            "batch's parts one after the other")
                    try:
                        hold(self)  # refused for a batch its member is done with
                    except BaseException:
                        assert part.writer is not None
                        part.writer.close()
                        raise
                    self._open[key] = part
            finally:
                with self._cond:
                    self._writing -= 1
                    self._cond.notify_all()
            return
        table = self.target.conform(_as_arrow(rows), batch)
        with self._cond:
            self._writing += 1
        try:
            with opened.lock:
                assert opened.writer is not None
                opened.writer.write(table)
                opened.rows += table.num_rows
        finally:
            with self._cond:
                self._writing -= 1
                self._cond.notify_all()

    def seal(self, batch: Any) -> concurrent.futures.Future[None]:
        """Commit every part written for ``batch`` together (the member
        calls it once the handler returned, off its event loop: the parts'
        last files are written here); the future ends once they are in the
        target, or with the judgement's error."""
        with self._cond:
            pending = self._open.pop(id(batch), None)
            self._cond.notify_all()
        if pending is None:
            done: concurrent.futures.Future[None] = concurrent.futures.Future()
            done.set_result(None)
            return done
        if pending.writer is not None:
            # The parts' last files are written now: counted among the writes
            # under way, so the committer gathers the step's other seals.
            with self._cond:
                self._writing += 1
            try:
                with pending.lock:
                    pending.messages = pending.writer.prepare()
            except BaseException as err:
                pending.finish(err)
                return pending.future
            finally:
                with self._cond:
                    self._writing -= 1
                    self._cond.notify_all()
        if self._inline is not None:
            with self._inline:
                if self._closed:
                    pending.finish(PaimonGroupError("the sink is closed"))
                else:
                    self._commit_reporting([pending])
        else:
            self._enqueue(pending)
        return pending.future

    def drop(self, batch: Any) -> None:
        """Forget the parts written for ``batch`` (its handler raised): none
        is committed; their data files stay unnamed by any snapshot."""
        with self._cond:
            pending = self._open.pop(id(batch), None)
            self._cond.notify_all()
        if pending is not None and pending.writer is not None:
            with pending.lock:
                pending.writer.close()

    def _written(self, rows: Any, batch: SourceBatch, *, parts: bool = False) -> _Pending:
        """``batch`` judged against the marks known, and its files written
        (``parts``: its first part written by the batch's writer, kept open
        for the others until :meth:`seal`)."""
        table = self.target.conform(_as_arrow(rows), batch)
        verdict = judge(self._mark_of(batch),
                        first=_first_of(batch), epoch=batch.epoch,
                        incarnation=_incarnation_of(batch), full_scan=_full_scan_of(batch),
                        start_moves=_start_moves_of(batch), rows_move=_source_of(batch).rows_move)
        _tell_batch(batch, verdict)
        _raise_unless_write(verdict, batch.group, batch.shard, batch.epoch)
        writer: PartsWriter | None = None
        if parts:
            writer = self.target.open_writer(table)
            try:
                writer.write(table)
            except BaseException:
                writer.close()
                raise
        pending = _Pending(batch.group, batch.shard, batch.epoch, _incarnation_of(batch),
                           _start_moves_of(batch), _first_of(batch), _full_scan_of(batch),
                           batch.next_snapshot, batch.snapshot_id,
                           [] if parts else self.target.write_files(table, self.commit_user),
                           table.num_rows, batch, _source_of(batch))
        pending.writer = writer
        return pending

    def _mark_of(self, batch: SourceBatch) -> ShardMark | None:
        """The mark ``batch`` is judged against, as of the newest snapshot:
        none if its group's marks belong to another source."""
        return self.target.group_marks(batch.group).for_batch(
            _source_of(batch)).get(batch.shard)

    def _queue_written(self, rows: Any, batch: SourceBatch, *, parts: bool = False
                       ) -> _Pending:
        """:meth:`_written`, counted among the writes under way meanwhile
        (the committer waits for them: see :meth:`_wait_due`)."""
        with self._cond:
            self._writing += 1
        try:
            return self._written(rows, batch, parts=parts)
        finally:
            with self._cond:
                self._writing -= 1
                self._cond.notify_all()

    def _enqueue(self, pending: _Pending) -> None:
        """Hand ``pending`` to the committer."""
        with self._cond:
            if self._closed:
                raise PaimonGroupError("the sink is closed")
            self._queue.append(pending)
            self._cond.notify_all()

    def marks(self, group: str) -> dict[int, ShardMark]:
        """Each shard's mark in the target for ``group`` (read now)."""
        return dict(self.target.marks(group, fresh=True))

    def close(self, timeout: float | None = None) -> None:
        """Commit what is queued and stop the committer. Idempotent."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._committer.is_alive():
            self._committer.join(timeout)
        for group in sorted(self._groups):
            unregister(group, self._record, self)

    def __enter__(self) -> PaimonSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- committing (the committer thread) ---------------------------------

    def _commit_loop(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue:
                    return
                self._wait_due()
                pending, self._queue = self._queue, []
            self._commit_reporting(pending)
            now = time.monotonic()
            self._credit = self._credit_at(now) - 1.0
            self._last_commit = now

    def _credit_at(self, now: float) -> float:
        """The commit credits at ``now``: one earned per interval since the
        last commit, at most :data:`COMMIT_BURST`."""
        if self.commit_interval_s <= 0:
            return float(COMMIT_BURST)
        earned = (now - self._last_commit) / self.commit_interval_s
        return min(float(COMMIT_BURST), self._credit + earned)

    def _commit_reporting(self, pending: list[_Pending]) -> None:
        """:meth:`_commit`, its error given to every waiter not answered yet."""
        try:
            self._commit(pending)
        except BaseException as err:
            log.warning("sink commit failed: %s", err)
            for p in pending:
                p.finish(err)

    def _wait_due(self) -> None:
        """Wait (holding the condition) until the next commit is due: once a
        commit credit is earned (:data:`COMMIT_BURST`: after a quiet
        period at once, then one interval after the last), and then until no
        other write is under way (the other shards of the step a member's
        handlers deliver at once, whose files may take longer to write), for
        at most one interval after the first batch queued."""
        first = time.monotonic()
        while not self._closed:
            rows = sum(p.rows for p in self._queue)
            now = time.monotonic()
            short = 1.0 - self._credit_at(now)
            due = max(now + short * self.commit_interval_s if short > 0 else now,
                      first + GATHER_S)
            if rows >= self.commit_rows:
                return
            if now < due:
                self._cond.wait(due - now)
            elif (self._writing or self._open) and now < first + self.commit_interval_s:
                self._cond.wait(first + self.commit_interval_s - now)
            else:
                return

    def _commit(self, pending: list[_Pending]) -> None:
        """Judge every pending batch against the newest marks and commit the
        ones to write, on top of the snapshot judged; again, after a short
        random wait, if another writer's commit came first
        (:data:`coordinators.retry.SINK_RACES`)."""
        verdicts: list[tuple[_Pending, Verdict | PaimonGroupError]] = []
        policy = retry.SINK_RACES.copy(sleep=self._sleep)
        try:
            policy(self._commit_attempt, pending, verdicts)
        except tenacity.RetryError:
            raise PaimonGroupError(
                f"the sink's commit lost {policy.statistics['attempt_number']} "
                "races in a row to other writers of the target; the batches are retried"
            ) from None
        for p, verdict in verdicts:
            if isinstance(verdict, PaimonGroupError):
                p.finish(verdict)  # its group's marks cannot be read
                continue
            _tell_batch(p.batch, verdict)
            try:
                _raise_unless_write(verdict, p.group, p.shard, p.epoch)
            except PaimonGroupError as err:
                p.finish(err)
            p.finish()

    def _commit_attempt(self, pending: list[_Pending],
                        verdicts: list[tuple[_Pending, Verdict | PaimonGroupError]]) -> bool:
        """One try of :meth:`_commit`: False if another writer took the
        snapshot id first. ``verdicts`` gets the batches not to write (or
        whose group's marks cannot be read: only that group's batches fail).

        The batches are judged in queue order, each against the marks the
        ones before it leave (two owners of one shard, a former and a new
        one, may both be queued: the later is judged against the earlier's
        mark). The commit carries every group's marks the target holds,
        those of groups it writes nothing for as they are, so an idle
        group's marks live as long as any sink writes the target."""
        latest, stored = self.target.marks_at_latest()
        current: dict[str, GroupMarks] = {}
        unreadable: dict[str, PaimonGroupError] = {}
        writes: list[_Pending] = []
        verdicts.clear()
        for p in pending:
            if p.group not in current and p.group not in unreadable:
                try:
                    current[p.group] = self.target.decoded(p.group, stored[p.group]) \
                        if p.group in stored else GroupMarks()
                except PaimonGroupError as err:
                    unreadable[p.group] = err
            if p.group in unreadable:
                verdicts.append((p, unreadable[p.group]))
                continue
            marks = current[p.group]
            known = marks.for_batch(p.source).get(p.shard)
            verdict = judge(known, first=p.first, epoch=p.epoch, incarnation=p.incarnation,
                            full_scan=p.full_scan, start_moves=p.start_moves,
                            rows_move=p.source.rows_move)
            if verdict.kind != "write":
                verdicts.append((p, verdict))
                continue
            writes.append(p)
            current[p.group] = marks.written(p.source, {p.shard: mark_after(
                known, epoch=p.epoch, next_snapshot=p.next_snapshot, incarnation=p.incarnation,
                start_moves=p.start_moves, full_scan=p.full_scan)})
        if not writes:
            return True
        nonce = uuid.uuid4().hex
        properties = {property_key(group): value for group, value in stored.items()}
        for group in {p.group for p in writes}:
            marks = current[group]
            properties[property_key(group)] = encode(marks.shards, marks.source)
        properties[NONCE_PROPERTY] = nonce
        messages = [m for p in writes for m in p.messages]
        if not self.target.commit_once(messages, latest, properties, self.commit_user,
                                       next(self._identifiers), nonce):
            return False
        self.commits += 1
        for p in writes:
            p.finish()
        return True


def _tell_batch(batch: Any, verdict: Verdict) -> None:
    """Mark ``batch`` (a ShardBatch) as held by the target up to the
    verdict's snapshot, so its member commits that position even if the
    caller swallows :class:`AlreadyWritten`."""
    if verdict.kind == "already" and hasattr(batch, "sink_holds"):
        batch.sink_holds = verdict.next_snapshot


def _raise_unless_write(verdict: Verdict, group: str, shard: int, epoch: int) -> None:
    if verdict.kind == "stale":
        raise StaleSinkWrite(f"group {group} shard {shard}: a newer owner than epoch {epoch} "
                             "has written to the target; nothing was written")
    if verdict.kind == "already":
        assert verdict.next_snapshot is not None
        raise AlreadyWritten(
            f"group {group} shard {shard}: the target already holds this batch, up to "
            f"snapshot {verdict.next_snapshot - 1}", shard=shard,
            next_snapshot=verdict.next_snapshot)


def _as_arrow(rows: Any) -> pa.Table:
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
