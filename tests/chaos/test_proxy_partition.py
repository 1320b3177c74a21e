"""Scenario 8: one member cut off from the coordinator by a loopback TCP proxy.

The member ``m2`` reaches the coordinator only through
:class:`tests.support.proxy.TcpProxy` (its ``--coordinator`` URL names the
proxy); the others connect directly. While snapshots are written:

1. the proxy delays every chunk by 0.2 s for a while (below the timeout:
   slower, nothing else);
2. it resets every connection once (RST), then passes again: the member's
   client reconnects;
3. it blackholes the member's traffic (no RST, no FIN: a cut cable) until
   the member's shards have moved to the others, i.e. past the session
   timeout, then heals.

The cut-off member must stop committing by its own monotonic deadline (its
late commits are rejected by the epoch fence or refused locally, never
accepted), record the loss of its shards, and rejoin after the heal. Nothing
is lost. etcd and ZooKeeper (a shared server, a fresh prefix / chroot); the
embedded SQLite coordinator has no network to cut.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.chaos.scenario import (
    COORDINATOR_BACKENDS,
    SESSION_TIMEOUT_S,
    Backend,
    Run,
    events_of,
    finish,
    harness,
    wait_stable_with,
    wait_until,
)
from tests.support.group_procs import GroupHarness
from tests.support.proxy import TcpProxy

pytestmark = [pytest.mark.chaos, pytest.mark.slow]

MEMBERS = ("m0", "m1", "m2")
VICTIM = "m2"


@pytest.fixture(params=COORDINATOR_BACKENDS)
def proxied(request: pytest.FixtureRequest) -> Iterator[tuple[Backend, str, TcpProxy]]:
    """(backend with the direct URL, the same URL through the proxy, the proxy)."""
    name: str = request.param
    server = request.getfixturevalue(f"{name}_server")
    if name == "etcd":
        url: str = server.url_with_prefix()
        host, port = server.endpoint.split(":")
    else:
        url = server.unique_url()
        host, port = server.host, str(server.port)
    proxy = TcpProxy(host, int(port), delay_s=0.2)
    proxy.start()
    try:
        yield Backend(name, url), url.replace(f"{host}:{port}", proxy.address, 1), proxy
    finally:
        proxy.stop()


def settled_shards(h: GroupHarness, timeout: float = 120) -> set[int]:
    """The shards the victim owns once it has owned them, under the same
    epochs, for longer than a session timeout. The reset of step 2 can end
    its session when the machine is slow to reconnect it (2 s): shards seen
    owned before that session expired are taken from it by the reset, not by
    the blackhole, and the loss the blackhole should cause never comes."""
    deadline = time.monotonic() + timeout
    while True:
        before = h.wait_for(lambda d: d["state"] == "stable" and any(
            s["owner"] == VICTIM for s in d["shards"]), what=f"{VICTIM} owning shards")
        time.sleep(SESSION_TIMEOUT_S + 1.0)
        after = h.describe()
        owned = [{(s["shard"], s["epoch"]) for s in d["shards"] if s["owner"] == VICTIM}
                 for d in (before, after)]
        if after["state"] == "stable" and owned[0] and owned[0] == owned[1]:
            return {shard for shard, _ in owned[1]}
        if time.monotonic() > deadline:
            raise AssertionError(f"{VICTIM} did not keep its shards for a session timeout; "
                                 f"last describe: {after}")


def test_member_cut_off_by_proxy(tmp_path: Path,
                                 proxied: tuple[Backend, str, TcpProxy]) -> None:
    backend, victim_url, proxy = proxied
    h = harness(tmp_path, backend)
    run = Run("8 member cut off by TCP proxy", backend.name)
    try:
        h.write(range(0, 100))
        h.start("m0")
        h.start("m1")
        h.start(VICTIM, "--coordinator", victim_url)  # the last --coordinator wins
        h.wait_caught_up(set(MEMBERS))
        assert proxy.connections_accepted > 0
        h.start_writer(first=100, count=300, per_snapshot=20, interval_s=0.4)

        # 1. delay, below the session timeout
        proxy.set_mode("delay")
        wait_until(h, lambda: len(h.written) >= 160, "the writer to be under way")
        proxy.set_mode("pass")
        # 2. one reset of every connection
        accepted = proxy.connections_accepted
        proxy.set_mode("reset")
        proxy.set_mode("pass")
        wait_until(h, lambda: proxy.connections_accepted > accepted,
                   f"{VICTIM} to reconnect after the reset")
        # 3. blackhole past the session timeout, then heal
        held = settled_shards(h)
        fault = run.fault("blackhole", VICTIM, h.procs[VICTIM].pid)
        proxy.set_mode("blackhole")
        h.wait_for(lambda d: d["state"] == "stable" and not any(
            s["owner"] == VICTIM for s in d["shards"]), what=f"{VICTIM}'s shards to move")
        proxy.set_mode("pass")
        # Its shards are gone: it records the loss (at the latest when it hears
        # from the coordinator again) and rejoins with a new session.
        lost = wait_until(h, lambda: events_of(h, VICTIM, "lost", after=fault.t),
                          f"{VICTIM} to record the loss of its shards")
        assert held <= {s for e in lost for s in e["shards"]}, (held, lost)
        wait_stable_with(h, set(MEMBERS), timeout=180)
        assert h.procs[VICTIM].poll() is None, h.log(VICTIM)[-3000:]
        finish(h, run, set(MEMBERS))
    finally:
        h.cleanup()
