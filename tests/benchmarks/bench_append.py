"""(8) Append tables: a group reading a bucket-unaware append table (sharded
by data file) vs one plain pypaimon streaming scan of the same table and the
same snapshots, side by side in one run; 2 members vs 1.

The table is Paimon's default append table (no ``bucket`` option: every
file in bucket 0). Every reader runs in a process of its own (spawned
alike) and reads with ``to_arrow``:

* **initial**: the full scan of the latest snapshot (8 files);
* **follow-ups**: 10 snapshots already committed (one file each), read one
  by one.

Timings are taken as in :mod:`tests.benchmarks.bench_throughput`.
"""

from __future__ import annotations

import statistics

from tests.benchmarks.common import (
    Context,
    Figure,
    commit_rows,
    latest_snapshot,
    rows_for,
    run_group,
    run_plain,
)

TITLE = "append"
TABLE = "db.ap"
SHARDS = 4


def _fill(warehouse: str, *, snapshots: int, rows_per_snapshot: int, first_id: int) -> int:
    from tests.support.tables import make_append_table, open_table

    if first_id == 0:
        make_append_table(warehouse, TABLE, buckets=-1)
    table = open_table(warehouse, TABLE)
    next_id = first_id
    for _ in range(snapshots):
        commit_rows(table, rows_for(next_id, rows_per_snapshot))
        next_id += rows_per_snapshot
    return next_id


def run(ctx: Context) -> list[Figure]:
    repeats = 1 if ctx.quick else 3
    initial_snapshots, initial_rows = 8, 12_500 if ctx.quick else 25_000
    follow_snapshots, follow_rows = 10, 2_500 if ctx.quick else 5_000
    base = ctx.scratch("append")
    wh = str(base / "wh")
    coord = f"sqlite://{base}/coord.sqlite"
    next_id = _fill(wh, snapshots=initial_snapshots, rows_per_snapshot=initial_rows,
                    first_id=0)

    def measure(first_snapshot: int | None, plans: int, start: str, expected: int
                ) -> dict[str, list[float]]:
        rates: dict[str, list[float]] = {"plain": [], "group1": [], "group2": []}
        for _ in range(repeats):
            rows, seconds, _ = run_plain(warehouse=wh, table=TABLE,
                                         first_snapshot=first_snapshot, plans=plans)
            assert rows == expected, (rows, expected)
            rates["plain"].append(rows / seconds)
            for members in (1, 2):
                result = run_group(warehouse=wh, table=TABLE, coordinator=coord,
                                   members=members, shards=SHARDS, start=start,
                                   expected_rows=expected)
                assert result.rows == expected, (result.rows, expected)
                rates[f"group{members}"].append(result.rows / result.seconds)
        return rates

    initial = measure(None, 1, "latest-full", initial_snapshots * initial_rows)
    first_follow = latest_snapshot(wh, TABLE) + 1
    _fill(wh, snapshots=follow_snapshots, rows_per_snapshot=follow_rows, first_id=next_id)
    follow = measure(first_follow, follow_snapshots, f"snapshot:{first_follow}",
                     follow_snapshots * follow_rows)

    figures: list[Figure] = []
    for label, rates in (("initial full scan", initial), ("10 follow-up snapshots", follow)):
        plain = statistics.median(rates["plain"])
        one = statistics.median(rates["group1"])
        two = statistics.median(rates["group2"])
        details = {k: [round(r) for r in v] for k, v in rates.items()}
        details["rows_per_s_median"] = {"plain": round(plain), "group1": round(one),
                                        "group2": round(two)}
        figures.append(Figure(
            TITLE, f"{label}: 1 member ({SHARDS} shards) / plain pypaimon",
            round(one / plain, 2), "x", target=">= 1.0", met=one / plain >= 1.0,
            details={**details, "note": f"{one:,.0f} vs {plain:,.0f} rows/s"}))
        figures.append(Figure(
            TITLE, f"{label}: 2 members / 1 member", round(two / one, 2), "x",
            target="(no target; 2 cores shared)", met=None,
            details={**details, "note": f"{two:,.0f} vs {one:,.0f} rows/s"}))
    return figures
