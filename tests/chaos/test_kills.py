"""Scenario 1: SIGKILL of a random member, ten times, while snapshots are written.

Three members on a 4-bucket table; every 1-2 s a random member that owns
shards at that moment is SIGKILLed and restarted at once under the same id
(static membership: it waits for its dead session to expire). Afterwards:
nothing lost, no stale commit accepted, duplicates only from batches in
flight at a kill (the checker's rules).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.chaos.scenario import Backend, Run, finish, harness

pytestmark = [pytest.mark.chaos, pytest.mark.slow]

MEMBERS = ("m0", "m1", "m2")
KILLS = 10


def test_repeated_sigkill_loses_nothing(tmp_path: Path, chaos_backend: Backend) -> None:
    h = harness(tmp_path, chaos_backend)
    run = Run("1 sigkill x10", chaos_backend.name)
    try:
        h.write(range(0, 100))
        for m in MEMBERS:
            h.start(m)
        h.wait_caught_up(set(MEMBERS))
        h.start_writer(first=100, count=600, per_snapshot=20, interval_s=0.5)
        for _ in range(KILLS):
            time.sleep(run.rng.uniform(1.0, 2.0))
            # A member that owns shards now, so that every kill moves shards.
            owners = sorted({s["owner"] for s in h.describe()["shards"]} & set(MEMBERS))
            victim = run.rng.choice(owners or list(MEMBERS))
            pid = h.procs[victim].pid
            run.fault("sigkill", victim, pid)
            h.kill(victim)
            h.start(victim)
        finish(h, run, set(MEMBERS))
    finally:
        h.cleanup()
