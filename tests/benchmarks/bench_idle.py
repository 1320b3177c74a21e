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
import os
import time
from collections import Counter
from typing import Any

from tests.benchmarks.common import Context, Figure
from tests.benchmarks.member_pool import GroupWatcher, MemberPool

TITLE = "idle"
SESSION_TIMEOUT_S = 10.0
WINDOW_S = 20.0
SETTLE_S = 5.0
STABLE_LIMIT_S = 240.0


def measure(url: str, wh: str, members: int, shards: int) -> dict[str, Any]:
    """One group of ``members`` x ``shards`` on ``url``: its idle figures."""
    names = [f"m{i:04d}" for i in range(members)]

    async def stable() -> float:
        async with GroupWatcher(url, "idle", shards) as watcher:
            return await watcher.wait_stable(set(names), STABLE_LIMIT_S)

    began = time.monotonic()
    pool = MemberPool(url=url, warehouse=wh, table="db.t", group="idle", shards=shards,
                      session_timeout_s=SESSION_TIMEOUT_S,
                      processes=min(os.cpu_count() or 1, members))
    try:
        pool.start(names)
        try:
            stable_s: float | None = asyncio.run(stable()) - began
        except TimeoutError:
            stable_s = None
        time.sleep(SETTLE_S)
        got = pool.measure(WINDOW_S)
    finally:
        pool.close()
    window = got["window_s"]
    calls: Counter[str] = Counter(got["calls"])
    return {
        "members": members, "shards": shards, "processes": pool.processes,
        "stable_s": stable_s,
        "cpu_ms_per_member_s": 1000.0 * got["cpu_s"] / window / members,
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
