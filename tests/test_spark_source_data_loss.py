"""failOnDataLoss of the ``paimon-group`` Spark source: real local-mode queries, expired snapshots.

A pending full scan whose snapshot expired, and a batch Spark re-runs from
its checkpoint whose snapshots expired: with ``failOnDataLoss=false`` the
query goes on as a worker does under ``--on-data-loss skip``; with the
default, it stops with one line whose advice, followed word for word (the
``paimon-group reset`` it prints, then a restart from the checkpoint), lets
the query go on.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.requirements import require
from tests.support.tables import expire_snapshots, make_append_table, make_pk_table, write_rows

pytestmark = pytest.mark.spark

if not os.environ.get("CI"):
    require("pyspark", "pip install '.[spark]' (tests/run.sh does)")

from paimon_group.spark.source.errors import error_line  # noqa: E402
from tests.support.waiting import wait_for  # noqa: E402
from tests.test_spark_source import REPO, Recorder, start_query  # noqa: E402

PAIMON_GROUP = Path(sys.executable).parent / "paimon-group"


def pin_full_scans(warehouse: Path, group: str, snapshot: int) -> None:
    """Every shard of ``group`` (no owner) at a pending full scan of ``snapshot``:
    what a member leaves when it pinned the group's start and stopped before
    delivering it."""
    from coordinators.protocol import Check, Put
    from coordinators.registry import open_coordinator
    from paimon_group.config.member import default_coordinator_url
    from paimon_group.protocol.group import GroupClient
    from paimon_group.protocol.records import Position

    async def go() -> None:
        async with open_coordinator(default_coordinator_url(str(warehouse))) as coord:
            client = GroupClient(coord, group)
            shards = sorted(await client.positions())
            record = Position(next_snapshot=snapshot + 1, epoch=0, member_id="test",
                              committed_at=time.time(), full_scan=snapshot).encode()
            deadline = time.monotonic() + 30
            while not await coord.commit([Check.is_absent(client.keys.owner(s)) for s in shards],
                                         [Put(client.keys.position(s), record) for s in shards]):
                assert time.monotonic() < deadline, "the stopped query still owns shards"
                await asyncio.sleep(0.2)

    asyncio.run(go())


def failure_line(query: Any) -> str:
    """The one line the failed query stopped with."""
    wait_for("the query to fail", lambda: query.exception() is not None, timeout=120)
    line = error_line(query.exception())
    assert line is not None, f"no line of ours in: {query.exception()}"
    return line


def follow_the_advice(line: str) -> str:
    """Run the ``paimon-group reset`` command the line gives, as printed (the
    stopped query's member may still be leaving: a refused reset is run again)."""
    assert "; then restart the query from its checkpoint" in line, line
    command = line.split(" and run: ", 1)[1].split("; then restart the query", 1)[0]
    argv = shlex.split(command)
    assert argv[0] == "paimon-group" and "--execute" in argv, command
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    deadline = time.monotonic() + 60
    while True:
        done = subprocess.run([str(PAIMON_GROUP), *argv[1:]], env=env, capture_output=True,
                              text=True, timeout=120)
        if done.returncode == 0:
            return done.stdout
        assert time.monotonic() < deadline, f"reset failed: {done.stdout}{done.stderr}"
        time.sleep(1)


def group_with_an_expired_full_scan(spark: Any, tmp_path: Path, *,
                                    bucket_unaware: bool = False) -> Path:
    """Group ``g`` whose four shards wait for a full scan of snapshot 2,
    expired (earliest retained: 3; snapshot 3 holds ids 0..29, 4 ids 30..39);
    ``bucket_unaware``: of an append table without buckets (the file rule)."""
    warehouse = tmp_path / "wh"
    if bucket_unaware:
        make_append_table(warehouse, "db.t", buckets=-1)
    else:
        make_pk_table(warehouse, "db.t", buckets=4)
    write_rows(warehouse, "db.t", range(10))
    first = Recorder(tmp_path / "sink0")
    query = start_query(spark, warehouse, first, tmp_path / "ckpt0")
    try:
        wait_for("the first run", lambda: len(first.sink_ids(spark)) == 10, query=query)
    finally:
        query.stop()
    write_rows(warehouse, "db.t", range(10, 20))
    pin_full_scans(warehouse, "g", 2)
    write_rows(warehouse, "db.t", range(20, 30))
    write_rows(warehouse, "db.t", range(30, 40))
    expire_snapshots(warehouse, "db.t", keep_from=3)
    return warehouse


def test_an_expired_pending_full_scan_is_scanned_at_the_earliest_snapshot_without_fail(
        spark: Any, tmp_path: Path) -> None:
    warehouse = group_with_an_expired_full_scan(spark, tmp_path)
    recorder, checkpoint = Recorder(tmp_path / "sink"), tmp_path / "ckpt"
    query = start_query(spark, warehouse, recorder, checkpoint, failOnDataLoss="false")
    try:
        wait_for("the full scan of snapshot 3 and snapshot 4",
                 lambda: sorted(recorder.sink_ids(spark)) == list(range(40)), query=query)
    finally:
        query.stop()
    first_run = len(recorder.batches)
    write_rows(warehouse, "db.t", range(40, 50))
    query = start_query(spark, warehouse, recorder, checkpoint, failOnDataLoss="false")
    try:
        wait_for("rows after the restart",
                 lambda: sorted(recorder.sink_ids(spark)) == list(range(50)), query=query)
    finally:
        query.stop()
    assert all(i >= 40 for _, ids in recorder.batches[first_run:] for i in ids)


def read_start(warehouse: Path, group: str) -> Any:
    from coordinators.registry import open_coordinator
    from paimon_group.config.member import default_coordinator_url
    from paimon_group.protocol.group import GroupClient
    from paimon_group.protocol.group_start import read_group_start

    async def go() -> Any:
        async with open_coordinator(default_coordinator_url(str(warehouse))) as coord:
            return await read_group_start(GroupClient(coord, group))

    return asyncio.run(go())


def test_an_expired_start_of_a_bucket_unaware_table_moves_the_group_start_without_fail(
        spark: Any, tmp_path: Path) -> None:
    """Issue 43, 5: on a bucket-unaware table the shards all read from one
    full scan; with failOnDataLoss=false the query moves the group's start
    for every shard, as workers do (it stopped with the line before)."""
    warehouse = group_with_an_expired_full_scan(spark, tmp_path, bucket_unaware=True)
    recorder, checkpoint = Recorder(tmp_path / "sink"), tmp_path / "ckpt"

    def run_until(what: str, ids: int) -> None:
        query = start_query(spark, warehouse, recorder, checkpoint, failOnDataLoss="false")
        try:
            wait_for(what, lambda: sorted(set(recorder.sink_ids(spark))) == list(range(ids)),
                     query=query)
        finally:
            query.stop()

    run_until("the full scan of the moved start, snapshot 4", 40)
    start = read_start(warehouse, "g")
    # Moved once, by the query's member (its WARNING line is the workers'
    # line; the source's planning runs in Spark's Python worker process).
    assert (start.moves, start.full_scan, start.moved_from, start.resolved_by) == (1, 4, 2, "q1")
    first_run = len(recorder.batches)
    write_rows(warehouse, "db.t", range(40, 50))
    run_until("rows after the restart", 50)
    assert all(i >= 40 for _, ids in recorder.batches[first_run:] for i in ids)


def test_an_expired_pending_full_scan_fails_with_the_line_whose_advice_works(
        spark: Any, tmp_path: Path) -> None:
    warehouse = group_with_an_expired_full_scan(spark, tmp_path)
    recorder, checkpoint = Recorder(tmp_path / "sink"), tmp_path / "ckpt"
    query = start_query(spark, warehouse, recorder, checkpoint)
    try:
        line = failure_line(query)
    finally:
        query.stop()
    assert line.startswith("shards 0, 1, 2, 3: snapshot 2 of table db.t, whose full scan was "
                           "still to be delivered, expired (earliest retained: 3): "), line
    assert "--to-earliest --shard 0 --shard 1 --shard 2 --shard 3 --execute" in line
    follow_the_advice(line)
    query = start_query(spark, warehouse, recorder, checkpoint)
    try:
        # --to-earliest: the changes of snapshot 3 and later (not a full scan).
        wait_for("snapshots 3 and 4",
                 lambda: sorted(recorder.sink_ids(spark)) == list(range(20, 40)), query=query)
    finally:
        query.stop()


def test_a_rerun_batch_whose_snapshots_expired_goes_on_after_the_advised_reset(
        spark: Any, tmp_path: Path) -> None:
    warehouse, checkpoint = tmp_path / "wh", tmp_path / "ckpt"
    make_pk_table(warehouse, "db.t", buckets=4)
    write_rows(warehouse, "db.t", range(10))
    refusing = Refusing(tmp_path / "sink")
    query = start_query(spark, warehouse, refusing, checkpoint)
    try:
        wait_for("the initial rows", lambda: len(refusing.sink_ids(spark)) == 10, query=query)
        refusing.refuse = True
        write_rows(warehouse, "db.t", range(100, 110))
        write_rows(warehouse, "db.t", range(110, 120))
        # Spark checkpointed the next batch's offset; the sink failed it.
        wait_for("the sink to fail the batch", lambda: query.exception() is not None)
    finally:
        query.stop()
    write_rows(warehouse, "db.t", range(120, 130))
    write_rows(warehouse, "db.t", range(130, 140))
    expire_snapshots(warehouse, "db.t", keep_from=4)  # the failed batch read from 2
    recorder = Recorder(tmp_path / "sink")
    query = start_query(spark, warehouse, recorder, checkpoint)
    try:
        line = failure_line(query)  # the re-run of the failed batch
    finally:
        query.stop()
    assert "of table db.t expired before they were read (earliest retained: 4)" in line, line
    follow_the_advice(line)
    query = start_query(spark, warehouse, recorder, checkpoint)
    try:
        wait_for("the rows after the gap", lambda: sorted(recorder.sink_ids(spark)) == [
            *range(10), *range(120, 140)], query=query)
        write_rows(warehouse, "db.t", range(140, 150))
        wait_for("the rows after the restart", lambda: sorted(recorder.sink_ids(spark)) == [
            *range(10), *range(120, 150)], query=query)
    finally:
        query.stop()


class Refusing(Recorder):
    """A sink that fails every batch once ``refuse`` is set."""

    refuse = False

    def __call__(self, df: Any, batch_id: int) -> None:
        if self.refuse:
            raise RuntimeError(f"the sink refuses batch {batch_id}")
        super().__call__(df, batch_id)
