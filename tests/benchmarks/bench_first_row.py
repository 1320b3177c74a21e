"""(16) Time to first row after launch: a one-member group against plain pypaimon.

Issue 53: a lone member's leader published its first generation only after
the forming wait (1 s), so every ``paimon-group run``, restarted pod and
Spark query's first batch paid a second. Side by side in one run, repeats
alternating, whole fresh interpreters from launch:

* **plain**: opens the table, takes its streaming scan's first plan and
  reads the first split (``to_arrow``), the first batch pypaimon gives;
* **group**: a one-member group (8 shards, ``latest-full``) on the embedded
  sqlite coordinator, etcd and ZooKeeper, until its handler's first batch
  (one shard's full scan); the member also reports the seconds from
  ``start()`` returning (the member ``running``) to that batch.

``BENCH_BASELINE_REPO`` (a checkout of an earlier commit, e.g. a git
worktree) adds the same member run from that checkout, measured in the same
alternation: the before and after of a change in one run.
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

from tests.benchmarks.common import Context, Figure, fill_table

TITLE = "first-row"
TABLE = "db.fr"
REPO = Path(__file__).resolve().parents[2]

_PLAIN = """
import json, sys, time
from tests.support.tables import open_table
pt = open_table(sys.argv[1], sys.argv[2])
builder = pt.new_stream_read_builder()
scan = builder.new_streaming_scan()
read = builder.new_read()
for plan in scan.stream_sync():
    splits = plan.splits()
    if splits:
        rows = read.to_arrow(splits[:1]).num_rows
        break
print(json.dumps({"first_row": time.monotonic(), "rows": rows}), flush=True)
"""

_MEMBER = """
import asyncio, json, os, sys, threading, time
from paimon_group.config.member import MemberConfig
from paimon_group.member import GroupMember
wh, name, coord = sys.argv[1:4]
running = None
lock = threading.Lock()
def handler(batch):
    n = batch.to_arrow().num_rows
    if n:
        lock.acquire()  # never released: the first batch ends the process
        now = time.monotonic()
        print(json.dumps({"first_row": now, "rows": n, "after_running": now - running}),
              flush=True)
        os._exit(0)
async def main():
    global running
    cfg = MemberConfig(group="g", warehouse=wh, table=name, coordinator=coord,
                       member_id="m", shards=8, start="latest-full", poll_interval_ms=50,
                       mirror_interval_s=3600.0)
    member = GroupMember(cfg)
    await member.start()
    running = time.monotonic()
    await member.run(handler)
asyncio.run(main())
"""


def launch(script: str, *args: str, repo: Path = REPO) -> dict[str, Any]:
    """``script`` in a fresh interpreter run in ``repo`` (first on its path):
    seconds from launch to its first row, and its report."""
    env = dict(os.environ, PYTHONPATH=str(repo))
    launched = time.monotonic()
    done = subprocess.run([sys.executable, "-c", script, *args], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError(f"reader process failed: {done.stderr[-2000:]}")
    report: dict[str, Any] = json.loads(lines[-1])
    report["seconds"] = report["first_row"] - launched
    return report


def _coordinators(ctx: Context, base: Path) -> tuple[dict[str, Any], Any]:
    """A fresh coordinator URL per run, by backend; and the ZooKeeper server
    to stop (None: not installed, ZooKeeper left out)."""
    from tests.support.zk_server import ZkServer, java_binary, zookeeper_jar

    made = {"sqlite": iter(f"sqlite://{base}/c-{n}.sqlite" for n in range(10**6)),
            "etcd": iter(ctx.etcd_url() for _ in range(10**6))}
    java, jar = java_binary(), zookeeper_jar()
    if java is None or jar is None:
        return made, None
    zk = ZkServer(java, jar, ctx.scratch("zk"))
    zk.start()
    made["zookeeper"] = iter(zk.unique_url() for _ in range(10**6))
    return made, zk


def run(ctx: Context) -> list[Figure]:
    repeats = 3 if ctx.quick else 7
    base = ctx.scratch("first-row")
    wh = str(base / "wh")
    fill_table(wh, TABLE, buckets=8, snapshots=4, rows_per_snapshot=25_000)
    baseline = os.environ.get("BENCH_BASELINE_REPO")
    urls, zk = _coordinators(ctx, base)
    runs: dict[str, list[dict[str, Any]]] = {"plain": []}
    try:
        for _ in range(repeats):
            runs["plain"].append(launch(_PLAIN, wh, TABLE))
            for backend, made in urls.items():
                runs.setdefault(backend, []).append(launch(_MEMBER, wh, TABLE, next(made)))
                if baseline:
                    runs.setdefault(f"{backend}, baseline", []).append(
                        launch(_MEMBER, wh, TABLE, next(made), repo=Path(baseline)))
    finally:
        if zk is not None:
            zk.stop()
    med = {k: statistics.median(r["seconds"] for r in v) for k, v in runs.items()}
    figures = [Figure(TITLE, "plain pypaimon: launch to first batch", med["plain"] * 1000,
                      "ms", details={"runs": runs})]
    for key, runs_of in runs.items():
        if key == "plain":
            continue
        after = statistics.median(r["after_running"] for r in runs_of)
        figures += [
            Figure(TITLE, f"group on {key}: launch to first batch", med[key] * 1000, "ms"),
            Figure(TITLE, f"group on {key}: running to first batch", after * 1000, "ms",
                   None if "baseline" in key else "<= 50 ms (sqlite)",
                   None if key != "sqlite" else after <= 0.05),
            Figure(TITLE, f"group on {key} / plain pypaimon, launch to first batch",
                   med[key] / med["plain"], "x"),
        ]
    return figures
