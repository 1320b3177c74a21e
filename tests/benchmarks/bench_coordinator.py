"""(6) Coordinator scale on the real member: start, join and leave of a large
group, and its requests at steady state; etcd and ZooKeeper side by side.

Real :class:`~paimon_group.GroupMember` objects (their control loops, without
reading, as the Spark source uses them), several per process over one worker
process per core (:mod:`tests.benchmarks.member_pool`), session timeout 10 s
(30 s at 1,000 members; ``BENCH_COORDINATOR_SESSION_S`` sets it), no table
reads; a member that fails is started again (as a supervisor would) and the
restarts are reported. Sizes: 200 members x 2,048 shards and 1,000 x 8,192 (20 x 256
with ``--quick``); ``BENCH_COORDINATOR_SIZES=200x2048`` picks some, and
``BENCH_COORDINATOR_SERVERS=etcd`` one server, ``BENCH_ZK_CLIENT=kazoo,asyncio``
the ZooKeeper clients (one run each, back to back; default: the coordinator's), and
``BENCH_COORDINATOR_PROFILE=DIR`` profiles the workers' event loops (cProfile)
during the joins and leaves and prints the top functions.

* start: every member's ``start()`` called -> stable, timed once the worker
  processes have imported (``workers_ready_s``: how long that took), with where
  its time went (``start_timeline``: the generations the watcher saw, the
  acquisitions and releases per second, when the members registered);
* join: one more member's ``start()`` called -> stable (median of the cycles);
* leave: a follower's ``stop()`` (graceful leave) called -> stable;
* steady state over a window after the start: the members' requests per
  member per second (``get``, ``get_many``, ``list``, ``create``, ``commit``,
  ``delete``, counted in the client) and the messages the server received per
  second (etcd: ``grpc_server_msg_received_total`` of its ``/metrics``, which
  also counts lease keep-alives and watch requests; ZooKeeper: ``Received`` of
  ``srvr``, every packet including pings).

Stable = the published assignment names exactly the live members and covers
every shard, and every shard's owner key is held by its assigned member, as
seen by a watcher in this process (:class:`~tests.benchmarks.member_pool.GroupWatcher`).
Each join and leave also prints where its time went, from the members'
``--history`` events and the watcher: when the new generation was seen, the
first and last release by the old owners, the first and last acquisition.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import os
import statistics
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.benchmarks.common import Context, Figure
from tests.benchmarks.member_pool import GroupWatcher, MemberPool

TITLE = "coordinator"
SESSION_TIMEOUT_S = 10.0
LARGE_SESSION_TIMEOUT_S = 30.0  # 1,000 members on 2 cores (Kafka's default: 45 s)


def processes(members: int) -> int:
    """One worker process per core; ``BENCH_COORDINATOR_PROCESSES`` overrides
    it (to see what the members per process cost, docs/benchmarks.md (14))."""
    chosen = os.environ.get("BENCH_COORDINATOR_PROCESSES")
    return min(int(chosen) if chosen else os.cpu_count() or 1, members)


def session_timeout_s(members: int) -> float:
    chosen = os.environ.get("BENCH_COORDINATOR_SESSION_S")
    if chosen:
        return float(chosen)
    return LARGE_SESSION_TIMEOUT_S if members >= 1000 else SESSION_TIMEOUT_S
GROUP = "scale"
SETTLE_S = 3.0


def etcd_messages(endpoint: str) -> Callable[[], float]:
    def count() -> float:
        with urllib.request.urlopen(f"http://{endpoint}/metrics", timeout=10) as response:
            text = response.read().decode()
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("grpc_server_msg_received_total{"))
    return count


def zookeeper_packets(zk: Any) -> Callable[[], float]:
    def count() -> float:
        for line in zk.four_letter("srvr").splitlines():
            if line.startswith("Received:"):
                return float(line.split(":", 1)[1])
        raise RuntimeError("no 'Received' in srvr")
    return count


def timeline(history: Path, t0: float, stable: float, generation_seen: float | None,
             joiner: str | None = None) -> dict[str, Any]:
    """Where a join's or leave's time went (seconds after the event)."""
    releases: list[float] = []
    acquires: list[float] = []
    for path in history.glob("history-*.jsonl"):
        for line in path.read_text().splitlines():
            e = json.loads(line)
            if not t0 <= e["t"] <= stable:
                continue
            if e["event"] == "release" and e["member"] != joiner:
                releases.append(e["t"] - t0)
            elif e["event"] == "acquire":
                acquires.append(e["t"] - t0)
    r3 = lambda v: None if v is None else round(v, 3)  # noqa: E731
    return {
        "generation_seen_s": r3(None if generation_seen is None else generation_seen - t0),
        "releases": len(releases), "first_release_s": r3(min(releases, default=None)),
        "last_release_s": r3(max(releases, default=None)),
        "acquires": len(acquires), "first_acquire_s": r3(min(acquires, default=None)),
        "last_acquire_s": r3(max(acquires, default=None)),
        "stable_s": r3(stable - t0),
    }


def registrations(members: dict[str, Any], began_wall: float) -> dict[str, Any]:
    """When the members registered (their records' ``started_at``): the first,
    the last, and the longest pause between two arrivals."""
    times = sorted(info.started_at - began_wall for info in members.values())
    gaps = [b - a for a, b in itertools.pairwise(times)]
    return {"first_registered_s": round(times[0], 2), "last_registered_s": round(times[-1], 2),
            "longest_arrival_pause_s": round(max(gaps, default=0.0), 3),
            "arrival_pauses_over_0.5_s": sum(g > 0.5 for g in gaps)}


def events_per_second(history: Path, t0: float, t1: float) -> dict[str, list[int]]:
    """Acquisitions and releases in each second from ``t0`` to ``t1``."""
    seconds = int(t1 - t0) + 1
    counts = {"acquire": [0] * seconds, "release": [0] * seconds}
    for path in history.glob("history-*.jsonl"):
        for line in path.read_text().splitlines():
            e = json.loads(line)
            if e["event"] in counts and t0 <= e["t"] <= t1:
                counts[e["event"]][int(e["t"] - t0)] += 1
    return counts


async def churn(pool: MemberPool, watcher: GroupWatcher, names: list[str], history: Path,
                cycles: int) -> dict[str, Any]:
    """``cycles`` times: one member joins -> stable, then a follower leaves -> stable."""
    live = set(names)
    joins: list[dict[str, Any]] = []
    leaves: list[dict[str, Any]] = []
    for c in range(cycles):
        newcomer = f"j{c:03d}"
        before, cpu = pool.requests(), pool.cpu_s()
        known = max(watcher.generations, default=0)
        t0 = await asyncio.to_thread(pool.join, newcomer)
        live.add(newcomer)
        stable = await watcher.wait_stable(live, 120)
        seen = min((t for g, t in watcher.generations.items() if g > known), default=None)
        joins.append({**timeline(history, t0, stable, seen, newcomer),
                      "requests": pool.requests() - before,
                      "client_cpu_s": round(pool.cpu_s() - cpu, 3)})
        await asyncio.sleep(SETTLE_S)

        leader = await watcher.leader()
        leaver = next(m for m in sorted(live) if m != leader and m != newcomer)
        before, cpu = pool.requests(), pool.cpu_s()
        known = max(watcher.generations, default=0)
        t0 = await asyncio.to_thread(pool.leave, leaver)
        live.discard(leaver)
        stable = await watcher.wait_stable(live, 120)
        seen = min((t for g, t in watcher.generations.items() if g > known), default=None)
        leaves.append({**timeline(history, t0, stable, seen),
                       "requests": pool.requests() - before,
                       "client_cpu_s": round(pool.cpu_s() - cpu, 3)})
        await asyncio.sleep(SETTLE_S)
    return {"joins": joins, "leaves": leaves}


async def scenario(url: str, wh: str, members: int, shards: int, window_s: float,
                   cycles: int, history: Path, server_count: Callable[[], float]
                   ) -> dict[str, Any]:
    names = [f"m{i:04d}" for i in range(members)]
    result: dict[str, Any] = {"members": members, "shards": shards,
                              "session_timeout_s": session_timeout_s(members),
                              "load_avg_before": os.getloadavg()}
    async with GroupWatcher(url, GROUP, shards) as watcher:
        # The workers import the member's modules before the pool returns: off
        # the loop, where the watcher's ZooKeeper session keeps beating.
        spawned = time.monotonic()
        pool = await asyncio.to_thread(functools.partial(
            MemberPool, url=url, warehouse=wh, table="db.t", group=GROUP, shards=shards,
            session_timeout_s=session_timeout_s(members), processes=processes(members),
            history_dir=history))
        # Before 1516da1 the start was timed from here (the workers' imports
        # included): start_s + workers_ready_s is that figure.
        result["workers_ready_s"] = round(time.monotonic() - spawned, 2)
        profiling = os.environ.get("BENCH_COORDINATOR_PROFILE")
        try:
            if profiling:
                await asyncio.to_thread(pool.profile, Path(profiling) / "start")
            began, began_wall = time.monotonic(), time.time()
            starting = asyncio.ensure_future(asyncio.to_thread(pool.start, names))
            started: list[float] = []
            starting.add_done_callback(lambda _: started.append(time.monotonic()))
            stable = await watcher.wait_stable(set(names), 600)
            await starting
            if profiling:
                print("   the start's profile:", flush=True)
                print_profile(await asyncio.to_thread(pool.profile, None))
            result["start_s"] = round(stable - began, 2)
            # When the last start() returned: the members' own start (open
            # the table, the session, register), apart from the rebalances.
            result["start_calls_returned_s"] = round(started[0] - began, 2)
            # Where the start's time went: the generations the watcher saw
            # (when), and the members' releases and acquisitions.
            result["start_timeline"] = {
                **timeline(history, began, stable, None),
                "generations_seen": {g: round(t - began, 2) for g, t in
                                     sorted(watcher.generations.items())},
                "events_per_s": events_per_second(history, began, stable),
                "requests": pool.requests(),
                **registrations(await watcher.group.members(), began_wall),
            }
            result["processes"] = pool.processes
            await asyncio.sleep(SETTLE_S)

            server_before = server_count()
            got = await asyncio.to_thread(pool.measure, window_s)
            server_after = server_count()
            window = got["window_s"]
            result["steady_requests_per_member_s"] = round(
                sum(got["calls"].values()) / window / members, 3)
            result["steady_calls"] = got["calls"]
            result["steady_server_messages_per_s"] = round(
                (server_after - server_before) / window, 1)
            result["steady_server_messages_per_member_s"] = round(
                (server_after - server_before) / window / members, 2)
            result["steady_cpu_ms_per_member_s"] = round(
                1000.0 * got["cpu_s"] / window / members, 2)
            result["load_avg_steady"] = os.getloadavg()
            result["threads_per_process"] = round(statistics.mean(got["threads"]), 1)
            result["peak_rss_mb_per_process"] = round(statistics.mean(got["rss_mb"]))

            if profiling:
                await asyncio.to_thread(pool.profile, Path(profiling))
            result.update(await churn(pool, watcher, names, history, cycles))
            if profiling:
                print_profile(await asyncio.to_thread(pool.profile, None))
            result["load_avg_after"] = os.getloadavg()
            result["restarted_members"] = await asyncio.to_thread(pool.restarts)
        finally:
            await asyncio.to_thread(pool.close)
    for what in ("joins", "leaves"):
        times = [c["stable_s"] for c in result[what]]
        result[f"{what[:-1]}_median_s"] = round(statistics.median(times), 3)
        result[f"{what[:-1]}_max_s"] = round(max(times), 3)
        # The last owner key created, by the members' own clocks: when the
        # group became stable, without the watcher's confirming read (which
        # lists every owner key: on ZooKeeper seconds under load).
        last = [max(c["last_acquire_s"] or 0.0, c["last_release_s"] or 0.0)
                for c in result[what]]
        result[f"{what[:-1]}_last_acquire_median_s"] = round(statistics.median(last), 3)
    return result


def print_profile(paths: list[Path]) -> None:
    """The workers' event loops during the joins and leaves, by own time."""
    import pstats

    stats = pstats.Stats(*(str(p) for p in paths))
    stats.sort_stats("tottime").print_stats(25)
    stats.sort_stats("cumulative").print_stats(40)


def sizes(quick: bool) -> list[tuple[int, int]]:
    if quick:
        return [(20, 256)]
    chosen = os.environ.get("BENCH_COORDINATOR_SIZES", "200x2048,1000x8192")
    return [(int(m), int(s)) for m, s in (p.split("x") for p in chosen.split(","))]


def servers() -> list[str]:
    """``BENCH_COORDINATOR_SERVERS=etcd`` picks some (default: both)."""
    chosen = os.environ.get("BENCH_COORDINATOR_SERVERS", "etcd,zookeeper").split(",")
    return [s for s in ("etcd", "zookeeper") if s in chosen]


def zk_clients() -> list[str]:
    """``BENCH_ZK_CLIENT=kazoo,asyncio``: the ZooKeeper clients to run, one after
    the other on the same server (default: "", the coordinator's default)."""
    chosen = os.environ.get("BENCH_ZK_CLIENT", "").split(",")
    return [c for c in ("kazoo", "asyncio") if c in chosen] or [""]


def runs() -> list[tuple[str, str]]:
    """(label, server) of each run: etcd, then ZooKeeper once per client."""
    found: list[tuple[str, str]] = []
    for server in servers():
        if server == "zookeeper":
            found += [(f"zookeeper ({client})" if client else "zookeeper", f"zookeeper:{client}")
                      for client in zk_clients()]
        else:
            found.append((server, server))
    return found


def figures_of(server: str, r: dict[str, Any], targets: bool) -> list[Figure]:
    where = f"{server}, {r['members']} members x {r['shards']} shards"
    load = f"load {r['load_avg_steady'][0]:.1f}"
    n = len(r["joins"])

    def judged(name: str, value_s: float, limit_s: float, text: str) -> Figure:
        return Figure(TITLE, name, round(1000 * value_s), "ms", target=text if targets else None,
                      met=value_s < limit_s if targets else None, details=r)

    return [
        judged(f"join -> stable, median of {n} ({where}; {load})",
               r["join_median_s"], 1.0, "< 1 s"),
        judged(f"leave -> stable, median of {n} ({where})", r["leave_median_s"], 1.0, "< 1 s"),
        Figure(TITLE, f"join -> last owner key created, median ({where})",
               round(1000 * r["join_last_acquire_median_s"]), "ms", details=r),
        Figure(TITLE, f"leave -> last owner key created, median ({where})",
               round(1000 * r["leave_last_acquire_median_s"]), "ms", details=r),
        judged(f"start of all members -> stable ({where})", r["start_s"], 10.0, "< 10 s"),
        Figure(TITLE, f"start of all members -> the last start() returned ({where})",
               round(1000 * r["start_calls_returned_s"]), "ms", details=r),
        Figure(TITLE, f"steady-state requests per member per second ({where})",
               r["steady_requests_per_member_s"], "/s", details=r),
        Figure(TITLE, f"steady-state messages received by the server ({where})",
               r["steady_server_messages_per_s"], "/s", details=r),
    ]


def run(ctx: Context) -> list[Figure]:
    from tests.support.tables import make_append_table, write_rows
    from tests.support.zk_server import ZkServer, require_zookeeper

    java, jar = require_zookeeper()
    zk = ZkServer(java, jar, ctx.scratch("zk"))
    zk.start()
    figures: list[Figure] = []
    window = 5.0 if ctx.quick else 20.0
    cycles = 1 if ctx.quick else 3
    try:
        for members, shards in sizes(ctx.quick):
            for server, which in runs():
                wh = str(ctx.scratch("wh"))
                make_append_table(wh, "db.t", buckets=-1)
                write_rows(wh, "db.t", range(10))
                if which == "etcd":
                    url, count = ctx.etcd_url(), etcd_messages(ctx.etcd().endpoint)
                else:
                    client = which.partition(":")[2]
                    url = zk.unique_url() + (f"&client={client}" if client else "")
                    count = zookeeper_packets(zk)
                try:
                    r = asyncio.run(scenario(url, wh, members, shards, window, cycles,
                                             ctx.scratch("history"), count))
                except (TimeoutError, RuntimeError) as err:
                    # Not stable within the limit (or a worker gave up): said,
                    # and the other sizes and servers still run.
                    print(f"   {server} {members}x{shards}: {err}", flush=True)
                    figures.append(Figure(TITLE, f"{server}, {members} members x {shards} "
                                          f"shards: {err}", None, ""))
                    continue
                print(f"   {server} {members}x{shards}: {json.dumps(r)}", flush=True)
                figures += figures_of(server, r, targets=(members, shards) == (200, 2048))
    finally:
        zk.stop()
    return figures
