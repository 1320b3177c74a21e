"""A file created only if its name is free (paimon_group/store/exclusive.py),
on a local file system and on a real S3-compatible server, from one process
and from two processes racing for the same names; and a Paimon sink's commit
in two processes at once, locally and on S3, losing no batch.

Before it, pypaimon's create (ask, then rename over the name) let two
processes both win the same name: 5 of 2,000 synchronised attempts; two sink
processes of 150 batches each lost one batch without an error.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pypaimon.filesystem.local_file_io import LocalFileIO

from paimon_group.reading.table import ShardedTable
from paimon_group.store.exclusive import (
    ExclusiveCreateUnsupported,
    create_exclusive,
    exclusive_create_check,
)
from tests.support.group_procs import REPO
from tests.support.s3_server import S3Warehouse
from tests.support.tables import _create
from tests.test_paimon_sink import SCHEMA

pytestmark = [pytest.mark.slow]


def test_a_free_name_is_created_and_a_taken_one_is_left_as_it_is(tmp_path: Path) -> None:
    fio = LocalFileIO(str(tmp_path))
    target = tmp_path / "snapshot" / "snapshot-1"
    assert create_exclusive(fio, str(target), "first") is True
    assert create_exclusive(fio, str(target), "second") is False
    assert create_exclusive(fio, f"file://{target}", "third") is False
    assert target.read_text() == "first"
    assert sorted(p.name for p in target.parent.iterdir()) == ["snapshot-1"]  # no temporary


def test_a_warehouse_whose_store_cannot_create_exclusively_is_refused_in_one_line() -> None:
    with pytest.raises(ExclusiveCreateUnsupported, match=r"cannot commit safely on a gs:// "):
        exclusive_create_check(object(), "gs://bucket/wh/db.db/t")
    exclusive_create_check(object(), "/data/wh/db.db/t")
    exclusive_create_check(object(), "file:///data/wh/db.db/t")
    exclusive_create_check(object(), "hdfs://namenode:8020/wh/db.db/t")


def _claim(k: int, directory: str, names: int, barrier: Any, out: Any) -> None:
    fio = LocalFileIO(directory)
    won = []
    for i in range(names):
        barrier.wait()
        if create_exclusive(fio, os.path.join(directory, f"snapshot-{i}"), f"process {k}"):
            won.append(i)
    out.put((k, won))


def test_two_processes_racing_for_the_same_names_never_both_win(tmp_path: Path) -> None:
    names = 1500
    ctx = multiprocessing.get_context("fork")
    barrier, out = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_claim, args=(k, str(tmp_path), names, barrier, out))
             for k in (0, 1)]
    for p in procs:
        p.start()
    won = dict(out.get(timeout=300) for _ in procs)
    for p in procs:
        p.join(60)
    assert set(won[0]).isdisjoint(won[1])
    assert sorted(won[0] + won[1]) == list(range(names))
    for k, ids in won.items():
        for i in ids:
            assert (tmp_path / f"snapshot-{i}").read_text() == f"process {k}"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_on_s3_a_taken_key_is_refused_by_the_store(s3_warehouse: S3Warehouse) -> None:
    _create(s3_warehouse.uri, "db.log", SCHEMA, primary_keys=[], options={"bucket": "-1"})
    table = ShardedTable.open(s3_warehouse.uri, "db.log", s3_warehouse.options).table
    path = f"{table.table_path}/snapshot/snapshot-7"
    s3_warehouse.server.reset_counts()
    assert create_exclusive(table.file_io, path, "first") is True
    assert create_exclusive(table.file_io, path, "second") is False
    assert table.file_io.read_file_utf8(path) == "first"
    counts = s3_warehouse.server.counts()
    assert counts.get("PUT", 0) == 2, counts  # one conditional upload each, no HEAD first


# Two processes, each a PaimonSink of its own on one target, writing the
# batches of their own shard at once (commit_interval_s=0: a commit per
# batch, both racing for every next snapshot id).
MEMBER = """
import sys
from paimon_group.sink import PaimonSink
from tests.test_paimon_sink import Batch, _rows
from tests.support.tables import register_catalog_options

warehouse, k, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
options = dict(a.split("=", 1) for a in sys.argv[4:])
if options:
    register_catalog_options(warehouse, options)
sink = PaimonSink(warehouse, "db.log", catalog_options=options or None, commit_interval_s=0)
print("ready", flush=True)
sys.stdin.readline()
for step in range(1, steps + 1):
    ids = range(k * 100000 + step * 10, k * 100000 + step * 10 + 10)
    sink.write(_rows(ids, step), Batch(k, 1, step, step))
sink.close()
print("done", sink.commits, flush=True)
"""


def _race_sinks(warehouse: str, steps: int, options: dict[str, str]) -> list[int]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen(
        [sys.executable, "-c", MEMBER, warehouse, str(k), str(steps),
         *(f"{key}={value}" for key, value in options.items())],
        cwd=REPO, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for k in (0, 1)]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    for p in procs:  # both start at once
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    commits = []
    for p in procs:
        out, _ = p.communicate(timeout=600)
        assert p.returncode == 0, out
        commits.append(int(out.split()[-1]))
    return commits


def _ids(warehouse: str, options: dict[str, str] | None = None) -> list[int]:
    table = ShardedTable.open(warehouse, "db.log", options).table
    builder = table.new_read_builder()
    rows = builder.new_read().to_arrow(builder.new_scan().plan().splits())
    return sorted(rows.column("id").to_pylist())


def _expected(steps: int) -> list[int]:
    return sorted(i for k in (0, 1) for step in range(1, steps + 1)
                  for i in range(k * 100000 + step * 10, k * 100000 + step * 10 + 10))


def test_two_sink_processes_on_one_local_target_lose_no_batch(tmp_path: Path) -> None:
    _create(tmp_path, "db.log", SCHEMA, primary_keys=[], options={"bucket": "-1"})
    steps = 200
    commits = _race_sinks(str(tmp_path), steps, {})
    assert _ids(str(tmp_path)) == _expected(steps)
    assert sum(commits) == 2 * steps
    snapshots = tmp_path / "db.db" / "log" / "snapshot"
    assert not [p for p in snapshots.iterdir() if p.name.endswith(".tmp")]


def test_two_sink_processes_on_one_s3_target_lose_no_batch(s3_warehouse: S3Warehouse) -> None:
    _create(s3_warehouse.uri, "db.log", SCHEMA, primary_keys=[], options={"bucket": "-1"})
    steps = 20
    commits = _race_sinks(s3_warehouse.uri, steps, s3_warehouse.options)
    assert _ids(s3_warehouse.uri, s3_warehouse.options) == _expected(steps)
    assert sum(commits) == 2 * steps


def test_an_s3_sink_without_boto3_is_refused_in_one_line(s3_warehouse: S3Warehouse) -> None:
    _create(s3_warehouse.uri, "db.log", SCHEMA, primary_keys=[], options={"bucket": "-1"})
    code = ("import sys; sys.modules['boto3'] = None\n"
            "from paimon_group.sink import PaimonSink\n"
            "from paimon_group.errors import ConfigError\n"
            "options = dict(a.split('=', 1) for a in sys.argv[2:])\n"
            "try:\n"
            "    PaimonSink(sys.argv[1], 'db.log', catalog_options=options)\n"
            "except ConfigError as err:\n"
            "    print(err); sys.exit(2)\n")
    run = subprocess.run([sys.executable, "-c", code, s3_warehouse.uri,
                          *(f"{k}={v}" for k, v in s3_warehouse.options.items())],
                         cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr
    assert run.stdout.strip().splitlines() == [
        "a Paimon sink on S3 commits with a conditional upload (If-None-Match), which needs "
        "boto3: pip install 'paimon-group[s3]'"]
