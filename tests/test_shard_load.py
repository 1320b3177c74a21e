"""Each shard's load measured from real tables' manifests (written with pypaimon).

The expected rows per shard are counted here from the rows written and
pypaimon's own bucket of each key (tests/support/tables.bucket_of), not from
the manifests the module reads.
"""

from __future__ import annotations

import collections
from pathlib import Path

import pytest

from paimon_group.protocol.sharding import Sharding, ShardRule
from paimon_group.reading.shard_load import MeasuredLoad, measure, shard_loads
from paimon_group.reading.table import ShardedTable
from tests.support.tables import (
    bucket_of,
    compact,
    make_append_table,
    make_pk_table,
    open_table,
    partition_of,
    write_rows,
)


@pytest.fixture
def warehouse(tmp_path: Path) -> str:
    return str(tmp_path / "wh")


def expected_by_bucket(warehouse: str, ids: list[int], shards: int) -> list[int]:
    table = open_table(warehouse, "db.t")
    rows = [0] * shards
    for key in ids:
        rows[bucket_of(table, key) % shards] += 1
    return rows


def test_empty_table_has_no_measure(warehouse: str) -> None:
    make_pk_table(warehouse, buckets=4)
    assert measure(ShardedTable.open(warehouse, "db.t"), Sharding(ShardRule.BUCKET, 4)) is None


def test_live_and_recent_rows_per_shard_on_a_fixed_bucket_table(warehouse: str) -> None:
    make_pk_table(warehouse, buckets=8)
    first = list(range(0, 400))
    write_rows(warehouse, "db.t", first)
    table = ShardedTable.open(warehouse, "db.t")
    sharding = Sharding(ShardRule.BUCKET, 4)
    measured = measure(table, sharding, recent=1)
    assert measured is not None
    assert list(measured.live) == expected_by_bucket(warehouse, first, 4)
    assert measured.recent == measured.live  # the one snapshot is the recent one

    second = list(range(1000, 1100))
    last = write_rows(warehouse, "db.t", second)
    measured = measure(table, sharding, recent=1)
    assert measured is not None and measured.snapshot_id == last
    assert list(measured.live) == expected_by_bucket(warehouse, first + second, 4)
    assert list(measured.recent) == expected_by_bucket(warehouse, second, 4)
    both = measure(table, sharding, recent=2)
    assert both is not None and both.recent == both.live

    # The load: recent rows, plus live rows where the full scan is ahead.
    loads = shard_loads(measured, full_scan_pending={1})
    assert loads == {s: measured.recent[s] + (measured.live[s] if s == 1 else 0)
                     for s in range(4)}


def test_a_compaction_is_not_recent_and_keeps_live_rows(warehouse: str) -> None:
    make_pk_table(warehouse, buckets=4)
    write_rows(warehouse, "db.t", range(100))
    write_rows(warehouse, "db.t", range(50), v=1)  # updates: live files hold 150 rows
    compact(warehouse, "db.t")  # merged: 100 live rows, a COMPACT snapshot
    table = ShardedTable.open(warehouse, "db.t")
    measured = measure(table, Sharding(ShardRule.BUCKET, 4), recent=1)
    assert measured is not None
    assert sum(measured.live) == 100
    assert sum(measured.recent) == 0  # follow-ups skip COMPACT snapshots


def test_a_skewed_partition_shows_in_the_loads(warehouse: str) -> None:
    make_append_table(warehouse, "db.t", buckets=2, partitioned=True)
    hot = [i * 8 for i in range(800)]  # all in partition p0
    cold = [i for i in range(1, 200 * 8) if i % 8 and i < 1600][:200]
    write_rows(warehouse, "db.t", hot + cold)
    table = ShardedTable.open(warehouse, "db.t")
    sharding = Sharding(ShardRule.PARTITION_BUCKET, 16)
    measured = measure(table, sharding)
    assert measured is not None
    t = open_table(warehouse, "db.t")
    expected = collections.Counter(
        sharding.shard_of((partition_of(k),), bucket_of(t, k), "") for k in hot + cold)
    assert list(measured.live) == [expected.get(s, 0) for s in range(16)]
    assert max(measured.live) >= 300  # the hot partition's buckets


def test_without_a_new_snapshot_the_last_measurement_is_kept(warehouse: str) -> None:
    make_pk_table(warehouse, buckets=2)
    write_rows(warehouse, "db.t", range(10))
    table = ShardedTable.open(warehouse, "db.t")
    sharding = Sharding(ShardRule.BUCKET, 2)
    first = measure(table, sharding)
    assert first is not None and sum(first.live) == 10
    # Numbers no manifest holds: returned as they are, so no manifest was read.
    known = MeasuredLoad(first.snapshot_id, (7, 7), (1, 1), first.measured_at)
    again = measure(table, sharding, known=known)
    assert again is not None and (again.live, again.recent) == ((7, 7), (1, 1))
    assert again.measured_at > known.measured_at
    write_rows(warehouse, "db.t", range(10, 15))
    fresh = measure(table, sharding, known=known)
    assert fresh is not None and sum(fresh.live) == 15
