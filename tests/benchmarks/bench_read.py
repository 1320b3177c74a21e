"""(8) The Arrow read path against plain pypaimon, side by side in one run.

One 8-bucket primary-key table (``rowkind.field`` so deletes can be written):
``ROWS`` inserted in 4 commits, then an update commit (+U of a fifth of the
keys) and a delete commit (-D of a tenth), so every bucket's full scan is a
merge of 6 files with updates and deletes. Then 10 follow-up snapshots.

Figures (each side measured alternately, median of the repeats):

* **initial, in-process**: reading the full scan of the latest snapshot,
  plan excluded on both sides: pypaimon ``to_arrow`` of its batch scan's
  splits vs ``ShardPlanner.read_arrow`` of the 8 shards' splits (one call per
  shard, as a member's handlers do, and all at once);
* **the limit**: a pyarrow decode of the same data files (all columns,
  ``pq.read_table``), and the read's ratio to it;
* **initial, whole process**: launch to last row: a Python process that opens
  the table and reads it with pypaimon (its streaming scan's first plan)
  against a process that runs a one-member group of 8 shards
  (``GroupMember``, embedded coordinator) whose handler calls ``to_arrow``;
* **10 follow-up snapshots, in-process**: pypaimon's streaming scan's
  follow-up plans read with ``to_arrow`` vs ``plan_next`` + ``read_arrow``;
* **peak RSS** of the whole-process runs (``VmHWM``; ``ru_maxrss`` would
  carry the launching process's peak across ``exec``), and of a member
  process streaming with ``iter_batches`` one shard at a time against the
  128 MiB growth budget of ``bench_memory``.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

from tests.benchmarks.common import Context, Figure, commit_rows, rows_for

TITLE = "read"
TABLE = "db.rd"
REPO = Path(__file__).resolve().parents[2]


def build_table(wh: str, rows: int) -> int:
    """The table described in the module docstring, before its follow-ups."""
    from tests.support.tables import make_pk_table, open_table

    make_pk_table(wh, TABLE, buckets=8, row_kind_field=True)
    pt = open_table(wh, TABLE)

    def with_op(data: pa.Table, op: str) -> pa.Table:
        return data.append_column("op", pa.array([op] * data.num_rows, pa.string()))

    per_commit = rows // 4
    for i in range(4):
        commit_rows(pt, with_op(rows_for(i * per_commit, per_commit), "+I"))
    commit_rows(pt, with_op(rows_for(0, rows // 5, v=1), "+U"))
    commit_rows(pt, with_op(rows_for(rows // 2, rows // 10, v=2), "-D"))
    return _latest(pt)


def add_follow_ups(wh: str, rows: int, follow_ups: int) -> int:
    """``follow_ups`` snapshots of new, updated and deleted rows; the latest id."""
    from tests.support.tables import open_table

    pt = open_table(wh, TABLE)
    step = max(1, rows // 200)
    for n in range(follow_ups):
        fresh = rows_for(rows + n * step, step, v=3)
        data = fresh.append_column("op", pa.array(["+I"] * step, pa.string()))
        changed = rows_for(n * step, step, v=4)
        ops = ["+U" if i % 2 else "-D" for i in range(step)]
        data = pa.concat_tables(
            [data, changed.append_column("op", pa.array(ops, pa.string()))])
        commit_rows(pt, data)
    return _latest(pt)


def _latest(pt: Any) -> int:
    return int(pt.snapshot_manager().get_latest_snapshot().id)


def _timed(fn: Any) -> tuple[float, Any]:
    started = time.perf_counter()
    result = fn()
    return time.perf_counter() - started, result


def in_process_initial(wh: str, repeats: int) -> dict[str, Any]:
    """The initial full scan read in this process, both sides alternately."""
    import pyarrow.parquet as pq
    from pypaimon.read.table_read import TableRead  # noqa: F401  (warm imports)

    from paimon_group.reading.table import ShardedTable
    from tests.support.tables import open_table

    pt = open_table(wh, TABLE)
    table = ShardedTable.open(wh, TABLE)
    planner = table.planner(8)
    shards = list(range(8))
    builder = pt.new_read_builder()
    splits = builder.new_scan().plan().splits()
    step = planner.plan_full(shards, _latest(pt))
    files = [f.physical_path() for s in splits for f in s.files]
    times: dict[str, list[float]] = {k: [] for k in
                                     ("pypaimon", "arrow_per_shard", "arrow_all", "decode")}
    rows: dict[str, int] = {}
    all_splits = [s for shard in shards for s in step.splits[shard]]
    for _ in range(repeats):
        t, out = _timed(lambda: builder.new_read().to_arrow(splits))
        times["pypaimon"].append(t)
        rows["pypaimon"] = out.num_rows
        t, n = _timed(lambda: sum(planner.read_arrow(step.splits[k]).num_rows for k in shards))
        times["arrow_per_shard"].append(t)
        rows["arrow"] = n
        t, _ = _timed(lambda: planner.read_arrow(all_splits))
        times["arrow_all"].append(t)
        t, _ = _timed(lambda: [pq.read_table(f) for f in files])
        times["decode"].append(t)
    assert rows["pypaimon"] == rows["arrow"], rows
    return {"median_s": {k: statistics.median(v) for k, v in times.items()},
            "runs_s": times, "rows": rows, "files": len(files), "splits": len(splits)}


def in_process_follow_ups(wh: str, first: int, latest: int, repeats: int) -> dict[str, Any]:
    """Follow-ups ``first..latest`` read in this process, both sides alternately."""
    from paimon_group.reading.table import ShardedTable

    planner = ShardedTable.open(wh, TABLE).planner(8)
    snapshots = {"initial": first - 1, "latest": latest}
    times: dict[str, list[float]] = {"pypaimon": [], "arrow": []}
    rows: dict[str, int] = {}
    for _ in range(repeats):
        t, rows["pypaimon"] = _timed(lambda: _follow_pypaimon(wh, snapshots))
        times["pypaimon"].append(t)
        t, rows["arrow"] = _timed(lambda: _follow_arrow(planner, snapshots))
        times["arrow"].append(t)
    assert rows["pypaimon"] == rows["arrow"], rows
    return {"median_s": {k: statistics.median(v) for k, v in times.items()},
            "runs_s": times, "rows": rows}


def _follow_pypaimon(wh: str, snapshots: dict[str, int]) -> int:
    from tests.support.tables import open_table

    pt = open_table(wh, TABLE)
    builder = pt.new_stream_read_builder()
    scan = builder.new_streaming_scan()
    scan.next_snapshot_id = snapshots["initial"] + 1
    read = builder.new_read()
    rows = 0
    for seen, plan in enumerate(scan.stream_sync(), start=1):
        rows += read.to_arrow(plan.splits()).num_rows
        if seen >= snapshots["latest"] - snapshots["initial"]:
            break
    return rows


def _follow_arrow(planner: Any, snapshots: dict[str, int]) -> int:
    shards = list(range(planner.num_shards))
    position, rows = snapshots["initial"] + 1, 0
    while (step := planner.plan_next(shards, position)) is not None:
        rows += sum(planner.read_arrow(step.splits[k]).num_rows for k in shards)
        position = step.next_snapshot
    return rows


_PLAIN = """
import json, sys, time
from tests.support.tables import open_table
wh, name, expected = sys.argv[1], sys.argv[2], int(sys.argv[3])
pt = open_table(wh, name)
builder = pt.new_stream_read_builder()
scan = builder.new_streaming_scan()
read = builder.new_read()
rows = 0
for plan in scan.stream_sync():
    rows += read.to_arrow(plan.splits()).num_rows
    break
def status_kib(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
print(json.dumps({"last_row": time.monotonic(), "rows": rows,
                  "peak": status_kib("VmHWM") * 1024}))
"""

_MEMBER = """
import asyncio, json, os, sys, threading, time
from paimon_group.config.member import MemberConfig
from paimon_group.member import GroupMember
wh, name, expected, coord, read = sys.argv[1:6]
expected = int(expected)
parallel, group = int(sys.argv[6]), sys.argv[7]
rows = 0
lock = threading.Lock()
def status_kib(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
def handler(batch):
    global rows
    if read == "to_arrow":
        n = batch.to_arrow().num_rows
    else:
        n = sum(b.num_rows for b in batch.iter_batches())
    with lock:
        rows += n
        if rows >= expected:
            print(json.dumps({"last_row": time.monotonic(), "rows": rows,
                              "peak": max(peak_at_start, status_kib("VmHWM") * 1024),
                              "ready_rss": ready_rss, "peak_since_ready": peak_since_ready()}),
                  flush=True)
            os._exit(0)
ready_rss = 0
reset = False
def peak_since_ready():
    return status_kib("VmHWM") * 1024 if reset else None
peak_at_start = 0
async def main():
    global ready_rss, reset, peak_at_start
    cfg = MemberConfig(group=group, warehouse=wh, table=name, coordinator=coord, member_id="m",
                       shards=8, start="latest-full", poll_interval_ms=50,
                       max_parallel_shards=parallel, mirror_interval_s=3600.0)
    member = GroupMember(cfg)
    await member.start()
    ready_rss = status_kib("VmRSS") * 1024
    peak_at_start = status_kib("VmHWM") * 1024
    try:
        open("/proc/self/clear_refs", "w").write("5")
        reset = True
    except OSError:
        pass
    await member.run(handler)
asyncio.run(main())
"""


def whole_process(script: str, *args: str) -> dict[str, Any]:
    """Launch ``script`` in a fresh interpreter; launch -> last row and its report."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    launched = time.monotonic()
    done = subprocess.run([sys.executable, "-c", script, *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError(f"reader process failed: {done.stderr[-2000:]}")
    report: dict[str, Any] = json.loads(lines[-1])
    report["seconds"] = report["last_row"] - launched
    return report


def run(ctx: Context) -> list[Figure]:
    rows = 250_000 if ctx.quick else 1_000_000
    repeats = 1 if ctx.quick else 3
    base = ctx.scratch("read")
    wh = str(base / "wh")
    initial = build_table(wh, rows)
    measured = in_process_initial(wh, repeats)
    med = measured["median_s"]
    expected = measured["rows"]["pypaimon"]
    procs: dict[str, list[dict[str, Any]]] = {"plain": [], "group": []}
    for n in range(repeats):
        procs["plain"].append(whole_process(_PLAIN, wh, TABLE, str(expected)))
        coord = f"sqlite://{base}/coord-{n}.sqlite"
        procs["group"].append(
            whole_process(_MEMBER, wh, TABLE, str(expected), coord, "to_arrow", "4", f"g{n}"))
    coord = f"sqlite://{base}/coord-mem.sqlite"
    streamed = whole_process(_MEMBER, wh, TABLE, str(expected), coord, "iter_batches", "1",
                             "gmem")
    plain_s = statistics.median(r["seconds"] for r in procs["plain"])
    group_s = statistics.median(r["seconds"] for r in procs["group"])
    growth = (streamed["peak_since_ready"] or streamed["peak"]) - streamed["ready_rss"]
    latest = add_follow_ups(wh, rows, 10)
    follow = in_process_follow_ups(wh, initial + 1, latest, repeats)
    details = {"in_process": measured, "processes": procs, "streamed": streamed,
               "follow_ups": follow, "rows_initial": expected}
    initial_x = med["pypaimon"] / med["arrow_per_shard"]
    follow_x = follow["median_s"]["pypaimon"] / follow["median_s"]["arrow"]
    return [
        Figure(TITLE, "initial scan, in-process (x pypaimon)", initial_x, "x", ">= 8x",
               initial_x >= 8, details),
        Figure(TITLE, "initial scan, all shards in one call (x pypaimon)",
               med["pypaimon"] / med["arrow_all"], "x"),
        Figure(TITLE, "initial scan vs a pyarrow decode of the files (read / decode)",
               med["arrow_per_shard"] / med["decode"], "x"),
        Figure(TITLE, "initial scan, whole process launch to last row (x pypaimon)",
               plain_s / group_s, "x", ">= 3x", plain_s / group_s >= 3),
        Figure(TITLE, "10 follow-up snapshots, in-process (x pypaimon)", follow_x, "x",
               ">= 2x", follow_x >= 2),
        Figure(TITLE, "peak RSS growth, iter_batches one shard at a time", growth / 2**20,
               "MiB", "<= 128 MiB", growth <= 128 * 2**20),
    ]
