"""Shared pieces of the benchmarks: figures, statistics, data, servers.

Every benchmark module ``bench_*.py`` defines ``TITLE`` and ``run(ctx) ->
list[Figure]``; :mod:`tests.benchmarks.run` discovers and runs them. A
:class:`Figure` is a ratio or a distribution measured side by side in the
same run, with the target it is judged against.

Example::

    def run(ctx: Context) -> list[Figure]:
        a, b = measure_a(), measure_b()
        return [Figure("x", "a vs b", a / b, "x", target=">= 1.0", met=a / b >= 1.0)]
"""

from __future__ import annotations

import math
import os
import statistics
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa


@dataclass
class Figure:
    """One measured figure: ``value`` in ``unit``, judged against ``target``."""

    bench: str
    name: str
    value: float | None
    unit: str
    target: str | None = None
    met: bool | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Context:
    """What every benchmark gets: a scratch directory and shared servers."""

    workdir: Path
    quick: bool = False
    _etcd: Any = None

    def scratch(self, name: str) -> Path:
        path = self.workdir / f"{name}-{uuid.uuid4().hex[:6]}"
        path.mkdir(parents=True)
        return path

    def etcd(self) -> Any:
        """A plaintext etcd server of this run (started on first use)."""
        if self._etcd is None:
            from tests.support.etcd_server import EtcdServer, etcd_binary

            binary = etcd_binary()
            if binary is None:
                raise RuntimeError("etcd binary not found (Debian package etcd-server)")
            server = EtcdServer(binary, self.scratch("etcd"))
            server.start()
            self._etcd = server
        return self._etcd

    def etcd_url(self) -> str:
        url: str = self.etcd().url_with_prefix()
        return url

    def close(self) -> None:
        if self._etcd is not None:
            self._etcd.stop()
            self._etcd = None


# -- statistics ---------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100), nearest-rank; NaN when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]


def distribution(values: Iterable[float]) -> dict[str, float]:
    data = list(values)
    if not data:
        return {"n": 0}
    return {
        "n": len(data),
        "min": min(data),
        "median": statistics.median(data),
        "p90": percentile(data, 90),
        "p99": percentile(data, 99),
        "max": max(data),
    }


def ms(seconds: float) -> float:
    return round(seconds * 1000.0, 1)


# -- data -----------------------------------------------------------------------


def rows_for(first_id: int, count: int, payload_bytes: int = 40, v: int = 0) -> pa.Table:
    """Rows in the test tables' schema (``id``, ``v``, ``payload``)."""
    from tests.support.tables import table_schema

    ids = pa.array(range(first_id, first_id + count), pa.int64())
    filler = "x" * max(0, payload_bytes - 12)
    payload = pa.array([f"{i:012d}{filler}" for i in range(first_id, first_id + count)])
    return pa.table(
        {"id": ids, "v": pa.array([v] * count, pa.int64()), "payload": payload},
        schema=table_schema(),
    )


def commit_rows(table: Any, data: pa.Table) -> float:
    """Write ``data`` in one commit (one snapshot); the CLOCK_MONOTONIC time it committed."""
    builder = table.new_batch_write_builder()
    write = builder.new_write()
    commit = builder.new_commit()
    try:
        write.write_arrow(data)
        commit.commit(write.prepare_commit())
        return time.monotonic()
    finally:
        write.close()
        commit.close()


def fill_table(
    warehouse: str, name: str, *, buckets: int, snapshots: int, rows_per_snapshot: int,
    payload_bytes: int = 40, first_id: int = 0,
) -> int:
    """Create (if needed) and write ``snapshots`` commits; the next free id."""
    from tests.support.tables import make_pk_table, open_table

    if not os.path.exists(os.path.join(warehouse, name.replace(".", ".db/", 1))):
        make_pk_table(warehouse, name, buckets=buckets)
    table = open_table(warehouse, name)
    next_id = first_id
    for _ in range(snapshots):
        commit_rows(table, rows_for(next_id, rows_per_snapshot, payload_bytes))
        next_id += rows_per_snapshot
    return next_id


def latest_snapshot(warehouse: str, name: str) -> int:
    from tests.support.tables import latest_snapshot_id

    latest = latest_snapshot_id(warehouse, name)
    assert latest is not None
    return latest


# -- groups of member processes -------------------------------------------------


@dataclass
class GroupRun:
    """What :func:`run_group` observed (times are CLOCK_MONOTONIC)."""

    started: float
    finished: float
    rows: int
    batches: list[tuple[Any, ...]]
    planner_stats: dict[str, dict[str, int]]
    peak_rss: dict[str, int]
    ready_rss: dict[str, int]

    @property
    def seconds(self) -> float:
        return self.finished - self.started


def run_group(
    *,
    warehouse: str,
    table: str,
    coordinator: str,
    members: int,
    shards: int,
    start: str,
    expected_rows: int | None = None,
    until: Any = None,
    poll_interval_ms: int = 100,
    read: str = "to_arrow",
    during: Any = None,
    timeout_s: float = 300.0,
) -> GroupRun:
    """Run ``members`` member processes of a fresh group until ``expected_rows``
    rows were delivered (or ``until(batches)`` is true), then stop them.

    Reading starts for all members at once (``go``) after the assignment has
    settled, so no rebalance happens while measuring. ``during(started)`` is
    called in this process once reading started (e.g. to write snapshots).
    """
    from tests.benchmarks.workers import SPAWN, member_process

    group = f"bench-{uuid.uuid4().hex[:8]}"
    out = SPAWN.Queue()
    go, stop = SPAWN.Event(), SPAWN.Event()
    procs = [
        SPAWN.Process(
            target=member_process,
            kwargs=dict(
                warehouse=warehouse, table=table, coordinator=coordinator, group=group,
                member_id=f"m{i}", shards=shards, start=start,
                poll_interval_ms=poll_interval_ms, expect_members=members, read=read,
                out=out, go=go, stop=stop,
            ),
            daemon=True,
        )
        for i in range(members)
    ]
    for p in procs:
        p.start()
    ready_rss: dict[str, int] = {}
    batches: list[tuple[Any, ...]] = []
    stats: dict[str, dict[str, int]] = {}
    peak: dict[str, int] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(ready_rss) < members:
            msg = out.get(timeout=max(1.0, deadline - time.monotonic()))
            if msg[0] == "ready":
                ready_rss[msg[1]] = msg[2]
        started = time.monotonic()
        go.set()
        if during is not None:
            during(started)
        rows = 0
        finished = started
        while True:
            if expected_rows is not None and rows >= expected_rows:
                break
            if until is not None and until(batches):
                break
            msg = out.get(timeout=max(1.0, deadline - time.monotonic()))
            if msg[0] == "batch":
                batches.append(msg)
                rows += msg[6]
                finished = max(finished, msg[8])
        stop.set()
        while len(stats) < members:
            msg = out.get(timeout=60)
            if msg[0] == "done":
                stats[msg[1]], peak[msg[1]] = msg[2], msg[3]
            elif msg[0] == "batch":
                batches.append(msg)
    finally:
        stop.set()
        go.set()
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return GroupRun(started, finished, rows, batches, stats, peak, ready_rss)


def run_plain(
    *, warehouse: str, table: str, first_snapshot: int | None, plans: int
) -> tuple[int, float, int]:
    """One plain pypaimon streaming scan in a process: (rows, seconds, peak RSS)."""
    from tests.benchmarks.workers import SPAWN, plain_process

    out = SPAWN.Queue()
    proc = SPAWN.Process(
        target=plain_process,
        kwargs=dict(warehouse=warehouse, table=table, first_snapshot=first_snapshot,
                    plans=plans, out=out),
        daemon=True,
    )
    proc.start()
    try:
        while True:
            msg = out.get(timeout=300)
            if msg[0] == "plain":
                _, rows, started, finished, peak = msg
                return int(rows), finished - started, int(peak)
    finally:
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()
