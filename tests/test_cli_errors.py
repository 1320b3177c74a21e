"""Bad input gets one clear line and a non-zero exit, and loses nothing."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.etcd_server import free_port
from tests.support.group_procs import REPO
from tests.support.tables import make_pk_table, write_rows


def cli(*args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "paimon_group", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    # Log lines of a member that started are allowed before the error line.
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    return errors[0]


@pytest.fixture
def warehouse(tmp_path: Path) -> str:
    wh = str(tmp_path / "wh")
    make_pk_table(wh, "db.t", buckets=4)
    write_rows(wh, "db.t", range(10))
    return wh


def run_args(wh: str, *extra: str, group: str = "g") -> list[str]:
    return ["run", "--group", group, "--warehouse", wh, "--table", "db.t",
            "--handler", "tests.support.handlers:record", "--session-timeout-s", "2", *extra]


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        ("localhost:2379", "malformed coordinator URL"),
        ("redis://127.0.0.1:6379", "unknown coordinator scheme 'redis'"),
        ("sqlite://relative/path.db", "absolute"),
    ],
)
def test_malformed_coordinator_urls(warehouse: str, url: str, needle: str) -> None:
    result = cli(*run_args(warehouse, "--coordinator", url))
    assert result.returncode == 2
    assert needle in one_line(result)


@pytest.mark.parametrize("command", ["run", "describe", "list"])
@pytest.mark.parametrize("url", ["etcd://127.0.0.1:{port}", "zk://127.0.0.1:{port}/x?acl=open"])
def test_a_refused_coordinator_is_one_line_at_once(warehouse: str, url: str, command: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing listens at the coordinator's port: one line naming the URL (its
    acl=open shown: no secret), well before the 10 s connect timeout."""
    from paimon_group.process.preflight import GRPC_PROXIES

    for variable in GRPC_PROXIES:  # etcd through a proxy is left to the connect timeout
        monkeypatch.delenv(variable, raising=False)
    url = url.format(port=free_port())
    args = {"run": run_args(warehouse, "--coordinator", url),
            "describe": ["describe", "--group", "g", "--warehouse", warehouse,
                         "--coordinator", url],
            "list": ["list", "--coordinator", url]}[command]
    started = time.monotonic()
    cli("--version")
    startup = time.monotonic() - started  # the interpreter's start on this machine now
    started = time.monotonic()
    result = cli(*args, timeout=120)
    elapsed = time.monotonic() - started
    assert result.returncode == 1, result.stderr
    assert result.stderr.splitlines() == [one_line(result)]
    assert one_line(result) == (
        f"error: coordinator {url} refused the connection ({url.split('/')[2]}: connection "
        "refused for 1 s): is it running, at this address and port?")
    assert elapsed < startup + 2.0, (elapsed, startup)


def test_a_raising_handler_logs_its_traceback_once(tmp_path: Path, warehouse: str) -> None:
    """4 shards, 3 attempts: one traceback, then one line per attempt; the
    member fails once one batch used its 3 (the shards whose handlers ran
    beside it stop at their next attempt, no other shard is begun)."""
    args = run_args(warehouse, "--coordinator", f"sqlite://{tmp_path}/c.sqlite",
                    "--max-handler-attempts", "3")
    args[args.index("--handler") + 1] = "tests.support.handlers:boom"
    result = cli(*args)
    assert result.returncode == 3, result.stderr
    assert result.stderr.count("Traceback") == 1, result.stderr
    raised = [line for line in result.stderr.splitlines() if "handler raised on" in line]
    failed_shard = result.stderr.splitlines()[-1].split(" on shard ")[1].split()[0]
    assert sum(f"on shard {failed_shard} " in line for line in raised) == 3, raised
    assert 3 <= len(raised) <= 4 * 3, result.stderr
    assert all(line.endswith("ValueError: boom (traceback above)") for line in raised[1:]), raised
    assert "(attempt 1 of 3): ValueError: boom" in raised[0]
    tail = result.stderr.splitlines()[-1]
    assert tail.startswith("error: handler failed 3 times on shard ")
    assert tail.endswith(": ValueError: boom")
    assert len(result.stderr.splitlines()) < 50, result.stderr


@pytest.mark.parametrize("table", [[], ["--table", "db.t"]], ids=["no-table", "table"])
def test_describe_json_of_a_missing_group(tmp_path: Path, warehouse: str,
                                          table: list[str]) -> None:
    """The "exists": false report either way, exit 2; without --json one line
    that does not speak of --table."""
    import asyncio
    import json

    from coordinators import open_coordinator

    coordinator = f"sqlite://{tmp_path}/c.sqlite"

    async def create() -> None:  # a coordinator without the group
        async with open_coordinator(coordinator):
            pass

    asyncio.run(create())
    where = ["--warehouse", warehouse, "--coordinator", coordinator, *table]
    result = cli("describe", "--group", "nope", *where, "--json")
    assert result.returncode == 2, result.stderr
    report = json.loads(result.stdout)
    assert report["exists"] is False and report["group"] == "nope", report
    assert result.stderr == ""
    result = cli("describe", "--group", "nope", *where)
    assert result.returncode == 2, result.stderr
    line = one_line(result)
    assert line == f"error: group 'nope' does not exist in {coordinator}", line
    assert "--table" not in line


def test_missing_table(tmp_path: Path, warehouse: str) -> None:
    result = cli("run", "--group", "g", "--warehouse", warehouse, "--table", "db.nope",
                 "--handler", "tests.support.handlers:record")
    assert result.returncode == 2
    assert "db.nope" in one_line(result)


@pytest.mark.parametrize(
    ("handler", "needle"),
    [
        ("no_such_module_xyz:f", "cannot import handler module 'no_such_module_xyz'"),
        ("tests.support.handlers:nope", "has no attribute 'nope'"),
        ("justamodule", "must be MODULE:CALLABLE"),
    ],
)
def test_unimportable_handler(warehouse: str, handler: str, needle: str) -> None:
    args = run_args(warehouse)
    args[args.index("--handler") + 1] = handler
    result = cli(*args)
    assert result.returncode == 2
    assert needle in one_line(result)


@pytest.mark.parametrize("name", ["a/b", "..", "x" * 129, "has space"])
def test_bad_group_and_member_names(warehouse: str, name: str) -> None:
    result = cli(*run_args(warehouse, group=name))
    assert result.returncode == 2
    assert "invalid group name" in one_line(result)
    result = cli(*run_args(warehouse, "--member-id", name))
    assert result.returncode == 2
    assert "invalid member id" in one_line(result)


def test_shard_count_contradicting_the_group(tmp_path: Path, warehouse: str) -> None:
    coord = f"sqlite://{tmp_path}/c.sqlite"
    # The group is created with 4 shards by describe-free means: a member that
    # fails fast on a bad start position after creating nothing, so create it
    # through the library instead.
    import asyncio

    from coordinators import open_coordinator
    from paimon_group.protocol.group import GroupClient

    async def create() -> None:
        async with open_coordinator(coord) as c:
            await GroupClient(c, "g").ensure_meta(4, "db.t")

    asyncio.run(create())
    result = cli(*run_args(warehouse, "--coordinator", coord, "--shards", "3"))
    assert result.returncode == 2
    assert "has 4 shards" in one_line(result)


def test_bad_start_position(warehouse: str) -> None:
    result = cli(*run_args(warehouse, "--start", "yesterday"))
    assert result.returncode == 2
    assert "yesterday" in one_line(result)


def test_describe_of_unknown_table_and_bad_url(warehouse: str) -> None:
    result = cli("describe", "--group", "g", "--warehouse", warehouse, "--table", "db.nope")
    assert result.returncode == 2
    one_line(result)
    result = cli("describe", "--group", "g", "--warehouse", warehouse, "--table", "db.t",
                 "--coordinator", "nope")
    assert result.returncode == 2
    one_line(result)


@pytest.mark.parametrize(
    ("columns", "needle"),
    [("id,nope", "['nope'] are not columns of the table"), ("id,,v", "comma-separated")],
)
def test_bad_columns(tmp_path: Path, warehouse: str, columns: str, needle: str) -> None:
    coordinator = f"sqlite://{tmp_path}/coord.sqlite"
    result = cli(*run_args(warehouse, "--columns", columns, "--coordinator", coordinator))
    assert result.returncode == 2
    assert needle in one_line(result)
    assert not Path(f"{tmp_path}/coord.sqlite").exists()  # nothing joined or created


def test_describe_watch_waits_for_a_missing_group(tmp_path: Path, warehouse: str) -> None:
    """Without --table: "exists": false on every refresh until the group is
    created, then its table's report (docs/operations.md, Reference)."""
    import asyncio
    import json
    import signal

    from coordinators import open_coordinator
    from paimon_group.protocol.group import GroupClient

    coordinator = f"sqlite://{tmp_path}/c.sqlite"

    async def create(group: str | None) -> None:
        async with open_coordinator(coordinator) as c:
            if group:
                await GroupClient(c, group).ensure_meta(4, "db.t")

    asyncio.run(create(None))
    proc = subprocess.Popen(
        [sys.executable, "-m", "paimon_group", "describe", "--group", "later", "--warehouse",
         warehouse, "--coordinator", coordinator, "--watch", "0.3", "--json"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stderr is not None
    try:
        first = proc.stdout.readline()
        assert first, proc.stderr.read()
        assert json.loads(first)["exists"] is False
        asyncio.run(create("later"))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            report = json.loads(proc.stdout.readline())
            if report["exists"]:
                break
        assert report["exists"] and report["table"] == "db.t" and report["num_shards"] == 4
        assert report["latest_snapshot"] == 1, report
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=30)
    assert code == 0, proc.stderr.read()
