"""Scenario 1: SIGKILL of a random member, ten times, while snapshots are written.

Three members on a 4-bucket table (and, with 5 kills, on a dynamic-bucket
and a bucket-unaware append table); every 1-2 s a random member that owns
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
from tests.support.group_procs import GroupHarness

pytestmark = [pytest.mark.chaos, pytest.mark.slow]

MEMBERS = ("m0", "m1", "m2")
KILLS = 10
KILLS_OTHER_KINDS = 5


def test_repeated_sigkill_loses_nothing(tmp_path: Path, chaos_backend: Backend) -> None:
    h = harness(tmp_path, chaos_backend)
    run = Run("1 sigkill x10", chaos_backend.name)
    try:
        _kill_repeatedly(h, run, kills=KILLS, count=600, updates=0)
    finally:
        h.cleanup()


@pytest.mark.parametrize("kind", ["dynamic", "append"])
def test_repeated_sigkill_loses_nothing_on_other_table_kinds(tmp_path: Path, kind: str) -> None:
    """The same on a dynamic-bucket table (new versions of earlier keys in every
    commit) and a bucket-unaware append table, on the embedded coordinator."""
    backend = Backend("sqlite", f"sqlite://{tmp_path}/coordinator.sqlite")
    h = harness(tmp_path, backend, kind=kind, target_row_num=40)
    run = Run(f"1 sigkill x{KILLS_OTHER_KINDS}, {kind} table", backend.name)
    try:
        _kill_repeatedly(h, run, kills=KILLS_OTHER_KINDS, count=300,
                         updates=5 if kind == "dynamic" else 0)
    finally:
        h.cleanup()


def _kill_repeatedly(h: GroupHarness, run: Run, *, kills: int, count: int,
                     updates: int) -> None:
    h.write(range(0, 100))
    for m in MEMBERS:
        h.start(m)
    h.wait_caught_up(set(MEMBERS))
    h.start_writer(first=100, count=count, per_snapshot=20, interval_s=0.5, updates=updates)
    for _ in range(kills):
        time.sleep(run.rng.uniform(1.0, 2.0))
        # A member that owns shards now, so that every kill moves shards.
        owners = sorted({s["owner"] for s in h.describe()["shards"]} & set(MEMBERS))
        victim = run.rng.choice(owners or list(MEMBERS))
        pid = h.procs[victim].pid
        run.fault("sigkill", victim, pid)
        h.kill(victim)
        h.start(victim)
    finish(h, run, set(MEMBERS))
