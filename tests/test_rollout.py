"""A rolling upgrade and a roll-back between the previous release and main, with
real processes, as a StatefulSet rollout does it (docs/kubernetes.md, "A rolling
upgrade"; the compatibility rule: docs/design.md, "Versions and compatibility").

* rollout: 3 members of the previous release (its tag, or the commit
  CHANGELOG.md records, installed from that tree into a virtualenv of its own:
  tests/support/releases.py, ``install_release``; its ``paimon-group`` script)
  read a table while a writer commits; each is stopped with SIGTERM and started
  again from main under the same member id, one at a time; then one is rolled
  back to the previous release. Every row delivered, none from a shard its
  member did not own, every exit 0. On sqlite, etcd and ZooKeeper.
* refusal: a group record naming a feature main does not know (as a later
  release switches one on), and one of a newer format, are refused by a main
  member in one line naming both versions (and by ``reset``); the member
  registers nothing and holds no shard.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from paimon_group.version import __version__
from tests.support.checker import check_all
from tests.support.group_procs import REPO, GroupHarness, live_members
from tests.support.releases import install_release, previous_release
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

MEMBERS = ("m0", "m1", "m2")


HANDLERS = REPO / "tests" / "support" / "handlers.py"
"""The tests' handler (standard library only), given to the previous release
as a module of its own: with main's tree on its path it would run main."""


@pytest.fixture(scope="session")
def previous_release_script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The previous release's ``paimon-group``, installed once per test session."""
    return install_release(previous_release(), tmp_path_factory.mktemp("previous-release"))




class MixedGroup(GroupHarness):
    """A group whose members run either main or the previous release."""

    def __init__(self, base: Path, coordinator: str, previous: Path) -> None:
        super().__init__(base, coordinator, session_timeout_s=2.0, poll_interval_ms=100)
        self.previous = previous
        self.handlers = base / "previous-handlers"
        self.handlers.mkdir()
        (self.handlers / "rollout_handlers.py").write_text(HANDLERS.read_text())
        self.runs: dict[str, str] = {}

    def start_as(self, member: str, release: str) -> subprocess.Popen[bytes]:
        if release == "main":
            proc = self.start(member)
        else:  # the installed release's script; nothing of main's tree on its path
            log = open(self.out / f"{member}.log", "ab")
            env = {**self.env, "PYTHONPATH": str(self.handlers)}
            command = self.command(member, handler="rollout_handlers:record")
            assert command[1:3] == ["-m", "paimon_group"], command
            proc = subprocess.Popen([str(self.previous), *command[3:]], cwd=self.handlers,
                                    stdout=log, stderr=subprocess.STDOUT, env=env)
            self.procs[member] = proc
        self.runs[member] = release
        return proc

    def wait_all_own(self) -> dict[str, Any]:
        """Until the three members are live, the group stable and every shard owned."""
        try:
            return self.wait_for(
                lambda d: live_members(d) == set(MEMBERS) and d["state"] == "stable"
                and all(s["owner"] in MEMBERS for s in d["shards"]),
                timeout=60, what="every member live and every shard owned")
        except AssertionError as err:
            raise AssertionError(f"{str(err)[:300]}\n{self.explain()}") from None

    def roll(self, member: str, release: str) -> int:
        """Stop ``member`` with SIGTERM and start it again on ``release``."""
        code = self.terminate(member)
        self.start_as(member, release)
        self.wait_all_own()
        return code

    def explain(self) -> str:
        return "\n".join(f"--- {m} ({self.runs.get(m)})\n{self.log(m)[-1500:]}"
                         for m in self.procs)


def test_rolling_upgrade_and_rollback(tmp_path: Path, group_coordinator: str,
                                      previous_release_script: Path) -> None:
    h = MixedGroup(tmp_path, group_coordinator, previous_release_script)
    try:
        h.write(range(0, 100))
        for m in MEMBERS:
            h.start_as(m, "previous")
        h.wait_all_own()
        h.start_writer(first=100, count=1200, per_snapshot=20, interval_s=0.1)
        stops = [h.roll(m, "main") for m in reversed(MEMBERS)]  # the highest ordinal first
        stops.append(h.roll("m2", "previous"))  # and one rolled back
        h.wait_writer()
        final = h.wait_caught_up(set(MEMBERS), timeout=90)
        versions = {m["member_id"]: m.get("version") for m in final["members"]}
        codes = h.terminate_all()
    finally:
        h.cleanup()
    assert stops == [0, 0, 0, 0] and codes == dict.fromkeys(MEMBERS, 0), (stops, codes,
                                                                           h.explain())
    assert h.runs == {"m0": "main", "m1": "main", "m2": "previous"}
    assert len(set(versions.values())) == 2, versions  # two versions in one group
    history = h.history()
    violations = check_all(h.written, history, h.bucket_function(), final["num_shards"])
    assert violations == {k: [] for k in violations}, h.explain()
    print(f"rows {len(h.written)}, versions {versions}")


def _rewrite_group_record(h: GroupHarness, change: dict[str, Any]) -> None:
    """The group record with ``change``, as a later release would write it."""
    from coordinators.protocol import Put
    from coordinators.registry import open_coordinator
    from paimon_group.config.member import resolve_coordinator
    from paimon_group.protocol.names import GroupKeys

    async def go() -> None:
        key = GroupKeys(h.group).meta
        async with open_coordinator(resolve_coordinator(h.warehouse, h.coordinator)) as coord:
            entry = await coord.get(key)
            assert entry is not None
            record = {**json.loads(entry.value), **change}
            assert await coord.commit([], [Put(key, json.dumps(record).encode())])

    asyncio.run(go())


def _refusal(h: GroupHarness) -> tuple[int, list[str]]:
    """Start member ``a`` and wait for its exit: its code and its error lines."""
    log_before = h.log("a")
    code = h.start("a").wait(timeout=60)
    lines = h.log("a")[len(log_before):].splitlines()
    return code, [line for line in lines if "error" in line.lower()]


def test_member_refuses_a_feature_it_cannot_follow(tmp_path: Path) -> None:
    h = GroupHarness(tmp_path, f"sqlite://{tmp_path}/coordinator.sqlite", buckets=2)
    try:
        h.write(range(10))
        h.start("a")
        h.wait_caught_up({"a"})
        assert h.terminate("a") == 0, h.log("a")
        # A later release switched on a feature main does not know.
        _rewrite_group_record(h, {"features": ["future-feature"], "written_by": "9.0.0"})
        h.write(range(10, 20))
        refused = _refusal(h)
        reset = subprocess.run(
            [sys.executable, "-m", "paimon_group", "reset", "--group", h.group, "--warehouse",
             h.warehouse, "--coordinator", h.coordinator, "--to-latest", "--execute"],
            cwd=REPO, capture_output=True, text=True, timeout=60, env=h.env)
        # A later release raised the group record's format.
        _rewrite_group_record(h, {"features": [], "format": 2})
        newer = _refusal(h)
    finally:
        h.cleanup()
    line = ("error: group 'g' uses feature future-feature (switched on by paimon-group 9.0.0), "
            f"which this member, paimon-group {__version__}, cannot follow: upgrade it to "
            "paimon-group 9.0.0 or later")
    assert refused == (2, [line]), h.log("a")
    assert (reset.returncode, reset.stderr.splitlines()) == (2, [line]), reset.stderr
    assert newer == (2, [
        "error: the record at coordinator key 'groups/g' has format 2 (written by "
        f"paimon-group 9.0.0); this member is paimon-group {__version__}, which reads "
        "format 1: upgrade it to 9.0.0 or later"]), h.log("a")
    _rewrite_group_record(h, {"format": 1})  # describe reads format 1 only
    d = h.describe()  # it held nothing and left nothing: no member, no owner
    assert d["members"] == [] and all(s["owner"] is None for s in d["shards"]), d
    assert all(s["next_snapshot"] == 2 for s in d["shards"]), d  # nothing committed


def test_the_previous_release_refuses_a_group_of_several_tables(
        tmp_path: Path, previous_release_script: Path) -> None:
    h = MixedGroup(tmp_path, f"sqlite://{tmp_path}/coordinator.sqlite", previous_release_script)
    try:
        h.write(range(10))
        h.table = "db.*"  # main creates a group of several tables (here one, by a pattern)
        h.start_as("m0", "main")
        wait_for("m0 holds its shards", lambda: "acquired shards" in h.log("m0"), timeout=60,
                 alive={"m0": h.procs["m0"]})
        assert h.terminate("m0") == 0, h.log("m0")
        h.table = "db.t"  # the previous release names the table itself
        code = h.start_as("m1", "previous").wait(timeout=60)
        lines = [line for line in h.log("m1").splitlines() if "error" in line.lower()]
    finally:
        h.cleanup()
    assert code != 0 and len(lines) == 1, h.log("m1")
    assert "'g'" in lines[0] and "db.*" in lines[0], lines
