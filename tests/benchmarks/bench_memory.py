"""(7) Peak RSS while reading the initial full scan of a table several times
larger than the memory budget.

Budget: a member may grow by at most 128 MiB over its RSS once joined
(python, pyarrow, pypaimon loaded; reading not started). The table holds 4x
that in Arrow (payload strings of 2 KiB over 8 buckets, 4 commits). Each
reader runs in its own process and reports ``ru_maxrss``:

* plain pypaimon: the streaming scan's first plan read with ``to_arrow``;
* a member (8 shards) whose handler calls ``batch.to_arrow()``;
* a member (8 shards) whose handler streams ``batch.iter_batches()`` (the budgeted one).
"""

from __future__ import annotations

from tests.benchmarks.common import Context, Figure, fill_table, run_group, run_plain
from tests.benchmarks.workers import SPAWN

TITLE = "memory"
TABLE = "db.big"
MiB = 2**20


def plain_baseline_rss(wh: str) -> int:
    """RSS of a process that opened the table (what the plain reader starts from)."""
    from tests.benchmarks.workers import plain_process

    out = SPAWN.Queue()
    proc = SPAWN.Process(target=plain_process, kwargs=dict(
        warehouse=wh, table=TABLE, first_snapshot=None, plans=1, out=out), daemon=True)
    proc.start()
    try:
        while True:
            msg = out.get(timeout=300)
            if msg[0] == "ready":
                ready: int = msg[2]
            elif msg[0] == "plain":
                return ready
    finally:
        proc.join(timeout=30)


def run(ctx: Context) -> list[Figure]:
    budget = (64 if ctx.quick else 128) * MiB
    payload = 2048
    rows = 4 * budget // payload
    base = ctx.scratch("memory")
    wh = str(base / "wh")
    coord = f"sqlite://{base}/coord.sqlite"
    fill_table(wh, TABLE, buckets=8, snapshots=4, rows_per_snapshot=rows // 4,
               payload_bytes=payload)
    table_bytes = rows * (payload + 16)

    ready = plain_baseline_rss(wh)
    _rows, _secs, plain_peak = run_plain(warehouse=wh, table=TABLE, first_snapshot=None, plans=1)
    growth = {"plain pypaimon to_arrow": plain_peak - ready}
    for read in ("to_arrow", "iter_batches"):
        result = run_group(warehouse=wh, table=TABLE, coordinator=coord, members=1, shards=8,
                           start="latest-full", expected_rows=rows, read=read)
        member = next(iter(result.peak_rss))
        growth[f"member, handler {read}"] = result.peak_rss[member] - result.ready_rss[member]
    details = {k: round(v / MiB, 1) for k, v in growth.items()}
    details["table_mib"] = round(table_bytes / MiB, 1)
    details["budget_mib"] = budget // MiB
    figures = [
        Figure(TITLE, f"RSS growth, {name} (table {table_bytes / MiB:.0f} MiB)",
               round(v / MiB, 1), "MiB",
               target=f"<= {budget // MiB} MiB" if "iter_batches" in name else None,
               met=(v <= budget) if "iter_batches" in name else None, details=details)
        for name, v in growth.items()
    ]
    streamed = growth["member, handler iter_batches"]
    figures.append(Figure(TITLE, "member iter_batches / plain to_arrow (RSS growth)",
                          round(streamed / max(1, growth["plain pypaimon to_arrow"]), 2), "x",
                          details=details))
    return figures
