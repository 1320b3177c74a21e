"""The one line a member logs when its coordinator stops answering.

Unit tests of :class:`Reachability` (the wording and the once-per-episode
rule), and a real one: a worker process on its own etcd server, the server
killed under it; within the session timeout the worker says in one line that
the coordinator is unreachable and what it does about it."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from paimon_group.member.reachability import Reachability
from tests.support.etcd_server import EtcdServer
from tests.support.tables import make_pk_table, write_rows

REPO = Path(__file__).resolve().parents[1]


def test_an_unreachable_coordinator_is_said_once_with_what_the_member_does() -> None:
    r = Reachability("etcd://etcd-0:2379/pg", safety_margin_s=2.5)
    line = r.on_state("suspended", now=10.0, deadline=18.0)
    assert line is not None and line.startswith("coordinator etcd://etcd-0:2379/pg unreachable")
    assert "at most 8 s more" in line and "in 5.5 s" in line and "keeps retrying" in line
    assert "\n" not in line
    assert r.on_state("suspended", now=12.0, deadline=18.0) is None   # once per episode
    back = r.on_state("connected", now=13.5, deadline=23.0)
    assert back == ("coordinator etcd://etcd-0:2379/pg reachable again after 3.5 s: "
                    "carrying on with the same shards")
    assert r.on_state("connected", now=14.0, deadline=24.0) is None   # nothing new
    assert r.on_state("suspended", now=20.0, deadline=24.0) is not None  # a new episode


def test_a_lost_session_is_said_once_and_its_reconnect_is_not_a_return() -> None:
    r = Reachability("zk://zk-0:2181", safety_margin_s=1.0)
    assert r.on_state("suspended", now=0.0, deadline=4.0) is not None
    lost = r.on_state("lost", now=5.0, deadline=4.0)
    assert lost is not None and "dropped its shards" in lost and "rejoins" in lost
    assert r.on_state("lost", now=6.0, deadline=4.0) is None
    # The new session of the rejoin connects: not "reachable again with the same shards".
    assert r.on_state("connected", now=7.0, deadline=17.0) is None


@pytest.mark.etcd
@pytest.mark.slow
def test_a_worker_says_within_the_session_timeout_that_etcd_is_gone(
    tmp_path: Path, etcd_server_factory: Callable[..., EtcdServer]
) -> None:
    server = etcd_server_factory()
    wh = tmp_path / "wh"
    make_pk_table(str(wh), "db.t", buckets=2)
    write_rows(str(wh), "db.t", range(10))
    out = tmp_path / "out"
    out.mkdir()
    timeout_s = 6.0
    env = {**os.environ, "PYTHONPATH": str(REPO), "PG_TEST_OUT": str(out)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "paimon_group", "run", "--group", "g", "--warehouse", str(wh),
         "--table", "db.t", "--handler", "tests.support.handlers:record", "--coordinator",
         server.url, "--session-timeout-s", str(timeout_s), "--member-id", "w1"],
        cwd=REPO, env=env, stderr=subprocess.PIPE, text=True)
    lines: list[tuple[float, str]] = []

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append((time.monotonic(), line.rstrip()))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 60
        while not any("acquired shards" in text for _, text in lines):
            assert proc.poll() is None and time.monotonic() < deadline, lines
            time.sleep(0.1)
        killed_at = time.monotonic()
        server.kill()
        while not any("unreachable" in text for _, text in lines):
            assert time.monotonic() < killed_at + 3 * timeout_s, lines[-5:]
            time.sleep(0.1)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    texts = [text for _, text in lines]
    said = next(i for i, text in enumerate(texts) if "unreachable" in text)
    assert f"coordinator etcd://{server.endpoint}" in texts[said], texts[said]
    assert "keeps retrying" in texts[said], texts[said]
    # Said first: before the member's first failed round or any loss (an
    # order, not a time: these machines are noisy).
    later = [i for i, text in enumerate(texts)
             if "control round failed" in text or "lost" in text.split(": ", 1)[-1]]
    assert all(said < i for i in later), texts[said - 2:]


@pytest.mark.asyncio
@pytest.mark.parametrize("backend", ["sqlite", "etcd"])
async def test_a_graceful_stop_says_nothing_of_a_lost_session(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Closing its own session at stop is not the coordinator going away: no
    WARNING "session lost ... rejoins when the coordinator answers"."""
    import asyncio
    import logging

    from paimon_group import GroupMember, MemberConfig

    wh = str(tmp_path / "wh")
    make_pk_table(wh, "db.t", buckets=2)
    url = (request.getfixturevalue("etcd_server").url_with_prefix() if backend == "etcd"
           else f"sqlite://{tmp_path}/c.sqlite")
    member = GroupMember(MemberConfig(group="g", warehouse=wh, table="db.t", coordinator=url,
                                      member_id="m", session_timeout_s=5))
    caplog.set_level(logging.INFO, logger="paimon_group")
    await member.start()
    for _ in range(200):
        if member.owned_shards:
            break
        await asyncio.sleep(0.05)
    assert member.owned_shards
    await member.stop()
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not warnings, warnings
    assert any("released shards" in r.getMessage() for r in caplog.records)
