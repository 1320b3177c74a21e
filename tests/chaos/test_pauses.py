"""Scenario 3: one member SIGSTOPped for 0.25x..2x the session timeout, then resumed.

Below the session timeout minus the safety margin (0.25x and 0.5x of 2 s,
margin 0.5 s) the group must not notice: no new generation, no shard moved,
no duplicate. At 1x and 2x the paused member's shards may move (at 2x they
must): then its commits after resuming are rejected or refused, never
accepted over the new owner, and nothing is lost.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from tests.chaos.scenario import SESSION_TIMEOUT_S, Backend, Run, finish, harness

pytestmark = [pytest.mark.chaos, pytest.mark.slow]

MEMBERS = ("m0", "m1", "m2")
SHORT = (0.25, 0.5)  # below (timeout - margin) / timeout = 0.75
LONG = (1.0, 2.0)


def test_pause_sweep(tmp_path: Path, chaos_backend: Backend) -> None:
    h = harness(tmp_path, chaos_backend)
    run = Run("3 pause sweep 0.25x-2x", chaos_backend.name)
    try:
        h.write(range(0, 100))
        for m in MEMBERS:
            h.start(m)
        h.wait_caught_up(set(MEMBERS))
        h.start_writer(first=100, count=400, per_snapshot=20, interval_s=0.4)

        for factor in SHORT:
            before = h.wait_for(lambda d: d["state"] == "stable", what="a stable group")
            victim = run.rng.choice([s["owner"] for s in before["shards"] if s["owner"]])
            run.fault(f"sigstop {factor}x", None)  # no takeover expected: no recovery time
            h.pause(victim)
            time.sleep(factor * SESSION_TIMEOUT_S)
            h.signal(victim, signal.SIGCONT)
            time.sleep(SESSION_TIMEOUT_S)  # any expiry would show by now
            after = h.describe()
            assert after["generation"] == before["generation"], (factor, before, after)
            assert [s["owner"] for s in after["shards"]] == [
                s["owner"] for s in before["shards"]], (factor, before, after)

        for factor in LONG:
            h.wait_caught_up(set(MEMBERS))
            victim = run.rng.choice(MEMBERS)
            run.fault(f"sigstop {factor}x", victim, h.procs[victim].pid)
            h.pause(victim)
            time.sleep(factor * SESSION_TIMEOUT_S)
            h.signal(victim, signal.SIGCONT)

        finish(h, run, set(MEMBERS))
    finally:
        h.cleanup()
