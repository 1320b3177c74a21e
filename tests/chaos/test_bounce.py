"""Scenario 4: a clean rolling bounce of every member (SIGTERM, restart with the same id).

Each member hands its shards off gracefully (in-flight batch finished, position
committed and ownership released in one commit) and exits 0; the group is
stable again before the next one is bounced. Zero duplicates are allowed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos.scenario import Backend, Run, explain, finish, harness

pytestmark = [pytest.mark.chaos, pytest.mark.slow]

MEMBERS = ("m0", "m1", "m2")


def test_rolling_bounce_has_no_duplicates(tmp_path: Path, chaos_backend: Backend) -> None:
    h = harness(tmp_path, chaos_backend)
    run = Run("4 rolling bounce", chaos_backend.name)
    try:
        h.write(range(0, 100))
        for m in MEMBERS:
            h.start(m)
        h.wait_caught_up(set(MEMBERS))
        h.start_writer(first=100, count=300, per_snapshot=20, interval_s=0.3)
        for m in MEMBERS:
            pid = h.procs[m].pid
            run.fault("sigterm", m, pid)
            assert h.terminate(m) == 0, explain(h)
            h.start(m)
            h.wait_for(lambda d: d["state"] == "stable"
                       and {x["member_id"] for x in d["members"]} == set(MEMBERS),
                       what=f"{m} back and the group stable")
        finish(h, run, set(MEMBERS), max_duplicates=0)
    finally:
        h.cleanup()
