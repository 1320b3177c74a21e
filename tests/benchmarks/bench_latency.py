"""(5) End-to-end latency: snapshot committed -> handler called, against the
poll interval.

One member process (8 shards, start ``latest``) while this process commits
20 snapshots at random intervals (150-450 ms, uncorrelated with the poll).
The commit time is taken right after pypaimon's commit returns, the call
time at the handler's entry, both CLOCK_MONOTONIC; per snapshot the first
handler call counts. Poll intervals 100 ms and 500 ms.
"""

from __future__ import annotations

import random

from tests.benchmarks.common import (
    Context,
    Figure,
    commit_rows,
    distribution,
    fill_table,
    latest_snapshot,
    ms,
    rows_for,
    run_group,
)
from tests.support.tables import open_table

TITLE = "latency"
TABLE = "db.lat"


def run(ctx: Context) -> list[Figure]:
    snapshots = 10 if ctx.quick else 20
    base = ctx.scratch("latency")
    wh = str(base / "wh")
    coord = f"sqlite://{base}/coord.sqlite"
    next_id = fill_table(wh, TABLE, buckets=8, snapshots=1, rows_per_snapshot=64)
    rng = random.Random(7)
    figures = []
    for poll_ms in (100, 500):
        committed: dict[int, float] = {}
        first_snapshot = latest_snapshot(wh, TABLE) + 1
        first_id = next_id

        def write(_started: float, first_snapshot: int = first_snapshot,
                  first_id: int = first_id, committed: dict[int, float] = committed) -> None:
            import time

            table = open_table(wh, TABLE)
            time.sleep(1.0)  # the member is reading (its start position is resolved)
            for i in range(snapshots):
                time.sleep(rng.uniform(0.15, 0.45))
                committed[first_snapshot + i] = commit_rows(
                    table, rows_for(first_id + i * 64, 64))

        result = run_group(warehouse=wh, table=TABLE, coordinator=coord, members=1, shards=8,
                           start="latest", expected_rows=snapshots * 64, during=write,
                           poll_interval_ms=poll_ms)
        next_id += snapshots * 64
        first_call: dict[int, float] = {}
        for msg in result.batches:
            _, _, _shard, first, last, _kind, _rows, called, _done = msg
            for snap in range(first, last + 1):
                first_call[snap] = min(first_call.get(snap, called), called)
        latencies = [first_call[s] - t for s, t in committed.items() if s in first_call]
        d = distribution(latencies)
        budget = poll_ms / 2000 + 0.05
        details = {k: (ms(v) if k != "n" else v) for k, v in d.items()}
        details["missing"] = len(committed) - len(latencies)
        figures.append(Figure(TITLE, f"poll {poll_ms} ms: median latency", ms(d["median"]),
                              "ms", target=f"<= {ms(budget):.0f} ms (poll/2 + 50)",
                              met=d["median"] <= budget, details=details))
        figures.append(Figure(TITLE, f"poll {poll_ms} ms: p99 latency (n={d['n']})",
                              ms(d["p99"]), "ms", details=details))
    return figures
