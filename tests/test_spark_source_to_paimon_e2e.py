"""Exactly-once from queries into Paimon under SIGKILLs (issue 56, S4).

Two streaming queries of one group (each its own driver process,
tests/support/spark_source_query.py ``--sink-format paimon``) read a
primary-key source with row kinds while a writer commits new keys, new
versions of earlier keys and deletes, and write every micro-batch into a
primary-key target and an append target through
:class:`~paimon_group.spark.source.PaimonBatchSink`. 20 times a driver is
SIGKILLed (its whole process group) and restarted at once from its
checkpoint: by the test at a random moment, or by itself inside
``foreachBatch`` before its writes, between the two targets' writes, or
after both (the batch not recorded by Spark: it is re-run on restart). The
other query takes the killed one's shards meanwhile, and gives them back.

The model: every source commit writes rows of one value ``v`` (the commit's
number), so ``(id, v, kind)`` names one change. Once the queries caught up:

* the append target holds every change once (the first snapshot's rows as
  the full scan's ``+I``, then each later commit's rows with their kinds): a
  duplicate is a micro-batch written twice, a missing change one lost;
* the primary-key target holds each key's last version, deleted keys absent.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from tests.support.requirements import require
from tests.support.tables import _create, delete_rows, make_pk_table, open_table, write_rows

pytestmark = [pytest.mark.spark, pytest.mark.slow]

if not os.environ.get("CI"):
    require("pyspark", "pip install '.[spark]' (tests/run.sh does)")

REPO = Path(__file__).resolve().parents[1]
KILLS = 20
POINTS = ("random", "before", "between", "after")
QUERIES = ("q0", "q1")


@pytest.fixture
def procs() -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    started: dict[str, subprocess.Popen[bytes]] = {}
    yield started
    for proc in started.values():
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)


def _targets(wh: Path) -> None:
    fields = [pa.field("id", pa.int64(), nullable=False), pa.field("v", pa.int64())]
    _create(wh, "db.pk", pa.schema([*fields, pa.field("seq", pa.int64()),
                                    pa.field("pg_row_kind", pa.string())]),
            primary_keys=["id"], options={"bucket": "2", "sequence.field": "seq",
                                          "rowkind.field": "pg_row_kind"})
    _create(wh, "db.log", pa.schema([*fields, pa.field("_row_kind", pa.string())]),
            primary_keys=[], options={"bucket": "-1"})


def _read(wh: Path, name: str, *columns: str) -> list[tuple[Any, ...]]:
    table = open_table(wh, name)
    builder = table.new_read_builder()
    rows = builder.new_read().to_arrow(builder.new_scan().plan().splits())
    return list(zip(*(rows.column(c).to_pylist() for c in columns), strict=True))


class _Model:
    """What the source's writer wrote: every change, and each key's last version."""

    def __init__(self) -> None:
        self.changes: Counter[tuple[int, int, str]] = Counter()
        self.state: dict[int, int] = {}
        self.commits = 0

    def write(self, wh: Path, ids: list[int], v: int) -> None:
        write_rows(wh, "db.t", ids, v=v)
        self.changes.update((i, v, "+I") for i in ids)
        self.state.update(dict.fromkeys(ids, v))
        self.commits += 1

    def delete(self, wh: Path, ids: list[int], v: int) -> None:
        delete_rows(wh, "db.t", ids, v=v)
        self.changes.update((i, v, "-D") for i in ids)
        for i in ids:
            self.state.pop(i)
        self.commits += 1

    def matches(self, wh: Path) -> tuple[bool, str]:
        log = Counter((int(i), int(v), str(k)) for i, v, k in
                      _read(wh, "db.log", "id", "v", "_row_kind"))
        live = {int(i): int(v) for i, v, k in _read(wh, "db.pk", "id", "v", "pg_row_kind")
                if k not in ("-D", "-U")}
        twice = sorted(c for c, n in log.items() if n > 1)[:5]
        lost = sorted((self.changes - log).elements())[:5]
        extra = sorted((log - self.changes).elements())[:5]
        wrong = sorted(k for k in set(live) | set(self.state)
                       if live.get(k) != self.state.get(k))[:5]
        ok = log == self.changes and live == self.state
        return ok, (f"append: {sum(log.values())} rows of {sum(self.changes.values())}, twice "
                    f"{twice}, lost {lost}, extra {extra}; primary key: {len(live)} keys of "
                    f"{len(self.state)}, wrong {wrong}")


@pytest.mark.timeout(2400)  # 20 driver restarts: about 40 s each on a loaded two-core machine
def test_two_queries_write_every_change_once_into_paimon_across_20_sigkills(
    tmp_path: Path, procs: dict[str, subprocess.Popen[bytes]]
) -> None:
    wh, marks, stop = tmp_path / "wh", tmp_path / "m", tmp_path / "stop"
    marks.mkdir()
    make_pk_table(wh, "db.t", buckets=4, row_kind_field=True)
    _targets(wh)
    model = _Model()
    model.write(wh, list(range(100)), 0)
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    rng = random.Random(os.environ.get("PG_CHAOS_SEED", "56"))

    def start(member: str) -> None:
        log = open(tmp_path / f"{member}.log", "ab")
        procs[member] = subprocess.Popen(
            [sys.executable, "-m", "tests.support.spark_source_query", "--warehouse", str(wh),
             "--table", "db.t", "--group", "g", "--member", member,
             "--checkpoint", str(tmp_path / f"ckpt-{member}"), "--sink", "db.pk,db.log",
             "--sink-format", "paimon", "--markers", str(marks), "--stop-file", str(stop),
             "--session-timeout-s", "3"],
            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def batches_since(member: str, since: float) -> int:
        return sum(1 for f in marks.glob(f"{member}-*.json")
                   if json.loads(f.read_text())["at"] >= since)

    def wait(what: str, check: Any, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            for name, proc in procs.items():
                if proc.poll() is not None and proc.returncode != -9:
                    raise AssertionError(f"{name} exited with {proc.returncode} ({what}): "
                                         f"{(tmp_path / f'{name}.log').read_text()[-3000:]}")
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.3)

    done = threading.Event()
    failed: list[BaseException] = []

    def writer() -> None:
        try:
            nxt, k = 1000, 1
            while not done.is_set():
                live = sorted(model.state)
                if k % 4 == 0:
                    model.delete(wh, rng.sample(live, 2), k)
                else:
                    model.write(wh, list(range(nxt, nxt + 10)) + rng.sample(live, 3), k)
                    nxt += 10
                k += 1
                time.sleep(1.0)
        except BaseException as err:
            failed.append(err)

    for q in QUERIES:
        start(q)
    began = time.time()
    wait("the full scan", lambda: any(batches_since(q, began) for q in QUERIES))
    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    wait("both queries' micro-batches", lambda: all(batches_since(q, began) for q in QUERIES))
    kills: Counter[str] = Counter()
    try:
        for cycle in range(KILLS):
            member, point = QUERIES[cycle % 2], POINTS[(cycle // 2) % len(POINTS)]
            # The query is running micro-batches (not starting its JVM).
            since = time.time()
            wait(f"{member} to run a micro-batch",
                 lambda m=member, t=since: batches_since(m, t))
            if point == "random":
                time.sleep(rng.uniform(0.0, 1.5))
                os.killpg(procs[member].pid, signal.SIGKILL)
            else:
                (marks / f"kill-{member}").write_text(point)
            try:
                procs[member].wait(timeout=60)
            except subprocess.TimeoutExpired:  # no micro-batch came: killed from here
                os.killpg(procs[member].pid, signal.SIGKILL)
                procs[member].wait(timeout=60)
                (marks / f"kill-{member}").unlink(missing_ok=True)
            assert procs[member].returncode == -9, (member, procs[member].returncode)
            kills[point] += 1
            start(member)
        done.set()
        thread.join(timeout=60)
        assert not failed, failed
        wait("the targets to hold every change once",
             lambda: model.matches(wh)[0], timeout=240)
    finally:
        done.set()
        ok, what = model.matches(wh)
        print(json.dumps({"kills": dict(kills), "source_commits": model.commits,
                          "seconds": round(time.time() - began), "model": what}))
    stop.touch()
    for q in QUERIES:
        assert procs[q].wait(timeout=120) == 0, (tmp_path / f"{q}.log").read_text()[-3000:]
    assert ok, what
