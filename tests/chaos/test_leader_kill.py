"""Scenario 5: the leader SIGKILLed while it publishes an assignment, repeatedly.

A member joining makes the leader compute and publish a new assignment. Each
round waits for a member process to register (its new pid is listed) and at
once SIGKILLs the current leader, then restarts the killed leader under the
same id: that restart is the next round's joiner. A leader dying half-way
through publishing must leave either the old or the new assignment, never a
state in which two members own a shard or a shard's position moves back;
the next leader (elected after the dead session expires) publishes again.
Nothing is lost.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos.scenario import Backend, Run, finish, harness
from tests.support.group_procs import live_members

pytestmark = [pytest.mark.chaos, pytest.mark.slow]

MEMBERS = ("m0", "m1", "m2")
ROUNDS = 4


def test_leader_killed_while_publishing(tmp_path: Path, chaos_backend: Backend) -> None:
    h = harness(tmp_path, chaos_backend)
    run = Run("5 leader killed while publishing", chaos_backend.name)
    try:
        h.write(range(0, 100))
        for m in MEMBERS[:2]:
            h.start(m)
        h.wait_caught_up(set(MEMBERS[:2]))
        h.start_writer(first=100, count=400, per_snapshot=20, interval_s=0.4)
        joiner = MEMBERS[2]
        h.start(joiner)
        for _ in range(ROUNDS):
            pid = h.procs[joiner].pid
            # The joiner's registration (its own pid listed) triggers a new
            # assignment by the leader; kill the leader right then.
            d = h.wait_for(lambda d, j=joiner, p=pid: d["leader"] is not None and any(
                m["member_id"] == j and m["pid"] == p for m in d["members"]),
                timeout=180, what=f"{joiner} (pid {pid}) to join under a leader")
            leader = d["leader"]
            kind = "sigkill leader"
            if leader == joiner:  # the joiner leads already: kill another member
                leader = run.rng.choice([m for m in MEMBERS if m != joiner])
                kind = "sigkill member (the joiner leads)"
            run.fault(kind, leader, h.procs[leader].pid)
            h.kill(leader)
            h.start(leader)
            joiner = leader
        # The last restart must have registered itself: a killed process's
        # key stays listed until its session expires, and a process still
        # starting up has no signal handler yet (SIGTERM would kill it).
        pids = {m: h.procs[m].pid for m in MEMBERS}
        h.wait_for(lambda d: d["state"] == "stable" and live_members(d) == set(MEMBERS)
                   and {m["member_id"]: m["pid"] for m in d["members"]} == pids,
                   timeout=180, what="a stable group of all the current processes")
        finish(h, run, set(MEMBERS))
    finally:
        h.cleanup()
