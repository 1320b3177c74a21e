"""Bookkeeping shared by the chaos scenarios: run a fault, check, record figures.

Every scenario ends with :func:`finish`: it waits until the group caught up,
stops every member, runs every check of :mod:`tests.support.checker` over the
histories (asserting none is violated) and appends one JSON line of figures
(rows written, lost, duplicates, rejected stale commits, recovery times) to
``$PG_CHAOS_REPORT`` when set; ``tests/chaos/report.py`` turns those lines
into the table of ``docs/reliability.md``.

Example::

    h = GroupHarness(tmp_path, backend.url, session_timeout_s=2.0)
    run = Run("sigkill", backend.name)
    ... inject faults, run.fault(...) ...
    finish(h, run, members={"m0", "m1", "m2"})
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.support.checker import (
    History,
    check_all,
    delivered_versions,
    duplicates,
    key_order,
    recovery_time,
    rejected_commits,
    versions_lost,
)
from tests.support.group_procs import GroupHarness, live_members

SESSION_TIMEOUT_S = 2.0
BUCKETS = 4

# Scenario x backend pairs that are not run, with the reason shown in the
# figures table (tests/chaos/report.py). These backends are left out of the
# scenario's parametrisation, not skipped at run time.
NOT_APPLICABLE: dict[tuple[str, str], str] = {
    ("6a coordinator killed + restarted", "sqlite"):
        "the coordinator is a file in the members' own processes: nothing to kill",
    ("6b coordinator paused > timeout", "sqlite"):
        "the coordinator is a file in the members' own processes: nothing to pause",
    ("7 zk session expiry + reconnect", "sqlite"): "ZooKeeper only",
    ("7 zk session expiry + reconnect", "etcd"): "ZooKeeper only",
    ("8 member cut off by TCP proxy", "sqlite"):
        "no network between a member and its coordinator file",
}


@dataclass(frozen=True)
class Backend:
    name: str  # sqlite, etcd, zk
    url: str


@dataclass
class Fault:
    kind: str
    member: str | None
    pid: int | None
    t: float  # CLOCK_MONOTONIC, comparable with the histories


@dataclass
class Run:
    scenario: str
    backend: str
    faults: list[Fault] = field(default_factory=list)
    rng: random.Random = field(default_factory=lambda: random.Random(os.environ.get(
        "PG_CHAOS_SEED", "0")))
    # Recovery times measured by the scenario itself (e.g. from a coordinator
    # restart to a stable group), added to those of member faults.
    recoveries: list[float] = field(default_factory=list)

    def fault(self, kind: str, member: str | None = None, pid: int | None = None) -> Fault:
        f = Fault(kind, member, pid, time.monotonic())
        self.faults.append(f)
        return f


def harness(tmp_path: Any, backend: Backend, **kwargs: Any) -> GroupHarness:
    kwargs.setdefault("session_timeout_s", SESSION_TIMEOUT_S)
    kwargs.setdefault("buckets", BUCKETS)
    return GroupHarness(tmp_path, backend.url, **kwargs)


def explain(h: GroupHarness) -> str:
    return "\n".join(f"--- {m}\n{h.log(m)[-2500:]}" for m in h.procs)


def stop_all(h: GroupHarness, timeout: float = 90) -> dict[str, int]:
    """SIGTERM every running member ONCE, then wait for each.

    (A second SIGTERM after a member's graceful stop finished, when its signal
    handler is gone, would kill it with -15; GroupHarness.terminate_all can
    send two.)
    """
    import signal

    for p in h.procs.values():
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    codes = {}
    for m, p in h.procs.items():
        codes[m] = p.wait(timeout=timeout)
        h.exit_codes.setdefault(m, []).append(codes[m])
    return codes


def finish(h: GroupHarness, run: Run, members: set[str], *,
           max_duplicates: int | None = None, caught_up_timeout: float = 180
           ) -> tuple[History, dict[str, Any]]:
    """Wait for the writer and the group, stop it, check the history, record figures."""
    h.wait_writer()
    final = h.wait_caught_up(members, timeout=caught_up_timeout)
    # Every running member process registered itself (a killed one's key
    # stays listed until its session expires, and a restart still starting
    # up has no SIGTERM handler yet: stop_all would kill it with -15).
    pids = {m: p.pid for m, p in h.procs.items() if m in members and p.poll() is None}
    h.wait_for(lambda d: pids.items() <= {(m["member_id"], m["pid"]) for m in d["members"]},
               caught_up_timeout, "every running member process to be registered")
    codes = stop_all(h)
    history = h.history()
    # Tables of other kinds than fixed buckets are written with versions
    # (updates of earlier keys): rows are versions, and each key's versions
    # must come from one shard in snapshot order.
    by_version = h.kind != "fixed"
    violations = check_all(h.written, history, h.bucket_function(), final["num_shards"],
                           versions=by_version)
    if by_version:
        violations["versions_lost"] = versions_lost(h.versions, history)
        violations["key_order"] = key_order(history)
    assert violations == {k: [] for k in violations}, (violations, explain(h))
    live_codes = {m: c for m, c in codes.items() if m in members}
    assert set(live_codes.values()) <= {0}, (codes, explain(h))
    dups = (sum(n - 1 for n in delivered_versions(history).values() if n > 1) if by_version
            else duplicates(history))
    if max_duplicates is not None:
        assert dups <= max_duplicates, (dups, explain(h))
    recoveries = list(run.recoveries) + [r for f in run.faults if f.member is not None
                  for r in [recovery_time(history, f.member, f.t, pid=f.pid)] if r is not None]
    figures = {
        "scenario": run.scenario,
        "backend": run.backend,
        "faults": len(run.faults),
        "rows_written": len(h.versions) if by_version else len(h.written),
        "rows_lost": (len(set(h.versions) - set(delivered_versions(history))) if by_version
                      else len(h.written - set(history.delivered_counts()))),
        "duplicates": dups,
        "rejected_commits": rejected_commits(history),
        "recoveries": recoveries,
    }
    path = os.environ.get("PG_CHAOS_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(figures) + "\n")
    print(json.dumps(figures))
    return history, figures


COORDINATOR_BACKENDS = [
    pytest.param("etcd", marks=pytest.mark.etcd),
    pytest.param("zk", marks=pytest.mark.zk),
]
"""Backends with a coordinator process of their own (not the embedded file)."""


def wait_until(h: GroupHarness, condition: Callable[[], Any], what: str,
               timeout: float = 120) -> Any:
    """Poll ``condition`` until it returns something truthy; fail with the logs."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}\n{explain(h)}")
        time.sleep(0.1)


def wait_stable_with(h: GroupHarness, members: set[str], timeout: float = 120
                     ) -> dict[str, Any]:
    """Until the group is stable with exactly ``members`` live (lag may be > 0)."""
    found: dict[str, Any] = h.wait_for(
        lambda d: d["state"] == "stable" and live_members(d) == members,
        timeout, f"a stable group of {sorted(members)}")
    return found


def running_group(h: GroupHarness, members: tuple[str, ...], *, count: int,
                  interval_s: float, first: int = 100) -> dict[str, Any]:
    """Start ``members`` on ``first`` rows, wait until they caught up, keep a
    writer running (``count`` more rows, 20 a snapshot) and return the describe
    report once every member owns shards."""
    h.write(range(0, first))
    for m in members:
        h.start(m)
    h.wait_caught_up(set(members))
    h.start_writer(first=first, count=count, per_snapshot=20, interval_s=interval_s)
    report: dict[str, Any] = h.wait_for(
        lambda d: d["state"] == "stable" and all(m["owned_shards"] for m in d["members"]),
        what="every member owning shards")
    return report


def stop_past_takeover(h: GroupHarness, run: Run, victim: str, kind: str,
                       hold_s: float) -> Fault:
    """SIGSTOP ``victim`` until the others took its shards and at least
    ``hold_s`` passed, then SIGCONT it; the fault (its time is the SIGSTOP)."""
    import signal

    fault = run.fault(kind, victim, h.procs[victim].pid)
    h.pause(victim)
    h.wait_for(lambda d: not any(s["owner"] == victim for s in d["shards"])
               and d["state"] == "stable", what=f"{victim}'s shards to move")
    time.sleep(max(0.0, hold_s - (time.monotonic() - fault.t)))
    h.signal(victim, signal.SIGCONT)
    return fault


def events_of(h: GroupHarness, member: str, kind: str, after: float = -math.inf
              ) -> list[dict[str, Any]]:
    """``member``'s history events of ``kind`` recorded after ``after`` (monotonic)."""
    return [e for e in h.history().events
            if e["member"] == member and e["event"] == kind and e["t"] > after]
