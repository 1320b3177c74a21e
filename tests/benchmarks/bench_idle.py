"""(10) Idle members: CPU and coordinator requests per member at steady state.

Real :class:`~paimon_group.GroupMember` objects (their control loops, without
reading, as the Spark source drives them), spread over as many worker
processes as the machine has cores, join one group of 2,048 shards (256 with
``--quick``) on a real etcd and a real ZooKeeper. Once the group is stable
(the published assignment names every member, every shard has an owner key),
each worker measures over the same window its process CPU time (every thread:
the event loop, the coordinator clients' keep-alive threads) and the requests
its members' coordinators made (``get``, ``get_many``, ``list``, ``create``,
``commit``, ``delete``; not keep-alives or watch streams).

Printed per server, at 20 and 200 members: idle CPU per member (ms of CPU per
second), requests per member per second, and the time from the start of all
members to stable. Neither idle figure may grow with the members or the
shards (issue 29): the check of a member's ownership reads its own keys only.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import resource
import time
from collections import Counter
from multiprocessing.connection import Connection
from typing import Any

from tests.benchmarks.common import Context, Figure

TITLE = "idle"
SESSION_TIMEOUT_S = 10.0
WINDOW_S = 20.0
SETTLE_S = 5.0
STABLE_LIMIT_S = 240.0
COUNTED = ("get", "get_many", "list", "create", "commit", "delete")


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _worker(conn: Connection, url: str, wh: str, members: list[str], shards: int) -> None:
    """Runs ``members`` in this process; answers "measure" with its figures."""
    from paimon_group import GroupMember, MemberConfig

    calls: Counter[str] = Counter()
    real_open = GroupMember._open_coordinator

    async def open_counting(self: GroupMember) -> Any:
        coord = await real_open(self)
        for name in COUNTED:
            real = getattr(coord, name)

            def counting(real: Any = real, name: str = name) -> Any:
                async def call(*args: Any, **kwargs: Any) -> Any:
                    calls[name] += 1
                    return await real(*args, **kwargs)
                return call

            setattr(coord, name, counting())
        return coord

    GroupMember._open_coordinator = open_counting  # type: ignore[method-assign]

    async def main() -> None:
        group = [GroupMember(MemberConfig(group="idle", warehouse=wh, table="db.t",
                                          coordinator=url, member_id=m, shards=shards,
                                          session_timeout_s=SESSION_TIMEOUT_S),
                             auto_commit=False) for m in members]
        await asyncio.gather(*(m.start() for m in group))
        conn.send("started")
        loop = asyncio.get_running_loop()
        while True:
            message = await loop.run_in_executor(None, conn.recv)
            if message == "stop":
                break
            before, cpu0, t0 = Counter(calls), _cpu_s(), time.monotonic()
            await asyncio.sleep(float(message))
            window = time.monotonic() - t0
            conn.send({"cpu_s": _cpu_s() - cpu0, "window_s": window,
                       "calls": dict(calls - before)})
        await asyncio.gather(*(m.stop() for m in group))

    asyncio.run(main())
    conn.send("stopped")


async def _stable(url: str, members: int, shards: int) -> bool:
    from coordinators.registry import open_coordinator
    from paimon_group.protocol.group import GroupClient

    async with open_coordinator(url) as coord:
        group = GroupClient(coord, "idle")
        assignment, _ = await group.read_assignment()
        if assignment is None or len(assignment.shards) != members:
            return False
        return len(await group.owners()) == shards


def measure(url: str, wh: str, members: int, shards: int) -> dict[str, Any]:
    """One group of ``members`` x ``shards`` on ``url``: its idle figures."""
    jobs = max(1, min(os.cpu_count() or 1, members))
    names = [f"m{i:04d}" for i in range(members)]
    context = multiprocessing.get_context("spawn")
    pipes: list[Connection] = []
    procs = []
    began = time.monotonic()
    for j in range(jobs):
        parent, child = context.Pipe()
        proc = context.Process(target=_worker, args=(child, url, wh, names[j::jobs], shards),
                               daemon=True)
        proc.start()
        pipes.append(parent)
        procs.append(proc)
    try:
        for p in pipes:
            if not p.poll(STABLE_LIMIT_S) or p.recv() != "started":
                raise RuntimeError("a worker did not start its members")
        stable_s: float | None = None
        while time.monotonic() - began < STABLE_LIMIT_S:
            if asyncio.run(_stable(url, members, shards)):
                stable_s = time.monotonic() - began
                break
            time.sleep(0.5)
        time.sleep(SETTLE_S)
        for p in pipes:
            p.send(str(WINDOW_S))
        results = [p.recv() for p in pipes]
    finally:
        for p in pipes:
            try:
                p.send("stop")
            except OSError:
                pass
        for p in pipes:
            if p.poll(60):
                p.recv()
        for proc in procs:
            proc.join(30)
            if proc.is_alive():
                proc.kill()
    window = max(r["window_s"] for r in results)
    calls: Counter[str] = Counter()
    for r in results:
        calls.update(r["calls"])
    return {
        "members": members, "shards": shards, "processes": jobs,
        "stable_s": stable_s,
        "cpu_ms_per_member_s": 1000.0 * sum(r["cpu_s"] for r in results) / window / members,
        "requests_per_member_s": sum(calls.values()) / window / members,
        "calls": dict(calls),
    }


def run(ctx: Context) -> list[Figure]:
    from tests.support.tables import make_append_table, write_rows
    from tests.support.zk_server import ZkServer, require_zookeeper

    shards = 256 if ctx.quick else 2048
    sizes = (20, 200)
    java, jar = require_zookeeper()
    zk = ZkServer(java, jar, ctx.scratch("zk"))
    zk.start()
    figures: list[Figure] = []
    try:
        for server in ("etcd", "zookeeper"):
            for members in sizes:
                wh = str(ctx.scratch("wh"))
                make_append_table(wh, "db.t", buckets=-1)
                write_rows(wh, "db.t", range(10))
                url = ctx.etcd_url() if server == "etcd" else zk.unique_url()
                got = measure(url, wh, members, shards)
                where = f"{server}, {members} members x {shards} shards"
                figures += [
                    Figure(TITLE, f"idle CPU per member ({where})",
                           round(got["cpu_ms_per_member_s"], 2), "ms/s", details=got),
                    Figure(TITLE, f"requests per member per second ({where})",
                           round(got["requests_per_member_s"], 2), "/s"),
                    Figure(TITLE, f"start of all members -> stable ({where})",
                           None if got["stable_s"] is None else round(got["stable_s"], 1),
                           "s"),
                ]
    finally:
        zk.stop()
    return figures
