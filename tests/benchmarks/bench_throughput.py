"""(1) Throughput: a group of 1 member owning 8 shards vs one plain pypaimon
streaming scan of the same table and the same snapshots; 2 members vs 1.

Two workloads on one 8-bucket primary-key table, every reader in a process
of its own (spawned alike), data read with ``to_arrow`` by both:

* **initial**: the full scan of the latest snapshot (pypaimon's first plan;
  the group's ``latest-full`` start);
* **follow-ups**: 10 snapshots already committed, read one by one (pypaimon's
  follow-up plans from ``next_snapshot_id``; the group's ``snapshot:N``).

Group timings run from the moment reading is released (after join and
assignment, the table already open) to the end of the last handler call;
the plain scan's from the creation of its read builder (table already open)
to its last ``to_arrow``.
"""

from __future__ import annotations

import statistics

from tests.benchmarks.common import (
    Context,
    Figure,
    fill_table,
    latest_snapshot,
    run_group,
    run_plain,
)

TITLE = "throughput"
TABLE = "db.tp"


def run(ctx: Context) -> list[Figure]:
    repeats = 1 if ctx.quick else 3
    initial_snapshots, initial_rows = 4, 12_500 if ctx.quick else 25_000
    follow_snapshots, follow_rows = 10, 2_500 if ctx.quick else 5_000
    base = ctx.scratch("throughput")
    wh = str(base / "wh")
    coord = f"sqlite://{base}/coord.sqlite"
    next_id = fill_table(wh, TABLE, buckets=8, snapshots=initial_snapshots,
                         rows_per_snapshot=initial_rows)
    total_initial = initial_snapshots * initial_rows

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
                                   members=members, shards=8, start=start,
                                   expected_rows=expected)
                assert result.rows == expected, (result.rows, expected)
                rates[f"group{members}"].append(result.rows / result.seconds)
        return rates

    initial = measure(None, 1, "latest-full", total_initial)
    first_follow = latest_snapshot(wh, TABLE) + 1
    fill_table(wh, TABLE, buckets=8, snapshots=follow_snapshots,
               rows_per_snapshot=follow_rows, first_id=next_id)
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
            TITLE, f"{label}: 1 member (8 shards) / plain pypaimon", round(one / plain, 2),
            "x", target=">= 1.0", met=one / plain >= 1.0,
            details={**details, "note": f"{one:,.0f} vs {plain:,.0f} rows/s"}))
        figures.append(Figure(
            TITLE, f"{label}: 2 members / 1 member", round(two / one, 2), "x",
            target="(no target; 2 cores shared)", met=None,
            details={**details, "note": f"{two:,.0f} vs {one:,.0f} rows/s"}))
    return figures
