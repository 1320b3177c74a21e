"""(13) Load-aware assignment: count against load on skewed tables, 4 members.

Two skewed tables written with pypaimon, 16 shards each:

* ``hot-partition``: a fixed-bucket primary-key table, 4 buckets over 8
  partitions, with 80% of the rows in partition p0 (rule
  ``partition-bucket``: p0's 4 buckets are 4 consecutive shards);
* ``dynamic``: a dynamic-bucket primary-key table whose first buckets carry
  most of the rows (their keys updated again and again, nothing compacted;
  rule ``bucket % 16``).

For each table and each assignor (``count``, ``load``), 4 real
:class:`~paimon_group.GroupMember` objects in this process, on an embedded
coordinator, join a new group, wait until the group is stable, then read the
backlog (``hot-partition``: ``--start latest-full``, a full scan of the
table; ``dynamic``: ``--start snapshot:1``, every snapshot's rows, every
version of a key, as a group catching up on a changelog reads them) with a
handler that reads each batch's rows and sleeps ``rows / RATE`` (every member
reads at the same fixed rate, one batch at a time): printed side by side,
the max/mean rows each member delivered, the time from the first delivery to
the last, and that time over the time of a perfect balance
(``total rows / 4 / RATE``).

The shards moved per rebalance come from the pure assignors on the loads
measured from the same table (``paimon_group.reading.shard_load``): 4 members join
one by one, a fifth joins, one leaves, and then the load shifts (the next
rows go to another partition, or other buckets) -- count against load, each
step's moves.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.benchmarks.common import Context, Figure

TITLE = "load"
MEMBERS = ["m0", "m1", "m2", "m3"]
SHARDS = 16
RATE = 10_000.0  # rows per second each member reads
GOAL_RATIO = 1.2


# -- the tables -------------------------------------------------------------------------


def hot_partition_table(wh: str, rows: int) -> str:
    """80% of ``rows`` in partition p0 (ids multiple of 8), in 4 commits."""
    from tests.support.tables import make_pk_table, write_rows

    make_pk_table(wh, "db.hot", buckets=4, partitioned=True)
    hot = [8 * i for i in range(rows * 4 // 5)]
    cold = [8 * i + 1 + i % 7 for i in range(rows - len(hot))]
    ids = hot + cold
    step = len(ids) // 4 + 1
    for start in range(0, len(ids), step):
        write_rows(wh, "db.hot", ids[start:start + step])
    return "db.hot"


def dynamic_table(wh: str, rows: int) -> str:
    """Keys in 32 dynamic buckets; the keys of the first buckets are written
    again and again (bucket b's keys ``rounds - b`` more times), so the first
    buckets carry most of the table's ``rows``."""
    from tests.support.tables import make_pk_table, write_rows

    keys = rows // 4
    target = max(1, keys // 32)
    make_pk_table(wh, "db.dyn", buckets=-1,
                  options={"dynamic-bucket.target-row-num": str(target)})
    write_rows(wh, "db.dyn", range(keys))
    written, rounds, v = keys, 12, 1
    while written < rows and rounds > 0:
        # Keys of the first `rounds` buckets (in key order, one bucket a
        # `target` of keys), one more version each.
        hot = range(min(keys, rounds * target, rows - written))
        write_rows(wh, "db.dyn", hot, v=v)
        written += len(hot)
        rounds -= 1
        v += 1
    return "db.dyn"


# -- draining the backlog with real members -----------------------------------------------


def _stable(members: list[Any]) -> bool:
    first = members[0].assignment
    if first is None or sorted(first.shards) != MEMBERS:
        return False
    for m in members:
        a = m.assignment
        if a is None or a.generation != first.generation:
            return False
        if sorted(m.owned_shards) != sorted(a.shards_of(m.member_id)):
            return False
    return True


def _caught_up(members: list[Any], latest: int) -> bool:
    positions = [p for m in members for p in m.shard_positions().values()]
    return len(positions) == SHARDS and all(p == latest + 1 for p in positions)


async def _drain(wh: str, table: str, assignor: str, start: str, group: str
                 ) -> dict[str, Any]:
    """4 members drain ``table``'s backlog; rows per member and the drain time."""
    from paimon_group import GroupMember, MemberConfig
    from paimon_group.reading.table import ShardedTable

    latest = ShardedTable.open(wh, table).latest_snapshot_id()
    assert latest is not None

    coordinator = f"sqlite://{Path(wh).parent}/{group}.sqlite"
    delivered: Counter[str] = Counter()
    times: list[float] = []

    def handler(batch: Any) -> None:
        n = batch.to_arrow().num_rows
        started = time.monotonic()
        time.sleep(n / RATE)
        delivered[batch.member_id] += n
        times.extend((started, time.monotonic()))

    members = [GroupMember(MemberConfig(
        group=group, warehouse=wh, table=table, coordinator=coordinator, member_id=m,
        shards=SHARDS, assignor=assignor, max_parallel_shards=1, poll_interval_ms=100,
        start=start,
        session_timeout_s=10.0)) for m in MEMBERS]
    for m in members:  # one after another, as a deployment starts them
        await m.start()
    deadline = time.monotonic() + 60
    while not _stable(members):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{assignor}: the group never got stable")
        await asyncio.sleep(0.05)
    generation = members[0].assignment.generation if members[0].assignment else 0
    runs = [asyncio.create_task(m.run(handler)) for m in members]
    deadline = time.monotonic() + 600
    while not _caught_up(members, latest):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{assignor}: not caught up ({sum(delivered.values())} rows)")
        await asyncio.sleep(0.05)
    moved_while_draining = (members[0].assignment.generation if members[0].assignment
                            else 0) - generation
    for m in members:
        await m.stop()
    for r in runs:
        r.cancel()
    await asyncio.gather(*runs, return_exceptions=True)
    rows = [delivered.get(m, 0) for m in MEMBERS]
    return {"rows": rows, "drain_s": max(times) - min(times),
            "generations_while_draining": moved_while_draining}


# -- moves per rebalance, from the pure assignors ----------------------------------------------


def _moves_per_rebalance(loads: dict[int, int], shifted: dict[int, int]
                         ) -> dict[str, list[int]]:
    from paimon_group.protocol.assignor import assign, moves
    from paimon_group.protocol.load_assignor import assign_by_load

    steps: list[tuple[list[str], dict[int, int]]] = [
        (MEMBERS[:1], loads), (MEMBERS[:2], loads), (MEMBERS[:3], loads), (MEMBERS, loads),
        ([*MEMBERS, "m4"], loads), ([*MEMBERS[1:], "m4"], loads), ([*MEMBERS[1:], "m4"], shifted),
    ]
    by: dict[str, Callable[..., dict[str, list[int]]]] = {
        "count": lambda members, ls, prev: assign(SHARDS, members, prev),
        "load": lambda members, ls, prev: assign_by_load(SHARDS, members, ls, prev),
    }
    out: dict[str, list[int]] = {}
    for name, fn in by.items():
        previous: dict[str, list[int]] | None = None
        counts = []
        for members, ls in steps:
            current = fn(members, ls, previous)
            counts.append(len(moves(previous, current)) if previous is not None else 0)
            previous = current
        out[name] = counts[1:]  # the first step places every shard
    return out


def _measured(wh: str, table: str, rule: str, full_scans: bool) -> dict[int, int]:
    """The loads a new group's leader sees (with every full scan ahead, or none)."""
    from paimon_group.protocol.sharding import Sharding, ShardRule
    from paimon_group.reading.shard_load import measure, shard_loads
    from paimon_group.reading.table import ShardedTable

    t = ShardedTable.open(wh, table)
    m = measure(t, Sharding(ShardRule(rule), SHARDS))
    assert m is not None
    return shard_loads(m, full_scan_pending=set(range(SHARDS)) if full_scans else set())


def _shift(wh: str, table: str, rule: str, rows: int) -> dict[int, int]:
    """Write ``rows`` more to other keys (partition p1, or new buckets) and
    measure the loads a caught-up group then sees (the recent rows)."""
    from paimon_group.protocol.sharding import Sharding, ShardRule
    from paimon_group.reading.shard_load import measure, shard_loads
    from paimon_group.reading.table import ShardedTable
    from tests.support.tables import write_rows

    if table == "db.hot":
        write_rows(wh, table, [8 * i + 1 for i in range(10**6, 10**6 + rows)])
    else:
        write_rows(wh, table, range(10**7, 10**7 + rows))
    m = measure(ShardedTable.open(wh, table), Sharding(ShardRule(rule), SHARDS), recent=1)
    assert m is not None
    return shard_loads(m, full_scan_pending=set())


def _case(ctx: Context, name: str, make: Callable[[str, int], str], rule: str,
          start: str, rows: int) -> list[Figure]:
    base = ctx.scratch(f"load-{name}")
    wh = str(base / "wh")
    table = make(wh, rows)
    loads = _measured(wh, table, rule, full_scans=start == "latest-full")
    figures = []
    for assignor in ("count", "load"):
        d = asyncio.run(_drain(wh, table, assignor, start, f"{name}-{assignor}"))
        # A perfect balance: the rows delivered, in equal parts, at RATE.
        perfect = sum(d["rows"]) / len(MEMBERS) / RATE
        ratio = max(d["rows"]) / statistics.mean(d["rows"])
        figures.append(Figure(
            TITLE, f"{name}: {assignor}: max/mean rows per member", ratio, "x",
            target=f"<= {GOAL_RATIO}" if assignor == "load" else None,
            met=ratio <= GOAL_RATIO if assignor == "load" else None,
            details={"rows": d["rows"], "shard_loads": loads}))
        over = d["drain_s"] / perfect
        figures.append(Figure(
            TITLE, f"{name}: {assignor}: drain {d['drain_s']:.2f} s / perfect {perfect:.2f} s",
            over, "x", target=f"<= {GOAL_RATIO}" if assignor == "load" else None,
            met=over <= GOAL_RATIO if assignor == "load" else None, details=d))
    moved = _moves_per_rebalance(loads, _shift(wh, table, rule, rows // 10))
    for assignor, counts in moved.items():
        figures.append(Figure(
            TITLE, f"{name}: {assignor}: shards moved per rebalance (join x3, join, leave, "
            f"load shift): {counts}", float(max(counts)), "max",
            details={"moves": counts}))
    return figures


def run(ctx: Context) -> list[Figure]:
    rows = 40_000 if ctx.quick else 160_000
    return [
        *_case(ctx, "hot-partition", hot_partition_table, "partition-bucket", "latest-full",
               rows),
        *_case(ctx, "dynamic", dynamic_table, "bucket", "snapshot:1", rows),
    ]
