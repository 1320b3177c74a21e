"""Scenario 9: the wall clock of one member jumps +30 s, then -60 s, mid-run.

The member ``m0`` runs with ``tests/chaos/clockjump`` on its ``PYTHONPATH``
(a ``sitecustomize`` that shifts ``time.time()`` by the offset in a file; see
there why not libfaketime). While snapshots are written its wall clock jumps
to +30 s, then to -30 s. Deadlines (session liveness, the safety margin,
revoke and shutdown timeouts) use the monotonic clock, so neither jump may
expire a session or move a shard: same generation, same owners, no member
records a loss. The jumps are verified in the member's own history, whose
records carry both clocks (``wall`` and the monotonic ``t``).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from tests.chaos.scenario import Backend, Run, events_of, explain, finish, harness, wait_until

pytestmark = [pytest.mark.chaos, pytest.mark.slow]

MEMBERS = ("m0", "m1", "m2")
JUMPER = "m0"
SITECUSTOMIZE_DIR = Path(__file__).parent / "clockjump"


def test_wall_clock_jump_changes_nothing(tmp_path: Path, chaos_backend: Backend) -> None:
    h = harness(tmp_path, chaos_backend)
    run = Run("9 wall clock jump +-30 s", chaos_backend.name)
    offset = tmp_path / "wall-clock-offset"
    offset.write_text("0")
    before_skew = time.time() - time.monotonic()  # the true skew of the two clocks
    env = {"PG_WALL_CLOCK_OFFSET_FILE": str(offset),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(SITECUSTOMIZE_DIR),
                                                       os.environ.get("PYTHONPATH")]))}
    try:
        h.write(range(0, 100))
        h.start(JUMPER, env=env)
        for m in MEMBERS[1:]:
            h.start(m)
        h.wait_caught_up(set(MEMBERS))
        h.start_writer(first=100, count=300, per_snapshot=20, interval_s=0.4)
        before = h.wait_for(lambda d: d["state"] == "stable" and any(
            s["owner"] == JUMPER for s in d["shards"]), what=f"{JUMPER} owning shards")

        for jump_to in (30, -30):
            fault = run.fault(f"wall clock to {jump_to:+d} s", None)  # no takeover expected
            offset.write_text(str(jump_to))
            # The jump is seen by the member: a record after it whose wall time
            # is off the true wall time by the offset (checked against the
            # monotonic clock, which both share with this process).
            def jumped(jump_to: int = jump_to, t: float = fault.t) -> list[dict[str, Any]]:
                return [e for e in events_of(h, JUMPER, "commit", after=t + 0.2)
                        if abs((e["wall"] - e["t"]) - (before_skew + jump_to)) < 2.0]

            wait_until(h, jumped, f"{JUMPER} to commit under the jumped clock")

        after = h.describe()
        assert after["generation"] == before["generation"], (before, after, explain(h))
        assert [s["owner"] for s in after["shards"]] == [
            s["owner"] for s in before["shards"]], (before, after, explain(h))
        # (Losses at start-up, while the members join one by one, are normal.)
        losses = [e for e in h.history().events
                  if e["event"] == "lost" and e["t"] > run.faults[0].t]
        assert losses == [], losses
        finish(h, run, set(MEMBERS))
    finally:
        h.cleanup()
