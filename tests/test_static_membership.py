"""Static membership with real processes named like StatefulSet pods.

* a rolling restart of g-0, g-1, g-2 (each SIGTERMed and restarted with the
  same id, one after another, snapshots written throughout): 0 duplicates,
  0 lost rows, and the survivors' own shards never move;
* a scale-down from 3 to 2 moves only the departed member's shards;
* a member that crashes and comes back within ``--rebalance-delay-s`` gets its
  own shards back, and no other member's shards move meanwhile;
* a second live process with a member id already in use is refused with one
  clear line, and the first keeps its shards.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.checker import check_all, duplicates
from tests.support.group_procs import GroupHarness, live_members

pytestmark = pytest.mark.slow

MEMBERS = ("g-0", "g-1", "g-2")


def owned(d: dict[str, Any]) -> dict[str, set[int]]:
    return {m["member_id"]: set(m["owned_shards"]) for m in d["members"]
            if m.get("session_state") != "gone"}


def releases(h: GroupHarness, member: str, since: float) -> set[int]:
    """Shards ``member`` released or lost after ``since`` (monotonic)."""
    out: set[int] = set()
    for e in h.history().events:
        if e["member"] != member or e["t"] <= since:
            continue
        if e["event"] == "release":
            out.add(e["shard"])
        elif e["event"] == "lost":
            out.update(e.get("shards", []))
    return out


def test_rolling_restart_keeps_survivors_shards(tmp_path: Path) -> None:
    h = GroupHarness(tmp_path, f"sqlite://{tmp_path}/coordinator.sqlite", buckets=9)
    extra = ("--rebalance-delay-s", "20")
    try:
        h.write(range(0, 100))
        for m in MEMBERS:
            h.start(m, *extra)
        start = h.wait_caught_up(set(MEMBERS))
        home = owned(start)
        assert all(len(s) == 3 for s in home.values()), home
        h.start_writer(first=100, count=900, per_snapshot=15, interval_s=0.1)
        for m in MEMBERS:
            since = time.monotonic()
            assert h.terminate(m) == 0, h.log(m)
            h.start(m, *extra)
            d = h.wait_for(lambda d: owned(d) == home and d["state"] == "stable",
                           timeout=90, what=f"{m} back with its own shards")
            for other in MEMBERS:
                if other != m:
                    # A survivor may release shards it held for m meanwhile,
                    # never its own.
                    assert not (releases(h, other, since) & home[other]), (other, d)
        h.wait_writer()
        final = h.wait_caught_up(set(MEMBERS))
        assert owned(final) == home
        codes = h.terminate_all()
    finally:
        h.cleanup()
    assert set(codes.values()) == {0}, codes
    history = h.history()
    violations = check_all(h.written, history, h.bucket_function(), 9)
    assert violations == {k: [] for k in violations}
    assert duplicates(history) == 0


def test_scale_down_moves_only_the_departed_members_shards(tmp_path: Path) -> None:
    h = GroupHarness(tmp_path, f"sqlite://{tmp_path}/coordinator.sqlite", buckets=8)
    try:
        h.write(range(0, 80))
        for m in MEMBERS:
            h.start(m)
        before = owned(h.wait_caught_up(set(MEMBERS)))
        since = time.monotonic()
        assert h.terminate("g-2") == 0
        after = owned(h.wait_caught_up({"g-0", "g-1"}))
        assert before["g-0"] <= after["g-0"] and before["g-1"] <= after["g-1"]
        assert after["g-0"] | after["g-1"] == set(range(8))
        assert not releases(h, "g-0", since) and not releases(h, "g-1", since)
        h.terminate_all()
    finally:
        h.cleanup()


def test_crashed_member_gets_its_shards_back_within_the_delay(tmp_path: Path) -> None:
    h = GroupHarness(tmp_path, f"sqlite://{tmp_path}/coordinator.sqlite", buckets=6)
    extra = ("--rebalance-delay-s", "60")
    try:
        h.write(range(0, 60))
        for m in MEMBERS:
            h.start(m, *extra)
        home = owned(h.wait_caught_up(set(MEMBERS)))
        since = time.monotonic()
        h.kill("g-1")  # no goodbye
        # Its session expires after 2 s; the delay keeps its shards for 60 s.
        d = h.wait_for(lambda d: live_members(d) == {"g-0", "g-2"},
                       timeout=50, what="g-1's session to expire")
        time.sleep(1)
        d = h.describe()
        assert owned(d) == {"g-0": home["g-0"], "g-2": home["g-2"]}  # nothing moved
        h.start("g-1", *extra)
        h.write(range(60, 120))
        final = h.wait_caught_up(set(MEMBERS))
        assert owned(final) == home
        assert not releases(h, "g-0", since) and not releases(h, "g-2", since)
        h.terminate_all()
    finally:
        h.cleanup()
    history = h.history()
    violations = check_all(h.written, history, h.bucket_function(), 6)
    assert violations == {k: [] for k in violations}


def test_second_live_process_with_the_same_id_is_refused(tmp_path: Path) -> None:
    h = GroupHarness(tmp_path, f"sqlite://{tmp_path}/coordinator.sqlite", buckets=4)
    try:
        h.write(range(0, 40))
        first = h.start("g-0")
        before = owned(h.wait_caught_up({"g-0"}))
        since = time.monotonic()
        import subprocess

        from tests.support.group_procs import REPO

        dup = subprocess.run(h.command("g-0"), cwd=REPO, env=h.env, capture_output=True,
                             text=True, timeout=60)
        assert dup.returncode == 1, dup.stderr
        errors = [line for line in dup.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "member id 'g-0' is held by another live process" in errors[0]
        assert first.poll() is None
        assert owned(h.describe()) == before
        assert not releases(h, "g-0", since)
        h.terminate_all()
    finally:
        h.cleanup()
