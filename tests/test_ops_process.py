"""Operations against real ``paimon-group run`` processes.

* ``/metrics`` scraped while a member runs shows the lag falling to 0, and a
  rebalance counted when a second member joins; ``/healthz`` and ``/readyz``
  answer 200 once the members are settled.
* ``reset`` makes a stopped group re-deliver from the chosen position, and
  nothing else: exactly the rows of the snapshots after the new position, in
  the shards that were reset.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from paimon_group.reading.mirror import ConsumerMirror
from paimon_group.reading.table import ShardedTable
from tests.support.group_procs import REPO, GroupHarness

pytestmark = pytest.mark.slow

BUCKETS = 4
TIMEOUT_S = 180.0


@pytest.fixture
def harness(tmp_path: Path, coordinator: str) -> Iterator[GroupHarness]:
    h = GroupHarness(tmp_path, coordinator, group="g", buckets=BUCKETS,
                     session_timeout_s=3.0, poll_interval_ms=100, start="earliest")
    h.env["PAIMON_GROUP_METRICS_HOST"] = "127.0.0.1"
    try:
        yield h
    finally:
        h.cleanup()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def http(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return int(r.status), r.read().decode()
    except urllib.error.HTTPError as err:
        return int(err.code), err.read().decode()
    except OSError:
        return 0, ""  # not listening (yet)


def scrape(port: int) -> dict[str, float] | None:
    """``{sample name with labels: value}``, or None while nothing answers."""
    status, text = http(port, "/metrics")
    if status != 200:
        return None
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            extra = {k: v for k, v in sample.labels.items() if k not in ("group", "member")}
            label = ",".join(f"{k}={v}" for k, v in sorted(extra.items()))
            out[f"{sample.name}{{{label}}}" if label else sample.name] = sample.value
    return out


def poll(predicate: Any, what: str, h: GroupHarness, timeout: float = TIMEOUT_S) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for member, proc in h.procs.items():
            if proc.poll() is not None and proc.returncode != 0:
                raise AssertionError(f"{member} exited {proc.returncode}:\n{h.log(member)}")
        result = predicate()
        if result:
            return result
        time.sleep(0.2)
    logs = "\n".join(f"--- {m}\n{h.log(m)[-3000:]}" for m in h.procs)
    raise AssertionError(f"timed out waiting for {what}\n{logs}")


def deliveries(out: Path) -> list[dict[str, Any]]:
    lines: list[dict[str, Any]] = []
    for path in sorted(out.glob("deliveries-*.jsonl")):
        lines += [json.loads(line) for line in path.read_text().splitlines() if line]
    return lines


def set_aside_deliveries(out: Path, name: str) -> None:
    target = out / name
    target.mkdir()
    for path in out.glob("deliveries-*.jsonl"):
        path.rename(target / path.name)


def paimon_group(h: GroupHarness, *args: str, table: bool = True
                 ) -> subprocess.CompletedProcess[str]:
    where = ["--warehouse", h.warehouse, "--table", h.table] if table else []
    return subprocess.run(
        [sys.executable, "-m", "paimon_group", *args, "--group", h.group, *where,
         "--coordinator", h.coordinator],
        cwd=REPO, env=h.env, capture_output=True, text=True, timeout=TIMEOUT_S,
    )


def test_metrics_show_lag_falling_to_zero_and_a_rebalance(harness: GroupHarness) -> None:
    h = harness
    for i in range(12):
        h.write(range(i * 10, i * 10 + 10))
    port1, port2 = free_port(), free_port()
    # A slow handler, one shard at a time, so that the lag is seen before it is
    # worked off: the 12 snapshots are one catch-up step, read in 4 x 1 s,
    # several times the metrics' 1 s lag refresh. Slow until then only
    # (tests/support/handlers.py: while the file exists).
    slow = h.out / "slow-m1"
    slow.write_text("1.0")
    h.start("m1", "--metrics-port", str(port1), "--max-parallel-shards", "1")
    lags: list[float] = []

    def m1_caught_up() -> bool:
        samples = scrape(port1)
        if samples is None or samples.get("paimon_group_owned_shards") != BUCKETS:
            return False
        if "paimon_group_table_latest_snapshot" not in samples:
            return False
        lags.append(samples["paimon_group_lag_snapshots"])
        return lags[-1] == 0 and max(lags) > 0

    poll(m1_caught_up, "m1's lag to rise and fall to 0", h)
    assert max(lags) > 0 and lags[-1] == 0
    slow.unlink()
    first = scrape(port1)
    assert first is not None and first["paimon_group_rebalances_total"] == 0
    assert first["paimon_group_batches_total"] >= BUCKETS

    # New snapshots while a second member joins.
    writer = threading.Thread(target=lambda: [
        (h.write(range(i * 10, i * 10 + 10)), time.sleep(0.2)) for i in range(12, 24)])
    writer.start()
    h.start("m2", "--metrics-port", str(port2))

    def rebalanced() -> bool:
        a, b = scrape(port1), scrape(port2)
        if a is None or b is None:
            return False
        return (a["paimon_group_rebalances_total"] >= 1
                and a["paimon_group_owned_shards"] > 0 and b["paimon_group_owned_shards"] > 0
                and a["paimon_group_owned_shards"] + b["paimon_group_owned_shards"] == BUCKETS)

    poll(rebalanced, "the rebalance to m1 + m2", h)
    writer.join(timeout=TIMEOUT_S)
    # One more snapshot once both hold shards, with rows in every bucket: each
    # member then handles a batch, whenever the rebalance landed among the
    # writer's snapshots (m1 may have read them all before m2 held a shard).
    h.write(range(240, 240 + 20 * BUCKETS))
    latest = ShardedTable.open(h.warehouse, h.table).latest_snapshot_id()
    assert latest == 25

    def both_caught_up() -> bool:
        samples = [scrape(port1), scrape(port2)]
        return all(
            s is not None
            and s.get("paimon_group_table_latest_snapshot") == latest
            and s["paimon_group_lag_snapshots"] == 0
            and s["paimon_group_owned_shards"] > 0
            and s["paimon_group_ready"] == 1
            for s in samples
        )

    poll(both_caught_up, "both members to catch up", h)
    for port in (port1, port2):
        samples = scrape(port)
        assert samples is not None
        assert samples["paimon_group_session_state{state=connected}"] == 1
        assert samples["paimon_group_member_state{state=running}"] == 1
        assert samples["paimon_group_handler_seconds_count"] >= 1
        assert http(port, "/healthz")[0] == 200
        assert http(port, "/readyz")[0] == 200
        for key, value in samples.items():
            if key.startswith("paimon_group_shard_lag_seconds"):
                assert value == 0
    assert sum(s["paimon_group_leader"] for s in (scrape(port1), scrape(port2)) if s) == 1
    # One SIGTERM each (a second one may land after the runner's handlers are gone).
    assert [h.terminate("m1"), h.terminate("m2")] == [0, 0]


def test_reset_redelivers_from_the_chosen_position_and_nothing_else(
    harness: GroupHarness,
) -> None:
    h = harness
    ids_of: dict[int, set[int]] = {}
    for i in range(6):
        ids = range(i * 10, i * 10 + 10)
        ids_of[h.write(ids)] = set(ids)
    assert sorted(ids_of) == [1, 2, 3, 4, 5, 6]
    bucket = h.bucket_function()

    def expected(snapshots: range, shards: set[int]) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {s: [] for s in shards}
        for snapshot in snapshots:
            for row_id in ids_of[snapshot]:
                if bucket(row_id) % BUCKETS in shards:
                    out[bucket(row_id) % BUCKETS].append(row_id)
        return {s: sorted(v) for s, v in out.items()}

    def delivered() -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        for d in deliveries(h.out):
            out.setdefault(d["shard"], []).extend(d["ids"])
        return {s: sorted(v) for s, v in out.items()}

    h.start("m1")
    h.wait_caught_up({"m1"})
    assert h.terminate("m1") == 0
    set_aside_deliveries(h.out, "first-run")

    # The whole group back to snapshot 4.
    plan = paimon_group(h, "reset", "--to-snapshot", "4", "--json")
    assert plan.returncode == 0, plan.stderr
    assert {(s["current"], s["new"]) for s in json.loads(plan.stdout)["shards"]} == {(7, 4)}
    done = paimon_group(h, "reset", "--to-snapshot", "4", "--execute", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["executed"] is True
    report = h.describe()
    assert {s["next_snapshot"] for s in report["shards"]} == {4}
    table = ShardedTable.open(h.warehouse, h.table)
    assert ConsumerMirror(table.table.file_io, table.table_path, h.group).all() == {
        s: 4 for s in range(BUCKETS)}

    h.start("m1")
    h.wait_caught_up({"m1"})
    assert h.terminate("m1") == 0
    again = deliveries(h.out)
    assert {d["snapshot"] for d in again} <= {4, 5, 6}
    assert all(d["kind"] == "delta" for d in again)
    assert delivered() == {s: v for s, v in expected(range(4, 7), set(range(BUCKETS))).items()
                           if v}
    set_aside_deliveries(h.out, "second-run")

    # One shard only, one snapshot back: only that shard re-reads snapshot 6.
    shard = next(s for s, v in expected(range(6, 7), set(range(BUCKETS))).items() if v)
    done = paimon_group(h, "reset", "--shard", str(shard), "--shift-by", "-1", "--execute")
    assert done.returncode == 0, done.stderr
    assert [s["next_snapshot"] for s in h.describe()["shards"]] == [
        6 if s == shard else 7 for s in range(BUCKETS)]
    h.start("m1")
    h.wait_caught_up({"m1"})
    assert h.terminate("m1") == 0
    assert delivered() == expected(range(6, 7), {shard})


def test_reset_and_delete_are_refused_while_a_real_member_runs(harness: GroupHarness) -> None:
    h = harness
    h.write(range(10))
    h.start("m1", "--log-format", "json")
    h.wait_caught_up({"m1"})
    for args in (["reset", "--to-earliest", "--execute"], ["delete"]):
        result = paimon_group(h, *args)
        assert result.returncode == 1, result
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and "live" in lines[0]
    assert {s["next_snapshot"] for s in h.describe()["shards"]} == {2}
    assert h.terminate("m1") == 0
    # --log-format json: one JSON object per line, with the group's context.
    records = [json.loads(line) for line in h.log("m1").splitlines() if line.strip()]
    assert records and all({"ts", "level", "msg"} <= set(r) for r in records)
    assert all(r["group"] == "g" and r["member"] == "m1" for r in records if "group" in r)
    assert any("generation" in r for r in records)
    # Stopped: delete goes through and leaves nothing behind.
    result = paimon_group(h, "delete", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["deleted_consumer_files"] == BUCKETS
    assert h.describe()["exists"] is False


def test_members_remove_ends_the_wait_for_a_static_member(harness: GroupHarness) -> None:
    """A member SIGKILLed under a long rebalance delay keeps its shards waiting for
    it; ``members remove`` tells the leader it is gone, and its shards move now."""
    h = harness
    h.write(range(40))
    h.start("m1", "--rebalance-delay-s", "900")
    h.wait_caught_up({"m1"})
    h.start("m2", "--rebalance-delay-s", "900")
    report = h.wait_for(
        lambda d: d["state"] == "stable" and {m["member_id"] for m in d["members"]} == {
            "m1", "m2"}, TIMEOUT_S, "m1 and m2 to share the shards")
    m2_shards = next(m["owned_shards"] for m in report["members"] if m["member_id"] == "m2")
    assert m2_shards
    h.kill("m2")
    # Its session expires; the leader keeps its shards for it (900 s).
    report = h.wait_for(
        lambda d: any(m["member_id"] == "m2" and m["session_state"] == "gone"
                      for m in d["members"])
        and all(d["shards"][s]["owner"] is None for s in m2_shards),
        TIMEOUT_S, "m2's session to expire")
    assert all(report["shards"][s]["assigned_to"] == "m2" for s in m2_shards)
    result = paimon_group(h, "members", "remove", "m2", table=False)
    assert result.returncode == 0, result.stderr
    h.wait_for(
        lambda d: d["state"] == "stable"
        and all(s["owner"] == "m1" for s in d["shards"])
        and [m["member_id"] for m in d["members"]] == ["m1"],
        TIMEOUT_S, "m1 to take m2's shards well before the rebalance delay")
    assert h.terminate("m1") == 0


def test_members_remove_of_a_live_member_stops_it_with_one_line(harness: GroupHarness) -> None:
    """A live member removed by an operator notices, stops reading and exits
    non-zero with one clear line; the others take its shards."""
    h = harness
    h.write(range(40))
    h.start("m1")
    h.wait_caught_up({"m1"})
    h.start("m2")
    h.wait_for(lambda d: d["state"] == "stable" and len(
        [m for m in d["members"] if m.get("session_state") != "gone"]) == 2,
        TIMEOUT_S, "m1 and m2 to share the shards")
    result = paimon_group(h, "members", "remove", "m2", table=False)
    assert result.returncode == 0, result.stderr
    code = h.procs["m2"].wait(timeout=TIMEOUT_S)
    assert code == 1, h.log("m2")
    errors = [line for line in h.log("m2").splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "was removed from group" in errors[0], h.log("m2")
    h.write(range(40, 80))
    final = h.wait_caught_up({"m1"})
    assert all(s["owner"] == "m1" for s in final["shards"])
    assert h.terminate("m1") == 0
