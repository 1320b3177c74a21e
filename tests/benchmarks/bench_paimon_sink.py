"""(15) The Paimon sink: rows per second into a Paimon table through
:class:`~paimon_group.sink.PaimonSink` vs plain pypaimon batch writes of the
same rows, side by side in one run; and the target's snapshots per minute at
the defaults while batches keep arriving.

Both targets have the columns ``id``, ``v``, ``payload``: a **primary-key**
target (4 buckets, key ``id``, ``'sequence.field' = 'seq'``, a fourth column
the sink fills with the batch's source snapshot) and an **append** target
(Paimon's default: no ``bucket`` option). Every repeat writes into fresh
tables, so both sides start from the same (empty) target.

* **plain pypaimon**: the rows of each batch (``seq`` already filled on the
  primary-key target) written and committed alone, one
  ``new_batch_write_builder()`` write + commit per batch, batch after batch
  in one thread, in the order the sink receives them: a snapshot per batch.
* **sink**: 4 shards, each delivering its batches in snapshot order; the
  batches of one step (one per shard) written at once by 4 threads, as a
  member's parallel handlers call ``sink.write``, the next step when all 4
  returned (a member delivers a shard's next batch once the last one is
  committed). One sink, default commit interval (1 s): its committer makes
  one target commit per interval at most, holding the step's 4 batches.
* **sink, interval 0**: the same, each write committed at once in its
  caller's thread (a snapshot per batch, as plain pypaimon): the sink's own
  cost (conform, marks, judging, the pinned commit) without the interval.

Rows per second are the rows over the time from the first write to the last
``write`` returned; median of the repeats, the sides alternating. A step of
4 batches takes at least one commit interval through the sink at the
defaults, so small steps are bounded by ``4 x rows per batch / interval``:
the figure for small batches shows that bound, the large-batch figure is the
one judged against the goal (0.9x).

**A member draining a backlog, and in steady state** (the figures judged
against the goal, >= 0.9x): one real member (``GroupMember``, the embedded
SQLite coordinator, 8 shards, ``start="earliest"``, its default parallel
handlers) reads a primary-key source of 8 buckets and writes every batch
into a fresh target, either through one ``PaimonSink`` at the defaults or
with plain pypaimon (one write and commit per batch, in the handler), the
two sides one after the other with the same source. *Drain*: 40 snapshots
of 3,000 rows written before the member starts; the time from the member's
start until the target holds every row. *Steady state*: a writer commits a
snapshot of 1,000 rows every 100 ms for 15 s (6 s with ``--quick``) while
the member runs; the time from the writer's start until the target holds
every row it wrote. The ratio is plain's time over the sink's; the target's
snapshots are counted too.

**Snapshots per minute**: one sink at the defaults, 4 shards each delivering
a batch every 100 ms (a thread per shard, 500 rows a batch) for 20 s (8 s
with ``--quick``); the target's snapshots over the run, per minute, against
the bound of about one per commit interval for this one member (60/min).
"""

from __future__ import annotations

import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from paimon_group.reading.planner import BatchKind
from paimon_group.sink import COMMIT_INTERVAL_S
from paimon_group.sink.paimon import COMMIT_BURST
from tests.benchmarks.common import Context, Figure

TITLE = "paimon-sink"
SHARDS = 4
SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("v", pa.int64()),
                    pa.field("payload", pa.string())])
SEQ = "seq"


@dataclass
class _Batch:
    """What the sink reads of a ShardBatch."""

    shard: int
    first_snapshot: int
    group: str = "bench"
    epoch: int = 1
    kind: BatchKind = BatchKind.DELTA

    @property
    def snapshot_id(self) -> int:
        return self.first_snapshot

    @property
    def next_snapshot(self) -> int:
        return self.first_snapshot + 1


def _create(wh: str, name: str, pk: bool) -> Any:
    from tests.support.tables import _create as create

    if pk:
        schema = pa.schema([*SCHEMA, pa.field(SEQ, pa.int64())])
        return create(wh, name, schema, primary_keys=["id"],
                      options={"bucket": "4", "sequence.field": SEQ})
    return create(wh, name, SCHEMA, primary_keys=[], options={})


def _rows(first_id: int, count: int) -> pa.Table:
    filler = "x" * 28
    return pa.table({
        "id": pa.array(range(first_id, first_id + count), pa.int64()),
        "v": pa.array([1] * count, pa.int64()),
        "payload": pa.array([f"{i:012d}{filler}" for i in range(first_id, first_id + count)]),
    }, schema=SCHEMA)


def _steps(batches: int, rows: int) -> list[list[tuple[_Batch, pa.Table]]]:
    """``batches`` steps of one batch per shard (source snapshot = step + 1)."""
    out = []
    for step in range(batches):
        out.append([(_Batch(shard, step + 1),
                     _rows((step * SHARDS + shard) * rows, rows)) for shard in range(SHARDS)])
    return out


def _plain(table: Any, steps: list[list[tuple[_Batch, pa.Table]]], pk: bool) -> float:
    """Seconds to write and commit every batch alone, one after the other."""
    began = time.monotonic()
    for step in steps:
        for batch, rows in step:
            _plain_write(table, rows, batch.snapshot_id if pk else None)
    return time.monotonic() - began


def _plain_write(table: Any, rows: pa.Table, snapshot_id: int | None) -> None:
    """One plain pypaimon write and commit of ``rows`` (``snapshot_id``: the
    primary-key target's sequence column filled with it)."""
    if snapshot_id is not None:
        rows = rows.append_column(SEQ, pa.array([snapshot_id] * rows.num_rows, pa.int64()))
    builder = table.new_batch_write_builder()
    write, commit = builder.new_write(), builder.new_commit()
    try:
        write.write_arrow(rows)
        commit.commit(write.prepare_commit())
    finally:
        write.close()
        commit.close()


def _through_sink(sink: Any, steps: list[list[tuple[_Batch, pa.Table]]]) -> float:
    """Seconds to deliver every step through ``sink``, a thread per shard."""
    with ThreadPoolExecutor(SHARDS) as pool:
        began = time.monotonic()
        for step in steps:
            list(pool.map(lambda item: sink.write(item[1], item[0]), step))
        return time.monotonic() - began


def _rate(wh: str, name: str, pk: bool, steps: list[list[tuple[_Batch, pa.Table]]],
          side: str) -> tuple[float, int]:
    """Rows per second of one side into a fresh target, and its snapshots."""
    from paimon_group.sink import PaimonSink
    from tests.support.tables import latest_snapshot_id

    table = _create(wh, name, pk)
    rows = sum(r.num_rows for step in steps for _, r in step)
    if side == "plain":
        seconds = _plain(table, steps, pk)
    else:
        interval = 0.0 if side == "sink0" else COMMIT_INTERVAL_S  # the default
        with PaimonSink(wh, name, commit_interval_s=interval) as sink:
            seconds = _through_sink(sink, steps)
    return rows / seconds, latest_snapshot_id(wh, name) or 0


def _compare(wh: str, pk: bool, batches: int, rows: int, repeats: int
             ) -> dict[str, Any]:
    steps = _steps(batches, rows)
    rates: dict[str, list[float]] = {"plain": [], "sink": [], "sink0": []}
    snapshots: dict[str, int] = {}
    kind = "pk" if pk else "ap"
    for r in range(repeats):
        for side in (("plain", "sink", "sink0") if r % 2 == 0 else ("sink0", "sink", "plain")):
            rate, snaps = _rate(wh, f"db.{kind}_{side}_{rows}_{r}", pk, steps, side)
            rates[side].append(rate)
            snapshots[side] = snaps
    return {"rates": rates, "snapshots": snapshots,
            "median": {k: statistics.median(v) for k, v in rates.items()}}


def _snapshots_per_minute(wh: str, seconds: float) -> tuple[float, int, float, int]:
    """Snapshots per minute of a target fed by 4 shards, a batch every 100 ms each."""
    from paimon_group.sink import PaimonSink
    from tests.support.tables import latest_snapshot_id

    name = "db.steady"
    _create(wh, name, True)
    stop = threading.Event()
    written = [0] * SHARDS

    def shard_loop(shard: int, sink: Any) -> None:
        snapshot = 1
        while not stop.is_set():
            due = time.monotonic() + 0.1
            sink.write(_rows((snapshot * SHARDS + shard) * 500, 500), _Batch(shard, snapshot))
            written[shard] += 1
            snapshot += 1
            time.sleep(max(0.0, due - time.monotonic()))

    with PaimonSink(wh, name) as sink:
        threads = [threading.Thread(target=shard_loop, args=(s, sink)) for s in range(SHARDS)]
        began = time.monotonic()
        for t in threads:
            t.start()
        time.sleep(seconds)
        stop.set()
        for t in threads:
            t.join()
        elapsed = time.monotonic() - began
        commits = sink.commits
    snapshots = latest_snapshot_id(wh, name) or 0
    assert snapshots == commits, (snapshots, commits)
    return snapshots / elapsed * 60.0, snapshots, elapsed, sum(written)


def _figures(label: str, result: dict[str, Any], batches: int, rows: int,
             judged: bool) -> list[Figure]:
    med: dict[str, float] = result["median"]
    details = {"rows_per_s": {k: [round(x) for x in v] for k, v in result["rates"].items()},
               "snapshots": result["snapshots"], "batches": batches * SHARDS,
               "rows_per_batch": rows}
    note = (f"{med['sink']:,.0f} vs {med['plain']:,.0f} rows/s; snapshots "
            f"{result['snapshots']['sink']} vs {result['snapshots']['plain']}")
    bound = SHARDS * rows / COMMIT_INTERVAL_S
    out = [Figure(
        TITLE, f"{label}, {SHARDS} shards x {batches} batches of {rows:,} rows: "
        "sink (default interval) / plain pypaimon",
        round(med["sink"] / med["plain"], 2), "x",
        target=">= 0.9" if judged else f"(bound {bound:,.0f} rows/s: 4 batches per interval)",
        met=med["sink"] / med["plain"] >= 0.9 if judged else None,
        details={**details, "note": note}),
        Figure(TITLE, f"{label}, {rows:,} rows a batch: sink (interval 0) / plain pypaimon",
               round(med["sink0"] / med["plain"], 2), "x", target=None, met=None,
               details={**details, "note": f"{med['sink0']:,.0f} vs {med['plain']:,.0f} rows/s"})]
    return out


def run(ctx: Context) -> list[Figure]:
    repeats = 1 if ctx.quick else 3
    # (batches per shard, rows per batch): pypaimon writes a primary-key
    # table row by row in Python (about 25,000 rows/s here), an append
    # table with Arrow (about 1 M rows/s): the large steps take at least a
    # commit interval to write on both.
    sizes = {True: ((2, 10_000), (2, 1_000)) if ctx.quick else ((3, 25_000), (3, 2_000)),
             False: ((3, 50_000), (3, 2_000)) if ctx.quick else ((5, 250_000), (5, 10_000))}
    steady_s = 8.0 if ctx.quick else 20.0
    wh = str(ctx.scratch("paimon-sink") / "wh")
    figures: list[Figure] = []
    for pk, label in ((True, "primary-key target"), (False, "append target")):
        large, small = sizes[pk]
        for (batches, rows), judged in ((large, True), (small, False)):
            result = _compare(wh, pk, batches, rows, repeats)
            figures += _figures(label, result, batches, rows, judged)
    figures += _member_figures(str(ctx.scratch("paimon-sink-member")), ctx.quick)
    per_minute, snapshots, elapsed, batches_written = _snapshots_per_minute(wh, steady_s)
    # One per interval, and the credits a quiet sink starts with.
    bound = int(elapsed // COMMIT_INTERVAL_S) + COMMIT_BURST
    figures.append(Figure(
        TITLE, f"target snapshots per minute at the defaults ({SHARDS} shards, a batch every "
        f"100 ms each, {elapsed:.1f} s: {batches_written} batches, {snapshots} snapshots)",
        round(per_minute, 1), "/min",
        target=f"<= {bound / elapsed * 60:.1f} (one per {COMMIT_INTERVAL_S:g} s interval "
        f"and {COMMIT_BURST} credits: {bound} snapshots)", met=snapshots <= bound))
    return figures


# -- a real member: drain and steady state ---------------------------------------

DRAIN_SNAPSHOTS, DRAIN_ROWS = 40, 3_000
STEADY_ROWS, STEADY_EVERY_S = 1_000, 0.1


def _target_rows(table: Any) -> int:
    """Rows the target's latest snapshot holds (every id is written once)."""
    latest = table.snapshot_manager().get_latest_snapshot()
    return 0 if latest is None else int(latest.total_record_count or 0)


def _member_side(wh: str, source: str, side: str, pk: bool, expected: Any,
                 writer: Any = None) -> tuple[float, int]:
    """Seconds from the member's start (or the writer's) until the target
    holds ``expected()`` rows, and the target's snapshots."""
    import asyncio

    from paimon_group import GroupMember, MemberConfig
    from paimon_group.sink import PaimonSink
    from tests.support.tables import open_table

    name = f"db.{'pk' if pk else 'ap'}_{side}_{source.split('.')[1]}"
    _create(wh, name, pk)
    table = open_table(wh, name)
    sink = PaimonSink(wh, name) if side == "sink" else None

    def handle(batch: Any) -> None:
        rows = batch.to_arrow().select(["id", "v", "payload"])
        if sink is not None:
            sink.write(rows, batch)
            return
        _plain_write(table, rows, batch.snapshot_id if pk else None)

    async def go() -> float:
        config = MemberConfig(group=f"bench-{name.split('.')[1]}", warehouse=wh, table=source,
                              coordinator=f"sqlite://{wh}/{name}.sqlite", member_id="m",
                              start="earliest", poll_interval_ms=50)
        began = time.monotonic()
        async with GroupMember(config) as member:
            run = asyncio.ensure_future(member.run(handle))
            feeding = asyncio.ensure_future(asyncio.to_thread(writer)) if writer else None
            if feeding is not None:
                began = time.monotonic()
            try:
                while feeding is None or not feeding.done():
                    await asyncio.sleep(0.05)
                    if feeding is None and _target_rows(table) >= expected():
                        break
                while _target_rows(table) < expected():
                    if run.done():
                        run.result()
                    await asyncio.sleep(0.02)
                return time.monotonic() - began
            finally:
                run.cancel()

    try:
        seconds = asyncio.run(go())
    finally:
        if sink is not None:
            sink.close()
    latest = table.snapshot_manager().get_latest_snapshot()
    return seconds, 0 if latest is None else int(latest.id)


def _member_figures(wh: str, quick: bool) -> list[Figure]:
    from tests.benchmarks.common import commit_rows, fill_table, rows_for
    from tests.support.tables import open_table

    steady_s = 6.0 if quick else 15.0
    out: list[Figure] = []
    for pk in (True, False):
        kind = "primary-key" if pk else "append"
        drain = f"db.drain_{'pk' if pk else 'ap'}"
        fill_table(wh, drain, buckets=8, snapshots=DRAIN_SNAPSHOTS,
                   rows_per_snapshot=DRAIN_ROWS)
        total = DRAIN_SNAPSHOTS * DRAIN_ROWS
        times: dict[str, tuple[float, int]] = {}
        for side in ("plain", "sink") if pk else ("sink", "plain"):
            times[side] = _member_side(wh, drain, side, pk, lambda t=total: t)
        ratio = times["plain"][0] / times["sink"][0]
        out.append(Figure(
            TITLE, f"drain, {kind} target: a member (8 shards) from start to a "
            f"{DRAIN_SNAPSHOTS}-snapshot, {total:,}-row backlog in the target: "
            "sink (defaults) / plain pypaimon (write and commit per batch)",
            round(ratio, 2), "x", target=">= 0.9", met=ratio >= 0.9,
            details={"seconds": {k: round(v[0], 2) for k, v in times.items()},
                     "target_snapshots": {k: v[1] for k, v in times.items()}}))
        for side in ("plain", "sink") if pk else ("sink", "plain"):
            source = f"db.steady_{'pk' if pk else 'ap'}_{side}"
            written = [fill_table(wh, source, buckets=8, snapshots=1,
                                  rows_per_snapshot=STEADY_ROWS)]

            def feed(source: str = source, written: list[int] = written) -> None:
                table = open_table(wh, source)
                end = time.monotonic() + steady_s
                while time.monotonic() < end:
                    due = time.monotonic() + STEADY_EVERY_S
                    commit_rows(table, rows_for(written[0], STEADY_ROWS))
                    written[0] += STEADY_ROWS
                    time.sleep(max(0.0, due - time.monotonic()))

            times[side] = _member_side(wh, source, side, pk, lambda w=written: w[0], feed)
        ratio = times["plain"][0] / times["sink"][0]
        out.append(Figure(
            TITLE, f"steady state, {kind} target: a snapshot of {STEADY_ROWS:,} rows every "
            f"{STEADY_EVERY_S * 1000:.0f} ms for {steady_s:g} s, from the writer's start until "
            "the target holds every row: sink (defaults) / plain pypaimon",
            round(ratio, 2), "x", target=">= 0.9", met=ratio >= 0.9,
            details={"seconds": {k: round(v[0], 2) for k, v in times.items()},
                     "target_snapshots": {k: v[1] for k, v in times.items()},
                     "snapshots_per_minute": {k: round(v[1] / v[0] * 60, 1)
                                              for k, v in times.items()}}))
    return out
