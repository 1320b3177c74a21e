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
import contextlib
import itertools
import logging
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import pyarrow as pa
import tenacity

from coordinators import retry
from paimon_group.errors import ConfigError, PaimonGroupError
from paimon_group.protocol.sinks import SinkRecord, SinkRegistry
from paimon_group.reading.planner import BatchKind
from paimon_group.sink.marks import (
    NONCE_PROPERTY,
    GroupMarks,
    ShardMark,
    Verdict,
    encode,
    marks_key,
    property_key,
)
from paimon_group.sink.pending import Pending as _Pending
from paimon_group.sink.pending import as_arrow as _as_arrow
from paimon_group.sink.pending import judge_step
from paimon_group.sink.pending import raise_unless_write as _raise_unless_write
from paimon_group.sink.pending import tell_batch as _tell_batch
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

    @property
    def group(self) -> str: ...
    @property
    def shard(self) -> int: ...
    @property
    def epoch(self) -> int: ...
    @property
    def kind(self) -> BatchKind: ...
    @property
    def first_snapshot(self) -> int: ...
    @property
    def snapshot_id(self) -> int: ...
    @property
    def next_snapshot(self) -> int: ...


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
        # The members whose batches it writes publish it in their groups
        # (protocol/sinks.py, for describe): it registers with each member's
        # registry, carried by the member's batches, until closed.
        self._record = SinkRecord("paimon", self.target.warehouse, table)
        self._registries: dict[int, SinkRegistry] = {}  # by id
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
        self._register(batch)
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

    def write_many(self, items: Sequence[tuple[Any, SourceBatch]]) -> list[Verdict]:
        """Write several batches' rows in **one** target commit: each
        ``(rows, batch)`` judged as :meth:`write` judges a batch, in order
        (each against the marks the ones before it leave), the rows of those
        to write written by one writer in that order (a key's changes keep
        their order across the items) and committed with their marks. The
        judgement and the commit are one step: the commit is made on the
        snapshot the items were judged on, and when another writer's commit
        came first they are judged again (and their files written again if
        the verdicts changed). Returns each item's verdict: an item judged
        ``stale`` or ``already`` is not written, and nothing is raised for
        it. Say, a Spark micro-batch's shards, each a run of snapshots
        (:class:`~paimon_group.spark.source.PaimonBatchSink`)."""
        for _, batch in items:
            self._register(batch)
        tables = [self.target.conform(_as_arrow(rows), batch) for rows, batch in items]
        pending = [_Pending.of(batch, table.num_rows)
                   for table, (_, batch) in zip(tables, items, strict=True)]
        chosen: list[tuple[int, ...]] = []  # the items whose files are written, and
        messages: list[Any] = []            # their files
        verdicts: list[tuple[_Pending, Verdict | PaimonGroupError]] = []

        def attempt() -> bool | None:
            latest, stored = self.target.marks_at_latest()
            writes, current = self._judge_pending(pending, stored, verdicts)
            for _, verdict in verdicts:
                if isinstance(verdict, PaimonGroupError):
                    raise verdict  # the group's marks cannot be read
            if not writes:
                return None
            now = tuple(i for i, p in enumerate(pending) if p in writes)
            if not chosen or chosen[-1] != now:
                messages[:] = self._files_of([tables[i] for i in now])
                chosen.append(now)
            return self._commit_writes(latest, stored, current, writes, messages)

        policy = retry.SINK_RACES.copy(sleep=self._sleep)
        lock = self._inline if self._inline is not None else contextlib.nullcontext()
        with lock:
            if self._closed:
                raise PaimonGroupError("the sink is closed")
            try:
                policy(attempt)
            except tenacity.RetryError:
                raise PaimonGroupError(
                    f"the sink's commit lost {policy.statistics['attempt_number']} races in "
                    "a row to other writers of the target; nothing was written") from None
        refused = {id(p): v for p, v in verdicts if isinstance(v, Verdict)}
        return [refused.get(id(p), Verdict("write")) for p in pending]

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
        pending = _Pending.of(batch, table.num_rows)
        verdict, _ = judge_step(self.target.group_marks(pending.key), pending)
        _tell_batch(batch, verdict)
        _raise_unless_write(verdict, batch.group, batch.shard, batch.epoch, pending.table)
        writer: PartsWriter | None = None
        if parts:
            writer = self.target.open_writer(table)
            try:
                writer.write(table)
            except BaseException:
                writer.close()
                raise
        if not parts:
            pending.messages = self.target.write_files(table, self.commit_user)
        pending.writer = writer
        return pending

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

    def marks(self, group: str, table: str = "") -> dict[int, ShardMark]:
        """Each shard's mark in the target for ``group`` (read now); with
        ``table``, those kept for that source table of a group of several
        tables (docs/paimon-sink.md, "A group of several tables")."""
        return dict(self.target.marks(marks_key(group, table), fresh=True))

    def close(self, timeout: float | None = None) -> None:
        """Commit what is queued and stop the committer. Idempotent."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._committer.is_alive():
            self._committer.join(timeout)
        for registry in list(self._registries.values()):
            registry.unregister(self._record, self)

    def _register(self, batch: SourceBatch) -> None:
        """Register with the member that delivered ``batch`` (its batches
        carry its :class:`~paimon_group.protocol.sinks.SinkRegistry`; a batch
        no member delivered carries none), once per member."""
        registry = getattr(batch, "sinks", None)
        if isinstance(registry, SinkRegistry) and id(registry) not in self._registries:
            self._registries[id(registry)] = registry
            registry.register(self._record, self)

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
                _raise_unless_write(verdict, p.group, p.shard, p.epoch, p.table)
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
        writes, current = self._judge_pending(pending, stored, verdicts)
        if not writes:
            return True
        if not self._commit_writes(latest, stored, current, writes,
                                   [m for p in writes for m in p.messages]):
            return False
        for p in writes:
            p.finish()
        return True

    def _judge_pending(self, pending: list[_Pending], stored: Mapping[str, str],
                       verdicts: list[tuple[_Pending, Verdict | PaimonGroupError]]
                       ) -> tuple[list[_Pending], dict[str, GroupMarks]]:
        """``pending`` judged in order against the marks ``stored`` (each
        against those the ones before it leave): the batches to write, and
        the marks of each key (a group's, or a group's source table's) once
        they are in. ``verdicts`` gets the others."""
        current: dict[str, GroupMarks] = {}
        unreadable: dict[str, PaimonGroupError] = {}
        writes: list[_Pending] = []
        verdicts.clear()
        for p in pending:
            key = p.key  # the group's, or its source table's (a group of several)
            if key not in current and key not in unreadable:
                try:
                    current[key] = self.target.decoded(key, stored[key]) \
                        if key in stored else GroupMarks()
                except PaimonGroupError as err:
                    unreadable[key] = err
            if key in unreadable:
                verdicts.append((p, unreadable[key]))
                continue
            verdict, current[key] = judge_step(current[key], p)
            if verdict.kind != "write":
                verdicts.append((p, verdict))
            else:
                writes.append(p)
        return writes, current

    def _files_of(self, tables: list[pa.Table]) -> list[Any]:
        """The commit messages of ``tables`` written in order by one writer."""
        if not tables:
            return []
        writer = self.target.open_writer(tables[0])
        try:
            for table in tables:
                writer.write(table)
        except BaseException:
            writer.close()
            raise
        return writer.prepare()

    def _commit_writes(self, latest: Any, stored: Mapping[str, str],
                       current: Mapping[str, GroupMarks], writes: list[_Pending],
                       messages: list[Any]) -> bool:
        """Commit ``messages`` (the files of ``writes``) on top of ``latest``
        with every group's marks: ``current``'s for the groups written,
        the others as ``stored``. False: another writer took the id first."""
        nonce = uuid.uuid4().hex
        properties = {property_key(key): value for key, value in stored.items()}
        for key in {p.key for p in writes}:
            marks = current[key]
            properties[property_key(key)] = encode(marks.shards, marks.source)
        properties[NONCE_PROPERTY] = nonce
        if not self.target.commit_once(messages, latest, properties, self.commit_user,
                                       next(self._identifiers), nonce):
            return False
        self.commits += 1
        return True
