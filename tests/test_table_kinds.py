"""Every table kind, read by a group of 3 real ``paimon-group run`` processes.

Per kind (default primary key = dynamic buckets, dynamic partitioned, default
append = bucket-unaware, append partitioned, fixed 2 buckets over 8
partitions with ``--shards 8``), a writer keeps committing (with new
versions of earlier keys on primary-key tables) while 3 members read:

* clean phase: every written row version delivered exactly once;
* each key's versions from one shard, in snapshot order;
* rows in at least 3 of the 4 shards (6 of 8 for the fixed partitioned case);
* then one member is SIGKILLed while the writer goes on: nothing is lost,
  the checker's fencing rules hold, and once the group stopped every shard's
  Paimon consumer file holds its final position.

The non-fixed kinds run on all three coordinators between them (sqlite,
etcd, ZooKeeper).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.support.checker import (
    check_all,
    key_order,
    shards_with_rows,
    versions_lost,
    versions_not_exactly_once,
)
from tests.support.group_procs import GroupHarness

pytestmark = pytest.mark.slow

MEMBERS = {"m0", "m1", "m2"}

# (kind, coordinator, extra run options, rule, shards, shards that must get rows)
CASES = [
    pytest.param("dynamic", "sqlite", (), "bucket", 4, 3, id="dynamic-sqlite"),
    pytest.param("dynamic-partitioned", "etcd", (), "partition-bucket", 4, 3,
                 id="dynamic-partitioned-etcd", marks=pytest.mark.etcd),
    pytest.param("append", "zk", (), "file", 4, 3, id="append-zk", marks=pytest.mark.zk),
    pytest.param("append-partitioned", "sqlite", (), "file", 4, 3,
                 id="append-partitioned-sqlite"),
    pytest.param("fixed-partitioned", "sqlite", ("--shards", "8"), "partition-bucket", 8, 6,
                 id="fixed-partitioned-8-shards-sqlite"),
]


def _coordinator(request: pytest.FixtureRequest, name: str, tmp_path: Path) -> str:
    if name == "sqlite":
        return f"sqlite://{tmp_path}/coordinator.sqlite"
    url: str = request.getfixturevalue(f"{name}_url")
    return url


def _explain(h: GroupHarness) -> str:
    return "\n".join(f"--- {m}\n{h.log(m)[-2500:]}" for m in h.procs)


@pytest.mark.parametrize(("kind", "coordinator", "extra", "rule", "num_shards", "min_shards"),
                         CASES)
def test_table_kind_in_a_group_of_three(
    request: pytest.FixtureRequest, tmp_path: Path, kind: str, coordinator: str,
    extra: tuple[str, ...], rule: str, num_shards: int, min_shards: int,
) -> None:
    keyed = not kind.startswith("append")
    h = GroupHarness(tmp_path, _coordinator(request, coordinator, tmp_path), kind=kind,
                     buckets=2, target_row_num=15 if kind == "dynamic-partitioned" else 60,
                     session_timeout_s=2.0, start="earliest")
    updates = 8 if keyed else 0
    try:
        h.write(range(0, 80))
        for m in sorted(MEMBERS):
            h.start(m, *extra)
        h.wait_caught_up(MEMBERS)
        h.start_writer(first=80, count=320, per_snapshot=20, interval_s=0.1, updates=updates)
        h.wait_writer()
        final = h.wait_caught_up(MEMBERS)
        assert final["num_shards"] == num_shards
        assert final["sharding"]["rule"] == rule
        clean = h.history()
        clean_versions = list(h.versions)

        # One member SIGKILLed while the writer goes on.
        h.start_writer(first=400, count=240, per_snapshot=20, interval_s=0.2, updates=updates)
        time.sleep(1.0)  # a few snapshots in: m2 is reading or about to
        h.kill("m2")
        h.wait_writer()
        h.wait_caught_up({"m0", "m1"})
        codes = h.terminate_all()
        stopped = h.describe()
    finally:
        h.cleanup()

    # The clean phase: exactly once, one shard per key in snapshot order, spread.
    assert versions_not_exactly_once(clean_versions, clean) == [], _explain(h)
    assert key_order(clean) == []
    assert len(shards_with_rows(clean)) >= min_shards, shards_with_rows(clean)
    if keyed:
        assert len(clean_versions) > len({i for i, _ in clean_versions})  # updates were read
    if kind == "append":  # 1 file when the group was created: said in one warning line
        assert any("1 of 4 shards have rows" in h.log(m) for m in MEMBERS), _explain(h)

    # After the kill: nothing lost, fencing held, still one shard per key.
    history = h.history()
    assert versions_lost(h.versions, history) == [], _explain(h)
    assert key_order(history) == []
    violations = check_all(h.written, history, h.bucket_function(), num_shards,
                           versions=True)
    assert violations == {k: [] for k in violations}, (violations, _explain(h))
    assert {m: c for m, c in codes.items() if m != "m2"} == {"m0": 0, "m1": 0}, codes
    # Paimon consumer files mirror every shard's final position (written on release).
    assert [s["consumer_file"] for s in stopped["shards"]] == [
        s["next_snapshot"] for s in stopped["shards"]]


def test_more_shards_than_a_table_can_fill_is_refused_before_the_group_exists(
    tmp_path: Path,
) -> None:
    """``--shards 8`` on a non-partitioned table of 4 buckets would leave shards
    4..7 empty for ever: one line, exit 2, and no group is created. On a
    partitioned table the same count spreads partitions and is accepted
    (test_table_kind_in_a_group_of_three)."""
    from tests.test_bad_input import assert_one_clear_line

    h = GroupHarness(tmp_path, f"sqlite://{tmp_path}/coordinator.sqlite", buckets=4)
    try:
        h.write(range(10))
        proc = h.start("m0", "--shards", "8")
        assert proc.wait(timeout=60) == 2, h.log("m0")
    finally:
        h.cleanup()
    line = assert_one_clear_line(h, "m0", "--shards 8")
    assert "4 buckets" in line and "shards 4..7 would never get a row" in line
    assert h.describe()["exists"] is False
