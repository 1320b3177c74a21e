"""Every bad input of a first run: one line, a non-zero exit, nothing created.

Each case runs twice, through the installed console script (``paimon-group``
beside the test's Python, what a user types) and through ``python -m
paimon_group`` from the source tree. Both, because the console script imports
the package from wherever the virtualenv's install points (an editable
install points at one checkout), while ``-m`` with ``cwd`` = this checkout
always runs the code under test: the first proves the entry point, the second
that the code being changed behaves.

"Nothing created": the warehouse and the scratch directory hold the same
files and directories after the command as before, and no SQLite coordinator
or parent directory appears. The one extra line allowed is "connecting to
URL (timeout N s)" before a network coordinator that does not answer.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.group_procs import REPO
from tests.support.tables import make_pk_table, write_rows

SCRIPT = Path(sys.executable).parent / "paimon-group"

ENTRIES = {
    "script": [str(SCRIPT)],
    "module": [sys.executable, "-m", "paimon_group"],
}


def tree(*roots: Path) -> set[str]:
    return {str(p) for root in roots for p in root.rglob("*")}


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    wh = tmp_path_factory.mktemp("bad-input") / "wh"
    make_pk_table(str(wh), "db.t", buckets=4)
    write_rows(str(wh), "db.t", range(10))
    return wh


def run_args(wh: Path, *extra: str) -> list[str]:
    return ["run", "--group", "g", "--warehouse", str(wh), "--table", "db.t",
            "--handler", "tests.support.handlers:record", *extra]


def cases(wh: Path, scratch: Path) -> dict[str, tuple[list[str], str]]:
    """Name -> (arguments, a word the error line must hold)."""
    missing_dir = scratch / "no" / "such" / "dir"
    return {
        "log-level": (run_args(wh, "--log-level", "LOUD"), "'LOUD'"),
        "mangled-url": (run_args(wh, "--coordinator", "etcd//oops"), "'etcd//oops'"),
        "sqlite-missing-dir": (
            run_args(wh, "--coordinator", f"sqlite://{missing_dir}/c.sqlite"),
            f"{missing_dir} of the SQLite coordinator"),
        "etcd-unreachable": (run_args(wh, "--coordinator", "etcd://127.0.0.1:1"),
                             "etcd://127.0.0.1:1"),
        "zk-unreachable": (run_args(wh, "--coordinator", "zk://127.0.0.1:1/?acl=open"),
                           "zk://127.0.0.1:1"),
        "missing-table": (["run", "--group", "g", "--warehouse", str(wh), "--table", "db.nope",
                           "--handler", "tests.support.handlers:record"], "db.nope"),
        "bad-group-name": (["run", "--group", "bad/name", "--warehouse", str(wh),
                            "--table", "db.t", "--handler", "tests.support.handlers:record"],
                           "bad/name"),
        "describe-missing-group": (["describe", "--group", "nope", "--warehouse", str(wh),
                                    "--table", "db.t"], "no coordinator at"),
        "list-no-coordinator": (["list", "--warehouse", str(wh)], "no coordinator at"),
        "unknown-option": (["describe", "--gruop", "g"], "--gruop"),
        # Checks of the run options that must come before anything is joined
        # or created (each used to join the group, or leave a coordinator file).
        "shards-over-buckets": (run_args(wh, "--shards", "8"), "--shards 8"),
        "shards-zero": (run_args(wh, "--shards", "0"), "--shards"),
        "bad-start": (run_args(wh, "--start", "yesterday"), "'yesterday'"),
        "bad-assignor": (run_args(wh, "--assignor", "random"), "'random'"),
        "unknown-column": (run_args(wh, "--columns", "nope"), "nope"),
        "poll-interval-zero": (run_args(wh, "--poll-interval-ms", "0"), "--poll-interval-ms"),
        "session-timeout-negative": (run_args(wh, "--session-timeout-s", "-1"),
                                     "--session-timeout-s"),
        "handler-attempts-zero": (run_args(wh, "--max-handler-attempts", "0"),
                                  "--max-handler-attempts"),
        "revoke-timeout-negative": (run_args(wh, "--revoke-timeout-s", "-2"),
                                    "--revoke-timeout-s"),
        "shutdown-timeout-zero": (run_args(wh, "--shutdown-timeout-s", "0"),
                                  "--shutdown-timeout-s"),
        "rebalance-delay-negative": (run_args(wh, "--rebalance-delay-s", "-1"),
                                     "--rebalance-delay-s"),
        "parallel-shards-zero": (run_args(wh, "--max-parallel-shards", "0"),
                                 "--max-parallel-shards"),
        "metrics-port-out-of-range": (run_args(wh, "--metrics-port", "70000"),
                                      "--metrics-port"),
        "history-missing-dir": (run_args(wh, "--history", f"{missing_dir}/h.jsonl"),
                                "--history"),
        "catalog-option-not-pair": (run_args(wh, "--catalog-option", "novalue"),
                                    "--catalog-option"),
        "both-handlers": (run_args(wh, "--spark-handler", "json:dumps"), "exactly one"),
        "unimportable-handler": (["run", "--group", "g", "--warehouse", str(wh),
                                  "--table", "db.t", "--handler", "no_such_module_x:handle"],
                                 "no_such_module_x"),
        "bad-member-id": (run_args(wh, "--member-id", "bad/id"), "bad/id"),
        "bad-log-format": (run_args(wh, "--log-format", "xml"), "'xml'"),
        "bad-on-data-loss": (run_args(wh, "--on-data-loss", "ignore"), "--on-data-loss"),
        # A warehouse URI with credentials: refused without echoing the secret.
        "warehouse-with-credentials": (
            ["run", "--group", "g", "--warehouse", "s3://AKIAEXAMPLE:s3cr3t-Val@bucket/wh",
             "--table", "db.t", "--handler", "tests.support.handlers:record"],
            "s3.secret-key"),
        "describe-warehouse-with-credentials": (
            ["describe", "--group", "g", "--warehouse", "s3://AKIAEXAMPLE:s3cr3t-Val@bucket/wh",
             "--table", "db.t", "--coordinator", f"sqlite://{scratch}/c.sqlite"],
            "s3.secret-key"),
        # Errors about coordinator credentials name the flag or variable to set.
        "zk-acl-needs-identity": (run_args(wh, "--coordinator", "zk://127.0.0.1:1/pg"),
                                  "--coordinator-username"),
        "credentials-in-url": (run_args(wh, "--coordinator", "etcd://u:pw@127.0.0.1:1"),
                               "PAIMON_GROUP_COORDINATOR_PASSWORD"),
    }


CASE_NAMES = list(cases(Path("/w"), Path("/s")))


@pytest.mark.parametrize("entry", list(ENTRIES))
@pytest.mark.parametrize("case", CASE_NAMES)
def test_bad_input_is_one_line(warehouse: Path, tmp_path: Path, entry: str, case: str) -> None:
    if entry == "script" and not SCRIPT.exists():
        pytest.fail(f"the console script {SCRIPT} is not installed")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    args, needle = cases(warehouse, scratch)[case]
    before = tree(warehouse, scratch)
    result = subprocess.run([*ENTRIES[entry], *args], cwd=REPO, capture_output=True,
                            text=True, timeout=60)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    lines = [line for line in lines if "connecting to " not in line
             or not case.endswith("unreachable")]
    assert result.returncode != 0, result.stderr
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), lines
    assert needle in lines[0], lines[0]
    assert result.stdout == ""
    assert "s3cr3t-Val" not in result.stderr and "AKIAEXAMPLE" not in result.stderr
    assert tree(warehouse, scratch) == before
    if case.endswith("unreachable"):  # nothing listens at port 1: known at once
        assert "refused the connection" in lines[0], result.stderr


def test_a_metrics_port_in_use_is_refused_before_anything_is_created(
    warehouse: Path, tmp_path: Path
) -> None:
    import socket

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    before = tree(warehouse, scratch)
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run([*ENTRIES["module"], *run_args(warehouse, "--metrics-port",
                                                               str(port))],
                                cwd=REPO, capture_output=True, text=True, timeout=60)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and lines[0].startswith("error: --metrics-port"), lines
    assert tree(warehouse, scratch) == before


def test_a_string_without_scheme_is_echoed_as_given_minus_secrets() -> None:
    from coordinators.registry import redact_url

    assert redact_url("etcd//oops") == "etcd//oops"
    assert redact_url("user:pw@etcd-0:2379?password=x") == "***@etcd-0:2379?password=***"


def test_redaction_hides_secrets_only() -> None:
    """ZooKeeper's acl=open and acl=creator are no secrets, nor an ACL list but
    for its digest hashes; a password, a token or an unknown parameter is masked."""
    from coordinators.registry import redact_url

    assert redact_url("zk://h:1/x?acl=open") == "zk://h:1/x?acl=open"
    assert redact_url("zk://h:1/x?ACL=creator") == "zk://h:1/x?ACL=creator"
    assert redact_url("zk://h:1/x?acl=digest:bob:pw:r,open") == \
        "zk://h:1/x?acl=digest:bob:***:r,open"
    assert redact_url("zk://h:1/x?acl=open&token=t&password=open") == \
        "zk://h:1/x?acl=open&token=***&password=***"
    assert redact_url("etcd://u:pw@h:1?acl=open") == "etcd://***@h:1?acl=open"


# -- the admin commands ----------------------------------------------------------------
#
# The same rule for every option of describe, list, reset, delete, members remove and
# demo: one line, exit 2, and nothing created, neither a file nor, on a server
# coordinator, a key. Cases run against a group that exists (``g``, 4 shards) in an
# embedded coordinator, and against an etcd prefix where nothing exists.


@pytest.fixture(scope="module")
def grouped(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A warehouse whose embedded coordinator holds group ``g`` (4 shards), made by a
    real member that joined and left."""
    import asyncio

    from paimon_group import GroupMember, MemberConfig

    wh = tmp_path_factory.mktemp("bad-admin") / "wh"
    make_pk_table(str(wh), "db.t", buckets=4)
    write_rows(str(wh), "db.t", range(10))

    async def join_and_leave() -> None:
        member = GroupMember(MemberConfig(group="g", warehouse=str(wh), table="db.t",
                                          member_id="m1", session_timeout_s=5))
        await member.start()
        for _ in range(200):
            if member.owned_shards:
                break
            await asyncio.sleep(0.05)
        await member.stop()

    asyncio.run(join_and_leave())
    return wh


def admin_cases(wh: Path, scratch: Path, etcd: str) -> dict[str, tuple[list[str], str]]:
    """Name -> (arguments, a word the error line must hold); ``wh`` holds group g."""
    at = ["--warehouse", str(wh), "--table", "db.t"]
    g = ["--group", "g", *at]
    on_etcd = ["--group", "g", *at, "--coordinator", etcd]
    return {
        "describe-neither-group-nor-all": (["describe", *at], "--all-groups"),
        "describe-all-groups-with-table": (["describe", "--all-groups", *at], "--table"),
        "describe-watch-zero": (["describe", *g, "--watch", "0"], "--watch"),
        "describe-bad-group": (["describe", "--group", "a b", *at], "'a b'"),
        "describe-missing-table": (["describe", "--group", "g", "--warehouse", str(wh),
                                    "--table", "db.nope"], "db.nope"),
        "describe-password-file-missing": (
            ["describe", *g, "--coordinator-password-file", str(scratch / "nope")],
            "password file"),
        "describe-missing-group-on-etcd": (["describe", *on_etcd], "'g'"),
        "list-bad-auth": (["list", "--warehouse", str(wh), "--coordinator-auth", "x"],
                          "--coordinator-auth"),
        "list-bad-url": (["list", "--coordinator", "zk:/x"], "zk:/x"),
        "reset-no-target": (["reset", *g], "exactly one"),
        "reset-two-targets": (["reset", *g, "--to-latest", "--to-earliest"], "exactly one"),
        "reset-snapshot-zero": (["reset", *g, "--to-snapshot", "0"], "--to-snapshot"),
        "reset-snapshot-future": (["reset", *g, "--to-snapshot", "999"], "--to-snapshot 999"),
        "reset-bad-timestamp": (["reset", *g, "--to-timestamp", "yesterday"], "'yesterday'"),
        "reset-shift-not-a-number": (["reset", *g, "--shift-by", "x"], "--shift-by"),
        "reset-shard-negative": (["reset", *g, "--to-latest", "--shard", "-1"], "--shard -1"),
        "reset-shard-out-of-range": (["reset", *g, "--to-latest", "--shard", "4"],
                                     "--shard 4"),
        "reset-missing-group-on-etcd": (["reset", *on_etcd, "--to-latest", "--execute"],
                                        "'g'"),
        "delete-missing-group": (["delete", "--group", "nope", "--warehouse", str(wh)],
                                 "'nope'"),
        "delete-missing-group-on-etcd": (["delete", *on_etcd], "'g'"),
        "delete-bad-group": (["delete", "--group", "../g", *at], "'../g'"),
        "members-remove-no-id": (["members", "remove", "--group", "g", "--warehouse",
                                  str(wh)], "MEMBER_ID"),
        "members-remove-unknown": (["members", "remove", "--group", "g", "--warehouse",
                                    str(wh), "nobody"], "'nobody'"),
        "members-remove-bad-id": (["members", "remove", "--group", "g", "--warehouse",
                                   str(wh), "bad/id"], "'bad/id'"),
        "members-remove-on-etcd": (["members", "remove", "--group", "g", "--warehouse",
                                    str(wh), "--coordinator", etcd, "m1"], "'g'"),
        "demo-no-workers": (["demo", "--workers", "0", "--dir", str(scratch / "demo")],
                            "--workers"),
        "demo-too-short": (["demo", "--seconds", "1", "--dir", str(scratch / "demo")],
                           "--seconds"),
    }


ADMIN_CASES = list(admin_cases(Path("/w"), Path("/s"), "etcd://h:1/p"))


@pytest.mark.parametrize("case", ADMIN_CASES)
def test_bad_admin_input_is_one_line(grouped: Path, tmp_path: Path, etcd_server: Any,
                                     case: str) -> None:
    import asyncio

    from coordinators.registry import open_coordinator

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    etcd = etcd_server.url_with_prefix()
    args, needle = admin_cases(grouped, scratch, etcd)[case]
    before = tree(grouped, scratch)
    result = subprocess.run([*ENTRIES["module"], *args], cwd=REPO, capture_output=True,
                            text=True, timeout=60)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2, (result.returncode, result.stderr, result.stdout[-500:])
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert needle in lines[0], lines[0]
    assert result.stdout == ""
    assert tree(grouped, scratch) == before

    async def keys() -> list[str]:
        async with open_coordinator(etcd) as coord:
            return [e.key for e in await coord.list("groups/")]

    assert asyncio.run(keys()) == []


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGINT"])
def test_a_sigterm_before_joining_is_a_clean_stop(warehouse: Path, tmp_path: Path,
                                                  signame: str) -> None:
    """A pod stopped while it starts (here: while its coordinator has not answered
    yet) exits 0 with one line, having joined and created nothing; Ctrl-C
    (SIGINT) as well."""
    import signal
    import socket
    import time

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    before = tree(warehouse, scratch)
    with socket.socket() as silent:  # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"etcd://127.0.0.1:{silent.getsockname()[1]}"
        proc = subprocess.Popen(
            [*ENTRIES["module"], *run_args(warehouse, "--coordinator", url,
                                           "--session-timeout-s", "60")],
            cwd=REPO, stderr=subprocess.PIPE, text=True)
        assert proc.stderr is not None
        deadline = time.monotonic() + 60
        first = proc.stderr.readline()
        assert "connecting to" in first and time.monotonic() < deadline, first
        proc.send_signal(getattr(signal, signame))
        rest = proc.stderr.read()
        code = proc.wait(timeout=30)
    assert code == 0, first + rest
    assert [line for line in rest.splitlines() if line.strip()] == [
        f"stopped before joining the group ({signame})"], rest
    assert tree(warehouse, scratch) == before
