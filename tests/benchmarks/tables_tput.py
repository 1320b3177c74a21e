"""Delivery of many tables: one group of them against one group a table.

The same worker processes (``multiprocessing`` spawn context) read the same
tables from ``earliest``, either as ONE group over a pattern (one member a
process) or as one single-table group a table (each process running one
member of every group). A worker imports the member's modules, says
``ready``, and on ``go`` starts its members and runs them; every handler call
reads ``batch.to_arrow()`` and reports its rows with the CLOCK_MONOTONIC time
it finished. Timed: from ``go`` to the last row of the expected total.
"""

from __future__ import annotations

import asyncio
import logging
import os
import statistics
import time
import uuid
from typing import Any

from tests.benchmarks.common import Context, Figure, fill_table
from tests.benchmarks.workers import SPAWN

PROCESSES = 2
LIMIT_S = 600.0


def tput_worker(*, configs: list[dict[str, Any]], out: Any, go: Any, stop: Any) -> None:
    """Run a member for each of ``configs`` (MemberConfig's keyword arguments)."""
    from paimon_group import GroupMember, MemberConfig

    for name in ("paimon_group", "coordinators"):
        logging.getLogger(name).setLevel(logging.ERROR)

    def handler(batch: Any) -> None:
        rows = batch.to_arrow().num_rows
        out.put(("rows", rows, time.monotonic()))

    async def main() -> None:
        members = [GroupMember(MemberConfig(**c), handle_signals=False) for c in configs]
        out.put(("ready",))
        await asyncio.to_thread(go.wait)
        await asyncio.gather(*(m.start() for m in members))
        out.put(("started", time.monotonic()))
        runs = [asyncio.create_task(m.run(handler)) for m in members]
        await asyncio.to_thread(stop.wait)
        await asyncio.gather(*(m.stop() for m in members), return_exceptions=True)
        for r in runs:
            r.cancel()
        await asyncio.gather(*runs, return_exceptions=True)
        out.put(("done",))

    asyncio.run(main())


def read_all(configs: list[list[dict[str, Any]]], expected: int) -> dict[str, float]:
    """One worker per list of ``configs``; seconds from ``go`` to the last of
    ``expected`` rows, and to the last worker's members started."""
    out, go, stop = SPAWN.Queue(), SPAWN.Event(), SPAWN.Event()
    procs = [SPAWN.Process(target=tput_worker, kwargs=dict(configs=c, out=out, go=go,
                                                         stop=stop), daemon=True)
             for c in configs]
    for p in procs:
        p.start()
    try:
        ready = 0
        while ready < len(procs):
            ready += out.get(timeout=LIMIT_S)[0] == "ready"
        began = time.monotonic()
        go.set()
        rows, last, started = 0, began, began
        deadline = began + LIMIT_S
        while rows < expected:
            msg = out.get(timeout=max(1.0, deadline - time.monotonic()))
            if msg[0] == "rows":
                rows, last = rows + msg[1], max(last, msg[2])
            elif msg[0] == "started":
                started = max(started, msg[1])
        stop.set()
        return {"seconds": last - began, "started_s": started - began, "rows": rows}
    finally:
        stop.set()
        go.set()
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()


def sizes(quick: bool) -> tuple[int, int]:
    chosen = os.environ.get("BENCH_TABLES_TPUT", "10x5000" if quick else "50x20000")
    tables, rows = chosen.split("x")
    return int(tables), int(rows)


def configs_of(url: str, wh: str, names: list[str], one_group: bool) -> list[list[dict[str, Any]]]:
    """Each worker's members: one of a group over ``tput.*``, or one of each
    table's own group."""
    tag = uuid.uuid4().hex[:6]
    base = {"warehouse": wh, "coordinator": url, "start": "earliest", "poll_interval_ms": 100,
            "session_timeout_s": 10.0, "mirror_interval_s": 3600.0}
    if one_group:
        return [[{**base, "group": f"all-{tag}", "table": "tput.*", "member_id": f"p{w}"}]
                for w in range(PROCESSES)]
    return [[{**base, "group": f"one-{tag}-{i}", "table": name, "member_id": f"p{w}"}
             for i, name in enumerate(names)] for w in range(PROCESSES)]


def delivery_figures(ctx: Context, title: str) -> list[Figure]:
    count, rows = sizes(ctx.quick)
    repeats = 1 if ctx.quick else 2
    wh = str(ctx.scratch("tput"))
    names = [f"tput.t{i:03d}" for i in range(count)]
    for name in names:
        fill_table(wh, name, buckets=4, snapshots=1, rows_per_snapshot=rows)
    url = ctx.etcd_url()
    expected = count * rows
    got: dict[str, list[dict[str, float]]] = {"one group": [], "a group a table": []}
    for _ in range(repeats):  # the two sides alternate
        for label, one in (("one group", True), ("a group a table", False)):
            r = read_all(configs_of(url, wh, names, one), expected)
            assert r["rows"] == expected, (label, r)
            got[label].append(r)
            print(f"   {label}: {r}", flush=True)
    rate = {k: statistics.median(expected / r["seconds"] for r in v) for k, v in got.items()}
    where = f"{count} tables x {rows:,} rows, 4 buckets, {PROCESSES} processes, etcd"
    ratio = rate["one group"] / rate["a group a table"]
    return [
        Figure(title, f"one group of {count} tables: rows/s ({where})", round(rate["one group"]),
               "rows/s", details={"runs": got["one group"]}),
        Figure(title, f"{count} single-table groups: rows/s ({where})",
               round(rate["a group a table"]), "rows/s", details={"runs": got["a group a table"]}),
        Figure(title, f"one group / {count} groups, rows/s", round(ratio, 2), "x",
               target=">= 0.95 (as fast)", met=ratio >= 0.95),
    ]
