"""Scenario 7: ZooKeeper session expiry with kazoo's automatic reconnection.

A member is SIGSTOPped for 2.5x its session timeout while it owns shards. The
server expires its session and deletes its ephemeral nodes; the others take
its shards. On SIGCONT, kazoo reconnects by itself and presents the old
session id; the server answers that it expired. The member must treat that
as LOST (not as a reconnection): it records the loss of its shards, never
commits under the old epochs (late commits are rejected or refused), and
rejoins with a *new* session. Nothing is lost.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos.scenario import (
    SESSION_TIMEOUT_S,
    Backend,
    Run,
    events_of,
    finish,
    harness,
    running_group,
    stop_past_takeover,
    wait_stable_with,
    wait_until,
)

pytestmark = [pytest.mark.chaos, pytest.mark.slow, pytest.mark.zk]

MEMBERS = ("m0", "m1", "m2")


def test_zk_session_expiry_is_lost_and_rejoined(tmp_path: Path, zk_url: str) -> None:
    backend = Backend("zk", zk_url)
    h = harness(tmp_path, backend)
    run = Run("7 zk session expiry + reconnect", backend.name)
    try:
        before = running_group(h, MEMBERS, count=300, interval_s=0.4)
        victim = run.rng.choice(MEMBERS)
        old = next(m for m in before["members"] if m["member_id"] == victim)
        # The others take its shards while it is stopped.
        fault = stop_past_takeover(h, run, victim, "sigstop 2.5x (session expiry)",
                                   2.5 * SESSION_TIMEOUT_S)

        # kazoo reconnects with the expired session: LOST, then a new session.
        lost = wait_until(h, lambda: [e for e in events_of(h, victim, "lost", after=fault.t)
                                      if e.get("reason") == "session lost"],
                          f"{victim} to record its session as lost")
        assert set(lost[0]["shards"]) == set(old["owned_shards"]), (lost, old)
        after = wait_stable_with(h, set(MEMBERS))
        new = next(m for m in after["members"] if m["member_id"] == victim)
        assert new["session"] != old["session"], (old, new)
        assert new["pid"] == old["pid"]  # the same process rejoined; it did not restart
        # No commit of the old session accepted after its shards moved: the
        # checker's stale-commit and ownership rules, in finish().
        finish(h, run, set(MEMBERS))
    finally:
        h.cleanup()
