"""The README's coordinator lines, run against the suite's real servers.

"Use it" shows how to point a worker at etcd and ZooKeeper. Each line that a
development server can answer is run here as written, with the host part
replaced by the suite's server (and the handler and table by a test's): the
worker joins, gets every shard and leaves on SIGTERM with exit 0. The
ZooKeeper line without credentials is the one users copied and saw fail: it
must now carry ``?acl=open`` (or credentials)."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.etcd_server import EtcdServer
from tests.support.tables import make_pk_table, write_rows
from tests.support.zk_server import ZkServer

REPO = Path(__file__).resolve().parents[1]


def readme_coordinator_lines() -> dict[str, str]:
    """The ``--coordinator`` URL of each ``paimon-group run`` line in "Use it"."""
    text = (REPO / "README.md").read_text()
    section = text[text.index("## Use it"):]
    section = section[:section.index("\n## ", 1)]
    urls: dict[str, str] = {}
    for line in section.replace("\\\n", " ").splitlines():
        if not line.startswith("paimon-group run") or "--coordinator " not in line:
            continue
        url = shlex.split(line)[shlex.split(line).index("--coordinator") + 1]
        if "--coordinator-username" not in line and "--coordinator-ca" not in line:
            urls[url.split("://")[0] + ("-open" if "acl=open" in url else "")] = url
    return urls


def test_the_readme_zookeeper_line_without_credentials_says_acl_open() -> None:
    lines = readme_coordinator_lines()
    assert "zk-open" in lines and "zk" not in lines, lines


@pytest.mark.parametrize("scheme", ["etcd", "zk-open"])
def test_a_readme_coordinator_line_runs_as_written(
    tmp_path: Path, scheme: str, request: pytest.FixtureRequest
) -> None:
    url = readme_coordinator_lines()[scheme]
    server: EtcdServer | ZkServer = request.getfixturevalue(
        "etcd_server" if scheme == "etcd" else "zk_server")
    hosts = server.endpoint if isinstance(server, EtcdServer) else server.hosts
    real = re.sub(r"://[^/]+", f"://{hosts}", url, count=1)
    wh = tmp_path / "wh"
    make_pk_table(str(wh), "db.t", buckets=2)
    write_rows(str(wh), "db.t", range(10))
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO), "PG_TEST_OUT": str(out)}
    log = open(tmp_path / "w.log", "w+")
    proc = subprocess.Popen(
        [sys.executable, "-m", "paimon_group", "run", "--group", f"readme-{scheme}",
         "--warehouse", str(wh), "--table", "db.t", "--handler",
         "tests.support.handlers:record", "--coordinator", real, "--session-timeout-s", "6"],
        cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while "acquired shards [0, 1]" not in (tmp_path / "w.log").read_text():
            assert proc.poll() is None and time.monotonic() < deadline, \
                (tmp_path / "w.log").read_text()[-2000:]
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, (tmp_path / "w.log").read_text()[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
