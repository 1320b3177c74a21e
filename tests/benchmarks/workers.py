"""Code that runs in benchmark subprocesses (``multiprocessing`` spawn context).

:func:`member_process` runs one real :class:`~paimon_group.member.GroupMember`;
:func:`plain_process` runs one plain pypaimon ``StreamReadBuilder`` scan. Both
report on a queue with CLOCK_MONOTONIC times (comparable across processes).

Protocol of :func:`member_process`: it joins, waits until the group's
assignment names ``expect_members`` members and it owns all of its shards,
puts ``("ready", member_id, rss_bytes)``, waits for ``go``, then reads; every
batch puts ``("batch", member_id, shard, first_snapshot, snapshot_id, kind,
rows, t_called, t_done)``; on ``stop`` it leaves and puts ``("done",
member_id, planner_stats, peak_rss_bytes, member_stats)``.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import resource
import time
from typing import Any

SPAWN = multiprocessing.get_context("spawn")


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def current_rss_bytes() -> int:
    import psutil

    rss: int = psutil.Process().memory_info().rss
    return rss


def member_process(
    *,
    warehouse: str,
    table: str,
    coordinator: str,
    group: str,
    member_id: str,
    shards: int,
    start: str,
    poll_interval_ms: int,
    expect_members: int,
    read: str,
    out: Any,
    go: Any,
    stop: Any,
    session_timeout_s: float = 10.0,
) -> None:
    from paimon_group.config.member import MemberConfig
    from paimon_group.member import GroupMember

    def handler(batch: Any) -> None:
        called = time.monotonic()
        rows = 0
        if read == "to_arrow":
            rows = batch.to_arrow().num_rows
        elif read == "iter_batches":
            for record_batch in batch.iter_batches():
                rows += record_batch.num_rows
        out.put(("batch", member_id, batch.shard, batch.first_snapshot, batch.snapshot_id,
                 batch.kind.value, rows, called, time.monotonic()))

    async def main() -> None:
        cfg = MemberConfig(
            group=group, warehouse=warehouse, table=table, coordinator=coordinator,
            member_id=member_id, shards=shards, start=start,
            poll_interval_ms=poll_interval_ms, session_timeout_s=session_timeout_s,
            mirror_interval_s=3600.0,
        )
        member = GroupMember(cfg)
        await member.start()
        while True:
            assignment = member.assignment
            if (
                member.ready
                and assignment is not None
                and len([m for m, s in assignment.shards.items() if s]) >= min(
                    expect_members, shards)
            ):
                break
            await asyncio.sleep(0.01)
        out.put(("ready", member_id, current_rss_bytes()))
        await asyncio.to_thread(go.wait)
        runner = asyncio.create_task(member.run(handler))
        waiter = asyncio.create_task(asyncio.to_thread(stop.wait))
        await asyncio.wait([runner, waiter], return_when=asyncio.FIRST_COMPLETED)
        if runner.done():
            runner.result()
        planner = getattr(member, "_planner", None)
        stats = planner.stats.snapshot() if planner is not None else {}
        member_stats = {"batches": member.stats.batches, "commits": member.stats.commits}
        await member.stop()
        runner.cancel()
        out.put(("done", member_id, stats, peak_rss_bytes(), member_stats))

    asyncio.run(main())


def plain_process(
    *,
    warehouse: str,
    table: str,
    first_snapshot: int | None,
    plans: int,
    out: Any,
) -> None:
    """Plain pypaimon: ``plans`` plans of one streaming scan, each read with to_arrow.

    ``first_snapshot`` None: the scan's own start (full scan of the latest
    snapshot); otherwise follow-ups from that snapshot.
    """
    from tests.support.tables import open_table

    pt = open_table(warehouse, table)
    out.put(("ready", "plain", current_rss_bytes()))
    started = time.monotonic()
    builder = pt.new_stream_read_builder()
    scan = builder.new_streaming_scan()
    if first_snapshot is not None:
        scan.next_snapshot_id = first_snapshot
    reader = builder.new_read()
    rows = 0
    seen = 0
    for plan in scan.stream_sync():
        rows += reader.to_arrow(plan.splits()).num_rows
        seen += 1
        if seen >= plans:
            break
    finished = time.monotonic()
    out.put(("plain", rows, started, finished, peak_rss_bytes()))
