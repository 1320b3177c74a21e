"""Scenario 2: a member SIGSTOPped past its session timeout in the middle of a
batch, then resumed: a zombie.

While it is stopped its session expires and the others take its shards. When
it resumes it finishes the batch it was in and tries to commit it under its
old epoch: that commit must be rejected by the coordinator's epoch fence (or
refused locally because its session can no longer be confirmed), never
accepted. It then records the loss of its shards, rejoins (same process, new
session) and the group goes on with nothing lost. Runs on every backend.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos.scenario import (
    SESSION_TIMEOUT_S,
    Backend,
    Run,
    events_of,
    explain,
    finish,
    harness,
    running_group,
    stop_past_takeover,
    wait_stable_with,
    wait_until,
)
from tests.support.group_procs import GroupHarness

pytestmark = [pytest.mark.chaos, pytest.mark.slow]

MEMBERS = ("m0", "m1", "m2")


def test_zombie_is_fenced_and_rejoins(tmp_path: Path, chaos_backend: Backend) -> None:
    h = harness(tmp_path, chaos_backend)
    run = Run("2 sigstop past timeout (zombie)", chaos_backend.name)
    try:
        before = running_group(h, MEMBERS, count=400, interval_s=0.3)
        victim = run.rng.choice(MEMBERS)
        old = next(m for m in before["members"] if m["member_id"] == victim)
        # Slow the victim's handler down from now on (it reads the file on
        # every batch), so that it is stopped in the middle of one.
        slow = h.out / f"slow-{victim}"
        slow.write_text("0.6")
        h.wait_busy(victim)
        fault = stop_past_takeover(h, run, victim, "sigstop past the timeout",
                                   2.0 * SESSION_TIMEOUT_S)
        slow.unlink()

        # Its batch in flight ends in a commit under the old epoch: never accepted.
        late = wait_until(h, lambda: [e for e in events_of(h, victim, "commit", after=fault.t)
                                      if e["epoch"] in old_epochs(h, victim, fault.t)],
                          f"{victim}'s commit of its batch in flight")
        assert all(e["outcome"] in ("rejected", "refused", "error") for e in late), (
            late, explain(h))
        wait_until(h, lambda: events_of(h, victim, "lost", after=fault.t),
                   f"{victim} to record the loss of its shards")
        after = wait_stable_with(h, set(MEMBERS))
        new = next(m for m in after["members"] if m["member_id"] == victim)
        assert new["pid"] == old["pid"], (old, new)  # the same process rejoined
        assert new["session"] != old["session"], (old, new)
        finish(h, run, set(MEMBERS))
    finally:
        h.cleanup()


def old_epochs(h: GroupHarness, member: str, before: float) -> set[int]:
    """Epochs ``member`` acquired before ``before`` (its ownership at the fault)."""
    return {e["epoch"] for e in h.history().events
            if e["member"] == member and e["event"] == "acquire" and e["t"] < before}
