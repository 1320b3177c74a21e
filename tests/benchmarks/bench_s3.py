"""(12) A warehouse on an S3-compatible server: requests and speed, against pypaimon.

The suite's S3 server (``tests/support/s3_server.py``: moto's server on a
loopback port, counting every request it serves by kind) holds one 8-bucket
primary-key table of ``ROWS`` keys written in 4 commits, then an update of a
fifth of the keys, so every bucket's full scan merges files.

Figures, side by side in one run:

* **full scan, in-process** (plan and read, after the table is opened): the
  requests and the time of pypaimon's batch scan + ``to_arrow``, of the Arrow
  path (``ShardPlanner.plan_full`` + ``read_arrow`` of the 8 shards), and of
  the limit, a pyarrow decode of the same data files fetched whole;
* **whole process**: from the start of a process to its last row, a plain
  pypaimon script reading the table against one ``paimon-group run`` member
  (embedded coordinator) whose handler counts rows; and the requests of each;
* **a group on the store**: 1, 4 and 16 ``paimon-group run`` members on the
  table (all caught up), the requests the server receives per second while
  idle, and in the ``AFTER_S`` seconds after one new snapshot (minus the idle
  rate), with the median commit-to-delivery latency, at the default 1000 ms
  poll. The leader polls for the group (``member/head.py``): idle, the
  group's requests do not grow with its members; per new snapshot, each
  member that owns shards reads the snapshot's manifests itself.

moto answers from memory, on loopback: what these figures count is requests,
which a real store bills and whose latency it adds; times are only relative.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.benchmarks.common import Context, Figure, commit_rows, rows_for

TITLE = "s3"
TABLE = "db.s3"
AFTER_S = 12.0
IDLE_S = 10.0
REPO = Path(__file__).resolve().parents[2]


def count_rows(batch: Any) -> None:
    """Handler of the measured members: appends ``rows time`` to ``$PG_BENCH_OUT/rows-<member>``."""
    with open(os.path.join(os.environ["PG_BENCH_OUT"], f"rows-{batch.member_id}"), "a") as f:
        f.write(f"{batch.to_arrow().num_rows} {time.time()}\n")


def _delivered(out: Path) -> tuple[int, float]:
    """Rows delivered so far by every member, and the time of the last delivery."""
    rows, last = 0, 0.0
    for path in out.glob("rows-*"):
        for line in path.read_text().splitlines():
            n, t = line.split()
            rows += int(n)
            last = max(last, float(t))
    return rows, last


def build_table(server: Any, rows: int) -> tuple[str, dict[str, str]]:
    from tests.support.s3_server import catalog_options
    from tests.support.tables import make_pk_table, open_table, register_catalog_options

    server.create_bucket("pg-bench")
    wh = "s3://pg-bench/wh"
    options = catalog_options(server.endpoint)
    register_catalog_options(wh, options)
    make_pk_table(wh, TABLE, buckets=8)
    pt = open_table(wh, TABLE)
    quarter = rows // 4
    for i in range(4):
        commit_rows(pt, rows_for(i * quarter, quarter))
    commit_rows(pt, rows_for(0, rows // 5, v=1))
    return wh, options


def _counted(server: Any, fn: Any) -> tuple[float, dict[str, int], Any]:
    server.reset_counts()
    began = time.perf_counter()
    result = fn()
    return time.perf_counter() - began, server.counts(), result


def in_process(server: Any, wh: str, options: dict[str, str]) -> dict[str, Any]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from paimon_group.reading.table import ShardedTable
    from tests.support.tables import open_table

    pt = open_table(wh, TABLE)
    table = ShardedTable.open(wh, TABLE, options)
    latest = int(pt.snapshot_manager().get_latest_snapshot().id)

    def pypaimon_read() -> int:
        builder = pt.new_read_builder()
        return int(builder.new_read().to_arrow(builder.new_scan().plan().splits()).num_rows)

    def arrow_read() -> int:
        planner = table.planner(8)
        step = planner.plan_full(range(8), latest)
        return sum(planner.read_arrow(s).num_rows for s in step.splits.values())

    builder = pt.new_read_builder()
    files = [f.physical_path() for s in builder.new_scan().plan().splits() for f in s.files]
    fs, to_fs = pt.file_io.filesystem, pt.file_io.to_filesystem_path

    def decode() -> int:
        def one(path: str) -> int:
            with fs.open_input_file(to_fs(path)) as f:
                return int(pq.read_table(pa.BufferReader(f.read_buffer())).num_rows)
        return sum(one(p) for p in files)

    out: dict[str, Any] = {"files": len(files)}
    for name, fn in (("pypaimon", pypaimon_read), ("arrow", arrow_read), ("decode", decode)):
        # Requests of the first (cold) read: pypaimon keeps the footers of the
        # files it read (its file-format metadata cache) for the next one.
        runs = [_counted(server, fn) for _ in range(3)]
        out[name] = {"s": min(r[0] for r in runs), "requests": runs[0][1],
                     "requests_warm": runs[-1][1], "rows": runs[-1][2]}
    assert out["pypaimon"]["rows"] == out["arrow"]["rows"], out
    return out


_PYPAIMON_SCRIPT = """
import sys, time
from pypaimon import CatalogFactory
opts = dict(a.split("=", 1) for a in sys.argv[1:])
t = CatalogFactory.create(opts).get_table("TABLE_NAME")
b = t.new_read_builder()
print(b.new_read().to_arrow(b.new_scan().plan().splits()).num_rows)
""".replace("TABLE_NAME", TABLE)


def _member(wh: str, out: Path, coordinator: str, member: str, env: dict[str, str]
            ) -> subprocess.Popen[bytes]:
    # A group of its own per run (by the scratch directory): a group name used
    # before on this table would resume from its consumer files.
    return subprocess.Popen(
        [sys.executable, "-m", "paimon_group", "run", "--group", f"bench-{out.name}",
         "--warehouse", wh,
         "--table", TABLE, "--handler", "tests.benchmarks.bench_s3:count_rows",
         "--coordinator", coordinator, "--member-id", member, "--session-timeout-s", "10"],
        cwd=REPO, env=env, stdout=open(out / f"{member}.log", "ab"), stderr=subprocess.STDOUT)


def _env(options: dict[str, str], out: Path) -> dict[str, str]:
    return {**os.environ, "PG_BENCH_OUT": str(out), "PYTHONPATH": str(REPO),
            "PAIMON_GROUP_CATALOG_OPTION": " ".join(f"{k}={v}" for k, v in options.items())}


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(60)
        except subprocess.TimeoutExpired:
            p.kill()


def whole_process(ctx: Context, server: Any, wh: str, options: dict[str, str],
                  rows: int) -> dict[str, Any]:
    args = [f"{k}={v}" for k, v in {**options, "warehouse": wh}.items()]
    server.reset_counts()
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-c", _PYPAIMON_SCRIPT, *args], cwd=REPO,
                          capture_output=True, text=True, check=True)
    pypaimon_s = time.monotonic() - began
    pypaimon_requests = server.counts()
    assert int(done.stdout.split()[-1]) == rows, done.stdout

    out = ctx.scratch("s3-whole")
    server.reset_counts()
    began, began_wall = time.monotonic(), time.time()
    proc = _member(wh, out, f"sqlite://{out}/c.sqlite", "m0", _env(options, out))
    try:
        while _delivered(out)[0] < rows:
            if proc.poll() is not None or time.monotonic() - began > 600:
                raise RuntimeError(f"member failed: {(out / 'm0.log').read_text()[-2000:]}")
            time.sleep(0.02)
        ours_s = _delivered(out)[1] - began_wall
        ours_requests = server.counts()
    finally:
        _stop([proc])
    return {"pypaimon": {"s": pypaimon_s, "requests": pypaimon_requests},
            "member": {"s": ours_s, "requests": ours_requests}}


def group(ctx: Context, server: Any, wh: str, options: dict[str, str], rows: int,
          members: int, first_new: int) -> dict[str, Any]:
    from tests.support.tables import open_table

    out = ctx.scratch(f"s3-group-{members}")
    env = _env(options, out)
    coordinator = f"sqlite://{out}/c.sqlite"
    procs = [_member(wh, out, coordinator, f"m{i}", env) for i in range(members)]
    try:
        deadline = time.monotonic() + 300
        while _delivered(out)[0] < rows:
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                raise RuntimeError("group failed: " + (out / "m0.log").read_text()[-2000:])
            time.sleep(0.1)
        time.sleep(15)  # joins settled, positions mirrored
        server.reset_counts()
        time.sleep(IDLE_S)
        idle = server.counts()["total"] / IDLE_S
        before = _delivered(out)[0]
        pt = open_table(wh, TABLE)
        committed = commit_rows(pt, rows_for(first_new, 100, v=7))
        committed_wall = time.time() - (time.monotonic() - committed)
        server.reset_counts()  # the writer's own requests are not counted
        time.sleep(AFTER_S)
        after = server.counts()["total"]
        got, last = _delivered(out)
        assert got - before == 100, (got, before)
    finally:
        _stop(procs)
    return {"members": members, "idle_per_s": idle,
            "per_snapshot": after - idle * AFTER_S, "latency_ms": (last - committed_wall) * 1000}


def run(ctx: Context) -> list[Figure]:
    from tests.support.s3_server import S3Server, free_port

    rows = 40_000 if ctx.quick else 200_000
    server = S3Server(free_port(), ctx.scratch("s3-server") / "server.log")
    server.start()
    try:
        wh, options = build_table(server, rows)
        scan = in_process(server, wh, options)
        whole = whole_process(ctx, server, wh, options, rows)
        groups = []
        for i, n in enumerate((1, 4) if ctx.quick else (1, 4, 16)):
            groups.append(group(ctx, server, wh, options, rows, n, rows + i * 1000))
    finally:
        server.stop()
    req = {k: scan[k]["requests"]["total"] for k in ("pypaimon", "arrow", "decode")}
    figures = [
        Figure(TITLE, "full scan requests (Arrow path / pypaimon)", req["arrow"] / req["pypaimon"],
               "x", "<= 1.2x", req["arrow"] <= 1.2 * req["pypaimon"], scan),
        Figure(TITLE, "full scan, in-process (x pypaimon)",
               scan["pypaimon"]["s"] / scan["arrow"]["s"], "x"),
        Figure(TITLE, "full scan vs a pyarrow decode of the files (read / decode)",
               scan["arrow"]["s"] / scan["decode"]["s"], "x"),
        Figure(TITLE, "whole process, start to last row (x pypaimon)",
               whole["pypaimon"]["s"] / whole["member"]["s"], "x", ">= 3x",
               whole["pypaimon"]["s"] >= 3 * whole["member"]["s"], whole),
        Figure(TITLE, "whole process requests (member / pypaimon)",
               whole["member"]["requests"]["total"] / whole["pypaimon"]["requests"]["total"],
               "x"),
    ]
    for g in groups:
        figures += [
            Figure(TITLE, f"{g['members']} member(s): idle requests per second (group)",
                   g["idle_per_s"], "req/s", details=g),
            Figure(TITLE, f"{g['members']} member(s): requests per new snapshot (group)",
                   g["per_snapshot"], "req"),
            Figure(TITLE, f"{g['members']} member(s): commit to delivery", g["latency_ms"], "ms"),
        ]
    base = groups[0]["per_snapshot"] or 1.0
    growth = groups[-1]["per_snapshot"] / base
    figures.append(Figure(TITLE, f"requests per snapshot, {groups[-1]['members']} members / 1",
                          growth, "x", "< 1.5x", growth < 1.5))
    return figures


if __name__ == "__main__":
    print(json.dumps([f.as_dict() for f in run(Context(Path(sys.argv[1]), quick=True))],
                     indent=1, default=str))
