"""(7) Peak RSS while reading the initial full scan of a table several times
larger than the memory budget.

Budget: a member may grow by at most 128 MiB over its RSS once joined
(python, pyarrow, pypaimon loaded; reading not started). The table holds 4x
that in Arrow (payload strings of 2 KiB over 8 buckets, 4 commits, so every
bucket's full scan is a primary-key merge of 4 files). Each reader runs in a
process of its own:

* plain pypaimon: the streaming scan's first plan read with ``to_arrow``
  (growth of ``ru_maxrss`` over the RSS of a process that opened the table);
* a member (8 shards) whose handler calls ``batch.to_arrow()``;
* a member (8 shards) whose handler streams ``batch.iter_batches()``, reading
  one shard at a time (``max_parallel_shards=1``): the budgeted figure;
* the same with the default ``max_parallel_shards`` (4 shards read at once).

A member's peak is measured from the moment it is ready: the kernel's
high-water mark (``VmHWM``) is reset then (``/proc/self/clear_refs``), so
that the start (imports, table open, planning) is not counted as reading.
Where that reset is not allowed, ``ru_maxrss`` is used, which may include it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from pathlib import Path
from typing import Any

from tests.benchmarks.common import Context, Figure, fill_table, run_plain
from tests.benchmarks.workers import SPAWN

TITLE = "memory"
TABLE = "db.big"
MiB = 2**20


def _status_kib(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_peak() -> bool:
    """Reset the kernel's RSS high-water mark of this process (Linux)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def member_worker(*, warehouse: str, coordinator: str, read: str, parallel: int | None,
                  expected_rows: int, out: Any) -> None:
    """One member of a fresh group of one: join, reset the peak, read
    everything, report ``(ready_rss, peak_rss, rows, how)`` in bytes."""
    import resource

    from paimon_group.config.member import MemberConfig
    from paimon_group.member import GroupMember

    rows = 0
    finished = asyncio.Event()
    loop: asyncio.AbstractEventLoop | None = None

    def handler(batch: Any) -> None:
        nonlocal rows
        if read == "to_arrow":
            n = batch.to_arrow().num_rows
        else:
            n = sum(b.num_rows for b in batch.iter_batches())
        rows += n
        if rows >= expected_rows and loop is not None:
            loop.call_soon_threadsafe(finished.set)

    async def main() -> tuple[int, int, str]:
        nonlocal loop
        loop = asyncio.get_running_loop()
        cfg = MemberConfig(
            group=f"mem-{uuid.uuid4().hex[:8]}", warehouse=warehouse, table=TABLE,
            coordinator=coordinator, member_id="m0", shards=8, start="latest-full",
            poll_interval_ms=100, session_timeout_s=10.0, mirror_interval_s=3600.0,
        )
        if parallel is not None:
            cfg = dataclasses.replace(cfg, max_parallel_shards=parallel)
        member = GroupMember(cfg)
        await member.start()
        while True:  # joined, and the assignment gives it its shards
            assignment = member.assignment
            if member.ready and assignment is not None and assignment.shards.get("m0"):
                break
            await asyncio.sleep(0.01)
        ready = (_status_kib("VmRSS") or 0) * 1024
        how = "VmHWM since ready" if _reset_peak() else "ru_maxrss"
        runner = asyncio.create_task(member.run(handler))
        done = asyncio.create_task(finished.wait())
        await asyncio.wait([runner, done], return_when=asyncio.FIRST_COMPLETED)
        if runner.done():
            runner.result()
        if how == "ru_maxrss":
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        else:
            peak = (_status_kib("VmHWM") or 0) * 1024
        await member.stop()
        runner.cancel()
        return ready, peak, how

    ready, peak, how = asyncio.run(main())
    out.put((ready, peak, rows, how))


def member_growth(wh: str, coordinator: str, read: str, parallel: int | None,
                  expected_rows: int) -> tuple[int, str]:
    out = SPAWN.Queue()
    proc = SPAWN.Process(target=member_worker, kwargs=dict(
        warehouse=wh, coordinator=coordinator, read=read, parallel=parallel,
        expected_rows=expected_rows, out=out), daemon=True)
    proc.start()
    try:
        ready, peak, rows, how = out.get(timeout=600)
    finally:
        proc.join(timeout=60)
        if proc.is_alive():
            proc.kill()
    if rows < expected_rows:
        raise RuntimeError(f"member read {rows} rows, expected {expected_rows}")
    return peak - ready, how


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
    fill_table(wh, TABLE, buckets=8, snapshots=4, rows_per_snapshot=rows // 4,
               payload_bytes=payload)
    table_bytes = rows * (payload + 16)
    # Rows after the merge: later commits overwrite earlier keys, so count
    # what a full scan returns rather than what was written.
    from paimon_group.reading.table import ShardedTable
    from tests.benchmarks.common import latest_snapshot

    table = ShardedTable.open(wh, TABLE)
    planner = table.planner(1)
    step = planner.plan_full([0], latest_snapshot(wh, TABLE))
    expected = sum(b.num_rows for b in planner.iter_batches(step.splits[0]))
    del table, planner, step

    ready = plain_baseline_rss(wh)
    _rows, _secs, plain_peak = run_plain(warehouse=wh, table=TABLE, first_snapshot=None, plans=1)
    growth = {"plain pypaimon to_arrow": plain_peak - ready}
    hows = set()
    budgeted = "member, handler iter_batches, 1 shard at a time"
    for name, read, parallel in (
        ("member, handler to_arrow (default parallelism)", "to_arrow", None),
        (budgeted, "iter_batches", 1),
        ("member, handler iter_batches (default parallelism)", "iter_batches", None),
    ):
        coord = f"sqlite://{base}/coord-{uuid.uuid4().hex[:6]}.sqlite"
        growth[name], how = member_growth(wh, coord, read, parallel, expected)
        hows.add(how)
    details: dict[str, Any] = {k: round(v / MiB, 1) for k, v in growth.items()}
    details["table_mib"] = round(table_bytes / MiB, 1)
    details["budget_mib"] = budget // MiB
    details["rows"] = expected
    details["member peak measured as"] = sorted(hows)
    figures = [
        Figure(TITLE, f"RSS growth, {name} (table {table_bytes / MiB:.0f} MiB)",
               round(v / MiB, 1), "MiB",
               target=f"<= {budget // MiB} MiB" if name == budgeted else None,
               met=(v <= budget) if name == budgeted else None, details=details)
        for name, v in growth.items()
    ]
    figures.append(Figure(TITLE, "member iter_batches (1 at a time) / plain to_arrow",
                          round(growth[budgeted] / max(1, growth["plain pypaimon to_arrow"]),
                                2), "x", details=details))
    return figures
