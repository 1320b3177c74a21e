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
import os
import random
import time
from dataclasses import dataclass, field
from typing import Any

from tests.support.checker import (
    History,
    check_all,
    duplicates,
    recovery_time,
    rejected_commits,
)
from tests.support.group_procs import GroupHarness

SESSION_TIMEOUT_S = 2.0
BUCKETS = 4


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
    codes = stop_all(h)
    history = h.history()
    violations = check_all(h.written, history, h.bucket_function(), final["num_shards"])
    assert violations == {k: [] for k in violations}, (violations, explain(h))
    live_codes = {m: c for m, c in codes.items() if m in members}
    assert set(live_codes.values()) <= {0}, (codes, explain(h))
    dups = duplicates(history)
    if max_duplicates is not None:
        assert dups <= max_duplicates, (dups, explain(h))
    recoveries = [r for f in run.faults if f.member is not None
                  for r in [recovery_time(history, f.member, f.t, pid=f.pid)] if r is not None]
    figures = {
        "scenario": run.scenario,
        "backend": run.backend,
        "faults": len(run.faults),
        "rows_written": len(h.written),
        "rows_lost": len(h.written - set(history.delivered_counts())),
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
