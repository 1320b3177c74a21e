"""A group created with ``--assignor load``, read by real ``paimon-group run`` processes.

On a skewed table (2 buckets over 8 partitions, 80% of the rows in partition
p0, ``--shards 8``): every written row version is delivered exactly once,
the group record says ``load``, the published assignment carries each
shard's load and describe gives each member its share of it, the hot
partition's two shards end with different members; a member started with
``--assignor count`` is refused in one line (exit 2) and joins nothing.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support.checker import key_order, versions_not_exactly_once
from tests.support.group_procs import REPO, GroupHarness

pytestmark = pytest.mark.slow

MEMBERS = {"m0", "m1", "m2"}


def skewed_ids(first: int, count: int) -> list[int]:
    """``count`` new ids from ``first``: 4 of every 5 in partition p0 (id % 8 == 0)."""
    hot = [first * 8 + 8 * i for i in range(count * 4 // 5)]
    cold = [first * 8 + 8 * i + 1 + i % 7 for i in range(count - len(hot))]
    return hot + cold


def test_load_group_on_a_skewed_table(tmp_path: Path) -> None:
    h = GroupHarness(tmp_path, f"sqlite://{tmp_path}/coordinator.sqlite",
                     kind="fixed-partitioned", buckets=2, start="earliest")
    try:
        for batch in range(4):
            h.write(skewed_ids(batch * 1000, 250))
        for m in sorted(MEMBERS):
            h.start(m, "--shards", "8", "--assignor", "load")
        h.wait_caught_up(MEMBERS)
        for batch in range(4, 8):
            h.write(skewed_ids(batch * 1000, 100))
        final = h.wait_caught_up(MEMBERS)
        refused = subprocess.run(h.command("m9", "--assignor", "count"), cwd=REPO,
                                 env=h.env, capture_output=True, text=True, timeout=120)
        after = h.describe()
        codes = h.terminate_all()
    finally:
        h.cleanup()

    history = h.history()
    assert versions_not_exactly_once(h.versions, history) == []
    assert key_order(history) == []
    assert codes == {"m0": 0, "m1": 0, "m2": 0}
    assert final["assignor"] == "load"
    shares = {m["member_id"]: m["load_share"] for m in final["members"]}
    assert set(shares) == MEMBERS and all(s is not None for s in shares.values()), shares
    assert abs(sum(shares.values()) - 1.0) < 1e-9
    hot = {s["shard"] for s in final["shards"]
           if s["shard"] in _hot_shards(h)}
    owners = {s["owner"] for s in final["shards"] if s["shard"] in hot}
    assert len(hot) == 2 and len(owners) == 2, final["shards"]

    assert refused.returncode == 2, refused
    errors = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "created with --assignor load" in errors[0], refused.stderr
    assert "Traceback" not in refused.stderr
    assert {m["member_id"] for m in after["members"]} == MEMBERS


def _hot_shards(h: GroupHarness) -> set[int]:
    """The shards of partition p0's two buckets, by the group's rule (from the
    table's files, independently of the member's measurement)."""
    shard_of = h.shard_function()
    return {shard_of(i) for i in skewed_ids(0, 250)[:200]}
