"""Scenario 6: the coordinator itself killed and restarted, or paused past the timeout.

etcd and ZooKeeper only: the embedded SQLite coordinator is a file inside the
members' own processes, there is no coordinator process to kill or pause (the
figures table says so; see ``NOT_APPLICABLE`` in :mod:`tests.chaos.scenario`).
Each test runs a server of its own (``etcd_server_factory`` /
``zk_server_factory``), never the shared one.

6a. SIGKILL of the server in the middle of the run, restart on the same ports
    and data a second later. Members see the coordinator unavailable, keep
    running (no member exits), and carry on once it is back; a session that
    did not survive is LOST and its member rejoins. Nothing is lost.
6b. SIGSTOP of the server for 2x the session timeout, then SIGCONT. No member
    may commit while its session is unconfirmed (invariant 3: the member's
    monotonic deadline passes during the pause); after the resume the group
    becomes stable again, possibly with new sessions. Nothing is lost.

Recovery time: from the restart / resume to a stable group of all members.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.chaos.scenario import (
    COORDINATOR_BACKENDS,
    SESSION_TIMEOUT_S,
    Backend,
    Run,
    finish,
    harness,
    wait_stable_with,
    wait_until,
)

pytestmark = [pytest.mark.chaos, pytest.mark.slow]

MEMBERS = ("m0", "m1", "m2")


@pytest.fixture(params=COORDINATOR_BACKENDS)
def own_server(request: pytest.FixtureRequest) -> tuple[Backend, Any]:
    """(backend, server): a coordinator server of this test only, with kill/pause."""
    name: str = request.param
    factory: Callable[..., Any] = request.getfixturevalue(f"{name}_server_factory")
    server = factory()
    url = server.url_with_prefix() if name == "etcd" else server.unique_url()
    return Backend(name, url), server


def _run_with_coordinator_fault(tmp_path: Path, backend: Backend, server: Any, scenario: str,
                                fault: str, inject: Callable[[], None]) -> None:
    h = harness(tmp_path, backend)
    run = Run(scenario, backend.name)
    try:
        h.write(range(0, 100))
        for m in MEMBERS:
            h.start(m)
        h.wait_caught_up(set(MEMBERS))
        h.start_writer(first=100, count=300, per_snapshot=20, interval_s=0.4)
        wait_until(h, lambda: len(h.written) >= 160, "the writer to be under way")
        run.fault(fault)
        inject()
        back = time.monotonic()
        # Every member survives the outage (none exits), and the group settles.
        wait_stable_with(h, set(MEMBERS), timeout=180)
        run.recoveries.append(time.monotonic() - back)
        exited = {m: p.returncode for m, p in h.procs.items() if p.poll() is not None}
        assert not exited, (exited, server.log_tail())
        finish(h, run, set(MEMBERS))
    finally:
        h.cleanup()


def test_coordinator_killed_and_restarted(tmp_path: Path, own_server: tuple[Backend, Any]
                                          ) -> None:
    backend, server = own_server

    def inject() -> None:
        server.kill()
        time.sleep(1.0)  # the outage
        server.start()

    _run_with_coordinator_fault(tmp_path, backend, server, "6a coordinator killed + restarted",
                                "coordinator sigkill", inject)


def test_coordinator_paused_past_timeout(tmp_path: Path, own_server: tuple[Backend, Any]
                                         ) -> None:
    backend, server = own_server

    def inject() -> None:
        server.pause()
        try:
            time.sleep(2 * SESSION_TIMEOUT_S)  # the outage: past every session's timeout
        finally:
            server.resume()

    _run_with_coordinator_fault(tmp_path, backend, server, "6b coordinator paused > timeout",
                                "coordinator sigstop 2x", inject)
