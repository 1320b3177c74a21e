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
idle CPU of both groups **side by side**: the two groups running at once
(started one after the other, 40 members), measured over the same three
windows, so that what else the machine does weighs on both alike; printed:
each window's figures and the median of its ratios many / one, the judged
figure. Once with members that do not read, once with **reading** members
(``paimon-group run``'s loop: each member reads its shards, its handler drops
the rows; the 16 rows of each table read first, before the windows).

**Delivery** (``tables_tput.py``): 50 primary-key tables of 4 buckets with
20,000 rows each, read from ``earliest`` by the same 2 worker processes, (a)
as ONE group ``table="tput.*"`` (one member a process) and (b) as 50
single-table groups (50 members a process, one a group); from the moment the
processes are told to start their members to the last row delivered
(handlers read ``batch.to_arrow()``). Printed: rows/s of each and (a) / (b).

**Floor** (``tables_poll.py``): what the leader's poll of the tables costs,
on a local warehouse and on an S3-compatible server, and the lowest idle
ratio many / one it allows, given the one table's member cost measured above.

Sizes: ``BENCH_TABLES_COUNT`` (default 200; ``--quick`` 40),
``BENCH_TABLES_MEMBERS`` (20), ``BENCH_TABLES_SERVERS`` (``etcd,zookeeper``),
``BENCH_TABLES_TPUT`` (``50x20000``: tables x rows; ``--quick`` ``10x5000``),
``BENCH_TABLES_PARTS`` (``scale,tput,floor``; ``idle``: the side-by-side idle
CPU alone; ``floor``: the poll's floor, ``tables_poll.py``), ``BENCH_TABLES_PROCESSES`` (the worker
processes of the scale part; default one a core: several members share a
process and its event loop, whose wake-ups the one table's members, woken
together, share more; ``20``: one member a process, as ``paimon-group run``
deploys them).
"""

from __future__ import annotations

import asyncio
import contextlib
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
from tests.benchmarks.tables_poll import floor_figures, local_floor, s3_floor
from tests.benchmarks.tables_tput import delivery_figures

TITLE = "tables"
BUCKETS = 8
SESSION_TIMEOUT_S = 10.0
SETTLE_S = 3.0
READ_SETTLE_S = 20.0
SIDE_WINDOWS = 3
STABLE_LIMIT_S = 120.0
BASELINE = "one.t"
FLAT = "flat.t"


def parts() -> list[str]:
    return os.environ.get("BENCH_TABLES_PARTS", "scale,tput,floor").split(",")


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
                   window_s: float, cycles: int, history: Path, fixed: int | None = None
                   ) -> dict[str, Any]:
    """One group of ``members`` on ``table`` (a name or a pattern; ``fixed``:
    its ``--shards``): its start, its idle cost, then ``cycles`` joins and
    leaves."""
    names = [f"m{i:03d}" for i in range(members)]
    group = f"tables-{uuid.uuid4().hex[:6]}"
    result: dict[str, Any] = {"table": table, "shards": shards, "members": members}
    async with GroupWatcher(url, group, shards) as watcher:
        pool = await asyncio.to_thread(functools.partial(
            MemberPool, url=url, warehouse=wh, table=table, group=group, shards=fixed,
            session_timeout_s=SESSION_TIMEOUT_S, processes=worker_processes(members),
            history_dir=history))
        try:
            result.update(await start_group(pool, watcher, names))
            await asyncio.sleep(SETTLE_S)
            got = await asyncio.to_thread(pool.measure, window_s)
            window = got["window_s"]
            result["idle_cpu_ms_per_member_s"] = round(
                1000.0 * got["cpu_s"] / window / members, 2)
            result["requests_per_member_s"] = round(
                sum(got["calls"].values()) / window / members, 3)
            result["idle_calls"] = got["calls"]
            result["rss_mb_per_process"] = round(statistics.mean(got["rss_mb"]))
            result["load_avg"] = os.getloadavg()[0]
            result.update(await churn(pool, watcher, names, history, cycles))
            result["restarted_members"] = await asyncio.to_thread(pool.restarts)
        finally:
            await asyncio.to_thread(pool.close)
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
    # The idle CPU measured here, one group after the other, is shown; the
    # target is judged on both groups measured at once (side_by_side).
    rows = (("start of all -> stable", "start_s", "s", 10.0, False),
            ("join -> stable (median)", "join_median_s", "s", 1.0, False),
            ("leave -> stable (median)", "leave_median_s", "s", 1.0, False),
            ("idle CPU per member, one group after the other", "idle_cpu_ms_per_member_s",
             "ms/s", None, False),
            ("requests per member per second", "requests_per_member_s", "/s", None, True))
    figures: list[Figure] = []
    for label, key, unit, limit, judged in rows:
        value, base = many[key], one[key]
        target = f"< {limit:g} s" if limit else None
        figures.append(Figure(TITLE, f"{label} ({where})", value, unit, target=target,
                              met=value < limit if limit else None,
                              details={"one_table": base}))
        figures.append(Figure(
            TITLE, f"{label}: {many['shards'] // BUCKETS} tables / one table ({server})",
            round(value / base, 2) if base else None, "x",
            target="<= 1.0" if judged else None,
            met=(value <= base) if judged else None,
            details={"many": value, "one": base}))
        figures.append(Figure(
            TITLE, f"{label}: {many['shards'] // BUCKETS} tables / one table of "
            f"{many['shards']} shards ({server})",
            round(value / flat[key], 2) if flat[key] else None, "x",
            details={"many": value, "flat": flat[key]}))
    return figures


async def side_by_side(url: str, wh: str, count: int, members: int, window_s: float,
                       windows: int, history: Path, reading: bool) -> dict[str, Any]:
    """The group of the one table and the group of the many tables running
    at once (started one after the other), their idle CPU per member measured
    over the same ``windows`` windows: whatever else the machine does in a
    window (another process, the tail of a start) weighs on both alike, where
    two groups measured one after the other each get their own share of it."""
    names = [f"m{i:03d}" for i in range(members)]
    pools: dict[str, MemberPool] = {}
    result: dict[str, Any] = {"reading": reading, "members": members, "windows": []}
    async with contextlib.AsyncExitStack() as stack:
        for label, table, shards in (("one", BASELINE, BUCKETS),
                                     ("many", "bench.*", count * BUCKETS)):
            group = f"side-{label}-{uuid.uuid4().hex[:6]}"
            watcher = await stack.enter_async_context(GroupWatcher(url, group, shards))
            (history / label).mkdir(parents=True, exist_ok=True)
            pool = await asyncio.to_thread(functools.partial(
                MemberPool, url=url, warehouse=wh, table=table, group=group, shards=None,
                session_timeout_s=SESSION_TIMEOUT_S, processes=worker_processes(members),
                history_dir=history / label, reading=reading))
            stack.push_async_callback(asyncio.to_thread, pool.close)
            await start_group(pool, watcher, names)
            pools[label] = pool
        # Reading members read every table's rows first (1,600 shards' plans
        # at 200 tables): let that end before the windows.
        await asyncio.sleep(READ_SETTLE_S if reading else SETTLE_S)
        for _ in range(windows):
            one, many = await asyncio.gather(
                asyncio.to_thread(pools["one"].measure, window_s),
                asyncio.to_thread(pools["many"].measure, window_s))
            per = {label: round(1000.0 * got["cpu_s"] / got["window_s"] / members, 2)
                   for label, got in (("one", one), ("many", many))}
            per["ratio"] = round(per["many"] / per["one"], 3) if per["one"] else None
            per["load_avg"] = round(os.getloadavg()[0], 2)
            result["windows"].append(per)
        result["restarted_members"] = [n for p in pools.values()
                                       for n in await asyncio.to_thread(p.restarts)]
    return result


def side_by_side_figures(server: str, count: int, got: dict[str, Any]) -> list[Figure]:
    """The median of the windows' ratios many / one, with every window's."""
    who = "reading members" if got["reading"] else "members"
    ratios = [w["ratio"] for w in got["windows"] if w["ratio"] is not None]
    median = round(statistics.median(ratios), 2) if ratios else None
    many = statistics.median(w["many"] for w in got["windows"])
    one = statistics.median(w["one"] for w in got["windows"])
    where = f"{server}, {got['members']} {who}, both groups at once"
    return [Figure(TITLE, f"idle CPU per {who[:-1]}, {count} tables ({where})", many, "ms/s",
                   details={"one_table": one}),
            Figure(TITLE, f"idle CPU per {who[:-1]}, side by side: {count} tables / one "
                   f"table ({server}), median of {len(ratios)} windows", median, "x",
                   target="<= 1.0", met=median is not None and median <= 1.0,
                   details={"windows": got["windows"]})]


def scale_figures(ctx: Context, wh: str, one_member_ms: dict[str, float]) -> list[Figure]:
    """The scale and side-by-side parts on the tables of ``wh``; the one
    table's idle member cost (ms/s, not reading) of each server goes in
    ``one_member_ms``."""
    from tests.support.zk_server import ZkServer, require_zookeeper

    count, members = table_count(ctx.quick), member_count()
    window, cycles = (5.0, 1) if ctx.quick else (30.0, 3)
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
            if "scale" in parts():
                got: dict[str, dict[str, Any]] = {}
                shards = count * BUCKETS
                for label, table, fixed in (("one", BASELINE, None), ("flat", FLAT, shards),
                                            ("many", "bench.*", None)):
                    got[label] = asyncio.run(scenario(
                        url, wh, table, fixed or (BUCKETS if table == BASELINE else shards),
                        members, window, cycles, ctx.scratch("history"), fixed))
                    print(f"   {server} {label}: {json.dumps(got[label])}", flush=True)
                figures += compared(server, got["many"], got["one"], got["flat"])
            for reading in (False, True):
                side = asyncio.run(side_by_side(
                    url, wh, count, members, window, 1 if ctx.quick else SIDE_WINDOWS,
                    ctx.scratch("history") / f"side-{server}-{reading}", reading))
                print(f"   {server} side by side{' reading' if reading else ''}: "
                      f"{json.dumps(side)}", flush=True)
                figures += side_by_side_figures(server, count, side)
                if not reading:
                    one_member_ms[server] = statistics.median(w["one"] for w in side["windows"])
    finally:
        if zk is not None:
            zk.stop()
    return figures


def floor_part(ctx: Context, wh: str, one_member_ms: dict[str, float]) -> list[Figure]:
    """The poll's floor (``tables_poll.py``) on the local tables of ``wh`` and
    on the S3 server."""
    count, members = table_count(ctx.quick), member_count()
    names = [f"bench.t{i:04d}" for i in range(count)]
    figures: list[Figure] = []
    for store, got in (("local", local_floor(wh, names, BASELINE, ctx.quick)),
                       ("S3", s3_floor(ctx))):
        print(f"   poll floor {store}: {json.dumps(got)}", flush=True)
        figures += floor_figures(store, got, count, members, one_member_ms)
    return figures


def run(ctx: Context) -> list[Figure]:
    figures: list[Figure] = []
    one_member_ms: dict[str, float] = {}
    if {"scale", "idle", "floor"} & set(parts()):
        wh = str(ctx.scratch("wh"))
        made = make_tables(wh, table_count(ctx.quick))
        print(f"   {table_count(ctx.quick) + 1} tables made in {made:.1f} s", flush=True)
        if "scale" in parts() or "idle" in parts():
            figures += scale_figures(ctx, wh, one_member_ms)
        if "floor" in parts():
            figures += floor_part(ctx, wh, one_member_ms)
    if "tput" in parts():
        figures += delivery_figures(ctx, TITLE)
    return figures
