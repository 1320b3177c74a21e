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

import contextlib
import random
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from paimon_group.errors import AlreadyWritten, StaleSinkWrite
from paimon_group.sink import PaimonSink

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
    from paimon_group.sink import paimon
    from paimon_group.sink.marks import Verdict

    real = paimon.judge
    paimon.judge = lambda *_a, **_k: Verdict("write")
    try:
        yield
    finally:
        paimon.judge = real


class SinkDied(Exception):
    """The member process died inside the sink's write (a planned crash)."""


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


ROW_KIND_COLUMN = "rk"


def _schema(plan: SinkPlan, row_kinds: bool) -> pa.Schema:
    fields = [pa.field("id", pa.int64(), nullable=False), pa.field("v", pa.int64()),
              pa.field("extra", pa.int64())]
    if row_kinds:
        fields.append(pa.field(ROW_KIND_COLUMN, pa.string()))
    if plan.partitioned:
        fields.append(pa.field("p", pa.int64(), nullable=False))
    if plan.pk:
        fields.append(pa.field("seq", pa.int64()))
    return pa.schema(fields)


class SinkWorld:
    """The run's target table and its members' sinks (one per incarnation)."""

    def __init__(self, plan: SinkPlan, seed: int, root: Path, row_kinds: bool = False) -> None:
        from tests.support.tables import _create

        self.plan = plan
        self.seed = seed
        self.warehouse = str(root / "out")
        # ``row_kinds``: the target records each row's kind in ``rk`` (a
        # primary-key target's ``'rowkind.field'``), for a source with deletes
        # (tests/sim/afterlife.py); this run's own rows are inserts.
        self.row_kinds = row_kinds
        options = {"bucket": "2", "sequence.field": "seq"} if plan.pk else {"bucket": "-1"}
        if row_kinds and plan.pk:
            options["rowkind.field"] = ROW_KIND_COLUMN
        keys = (["p", "id"] if plan.partitioned else ["id"]) if plan.pk else []
        _create(self.warehouse, TABLE, _schema(plan, row_kinds), primary_keys=keys,
                options=options,
                partition_keys=["p"] if plan.partitioned else [])
        self.sinks: dict[int, PaimonSink] = {}
        self.stats: Counter[str] = Counter()
        # The ids of batches the sink answered AlreadyWritten (not written),
        # and of those it committed.
        self.not_written: set[int] = set()
        self.written: set[int] = set()
        # Rows (id, v) written by the members started again on a re-created
        # table (tests/sim/afterlife.py, checked there).
        self.foreign: set[tuple[int, int]] = set()

    def close(self) -> None:
        """Close every member's sink (each leaves the process's registry)."""
        for sink in self.sinks.values():
            sink.close(timeout=5)

    def _sink(self, number: int) -> PaimonSink:
        sink = self.sinks.get(number)
        if sink is None:
            sink = self.sinks[number] = PaimonSink(self.warehouse, TABLE, commit_interval_s=0)
        return sink

    def crash_point(self, number: int, batch: Any, armed: bool) -> str | None:
        """Where (if anywhere) this incarnation dies writing ``batch``."""
        if not armed:
            return None
        rng = random.Random(f"sink-crash:{self.seed}:{number}:{batch.shard}:"
                            f"{batch.snapshot_id}:{batch.epoch}")
        r = rng.random()
        if r < self.plan.crash_rate / 2:
            return "before"
        if r < self.plan.crash_rate:
            return "after"
        return None

    def write(self, number: int, rows: pa.Table, batch: Any, point: str | None,
              die: Callable[[], None]) -> None:
        """Write ``rows`` as ``batch``'s output through incarnation
        ``number``'s sink; ``die`` kills the incarnation at ``point`` (before
        or after the target commit): :class:`SinkDied` then."""
        sink = self._sink(number)
        out = rows.select([c for c in ("id", "v", "extra") if c in rows.column_names])
        if self.plan.partitioned:
            out = out.append_column("p", pa.array(
                [i % PARTS for i in out.column("id").to_pylist()], pa.int64()))
        if self.row_kinds:
            out = out.append_column(ROW_KIND_COLUMN, pa.array(["+I"] * out.num_rows,
                                                              pa.string()))
        target = sink.target
        real = type(target).commit_once

        def commit_once(*args: Any, **kwargs: Any) -> bool:
            if point == "before":
                self.stats["sink_crash_before_commit"] += 1
                die()
                raise SinkDied("killed with the batch's files written, before the commit")
            done = real(target, *args, **kwargs)
            if done:
                self.written.update(out.column("id").to_pylist())
            if done and point == "after":
                self.stats["sink_crash_after_commit"] += 1
                die()
                raise SinkDied("killed after the target commit, before the position's")
            return done

        target.commit_once = commit_once  # type: ignore[method-assign]
        try:
            sink.write(out, batch)
            self.stats["sink_batches_written"] += 1
        except AlreadyWritten:
            self.stats["sink_already_written"] += 1
            self.not_written.update(out.column("id").to_pylist())
            raise
        except StaleSinkWrite:
            self.stats["sink_stale_refused"] += 1
            raise
        finally:
            del target.commit_once

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
        delivered_ids = {i for d in run.deliveries for i in d["ids"]}
        rows = [r for r in rows if r not in self.foreign or r[0] in delivered_ids]
        self.stats["sink_target_rows"] += len(rows)
        self.stats["sink_commits"] += sum(s.commits for s in self.sinks.values())
        delivered = {(i, v) for d in run.deliveries for i, v in zip(d["ids"], d["vs"],
                                                                  strict=True)}
        found: dict[str, list[str]] = defaultdict(list)
        lives, rescanned = self._lives(run), self._rescanned(run)

        def copies(r: tuple[int, int]) -> int:
            return len(lives.get(r, ())) + rescanned[r]

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
        missing -= set(run._excused(missing))
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
                     if not run._files_left(k, mirrored)]
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
            if run._excuse(oracle, i, [snapshot]) is not None:
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
