"""The core promises, shown with real ``paimon-group run`` processes.

* faults: >= 3 members on a primary-key table with 8 buckets while snapshots
  are written; one member SIGKILLed, another SIGSTOPped in the middle of a batch
  past its session timeout and resumed, a member added. Afterwards: every row
  delivered at least once, no row from a shard that does not hold its bucket,
  no position moved backwards, the paused member's commit after the takeover
  rejected, duplicates only from batches whose commit was not accepted.
  Runs on the embedded coordinator, etcd and ZooKeeper.
* a clean run with no faults (initial full scan, follow-ups, graceful stop,
  more than 10 new snapshots while stopped, restart) delivers every row
  exactly once, and every process exits 0.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.checker import check_all, duplicates
from tests.support.group_procs import GroupHarness, live_members

pytestmark = pytest.mark.slow




def _explain(h: GroupHarness) -> str:
    return "\n".join(f"--- {m}\n{h.log(m)[-3000:]}" for m in h.procs)


def test_faults_lose_nothing_and_fence_the_zombie(tmp_path: Path, group_coordinator: str) -> None:
    h = GroupHarness(tmp_path, group_coordinator, session_timeout_s=2.0)
    try:
        h.write(range(0, 200))
        h.env["PG_TEST_SLEEP_M1"] = "0.3"  # m1 is slow, so it is caught mid-batch
        for m in ("m0", "m1", "m2"):
            h.start(m)
        h.wait_caught_up({"m0", "m1", "m2"})
        h.start_writer(first=200, count=1200, per_snapshot=20, interval_s=0.15)

        time.sleep(1.5)
        h.kill("m2")  # crash: its shards move after the session timeout

        h.wait_busy("m1")
        h.pause("m1")  # a zombie, paused in the middle of a batch
        stopped_at = time.monotonic()
        # Wait until the others have taken m1's shards over.
        h.wait_for(lambda d: live_members(d) == {"m0"}
                   and all(s["owner"] == "m0" for s in d["shards"]),
                   timeout=60, what="m0 to own every shard")
        # (The takeover may come less than a session timeout after the stop:
        # the server's timer started at m1's last heartbeat, before it.)
        h.signal("m1", signal.SIGCONT)

        h.start("m3")  # a member joins
        h.wait_writer()
        final = h.wait_caught_up({"m0", "m1", "m3"}, timeout=180)
        codes = h.terminate_all()
    finally:
        h.cleanup()

    assert codes == {"m0": 0, "m1": 0, "m2": 0, "m3": 0} or codes.get("m2") in (0, -9), (
        codes, _explain(h))
    history = h.history()
    violations = check_all(h.written, history, h.bucket_function(), final["num_shards"])
    assert violations == {k: [] for k in violations}, _explain(h)

    # The zombie finished its batch after the takeover: its commit must have
    # been rejected by the coordinator (its epoch is stale), never accepted.
    m1_after = [e for e in history.events
                if e["member"] == "m1" and e["event"] == "commit" and e["t"] > stopped_at]
    rejected = [e for e in m1_after if e["outcome"] in ("rejected", "refused")]
    assert rejected, f"m1's in-flight commit after resuming: {m1_after[:5]}"
    print(f"rows {len(h.written)}, duplicates {duplicates(history)}, "
          f"rejected zombie commits {len(rejected)}")


def test_clean_run_delivers_exactly_once(tmp_path: Path) -> None:
    h = GroupHarness(tmp_path, f"sqlite://{tmp_path}/coordinator.sqlite")
    try:
        for i in range(3):
            h.write(range(i * 50, (i + 1) * 50))  # the initial full scan reads these
        for m in ("a", "b", "c"):
            h.start(m)
        for i in range(3, 8):
            h.write(range(i * 50, (i + 1) * 50))  # follow-ups
            time.sleep(0.2)
        h.wait_caught_up({"a", "b", "c"})
        first = h.terminate_all()
        assert first == {"a": 0, "b": 0, "c": 0}, _explain(h)

        for i in range(8, 23):  # 15 snapshots while the group is stopped: catch-up
            h.write(range(i * 50, (i + 1) * 50))
        for m in ("a", "b", "c"):
            h.start(m)
        h.wait_caught_up({"a", "b", "c"})
        for i in range(23, 26):
            h.write(range(i * 50, (i + 1) * 50))
        final = h.wait_caught_up({"a", "b", "c"})
        second = h.terminate_all()
    finally:
        h.cleanup()
    assert second == {"a": 0, "b": 0, "c": 0}, _explain(h)
    history = h.history()
    violations = check_all(h.written, history, h.bucket_function(), final["num_shards"])
    assert violations == {k: [] for k in violations}, _explain(h)
    counts = history.delivered_counts()
    assert set(counts) == h.written
    assert duplicates(history) == 0, [i for i, n in counts.items() if n > 1][:20]
    kinds = {d["kind"] for d in history.deliveries}
    assert {"initial", "delta", "catch-up"} <= kinds, kinds


def test_consumer_files_mirror_committed_positions(tmp_path: Path) -> None:
    h = GroupHarness(tmp_path, f"sqlite://{tmp_path}/coordinator.sqlite", buckets=4)
    try:
        h.write(range(100))
        h.start("a")
        h.wait_caught_up({"a"})
        for i in range(1, 4):
            h.write(range(i * 100, (i + 1) * 100))
        final = h.wait_caught_up({"a"})
        assert h.terminate("a") == 0
    finally:
        h.cleanup()
    from paimon_group.reading.mirror import ConsumerMirror
    from tests.support.tables import open_table

    table = open_table(h.warehouse, h.table)
    files = ConsumerMirror(table.file_io, table.table_path, h.group).all()
    positions = {s["shard"]: s["next_snapshot"] for s in final["shards"]}
    # After a graceful stop the mirror is flushed: equal to the coordinator.
    assert files == positions


def _run_cli(*args: str, cwd: Path | None = None, timeout: float = 120) -> Any:
    import subprocess
    import sys

    from tests.support.group_procs import REPO

    return subprocess.run([sys.executable, "-m", "paimon_group", *args], cwd=cwd or REPO,
                          capture_output=True, text=True, timeout=timeout)


def test_handler_that_keeps_raising_releases_and_exits_nonzero(tmp_path: Path) -> None:
    h = GroupHarness(tmp_path, f"sqlite://{tmp_path}/coordinator.sqlite", buckets=2)
    h.write(range(10))
    proc = h.start("a", "--max-handler-attempts", "2",
                   handler="tests.support.handlers:fail_always")
    code = proc.wait(timeout=120)
    assert code == 3, h.log("a")
    assert "error: handler failed 2 times" in h.log("a")
    d = h.describe()
    assert all(s["owner"] is None for s in d["shards"]), d  # released
    # Nothing was committed past the failing batch: the start (a full scan of
    # snapshot 1) is pinned and still pending.
    assert all(s["pending_full_scan"] == 1 for s in d["shards"]), d
