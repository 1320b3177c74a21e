"""The Paimon sink in the simulation (issue 39): each batch's output written
into a Paimon target table, once, across the run's crashes and handoffs.

A seed draws (its own draw: the other draws of a seed stay, and the seeds
without the sink run as before) a :class:`SinkPlan`: in one seed in three
the members' handler writes each batch's rows (``id``, ``v``, ``extra``)
into a target table of the run (its own warehouse) through
:class:`~paimon_group.sink.PaimonSink` with ``commit_interval_s=0`` (each
write commits in the handler's call: no thread, a step of the virtual
time). The target is a primary-key table (key ``id``; ``'sequence.field'``
``seq``, which the sink fills with the source snapshot) or an append table,
partitioned (``p = id % 3``) or not. In those seeds every member runs
``run(handler)`` (the sink's replay verdict, ``AlreadyWritten``, is a
handler's: a body of ``async for`` cannot say it).

The sink's commit is a step the run crashes around: during the chaos, a
batch's write may kill its member (the run's crash: no goodbye, its session
expires; its supervisor restarts it) **before** the target commit (its data
files written, never committed) or **after** it (the batch is in the
target, its position never committed: the next owner's replay finds it).

The oracle (:meth:`SinkWorld.check`), after the settle and the stop: the
target holds each source batch's output once:

* ``sink_duplicate``: no row ``(id, v)`` twice in an append target (the
  deliveries may hold it twice: at least once), but once per life of the
  group: a group created anew with no consumer file of it left (a
  coordinator switch or wipe) is a new consumer, which starts as configured
  and writes its full scan whole (the sink cannot tell which of its rows the
  target holds: docs/reliability.md, "The Paimon sink in the simulation");
  and once more per full scan that replaced an expired one (``--on-data-loss
  skip``), which is written whole for the same reason;
* ``sink_unreal``: no row that no handler was delivered;
* ``sink_missing``: every id the run's checker expects delivered is in the
  target, unless expiry explains its absence (the excuses of
  :class:`tests.sim.expiry.LossOracle`, as for the deliveries);
* ``sink_value``: on a deduplicate source, each expected key's latest
  version is in the target (an append target holds that row, a
  primary-key target holds it as the key's value), unless expiry explains
  why it was never delivered.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from paimon_group.errors import AlreadyWritten, StaleSinkWrite
from paimon_group.sink import PaimonSink
from paimon_group.sink.kinds import ROW_KIND
from paimon_group.sink.paimon import GATHER_S
from paimon_group.sink.target import TargetTable

if TYPE_CHECKING:
    from tests.sim.scenario import Run

TARGETS = ("pk", "pk-partitioned", "append", "append-partitioned")
TABLE = "db.out"
PARTS = 3


@contextlib.contextmanager
def writes_all(on: bool) -> Iterator[None]:
    """Planted (tests only): the sink's check reverted, every batch judged
    ``write`` (a replay written again, a former owner's batch committed)."""
    if not on:
        yield
        return
    from paimon_group.sink import pending
    from paimon_group.sink.marks import Verdict

    real = pending.judge  # every verdict of the sink is judge_step's
    pending.judge = lambda *_a, **_k: Verdict("write")  # type: ignore[assignment]
    try:
        yield
    finally:
        pending.judge = real


class SinkDied(Exception):
    """The member process died inside the sink's commit (a planned crash)."""


# Plants (tests only), each a fix of the sink reverted in a simulated
# process's sink (SimSink), the package untouched:
SINK_PLANTS = {
    # C1: the marks of a re-created table's old snapshots hold for the new
    # one's batches (a batch's source table unknown: its marks not told apart).
    "sink_marks_any_table": "C1",
    # C2: only the first part of a batch written in parts reaches the target.
    "sink_first_part_only": "C2",
    # C4: the output's _row_kind dropped, every row written as an insert.
    "sink_kinds_dropped": "C4",
    # C5: the batches of one commit judged against the same marks (two owners
    # of one shard queued together both written).
    "sink_queue_same_marks": "C5",
}


class CommitHooks:
    """What a simulated process's sink tells its run around each target
    commit; the run's own hooks override these."""

    def point(self, writes: list[Any]) -> str | None:
        """Where the process dies in the commit of ``writes`` (the pending
        batches to write): "before" the target commit, "after" it, or None."""
        return None

    def die(self, point: str) -> None:
        """The process dies (``point``: "before" or "after" the commit)."""

    def committed(self, writes: list[Any]) -> None:
        """``writes`` are in the target (one commit)."""

    def judged(self, pending: Any, verdict: Any) -> None:
        """``pending`` was not written: ``verdict`` (already written, stale,
        or an error)."""


class SimSink(PaimonSink):
    """A simulated process's :class:`PaimonSink`: the package's sink, with the
    run's crash points around its target commit for the sink's whole life,
    and (``commit_interval_s`` > 0) its committer on the run's event loop.

    The crash points: the target's ``commit_once`` (the one call that makes
    the commit) is wrapped, per sink, so the process dies with the batches'
    files written and never committed ("before"), or with them in the
    target and no position committed ("after"): :class:`SinkDied` then, and
    whatever waits on the commit in the process is dead with it.

    The committer: PaimonSink's committer is a thread, which cannot run on
    the run's virtual time; here it is a task on the event loop doing what
    ``PaimonSink._commit_loop`` does (the same ``_wait_due`` conditions: a
    commit credit, the gather time, the batches of the step still open, at
    most one interval) and committing with the sink's own
    ``_commit_reporting``: the batches queued meanwhile, of every member of
    the process, go into one commit, judged by the sink's own
    ``_commit_attempt``. A dead process's committer stops with it
    (:meth:`kill`): what it had queued is never committed."""

    def __init__(self, warehouse: str, table: str, hooks: CommitHooks, *,
                 commit_interval_s: float = 0.0, plant: str | None = None) -> None:
        # Built inline (no committer thread); a batched sink's committer is
        # the task started below.
        super().__init__(warehouse, table, commit_interval_s=0)
        self.plant = plant
        if plant == "sink_kinds_dropped":
            self.target = _KindsDropped.open(warehouse, table)
        if plant == "sink_marks_any_table":
            self.target = _AnySource.open(warehouse, table)
        self.hooks = hooks
        self.dead = False
        self.two_owners_in_a_commit = 0  # commits writing two epochs of one shard
        self._attempt: tuple[list[Any], list[Any]] | None = None
        self._last_verdicts: list[Any] = []
        real = self.target.commit_once

        def commit_once(*args: Any, **kwargs: Any) -> bool:
            assert self._attempt is not None
            pending, verdicts = self._attempt
            refused = {id(p) for p, _v in verdicts}
            writes = [p for p in pending if id(p) not in refused]
            point = hooks.point(writes)
            if point == "before":
                self._die(point)
                raise SinkDied("killed with the batches' files written, before the commit")
            done: bool = real(*args, **kwargs)
            if done:
                self._committed(writes)
            if done and point == "after":
                self._die(point)
                raise SinkDied("killed after the target commit, before the positions'")
            return done

        self.target.commit_once = commit_once  # type: ignore[method-assign]
        self._task: asyncio.Task[None] | None = None
        self._changed: asyncio.Event | None = None
        if commit_interval_s > 0:
            self.commit_interval_s = commit_interval_s
            self._inline = None  # seal queues for the committer (PaimonSink.seal)
            self._changed = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(
                self._commit_loop_on_the_loop(), name="sim-sink-committer")

    # -- the process dies

    def _die(self, point: str) -> None:
        self.hooks.die(point)
        self.kill()

    def kill(self) -> None:
        """The process died: its committer with it, its queue lost."""
        self.dead = True
        self._closed = True
        self._queue = []
        if self._task is not None:
            self._task.cancel()

    def holds_newer(self, group: str, shard: int, epoch: int) -> bool:
        """Whether a batch of ``shard`` of a later epoch is open (parts
        written) or queued in this sink."""
        return any(p.group == group and p.shard == shard and p.epoch > epoch
                   for p in [*self._open.values(), *self._queue])

    def _committed(self, writes: list[Any]) -> None:
        self.hooks.committed(writes)

    # -- the commit, judged and made by PaimonSink

    def _commit(self, pending: list[Any]) -> None:
        epochs: dict[tuple[str, int], set[int]] = defaultdict(set)
        for p in pending:
            epochs[(p.group, p.shard)].add(p.epoch)
        if any(len(e) > 1 for e in epochs.values()):
            self.two_owners_in_a_commit += 1
        self._last_verdicts = []
        super()._commit(pending)
        for p, verdict in self._last_verdicts:
            self.hooks.judged(p, verdict)

    def _commit_attempt(self, pending: list[Any], verdicts: list[Any]) -> bool:
        self._attempt = (pending, verdicts)
        try:
            done: bool = self._judged_together(pending, verdicts) \
                if self.plant == "sink_queue_same_marks" \
                else super()._commit_attempt(pending, verdicts)
        finally:
            self._attempt = None
        self._last_verdicts = list(verdicts)
        return done

    def _judged_together(self, pending: list[Any], verdicts: list[Any]) -> bool:
        """Planted (C5 reverted): every queued batch judged against the marks
        of the snapshot read, none against those the batches before it in
        the queue leave (the sink's attempt before the fix; each shard's
        mark in the commit the last batch's)."""
        from paimon_group.sink.marks import (
            NONCE_PROPERTY,
            GroupMarks,
            ShardMark,
            encode,
            judge,
            property_key,
        )

        latest, stored = self.target.marks_at_latest()
        read = {g: self.target.decoded(g, v) for g, v in stored.items()}
        writes = []
        verdicts.clear()
        for p in pending:
            marks = read.get(p.group, GroupMarks())
            verdict = judge(marks.for_batch(p.source).get(p.shard), first=p.first,
                            epoch=p.epoch, incarnation=p.incarnation,
                            full_scan=p.full_scan, start_moves=p.start_moves)
            (writes if verdict.kind == "write" else verdicts).append((p, verdict))
        if not writes:
            return True
        nonce = uuid.uuid4().hex
        properties = {property_key(g): v for g, v in stored.items()}
        for group in {p.group for p, _v in writes}:
            ours = {p.shard: ShardMark(p.epoch, p.next_snapshot, p.incarnation, p.start_moves)
                    for p, _v in writes if p.group == group}
            source = next(p.source for p, _v in reversed(writes) if p.group == group)
            marks = read.get(group, GroupMarks()).written(source, ours)
            properties[property_key(group)] = encode(marks.shards, marks.source)
        properties[NONCE_PROPERTY] = nonce
        if not self.target.commit_once([m for p, _v in writes for m in p.messages], latest,
                                       properties, self.commit_user,
                                       next(self._identifiers), nonce):
            return False
        self.commits += 1
        for p, _v in writes:
            p.finish()
        return True

    def write(self, rows: Any, batch: Any) -> None:
        if self.plant == "sink_first_part_only" and id(batch) in self._open:
            return  # planted: a later part of the batch is lost
        super().write(rows, batch)
        self._wake()

    # -- the committer, on the event loop

    def seal(self, batch: Any) -> Any:
        sealed = super().seal(batch)
        self._wake()
        return sealed

    def drop(self, batch: Any) -> None:
        super().drop(batch)
        self._wake()

    def _wake(self) -> None:
        if self._changed is not None:
            self._changed.set()

    async def _changes(self, timeout: float | None) -> None:
        """Until the queue or the open batches change (``_cond.wait``)."""
        assert self._changed is not None
        self._changed.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout)

    async def _commit_loop_on_the_loop(self) -> None:
        """``PaimonSink._commit_loop`` and its ``_wait_due``, on virtual time
        (the loop's clock)."""
        clock = asyncio.get_running_loop().time
        while True:
            while not self._queue and not self._closed:
                await self._changes(None)
            if not self._queue:
                return
            first = clock()
            while not self._closed:
                rows = sum(p.rows for p in self._queue)
                now = clock()
                short = 1.0 - self._credit_at(now)
                due = max(now + short * self.commit_interval_s if short > 0 else now,
                          first + GATHER_S)
                if rows >= self.commit_rows:
                    break
                if now < due:
                    await self._changes(due - now)
                elif (self._writing or self._open) and now < first + self.commit_interval_s:
                    await self._changes(first + self.commit_interval_s - now)
                else:
                    break
            if self.dead:
                return
            pending, self._queue = self._queue, []
            self._commit_reporting(pending)
            now = clock()
            self._credit = self._credit_at(now) - 1.0
            self._last_commit = now

    def close(self, timeout: float | None = None) -> None:
        super().close(timeout)
        if self._task is not None:
            self._task.cancel()


class _KindsDropped(TargetTable):
    """Planted (C4 reverted): the output's ``_row_kind`` dropped before the
    rows are shaped for the target, every row written as an insert (and a
    batch that read retractions not refused)."""

    def conform(self, rows: pa.Table, batch: Any) -> pa.Table:
        if ROW_KIND in rows.column_names:
            rows = rows.drop_columns([ROW_KIND])
        return super().conform(rows, _NoRetractions(batch))


class _AnySource(TargetTable):
    """Planted (C1 reverted): every group's marks read without their source
    (as marks of format 1): they hold for the batches of any source, a
    re-created table's or a group's of another shard count."""

    def decoded(self, group: str, value: str) -> Any:
        from paimon_group.sink.marks import GroupMarks

        return GroupMarks(shards=super().decoded(group, value).shards)


class _NoRetractions:
    def __init__(self, batch: Any) -> None:
        self.snapshot_id = batch.snapshot_id
        self.retractions = 0


@dataclass(frozen=True)
class SinkPlan:
    on: bool
    target: str  # one of TARGETS
    crash_rate: float  # per batch written during the chaos, split between the two points

    @classmethod
    def draw(cls, seed: int) -> SinkPlan:
        rng = random.Random(f"sink:{seed}")
        on = rng.random() < 1 / 3
        target = rng.choice(TARGETS)
        return cls(on, target, rng.choice([0.04, 0.1, 0.2]))

    @property
    def pk(self) -> bool:
        return self.target.startswith("pk")

    @property
    def partitioned(self) -> bool:
        return self.target.endswith("partitioned")


PK_KIND_COLUMN = "rk"
"""A primary-key target's ``'rowkind.field'`` (the sink fills it from
``_row_kind``); an append target records kinds in its column ``_row_kind``
(:data:`paimon_group.sink.kinds.ROW_KIND`), as the sink's contract says."""


def kind_column(plan: SinkPlan) -> str:
    """The target's column holding each row's kind (with row kinds)."""
    return PK_KIND_COLUMN if plan.pk else ROW_KIND


def _schema(plan: SinkPlan, row_kinds: bool) -> pa.Schema:
    fields = [pa.field("id", pa.int64(), nullable=False), pa.field("v", pa.int64()),
              pa.field("extra", pa.int64())]
    if row_kinds:
        fields.append(pa.field(kind_column(plan), pa.string()))
    if plan.partitioned:
        fields.append(pa.field("p", pa.int64(), nullable=False))
    if plan.pk:
        fields.append(pa.field("seq", pa.int64()))
    return pa.schema(fields)


class SinkWorld:
    """The run's target table and its members' sinks (one per incarnation)."""

    def __init__(self, plan: SinkPlan, seed: int, root: Path, row_kinds: bool = False,
                 plant: str | None = None) -> None:
        from tests.support.tables import _create

        self.plan = plan
        self.seed = seed
        self.plant = plant
        self.warehouse = str(root / "out")
        # ``row_kinds``: the target records each row's kind (a primary-key
        # target in its 'rowkind.field' ``rk``, an append target in
        # ``_row_kind``), for a source with deletes (tests/sim/afterlife.py);
        # this run's own rows carry none: the sink writes them as inserts.
        self.row_kinds = row_kinds
        options = {"bucket": "2", "sequence.field": "seq"} if plan.pk else {"bucket": "-1"}
        if row_kinds and plan.pk:
            options["rowkind.field"] = PK_KIND_COLUMN
        keys = (["p", "id"] if plan.partitioned else ["id"]) if plan.pk else []
        _create(self.warehouse, TABLE, _schema(plan, row_kinds), primary_keys=keys,
                options=options,
                partition_keys=["p"] if plan.partitioned else [])
        self.sinks: dict[int, SimSink] = {}
        self.stats: Counter[str] = Counter()
        # The ids of batches the sink answered AlreadyWritten (not written),
        # and of those it committed.
        self.not_written: set[int] = set()
        self.written: set[int] = set()
        # Rows (id, v) written by the members started again on a re-created
        # table (tests/sim/afterlife.py, checked there).
        # (each with the lives of the groups that wrote it).
        self.foreign: dict[tuple[int, int], set[tuple[str, int]]] = defaultdict(set)
        # Each batch's output ids, by the batch (kept alive while the run is).
        self._ids: dict[int, tuple[Any, list[int]]] = {}
        # Each batch's last delivery record (the run's), marked
        # "already_written" when the sink refuses the batch as written.
        self._records: dict[int, dict[str, Any]] = {}
        self.armed: Callable[[], bool] = lambda: False  # crashes come in the chaos only

    def close(self) -> None:
        """Close every member's sink (each leaves the process's registry)."""
        for sink in self.sinks.values():
            sink.close(timeout=5)
        self._ids.clear()
        self._records.clear()

    def ids_of(self, batch: Any) -> list[int]:
        return self._ids.get(id(batch), (None, []))[1]

    def refused(self, batch: Any) -> None:
        """The sink answered ``batch`` "already written": none of its rows
        written, the member commits the sink's mark instead of the batch's
        next snapshot (:func:`tests.support.checker.unexplained_duplicates`)."""
        record = self._records.get(id(batch))
        if record is not None:
            record["already_written"] = True

    def _sink(self, number: int, die: Callable[[], None]) -> SimSink:
        sink = self.sinks.get(number)
        if sink is None:
            sink = self.sinks[number] = SimSink(self.warehouse, TABLE,
                                                _RunHooks(self, number, die),
                                                plant=self.plant)
        return sink

    def crash_point(self, number: int, batch: Any) -> str | None:
        """Where (if anywhere) this incarnation dies committing ``batch``."""
        if not self.armed():
            return None
        rng = random.Random(f"sink-crash:{self.seed}:{number}:{batch.shard}:"
                            f"{batch.snapshot_id}:{batch.epoch}")
        r = rng.random()
        if r < self.plan.crash_rate / 2:
            return "before"
        if r < self.plan.crash_rate:
            return "after"
        return None

    def write(self, number: int, rows: pa.Table, batch: Any, die: Callable[[], None],
              record: dict[str, Any] | None = None) -> None:
        """Write ``rows`` as ``batch``'s output through incarnation
        ``number``'s sink (its files; the member commits them once the
        handler returned); ``die`` kills the incarnation at its sink's crash
        points (:class:`SimSink`); ``record``: the batch's delivery record."""
        sink = self._sink(number, die)
        out = rows.select([c for c in ("id", "v", "extra") if c in rows.column_names])
        if self.plan.partitioned:
            out = out.append_column("p", pa.array(
                [i % PARTS for i in out.column("id").to_pylist()], pa.int64()))
        self._ids.setdefault(id(batch), (batch, []))[1].extend(out.column("id").to_pylist())
        if record is not None:
            self._records[id(batch)] = record
        try:
            sink.write(out, batch)
        except AlreadyWritten:
            self.stats["sink_already_written"] += 1
            self.not_written.update(out.column("id").to_pylist())
            self.refused(batch)
            raise
        except StaleSinkWrite:
            self.stats["sink_stale_refused"] += 1
            raise


    # -- the oracle

    def read(self) -> pa.Table:
        from tests.support.tables import open_table

        table = open_table(self.warehouse, TABLE)
        builder = table.new_read_builder()
        return builder.new_read().to_arrow(builder.new_scan().plan().splits())

    def check(self, run: Run, expected: set[int]) -> dict[str, list[str]]:
        """The target against the deliveries and ``expected`` (the ids the
        run's checker expects delivered; empty for a dropped table)."""
        out = self.read()
        rows = list(zip(out.column("id").to_pylist(), out.column("v").to_pylist(),
                        strict=True))
        delivered = {(i, v) for d in run.deliveries for i, v in zip(d["ids"], d["vs"],
                                                                  strict=True)}
        # The rows of the members started again on the re-created table are
        # not this run's, but those this run's members delivered too (they read
        # the re-created table before they noticed it was): such a row may be
        # in the target once more per life of a later group that wrote it.
        rows = [r for r in rows if r not in self.foreign or r in delivered]
        self.stats["sink_target_rows"] += len(rows)
        self.stats["sink_commits"] += sum(s.commits for s in self.sinks.values())
        found: dict[str, list[str]] = defaultdict(list)
        lives, rescanned = self._lives(run), self._rescanned(run)

        def copies(r: tuple[int, int]) -> int:
            return len(lives.get(r, ())) + rescanned[r] + len(self.foreign.get(r, ()))

        twice = sorted(r for r, n in Counter(rows).items() if n > copies(r))
        for r, n in Counter(rows).items():
            if n > 1 and n <= copies(r):
                self.stats["sink_rows_again_new_group" if rescanned[r] == 0
                           else "sink_rows_again_rescanned"] += 1
        if twice:
            found["sink_duplicate"].append(
                f"{len(twice)} rows (id, v) twice or more in the {self.plan.target} target, "
                f"e.g. {twice[:8]}")
        unreal = sorted(set(rows) - delivered)
        if unreal:
            found["sink_unreal"].append(f"{len(unreal)} rows in the target never delivered, "
                                        f"e.g. {unreal[:8]}")
        have: dict[int, set[int]] = defaultdict(set)
        for i, v in rows:
            have[i].add(v)
        missing = expected - set(have)
        missing -= set(run.excused(missing))
        missing -= self._lost_before_the_mark(run, missing)
        if missing:
            found["sink_missing"].append(
                f"{len(missing)} expected ids not in the {self.plan.target} target, e.g. "
                f"{sorted(missing)[:10]}{self._why(run, sorted(missing)[:3])}")
        found["sink_value"].extend(self._values(run, expected, have))
        return found

    def _lost_before_the_mark(self, run: Run, missing: set[int]) -> set[int]:
        """Ids the target lacks because a snapshot that carried them expired
        (``--on-data-loss skip``) before their shard read them, in the life of
        the group whose marks the target holds: a later life that delivered
        them again (a group re-created after its consumer files expired, its
        full scan of the earliest snapshot left) had that scan answered
        "already written" (its position is behind the shard's mark), so the
        sink never wrote them. Excused when every delivery of the id went to
        the sink in a batch it did not write, and a snapshot that carried it
        expired (seed 311532)."""
        if run.expiry.on_data_loss != "skip" or not missing:
            return set()
        out = set()
        for i in (missing & self.not_written) - self.written:
            if any(s in run.wh.expired_at for s, _v in run.wh.versions.get(i, [])):
                out.add(i)
        self.stats["sink_rows_lost_before_the_mark"] += len(out)
        return out

    @staticmethod
    def _lives(run: Run) -> dict[tuple[int, int], set[int]]:
        """Each delivered row's lives of the group: a group created anew with
        no consumer file of it left (a switch or wipe) is a new consumer that
        starts as configured, and writes its full scan again."""
        forgotten = [n for k, (_s, mirrored, n) in enumerate(run.eras)
                     if not run.files_left(k, mirrored)]
        out: dict[tuple[int, int], set[int]] = defaultdict(set)
        for d in run.deliveries:
            life = sum(1 for n in forgotten if d["pid"] >= n)
            for row in zip(d["ids"], d["vs"], strict=True):
                out[row].add(life)
        return out

    @staticmethod
    def _rescanned(run: Run) -> Counter[tuple[int, int]]:
        """How often each row was delivered by a full scan that replaced an
        expired one (``--on-data-loss skip``: a pending full scan scanned at
        the earliest snapshot instead, or the group's start moved): the
        replacement, another batch of the source, is written whole, and it
        holds rows the target may have from the expired scan or its deltas."""
        from tests.support import checker

        history = run.history()
        snapshots = checker.moved_start_scans(history) | {
            e["earliest"] for e in history.events if e.get("event") == "skip"
            and e.get("full_scan") and e.get("earliest") is not None}
        out: Counter[tuple[int, int]] = Counter()
        for d in run.deliveries:
            if d["kind"] == "initial" and d["snapshot"] in snapshots:
                out.update(zip(d["ids"], d["vs"], strict=True))
        return out

    def _values(self, run: Run, expected: set[int], have: dict[int, set[int]]) -> list[str]:
        from tests.sim.table import PK_KINDS

        if run.kind not in PK_KINDS or run.kind == "first-row":
            return []
        oracle = run.oracle()
        bad = []
        for i in sorted(expected & set(have)):
            snapshot, want = run.wh.versions[i][-1]
            if want in have[i]:
                continue
            if run.excuse(oracle, i, [snapshot]) is not None:
                continue
            if (run.expiry.on_data_loss == "skip" and snapshot in run.wh.expired_at
                    and i in self.not_written):
                # As _lost_before_the_mark, for a key's latest version: its
                # write lost (a crash before the target's commit), its
                # snapshot expired before it was read again, and a later
                # life's full scan holding it answered "already written"
                # (seed 564249).
                self.stats["sink_versions_lost_before_the_mark"] += 1
                continue
            bad.append(f"key {i}: the target holds v={sorted(have[i])}, not its latest "
                       f"version v={want} (versions {run.wh.versions[i]})")
        return bad[:10]

    def _why(self, run: Run, ids: list[int]) -> str:
        """What the deliveries and the marks say of ``ids`` (to classify)."""
        notes = []
        for i in ids:
            ds = [f"{d['member']}#{d['pid']} shard {d['shard']} ep {d['epoch']} "
                  f"snap {d['snapshot']}->{d['next_snapshot']}"
                  for d in run.deliveries if i in d["ids"]]
            notes.append(f"id {i} delivered by {ds[:4]}")
        marks = next(iter(self.sinks.values())).marks("g") if self.sinks else {}
        return f"; {'; '.join(notes)}; marks {marks}"


class _RunHooks(CommitHooks):
    """The main run's hooks for incarnation ``number``'s sink."""

    def __init__(self, world: SinkWorld, number: int, die: Callable[[], None]) -> None:
        self.world = world
        self.number = number
        self._die = die

    def point(self, writes: list[Any]) -> str | None:
        points = {self.world.crash_point(self.number, p.batch) for p in writes}
        return "before" if "before" in points else "after" if "after" in points else None

    def die(self, point: str) -> None:
        self.world.stats[f"sink_crash_{point}_commit"] += 1
        self._die()

    def committed(self, writes: list[Any]) -> None:
        for p in writes:
            self.world.stats["sink_batches_written"] += 1
            self.world.written.update(self.world.ids_of(p.batch))

    def judged(self, pending: Any, verdict: Any) -> None:
        kind = getattr(verdict, "kind", None)
        if kind == "already":
            self.world.stats["sink_already_written"] += 1
            self.world.not_written.update(self.world.ids_of(pending.batch))
            self.world.refused(pending.batch)
        elif kind == "stale":
            self.world.stats["sink_stale_refused"] += 1
