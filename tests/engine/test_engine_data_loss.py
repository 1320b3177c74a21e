"""Time to data loss and the member's stop (or skip) at the loss, with real expiry.

Paimon's engine writes a table whose retention is small
(``snapshot.time-retained`` 12 s, ``snapshot.num-retained.min`` 3,
``consumer.expiration-time`` 4 s): its commits delete consumer files not
rewritten for 4 s and expire snapshots, exactly as a production writer
does. A real ``paimon-group run`` member reads it; its handler stalls on a
batch (30 s), so its consumer file ages out and its next snapshots expire.
The member's ``/metrics`` is scraped meanwhile: the time to data loss falls
and crosses the alarm threshold before the table's earliest snapshot passes
the shard's position; once the handler returns, the member stops with one
line naming the lost snapshots and the reset command (``fail``), or skips
them with a WARNING and goes on (``skip``). The Spark source's
``failOnDataLoss`` meets snapshots the engine expired by count.
"""

from __future__ import annotations

import math
import re
import shlex
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pytest
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from paimon_group.ops.render import render_describe
from tests.engine.engine import Engine
from tests.support.etcd_server import free_port
from tests.support.group_procs import GroupHarness
from tests.support.tables import table_schema

pytestmark = [pytest.mark.engine, pytest.mark.slow]

RETENTION = {"bucket": "2", "snapshot.num-retained.min": "3",
             "snapshot.num-retained.max": "10000", "snapshot.time-retained": "12 s",
             "consumer.expiration-time": "4 s"}
ALARM_S = 8.0
"""The test's alert threshold (the shipped rule: 15 minutes, for a retention of hours)."""
STALL_S = 30


def rows(ids: range) -> pa.Table:
    return pa.table({"id": list(ids), "v": [0] * len(ids), "payload": ["p"] * len(ids)},
                    schema=table_schema())


class Writer:
    """The engine committing a few rows every 0.5 s (each commit expires snapshots)."""

    def __init__(self, engine: Engine, warehouse: str, first: int) -> None:
        self.engine, self.warehouse, self.next = engine, warehouse, first
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            while not self.stop.is_set():
                self.engine.write(self.warehouse, rows(range(self.next, self.next + 4)))
                self.next += 4
                self.stop.wait(0.5)
        except BaseException as err:
            self.error = err

    def __enter__(self) -> Writer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=60)


@dataclass
class Watch:
    """What the test saw, second by second: the member's time to data loss,
    its shards' positions and the table's earliest snapshot."""

    losses: list[tuple[float, float]] = field(default_factory=list)
    alarm_at: float | None = None
    expired_at: float | None = None
    stalled_at: int | None = None
    skipped: float = 0.0


def scrape(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return {f.name: [(s.labels, s.value) for s in f.samples]
            for f in text_string_to_metric_families(text)}


def earliest_snapshot(table_dir: Path) -> int | None:
    ids = [int(p.name.split("-")[1]) for p in (table_dir / "snapshot").glob("snapshot-*")]
    return min(ids) if ids else None


def watch(h: GroupHarness, port: int, table_dir: Path, until: object, timeout: float = 120
          ) -> Watch:
    """Scrape and look at the table every 0.25 s until ``until(watch)`` or the member exits."""
    seen = Watch()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and h.procs["m0"].poll() is None:
        try:
            metrics = scrape(port)
        except OSError:
            time.sleep(0.25)
            continue
        now = time.monotonic()
        (loss,) = [v for _, v in metrics.get("paimon_group_time_to_data_loss_seconds", [])] or \
            [math.inf]
        positions = [v for _, v in metrics.get("paimon_group_shard_position", [])]
        seen.skipped = sum(v for _, v in metrics.get("paimon_group_skipped_snapshots", []))
        if math.isfinite(loss):
            seen.losses.append((now, loss))
            if seen.stalled_at is None and positions:
                seen.stalled_at = int(min(positions))
        if loss < ALARM_S and seen.alarm_at is None:
            seen.alarm_at = now
        earliest = earliest_snapshot(table_dir)
        if (seen.stalled_at is not None and earliest is not None
                and earliest > seen.stalled_at and seen.expired_at is None):
            seen.expired_at = now
        if until(seen):  # type: ignore[operator]
            break
        time.sleep(0.25)
    return seen


def assert_alarm_fell_and_fired_before_expiry(seen: Watch) -> None:
    values = [v for _, v in seen.losses]
    assert len(values) >= 3, seen
    assert values[0] > values[-1] and values[0] >= ALARM_S, values
    assert seen.alarm_at is not None and seen.expired_at is not None, seen
    assert seen.alarm_at < seen.expired_at, seen


def start_stalled_member(engine: Engine, tmp_path: Path, *extra: str
                         ) -> tuple[GroupHarness, int, Path]:
    h = GroupHarness(tmp_path, f"sqlite://{tmp_path}/coordinator.sqlite", buckets=2,
                     create=False)
    engine.create_table(h.warehouse, table_schema(), primary_keys=["id"], options=RETENTION)
    engine.write(h.warehouse, rows(range(0, 8)))
    port = free_port()
    h.start("m0", "--metrics-port", str(port), "--progress-interval-s", "1", *extra)
    h.wait_caught_up({"m0"})
    # The next batch stalls in the handler for STALL_S seconds.
    (h.out / "slow-m0").write_text(str(STALL_S))
    return h, port, Path(h.warehouse) / "db.db" / "t"


def test_the_alarm_falls_and_fires_before_expiry_then_the_member_stops(
        engine: Engine, tmp_path: Path) -> None:
    h, port, table_dir = start_stalled_member(engine, tmp_path)
    try:
        with Writer(engine, h.warehouse, 100) as writer:
            seen = watch(h, port, table_dir, until=lambda w: False)
            code = h.procs["m0"].wait(timeout=120)
        assert writer.error is None, writer.error
        assert_alarm_fell_and_fired_before_expiry(seen)
        log = h.log("m0")
        assert code == 1, log[-3000:]
        errors = [line for line in log.splitlines() if line.startswith("error:")]
        assert len(errors) == 1, log[-3000:]
        line = errors[0]
        match = re.search(r"shards 0, 1: snapshots (\d+)\.\.(\d+) of table db\.t expired "
                          r"before they were read \(earliest retained: (\d+)\)", line)
        assert match, line
        first, last, earliest = (int(g) for g in match.groups())
        assert first <= last == earliest - 1
        assert (f"paimon-group reset --group g --warehouse {h.warehouse} --table db.t "
                "--coordinator sqlite://") in line
        assert "--to-earliest --shard 0 --shard 1 --execute" in line
        # Nothing committed past the gap: the positions are its first snapshot.
        report = h.describe()
        assert {s["next_snapshot"] for s in report["shards"]} == {first}
        # describe says the loss happened, per shard and for the group, in
        # JSON and in text.
        assert {s["data_loss"] for s in report["shards"]} == {"expired"}
        assert report["time_to_data_loss_s"] == 0 and report["data_loss_shard"] == 0
        console = Console(width=200, record=True)
        render_describe(report, console)
        assert "time to data loss 0s (shard 0); shard 1 0s" in console.export_text()
        # The command in the line is exact: run as written, it resumes the
        # shards from the earliest retained snapshot.
        command = shlex.split(line.split("stop the group's members and run: ", 1)[1])
        assert command[:2] == ["paimon-group", "reset"]
        done = subprocess.run([sys.executable, "-m", "paimon_group", *command[1:]],
                              capture_output=True, text=True, timeout=120, env=h.env)
        assert done.returncode == 0, done.stderr
        now_earliest = earliest_snapshot(table_dir)
        assert now_earliest is not None and now_earliest >= earliest
        assert {s["next_snapshot"] for s in h.describe()["shards"]} == {now_earliest}
        # Before the stop, the progress line said it too.
        assert re.search(r"data loss in \d+ s \(shard \d\)", log), log[-3000:]
    finally:
        h.cleanup()


def test_with_on_data_loss_skip_the_member_skips_the_lost_snapshots_and_goes_on(
        engine: Engine, tmp_path: Path) -> None:
    h, port, table_dir = start_stalled_member(engine, tmp_path, "--on-data-loss", "skip")
    try:
        with Writer(engine, h.warehouse, 100) as writer:
            seen = watch(h, port, table_dir, until=lambda w: w.skipped > 0)
            assert seen.skipped > 0, h.log("m0")[-3000:]
            (h.out / "slow-m0").unlink()
            time.sleep(2)
        assert writer.error is None, writer.error
        assert_alarm_fell_and_fired_before_expiry(seen)
        h.wait_caught_up({"m0"})
        assert h.terminate("m0") == 0
        log = h.log("m0")
        warnings = re.findall(r"WARNING .*shards 0, 1: snapshots? (\d+)(?:\.\.(\d+))? of table "
                              r"db\.t expired before they were read .*skipping to snapshot (\d+)",
                              log)
        assert warnings, log[-3000:]
        # Rows written after the skip were delivered.
        delivered = set(h.history().delivered_counts())
        assert set(range(writer.next - 4, writer.next)) <= delivered
    finally:
        h.cleanup()


def test_the_spark_source_fails_or_skips_on_snapshots_the_engine_expired(
        engine: Engine, tmp_path: Path) -> None:
    """``failOnDataLoss`` on snapshots expired by count (``num-retained.max``)."""
    from paimon_group.errors import SnapshotExpired
    from paimon_group.reading.table import ShardedTable
    from paimon_group.spark.source.offsets import NO_CATCH_UP, Cursor, plan_ranges

    warehouse = str(tmp_path / "wh")
    engine.create_table(warehouse, table_schema(), primary_keys=["id"], options={
        "bucket": "2", "snapshot.num-retained.min": "1", "snapshot.num-retained.max": "3"})
    for k in range(8):
        engine.write(warehouse, rows(range(4 * k, 4 * k + 4)))
    table = ShardedTable.open(warehouse, "db.t")
    latest, earliest = table.latest_snapshot_id(), table.earliest_snapshot_id()
    assert latest is not None and earliest is not None and earliest > 2
    planner = table.planner(2, catch_up_threshold=NO_CATCH_UP)
    cursors = {0: Cursor(next=2), 1: Cursor(next=2)}
    with pytest.raises(SnapshotExpired, match=rf"shards 0, 1: snapshots 2\.\.{earliest - 1} "
                       rf"of table db\.t expired before they were read"):
        plan_ranges(planner, cursors, latest=latest)
    reached, pieces = plan_ranges(planner, cursors, latest=latest, fail_on_data_loss=False)
    assert reached == {0: latest + 1, 1: latest + 1}
    assert min(p.snapshot for shard in pieces.values() for p in shard) >= earliest
