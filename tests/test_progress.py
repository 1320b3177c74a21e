"""Progress of a running worker: a rate line at INFO, one line per batch at DEBUG.

A real ``paimon-group run`` process on the embedded coordinator; the lines are
read from its log.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from paimon_group.ops.lag import ShardLag
from paimon_group.ops.retention import DataLossEstimate
from paimon_group.process.progress import loss_text, progress_line
from tests.support.group_procs import GroupHarness

pytestmark = [pytest.mark.slow]

PROGRESS = re.compile(r"INFO paimon_group\.progress: progress: (\d+) batches, (\d+) rows in "
                      r"\d+ s \(\d+ rows/s\); shards \[[\d, ]*\]; lag (\d+|unknown)")


def test_progress_line_text() -> None:
    assert progress_line(12, 3400, 5.0, [0, 1], 0) == (
        "progress: 12 batches, 3400 rows in 5 s (680 rows/s); shards [0, 1]; lag 0 snapshots")
    assert progress_line(0, 0, 5.0, [], None).endswith("lag unknown")


def test_progress_line_names_the_time_to_data_loss() -> None:
    shards = {0: ShardLag(10, 0, 0.0),
              1: ShardLag(4, 37, 95.4, DataLossEstimate(250.0, "at risk"), 0.0, 1200, True),
              2: ShardLag(9, 3, 12.0, DataLossEstimate(None, "protected"), 0.0, 30, True)}
    assert progress_line(1, 20, 5.0, [0, 1, 2], 40, loss_text(shards, [0, 1, 2])).endswith(
        "lag 40 snapshots, 1230 rows, 95 s; data loss in 4 m 10 s (shard 1)")
    assert loss_text(shards, [0, 2]) == ", 30 rows, 12 s; data loss: protected"
    assert loss_text(shards, [0]) == ""
    # Beyond the snapshots counted, the rows are a lower bound.
    shards[2] = ShardLag(9, 300, 12.0, DataLossEstimate(None, "protected"), 0.0, 5000, False)
    assert loss_text(shards, [2]) == ", >= 5000 rows, 12 s; data loss: protected"


def test_a_running_worker_logs_its_progress(tmp_path: Path) -> None:
    h = GroupHarness(tmp_path, f"sqlite://{tmp_path}/coordinator.sqlite", buckets=2)
    try:
        h.write(range(0, 30))
        h.start("m0", "--progress-interval-s", "0.5", "--log-level", "DEBUG")
        h.wait_caught_up({"m0"})
        h.write(range(30, 50))
        h.wait_for(lambda d: sum(int(m[1]) for m in PROGRESS.findall(h.log("m0"))) >= 50,
                   what="progress lines counting every row")
        assert h.terminate("m0") == 0
    finally:
        h.cleanup()
    log = h.log("m0")
    lines = PROGRESS.findall(log)
    assert sum(int(batches) for batches, _, _ in lines) >= 2, log[-3000:]
    assert sum(int(rows) for _, rows, _ in lines) == 50, log[-3000:]
    delivered = re.findall(r"DEBUG paimon_group\.member: delivered shard \d \w+ snapshots "
                           r"\S+\.\.\d+: (\d+) rows", log)
    assert sum(int(n) for n in delivered) == 50, log[-3000:]
