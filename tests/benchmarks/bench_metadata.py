"""(2) Metadata files read per snapshot per member with 1, 8 and 32 owned
shards (the planner's counters; should stay flat).

One member process alone in a group of S shards owns all S of them; S = 1, 8
and 32 over the same 32-bucket table. While it runs, 10 snapshots are
committed (every bucket gets rows in each); the member's
``ShardPlanner.stats`` (snapshot files + manifest lists + manifests read)
divided by the snapshots it read gives the figure.
"""

from __future__ import annotations

import time

from tests.benchmarks.common import Context, Figure, commit_rows, fill_table, rows_for, run_group
from tests.support.tables import open_table

TITLE = "metadata"
TABLE = "db.md"
SNAPSHOTS = 10
ROWS = 32 * 8


def run(ctx: Context) -> list[Figure]:
    base = ctx.scratch("metadata")
    wh = str(base / "wh")
    coord = f"sqlite://{base}/coord.sqlite"
    next_id = fill_table(wh, TABLE, buckets=32, snapshots=1, rows_per_snapshot=ROWS)
    per_snapshot: dict[int, float] = {}
    breakdown: dict[int, dict[str, float]] = {}
    for shards in (1, 8, 32):
        first = next_id

        def write(_started: float, first: int = first) -> None:
            table = open_table(wh, TABLE)
            for i in range(SNAPSHOTS):
                commit_rows(table, rows_for(first + i * ROWS, ROWS))
                time.sleep(0.05)

        result = run_group(warehouse=wh, table=TABLE, coordinator=coord, members=1,
                           shards=shards, start="latest", expected_rows=SNAPSHOTS * ROWS,
                           during=write)
        next_id += SNAPSHOTS * ROWS
        stats = next(iter(result.planner_stats.values()))
        steps = max(1, stats["steps_planned"])
        files = stats["snapshots_read"] + stats["manifest_lists_read"] + stats["manifests_read"]
        per_snapshot[shards] = files / SNAPSHOTS
        breakdown[shards] = {**stats, "files_per_step": round(files / steps, 2)}
    low, high = min(per_snapshot.values()), max(per_snapshot.values())
    ratio = high / low
    figures = [
        Figure(TITLE, f"{s} owned shard{'s' if s > 1 else ''}: metadata files per snapshot",
               round(v, 2), "files", details=breakdown[s])
        for s, v in per_snapshot.items()
    ]
    figures.append(Figure(TITLE, "32 shards / 1 shard (max/min over 1, 8, 32)",
                          round(ratio, 2), "x", target="<= 1.10", met=ratio <= 1.10,
                          details={"per_snapshot": per_snapshot}))
    return figures
