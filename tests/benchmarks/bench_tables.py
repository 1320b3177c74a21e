"""(18) One group, many tables: the group's scale and delivery against one table's.

**Scale** (etcd and ZooKeeper, real servers): 20 real
:class:`~paimon_group.GroupMember` objects (control loops without reading, as
in the ``coordinator`` and ``idle`` benchmarks, over the machine's worker
processes) form a group of ``table="bench.*"`` over 200 primary-key tables of
8 buckets (1,600 shards), and, side by side in the same run, a group of one
8-bucket table (8 shards, the plain name: a single-table group). For each:
the start of all members -> stable (the published assignment covers every
shard, each owner key held by its assigned member), one join -> stable and one
leave -> stable (median of the cycles), and the steady idle CPU (ms of CPU per
second per member, every thread of the workers) and coordinator requests per
member per second. Printed: each figure and the ratio many / one. Then the
same two groups of **reading** members (``paimon-group run``'s loop: each
member reads its shards, its handler drops the rows; the 16 rows of each
table read first): their idle CPU per member, measured after the group is
stable and its rows read, with its ratio many / one.

**Delivery** (``tables_tput.py``): 50 primary-key tables of 4 buckets with
20,000 rows each, read from ``earliest`` by the same 2 worker processes, (a)
as ONE group ``table="tput.*"`` (one member a process) and (b) as 50
single-table groups (50 members a process, one a group); from the moment the
processes are told to start their members to the last row delivered
(handlers read ``batch.to_arrow()``). Printed: rows/s of each and (a) / (b).

Sizes: ``BENCH_TABLES_COUNT`` (default 200; ``--quick`` 40),
``BENCH_TABLES_MEMBERS`` (20), ``BENCH_TABLES_SERVERS`` (``etcd,zookeeper``),
``BENCH_TABLES_TPUT`` (``50x20000``: tables x rows; ``--quick`` ``10x5000``),
``BENCH_TABLES_PARTS`` (``scale,tput``), ``BENCH_TABLES_PROCESSES`` (the worker
processes of the scale part; default one a core: several members share a
process and its event loop, whose wake-ups the one table's members, woken
together, share more; ``20``: one member a process, as ``paimon-group run``
deploys them).
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

from tests.benchmarks.bench_coordinator import churn
from tests.benchmarks.common import Context, Figure, fill_table
from tests.benchmarks.member_pool import GroupWatcher, MemberPool
from tests.benchmarks.tables_tput import delivery_figures

TITLE = "tables"
BUCKETS = 8
SESSION_TIMEOUT_S = 10.0
SETTLE_S = 3.0
READ_SETTLE_S = 20.0
STABLE_LIMIT_S = 120.0
BASELINE = "one.t"
FLAT = "flat.t"


def parts() -> list[str]:
    return os.environ.get("BENCH_TABLES_PARTS", "scale,tput").split(",")


def table_count(quick: bool) -> int:
    return int(os.environ.get("BENCH_TABLES_COUNT", "40" if quick else "200"))


def member_count() -> int:
    return int(os.environ.get("BENCH_TABLES_MEMBERS", "20"))


def worker_processes(members: int) -> int:
    chosen = int(os.environ.get("BENCH_TABLES_PROCESSES", "0"))
    return min(chosen or os.cpu_count() or 1, members)


def servers() -> list[str]:
    chosen = os.environ.get("BENCH_TABLES_SERVERS", "etcd,zookeeper").split(",")
    return [s for s in ("etcd", "zookeeper") if s in chosen]


def make_tables(wh: str, count: int) -> float:
    """The baseline table, ``count`` tables ``bench.tNNN``, 8 buckets, 16
    rows each in one snapshot, and one bucket-unaware append table (read in
    as many shards as the tables have buckets); the seconds it took."""
    from tests.support.tables import make_append_table, write_rows

    began = time.monotonic()
    make_append_table(wh, FLAT, buckets=-1)
    write_rows(wh, FLAT, range(16))
    fill_table(wh, BASELINE, buckets=BUCKETS, snapshots=1, rows_per_snapshot=16)
    for i in range(count):
        fill_table(wh, f"bench.t{i:04d}", buckets=BUCKETS, snapshots=1, rows_per_snapshot=16)
    return time.monotonic() - began


async def start_group(pool: MemberPool, watcher: GroupWatcher, names: list[str]
                      ) -> dict[str, Any]:
    """Start every member at once: seconds to stable, and to the last start();
    the workers' CPU seconds until stable."""
    cpu = await asyncio.to_thread(pool.cpu_s)
    began = time.monotonic()
    starting = asyncio.ensure_future(asyncio.to_thread(pool.start, names))
    returned: list[float] = []
    starting.add_done_callback(lambda _: returned.append(time.monotonic()))
    stable = await watcher.wait_stable(set(names), STABLE_LIMIT_S)
    await starting
    return {"start_s": round(stable - began, 2),
            "start_calls_returned_s": round(returned[0] - began, 2),
            "start_requests": pool.requests(),
            "start_cpu_s": round(await asyncio.to_thread(pool.cpu_s) - cpu, 2),
            "generations": len(watcher.generations)}


async def scenario(url: str, wh: str, table: str, shards: int, members: int,
                   window_s: float, cycles: int, history: Path, fixed: int | None = None,
                   reading: bool = False) -> dict[str, Any]:
    """One group of ``members`` on ``table`` (a name or a pattern; ``fixed``:
    its ``--shards``): its start, its idle cost, then ``cycles`` joins and
    leaves (none for ``reading`` members: their idle cost only)."""
    names = [f"m{i:03d}" for i in range(members)]
    group = f"tables-{uuid.uuid4().hex[:6]}"
    result: dict[str, Any] = {"table": table, "shards": shards, "members": members}
    async with GroupWatcher(url, group, shards) as watcher:
        pool = await asyncio.to_thread(functools.partial(
            MemberPool, url=url, warehouse=wh, table=table, group=group, shards=fixed,
            session_timeout_s=SESSION_TIMEOUT_S, processes=worker_processes(members),
            history_dir=history, reading=reading))
        try:
            result.update(await start_group(pool, watcher, names))
            # Reading members read every table's rows first (1,600 shards'
            # plans at 200 tables): let that end before the window.
            await asyncio.sleep(READ_SETTLE_S if reading else SETTLE_S)
            got = await asyncio.to_thread(pool.measure, window_s)
            window = got["window_s"]
            result["idle_cpu_ms_per_member_s"] = round(
                1000.0 * got["cpu_s"] / window / members, 2)
            result["requests_per_member_s"] = round(
                sum(got["calls"].values()) / window / members, 3)
            result["idle_calls"] = got["calls"]
            result["rss_mb_per_process"] = round(statistics.mean(got["rss_mb"]))
            result["load_avg"] = os.getloadavg()[0]
            if not reading:
                result.update(await churn(pool, watcher, names, history, cycles))
            result["restarted_members"] = await asyncio.to_thread(pool.restarts)
        finally:
            await asyncio.to_thread(pool.close)
    if reading:
        return result
    for what in ("joins", "leaves"):
        result[f"{what[:-1]}_median_s"] = round(
            statistics.median(c["stable_s"] for c in result[what]), 3)
    return result


def compared(server: str, many: dict[str, Any], one: dict[str, Any], flat: dict[str, Any]
             ) -> list[Figure]:
    """The figures of the group of many tables, each beside the one table's
    and their ratio, and the ratio to one table of as many shards."""
    where = (f"{server}, {many['members']} members, {many['shards'] // BUCKETS} tables x "
             f"{BUCKETS} buckets")
    rows = (("start of all -> stable", "start_s", "s", 10.0),
            ("join -> stable (median)", "join_median_s", "s", 1.0),
            ("leave -> stable (median)", "leave_median_s", "s", 1.0),
            ("idle CPU per member", "idle_cpu_ms_per_member_s", "ms/s", None),
            ("requests per member per second", "requests_per_member_s", "/s", None))
    figures: list[Figure] = []
    for label, key, unit, limit in rows:
        value, base = many[key], one[key]
        target = f"< {limit:g} s" if limit else None
        figures.append(Figure(TITLE, f"{label} ({where})", value, unit, target=target,
                              met=value < limit if limit else None,
                              details={"one_table": base}))
        figures.append(Figure(
            TITLE, f"{label}: {many['shards'] // BUCKETS} tables / one table ({server})",
            round(value / base, 2) if base else None, "x",
            target="<= 1.0" if limit is None else None,
            met=(value <= base) if limit is None else None,
            details={"many": value, "one": base}))
        figures.append(Figure(
            TITLE, f"{label}: {many['shards'] // BUCKETS} tables / one table of "
            f"{many['shards']} shards ({server})",
            round(value / flat[key], 2) if flat[key] else None, "x",
            details={"many": value, "flat": flat[key]}))
    return figures


def reading_compared(server: str, many: dict[str, Any], one: dict[str, Any]) -> list[Figure]:
    """The idle CPU of a reading member of the many tables' group beside the
    one table's, and their ratio."""
    key = "idle_cpu_ms_per_member_s"
    tables = many["shards"] // BUCKETS
    where = f"{server}, {many['members']} reading members, {tables} tables x {BUCKETS} buckets"
    value, base = many[key], one[key]
    return [Figure(TITLE, f"idle CPU per reading member ({where})", value, "ms/s",
                   details={"one_table": base}),
            Figure(TITLE, f"idle CPU per reading member: {tables} tables / one table ({server})",
                   round(value / base, 2) if base else None, "x", target="<= 1.0",
                   met=value <= base, details={"many": value, "one": base})]


def scale_figures(ctx: Context) -> list[Figure]:
    from tests.support.zk_server import ZkServer, require_zookeeper

    count, members = table_count(ctx.quick), member_count()
    window, cycles = (5.0, 1) if ctx.quick else (30.0, 3)
    wh = str(ctx.scratch("wh"))
    made = make_tables(wh, count)
    print(f"   {count + 1} tables made in {made:.1f} s", flush=True)
    zk = None
    figures: list[Figure] = []
    try:
        for server in servers():
            if server == "etcd":
                url = ctx.etcd_url()
            else:
                if zk is None:
                    java, jar = require_zookeeper()
                    zk = ZkServer(java, jar, ctx.scratch("zk"))
                    zk.start()
                url = zk.unique_url()
            got: dict[str, dict[str, Any]] = {}
            shards = count * BUCKETS
            for label, table, fixed in (("one", BASELINE, None), ("flat", FLAT, shards),
                                        ("many", "bench.*", None)):
                got[label] = asyncio.run(scenario(
                    url, wh, table, fixed or (BUCKETS if table == BASELINE else shards),
                    members, window, cycles, ctx.scratch("history"), fixed))
                print(f"   {server} {label}: {json.dumps(got[label])}", flush=True)
            figures += compared(server, got["many"], got["one"], got["flat"])
            for label, table in (("one reading", BASELINE), ("many reading", "bench.*")):
                got[label] = asyncio.run(scenario(
                    url, wh, table, BUCKETS if table == BASELINE else shards, members, window,
                    0, ctx.scratch("history"), reading=True))
                print(f"   {server} {label}: {json.dumps(got[label])}", flush=True)
            figures += reading_compared(server, got["many reading"], got["one reading"])
    finally:
        if zk is not None:
            zk.stop()
    return figures


def run(ctx: Context) -> list[Figure]:
    figures: list[Figure] = []
    if "scale" in parts():
        figures += scale_figures(ctx)
    if "tput" in parts():
        figures += delivery_figures(ctx, TITLE)
    return figures
