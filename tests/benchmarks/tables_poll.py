"""(18) The floor of an idle group of many tables: what noticing a new snapshot costs.

A group learns of a table's new snapshot by asking the store for the file of
the snapshot after the latest it knows (Paimon commits a snapshot by writing
that file; no store the group reads from says so by itself). The group's
leader asks it of every live table at every poll interval
(``TablesPoller``, member/table_refresh.py), where a group of one table asks
it of one: whatever else is saved, a member's share of that poll is what its
idle cost at N tables must exceed one table's by.

Measured side by side in one run, on a local warehouse and on the suite's
S3-compatible server (moto, on loopback: it counts requests, its CPU is the
client's): ``ShardedTable.latest_snapshot_id`` of each of ``K`` idle tables
(one poll of the leader's, between identity checks) and of one table,
alternated, one poll a second as the leader runs them (a poll finds caches
as the rest of the second left them). Printed: the CPU of a poll of ``K``
tables and of one (thread CPU time, median of the rounds: a poll that also
confirms the latest by a full read, every 30 s, is left out, so the figure
errs low), the requests a poll makes, what a table past the first adds to a
poll, and the **lowest ratio** that the poll alone
allows an idle member of ``count`` tables over ``members`` members against a
member of one table, given the one table's member cost measured by the
side-by-side windows of the same run (``count - 1`` more tables polled each
second, shared by the members).

Sizes: ``BENCH_TABLES_POLL_S3`` (tables on the S3 server, default 20;
``--quick`` 5): the poll of ``count`` tables there is ``count`` times a table's,
one request each.
"""

from __future__ import annotations

import os
import statistics
import time
import uuid
from typing import Any

from tests.benchmarks.common import Context, Figure, fill_table

ROUNDS = 12
ROUND_S = 1.0


def s3_table_count(quick: bool) -> int:
    return int(os.environ.get("BENCH_TABLES_POLL_S3", "5" if quick else "20"))


def measure_polls(tables: list[Any], one: Any, rounds: int,
                  requests: Any = None) -> dict[str, Any]:
    """Thread CPU of a poll of ``tables`` and of ``one``, alternated once a
    second; ``requests``: a callable giving the store's request count so far."""
    for t in [*tables, one]:  # opened: each knows its latest, as a leader's do
        t.latest_snapshot_id()
        t.latest_snapshot_id()
    many_s: list[float] = []
    one_s: list[float] = []
    counted = {"many": 0, "one": 0}
    for _ in range(rounds):
        for label, polled, into in (("many", tables, many_s), ("one", [one], one_s)):
            before = requests() if requests is not None else 0
            began = time.thread_time()
            for t in polled:
                t.latest_snapshot_id()
            into.append(time.thread_time() - began)
            if requests is not None:
                counted[label] += requests() - before
            time.sleep(ROUND_S / 2)
    many, single = statistics.median(many_s), statistics.median(one_s)
    return {"tables": len(tables), "poll_ms": round(many * 1000, 3),
            "one_ms": round(single * 1000, 3),
            # What each table past the first adds to a poll.
            "per_table_us": round((many - single) / max(len(tables) - 1, 1) * 1e6, 1),
            "requests_per_poll": counted["many"] / rounds,
            "requests_one": counted["one"] / rounds}


def local_floor(wh: str, names: list[str], baseline: str, quick: bool) -> dict[str, Any]:
    from paimon_group.reading.table import ShardedTable

    tables = [ShardedTable.open(wh, n) for n in names]
    one = ShardedTable.open(wh, baseline)
    return measure_polls(tables, one, 4 if quick else ROUNDS)


def s3_floor(ctx: Context) -> dict[str, Any]:
    from paimon_group.reading.table import ShardedTable
    from tests.support.s3_server import S3Server, catalog_options, free_port
    from tests.support.tables import register_catalog_options

    count = s3_table_count(ctx.quick)
    server = S3Server(free_port(), ctx.scratch("poll-s3") / "server.log")
    server.start()
    try:
        bucket = f"pg-poll-{uuid.uuid4().hex[:6]}"
        server.create_bucket(bucket)
        wh, options = f"s3://{bucket}/wh", catalog_options(server.endpoint)
        register_catalog_options(wh, options)
        names = [f"poll.t{i:03d}" for i in range(count)]
        for name in [*names, "poll.one"]:
            fill_table(wh, name, buckets=8, snapshots=1, rows_per_snapshot=16)
        tables = [ShardedTable.open(wh, n, options) for n in names]
        one = ShardedTable.open(wh, "poll.one", options)
        return measure_polls(tables, one, 4 if ctx.quick else ROUNDS,
                             lambda: server.counts()["total"])
    finally:
        server.stop()


def floor_figures(store: str, got: dict[str, Any], count: int, members: int,
                  one_member_ms: dict[str, float]) -> list[Figure]:
    """The poll's figures on ``store``; the lowest idle ratio it allows at
    ``count`` tables over ``members`` members, for each server whose one-table
    member cost (ms/s) the side-by-side windows measured."""
    figures = [Figure("tables", f"leader's poll of {got['tables']} idle tables / of one "
                      f"({store})", round(got["poll_ms"] / got["one_ms"], 1)
                      if got["one_ms"] else None, "x", details=got)]
    excess_ms = (count - 1) * got["per_table_us"] / 1000.0 / members  # per member, per s
    for server, one_ms in one_member_ms.items():
        figures.append(Figure(
            "tables", f"lowest idle ratio the poll allows, {count} tables over {members} "
            f"members, one poll a second ({store}; one table's member as measured on "
            f"{server})", round(1.0 + excess_ms / one_ms, 3), "x",
            details={"poll_excess_ms_per_member": round(excess_ms, 3),
                     "one_table_member_ms": one_ms}))
    return figures
