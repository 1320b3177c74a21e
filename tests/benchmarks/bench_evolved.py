"""(11) Files of three schema versions, and a partial-update table: the Arrow
read path against pypaimon.

One 8-bucket primary-key table, ``ROWS`` keys written in three commits, each
under another schema: ``(id, v, payload)``, then ``ADD COLUMN extra BIGINT``,
then ``RENAME payload TO body``; then an update commit (a fifth of the keys,
latest schema), so every bucket's full scan merges files of three schemas.
Before the Arrow reader mapped older files by field id, every split of such a
table went to pypaimon's row reader.

The partial-update table (8 buckets, ``ROWS`` keys): three commits of every
key, each setting one of ``v``/``payload`` and leaving the other null, so
every key's fields merge from several records.

Figures in-process, plan excluded on every side, the whole table read in
one call on each: pypaimon ``to_arrow`` of its batch scan's splits (3 times,
median) and, alternated 7 times (median and best), pypaimon's native reader
(``read.native.enabled``, package ``pypaimon-rust``, not a dependency:
``pip install pypaimon-rust`` first, else its figure is blank) on the same
splits, ``ShardPlanner.read_arrow`` of the 8 shards' splits in one call,
the same shard by shard (8 calls, as a member's handler reads a batch per
shard), and the limit, a pyarrow decode of the same data files (every
column, one file after the other). Whether any split fell back to
pypaimon's reader is printed beside them (it must be 0).

Whole process, from the start of a process to its last row, best of
``repeats``: a plain pypaimon script (catalog, plan, ``to_arrow``), the same
with the native reader, and one ``paimon-group run`` member of a new group
(embedded coordinator), whose handler counts the rows of each batch.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

from tests.benchmarks.common import Context, Figure, commit_rows, rows_for

TITLE = "evolved"
TABLE = "db.ev"
PARTIAL = "db.pu"


def _rows(pt: Any, first: int, count: int, v: int) -> pa.Table:
    """Rows of the table's current schema (``extra``/``body`` when it has them)."""
    from pypaimon.schema.data_types import PyarrowFieldParser

    base = rows_for(first, count, v=v)
    schema = PyarrowFieldParser.from_paimon_schema(pt.fields)
    columns = []
    for field in schema:
        if field.name == "extra":
            columns.append(pa.array(range(first, first + count), pa.int64()))
        elif field.name == "body":
            columns.append(base.column("payload"))
        else:
            columns.append(base.column(field.name))
    return pa.Table.from_arrays(columns, schema=schema)


def build_table(wh: str, rows: int) -> int:
    """The table of the module docstring; its latest snapshot id."""
    from pypaimon.schema.data_types import AtomicType
    from pypaimon.schema.schema_change import SchemaChange

    from tests.support.tables import catalog, make_pk_table, open_table

    make_pk_table(wh, TABLE, buckets=8)
    third = rows // 3
    changes = [None, SchemaChange.add_column("extra", AtomicType("BIGINT")),
               SchemaChange.rename_column("payload", "body")]
    for i, change in enumerate(changes):
        if change is not None:
            catalog(wh).alter_table(TABLE, [change])
        pt = open_table(wh, TABLE)
        commit_rows(pt, _rows(pt, i * third, third, v=0))
    pt = open_table(wh, TABLE)
    commit_rows(pt, _rows(pt, 0, 3 * third, v=1).take(pa.array(range(0, 3 * third, 5))))
    return int(pt.snapshot_manager().get_latest_snapshot().id)


def build_partial_update(wh: str, rows: int) -> None:
    """The partial-update table of the module docstring."""
    from tests.support.tables import make_pk_table, open_table

    make_pk_table(wh, PARTIAL, buckets=8, options={"merge-engine": "partial-update"})
    pt = open_table(wh, PARTIAL)
    for v in range(3):
        data = rows_for(0, rows, v=v)
        if v % 2:
            data = data.set_column(1, "v", pa.nulls(rows, pa.int64()))
        else:
            data = data.set_column(2, "payload", pa.nulls(rows, pa.string()))
        commit_rows(pt, data)


def _native_builder(pt: Any) -> tuple[Any, Any] | None:
    """pypaimon's native reader (``read.native.enabled``, from the
    ``pypaimon-rust`` package) on the same table, if installed."""
    try:
        import pypaimon_rust  # noqa: F401
    except ImportError:
        return None
    builder = pt.copy({"read.native.enabled": "true"}).new_read_builder()
    return builder, builder.new_scan().plan().splits()


def _timed(fn: Any) -> tuple[float, Any]:
    started = time.perf_counter()
    result = fn()
    return time.perf_counter() - started, result


def measure(wh: str, repeats: int, name: str = TABLE, alternations: int = 7
            ) -> dict[str, Any]:
    """In-process reads of the whole table, plan excluded on every side:
    pypaimon's reader (``repeats`` times: it takes seconds), then
    ``alternations`` rounds of, one after the other, the native reader, the
    Arrow path, the Arrow path shard by shard, and the pyarrow decode (so a
    change of load on the shared machine hits every side alike).

    The native reader reads the batch scan's splits in one ``to_arrow``; the
    Arrow path the 8 shards' splits in one ``read_arrow`` (the same splits:
    one per bucket); "by shard" is 8 ``read_arrow`` calls one after the other,
    one per shard, as a member's handler gets a batch per shard."""
    import pyarrow.parquet as pq

    from paimon_group.reading.table import ShardedTable
    from tests.support.tables import open_table

    pt = open_table(wh, name)
    table = ShardedTable.open(wh, name)
    planner = table.planner(8)
    shards = list(range(8))
    builder = pt.new_read_builder()
    splits = builder.new_scan().plan().splits()
    latest = int(pt.snapshot_manager().get_latest_snapshot().id)
    step = planner.plan_full(shards, latest)
    every = [s for k in shards for s in step.splits[k]]
    files = [f.physical_path() for s in splits for f in s.files]
    times: dict[str, list[float]] = {"pypaimon": [], "arrow": [], "arrow_by_shard": [],
                                     "decode": []}
    rows: dict[str, int] = {}
    for _ in range(repeats):
        t, out = _timed(lambda: builder.new_read().to_arrow(splits))
        times["pypaimon"].append(t)
        rows["pypaimon"] = out.num_rows
    native = _native_builder(pt)
    for _ in range(alternations):
        if native is not None:
            t, out = _timed(lambda: native[0].new_read().to_arrow(native[1]))
            times.setdefault("native", []).append(t)
            rows["native"] = out.num_rows
        t, out = _timed(lambda: planner.read_arrow(every))
        times["arrow"].append(t)
        rows["arrow"] = out.num_rows
        t, n = _timed(lambda: sum(planner.read_arrow(step.splits[k]).num_rows for k in shards))
        times["arrow_by_shard"].append(t)
        rows["arrow_by_shard"] = n
        t, _ = _timed(lambda: [pq.read_table(f) for f in files])
        times["decode"].append(t)
    assert len(set(rows.values())) == 1, rows
    assert planner.view.read_path is not None
    return {"median_s": {k: statistics.median(v) for k, v in times.items()},
            "best_s": {k: min(v) for k, v in times.items()}, "runs_s": times,
            "rows": rows, "files": len(files), "load_average": os.getloadavg(),
            "fallback_splits": planner.view.read_path.fallback_splits}


_SCRIPT = """
import sys
from pypaimon import CatalogFactory
t = CatalogFactory.create({"warehouse": sys.argv[1]}).get_table(sys.argv[2])
if sys.argv[3] == "native":
    t = t.copy({"read.native.enabled": "true"})
b = t.new_read_builder()
print(b.new_read().to_arrow(b.new_scan().plan().splits()).num_rows)
"""


def _member_seconds(wh: str, name: str, out: Path, rows: int) -> float:
    """One member of a new group, from its start to its last row."""
    repo = Path(__file__).resolve().parents[2]
    out.mkdir(parents=True, exist_ok=True)
    began = time.time()
    proc = subprocess.Popen(
        [sys.executable, "-m", "paimon_group", "run", "--group", f"bench-{out.name}",
         "--warehouse", wh, "--table", name, "--handler", "tests.benchmarks.bench_s3:count_rows",
         "--coordinator", f"sqlite://{out}/c.sqlite", "--member-id", "m0"],
        cwd=repo, env={**os.environ, "PG_BENCH_OUT": str(out), "PYTHONPATH": str(repo)},
        stdout=open(out / "m0.log", "ab"), stderr=subprocess.STDOUT)
    try:
        while True:
            lines = [line.split() for p in out.glob("rows-*") for line in
                     p.read_text().splitlines()]
            if sum(int(n) for n, _ in lines) >= rows:
                return max(float(t) for _, t in lines) - began
            if proc.poll() is not None or time.time() - began > 600:
                raise RuntimeError((out / "m0.log").read_text()[-2000:])
            time.sleep(0.01)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


def whole_process(ctx: Context, wh: str, name: str, rows: int, repeats: int
                  ) -> dict[str, float]:
    """Seconds from a process's start to its last row (best of ``repeats``)."""
    sides = ["pypaimon"] + (["native"] if _native_builder_available() else [])
    best: dict[str, float] = {}
    for run_index in range(repeats):
        for side in sides:
            began = time.monotonic()
            done = subprocess.run([sys.executable, "-c", _SCRIPT, wh, name, side],
                                  capture_output=True, text=True, check=True)
            assert int(done.stdout.split()[-1]) == rows, done.stdout
            best[side] = min(best.get(side, 1e9), time.monotonic() - began)
        out = ctx.scratch(f"evolved-whole-{name}-{run_index}")
        best["member"] = min(best.get("member", 1e9), _member_seconds(wh, name, out, rows))
    return best


def _native_builder_available() -> bool:
    try:
        import pypaimon_rust  # noqa: F401
    except ImportError:
        return False
    return True


def _native_figures(label: str, measured: dict[str, Any]) -> list[Figure]:
    """native / Arrow path (time), by the medians and by the best runs; and
    the same for the Arrow path read shard by shard."""
    med, best = measured["median_s"], measured["best_s"]
    if "native" not in med:
        return [Figure(TITLE, f"{label}: pypaimon's native reader / Arrow path (time)", None,
                       "x", ">= 1.0 (pypaimon-rust installed)", None)]
    ratio = med["native"] / med["arrow"]
    return [
        Figure(TITLE, f"{label}: pypaimon's native reader / Arrow path (time, medians)",
               ratio, "x", ">= 1.0", ratio >= 1.0,
               {"best": best["native"] / best["arrow"], "load_average": measured["load_average"]}),
        Figure(TITLE, f"{label}: native reader / Arrow path shard by shard (time, medians)",
               med["native"] / med["arrow_by_shard"], "x", None, None,
               {"best": best["native"] / best["arrow_by_shard"]}),
    ]


def run(ctx: Context) -> list[Figure]:
    rows = 240_000 if ctx.quick else 999_999
    repeats = 1 if ctx.quick else 3  # pypaimon's reads and the whole-process runs
    wh = str(ctx.scratch("evolved") / "wh")
    build_table(wh, rows)
    got = measure(wh, repeats)
    med = got["median_s"]
    ratio = med["pypaimon"] / med["arrow"]
    build_partial_update(wh, rows)
    partial = measure(wh, repeats, PARTIAL)
    pmed = partial["median_s"]
    pratio = pmed["pypaimon"] / pmed["arrow"]
    whole = {label: whole_process(ctx, wh, name, got["rows"]["arrow"] if name == TABLE
                                  else partial["rows"]["arrow"], repeats)
             for label, name in (("3 schema versions", TABLE), ("partial-update", PARTIAL))}
    figures = []
    for label, best in whole.items():
        figures.append(Figure(TITLE, f"{label}: whole process, start to last row (x pypaimon)",
                              best["pypaimon"] / best["member"], "x", None, None, best))
        if "native" in best:
            figures.append(Figure(
                TITLE, f"{label}: whole process, native reader / member (time)",
                best["native"] / best["member"], "x", None, None, best))
    for label, measured in (("3 schema versions", got), ("partial-update", partial)):
        figures.extend(_native_figures(label, measured))
    return [
        *figures,
        Figure(TITLE, "partial-update initial scan, in-process (x pypaimon)", pratio, "x",
               ">= 8x", pratio >= 8, partial),
        Figure(TITLE, "partial-update splits left to pypaimon's reader",
               float(partial["fallback_splits"]), "splits", "0",
               partial["fallback_splits"] == 0),
        Figure(TITLE, "initial scan over 3 schema versions, in-process (x pypaimon)", ratio,
               "x", ">= 8x", ratio >= 8, got),
        Figure(TITLE, "initial scan over 3 schema versions vs a pyarrow decode (read / decode)",
               med["arrow"] / med["decode"], "x"),
        Figure(TITLE, "splits left to pypaimon's reader", float(got["fallback_splits"]),
               "splits", "0", got["fallback_splits"] == 0),
    ]
