"""Shard-exact planning on real pypaimon tables (no mocks).

Every path is checked the same way, independently of split metadata: each row
a shard receives has ``bucket_of(id) % S == shard`` (the bucket pypaimon's
writer computes for the key), and across all shards every expected row
``(id, v)`` arrives exactly once.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pypaimon import Schema

from coordinators.errors import PaimonGroupError
from paimon_group.errors import (
    ConfigError,
    PlanInvariantViolated,
    SnapshotExpired,
    TableNotFound,
    UnsupportedTable,
)
from paimon_group.reading.batch import ShardBatch
from paimon_group.reading.planner import BatchKind, ShardPlanner, StepPlan
from paimon_group.reading.table import ShardedTable
from tests.support.tables import (
    bucket_of,
    catalog,
    commit_empty,
    compact,
    delete_rows,
    expire_snapshots,
    make_append_table,
    make_pk_table,
    open_table,
    table_schema,
    write_rows,
)

Row = tuple[int, int]  # (id, v)


@pytest.fixture
def warehouse(tmp_path: Path) -> str:
    return str(tmp_path / "warehouse")


def read_step(planner: ShardPlanner, step: StepPlan) -> dict[int, pa.Table]:
    return {shard: planner.read_arrow(splits) for shard, splits in step.splits.items()}


def assert_shard_exact(
    table: ShardedTable,
    num_shards: int,
    per_shard: Mapping[int, pa.Table],
    expected: Iterable[Row],
) -> None:
    """Every row in the shard of its bucket; all shards together: expected, once each."""
    pt = table.table
    delivered: collections.Counter[Row] = collections.Counter()
    for shard, rows in per_shard.items():
        ids = rows.column("id").to_pylist()
        versions = rows.column("v").to_pylist()
        wrong = [i for i in ids if bucket_of(pt, i) % num_shards != shard]
        assert not wrong, f"shard {shard} got ids of other shards: {wrong[:10]}"
        delivered.update(zip(ids, versions, strict=True))
    want = collections.Counter(expected)
    duplicates = {r: n for r, n in delivered.items() if n > 1}
    assert not duplicates, f"delivered more than once: {list(duplicates)[:10]}"
    assert delivered == want, (
        f"missing {sorted(want - delivered)[:10]}, unexpected {sorted(delivered - want)[:10]}"
    )


def follow(
    planner: ShardPlanner, shards: Iterable[int], position: int
) -> tuple[list[StepPlan], dict[int, list[pa.Table]], int]:
    """Plan and read steps from ``position`` until caught up."""
    shard_list = list(shards)
    steps: list[StepPlan] = []
    tables: dict[int, list[pa.Table]] = collections.defaultdict(list)
    while (step := planner.plan_next(shard_list, position)) is not None:
        assert set(step.splits) == set(shard_list)
        assert step.next_snapshot == step.snapshot_id + 1
        assert step.next_snapshot > position
        steps.append(step)
        for shard, rows in read_step(planner, step).items():
            tables[shard].append(rows)
        position = step.next_snapshot
    return steps, tables, position


def concat(tables: dict[int, list[pa.Table]], planner: ShardPlanner) -> dict[int, pa.Table]:
    return {
        shard: pa.concat_tables(parts) if parts else planner.schema.empty_table()
        for shard, parts in tables.items()
    }


# -- initial full scan -------------------------------------------------------------------


@pytest.mark.parametrize("num_shards", [3, 8])
def test_initial_full_scan_gives_each_shard_exactly_its_buckets(
    warehouse: str, num_shards: int
) -> None:
    make_pk_table(warehouse, "db.t", buckets=8)
    write_rows(warehouse, "db.t", range(0, 60), v=1)
    write_rows(warehouse, "db.t", range(40, 100), v=2)  # updates 40..59
    last = write_rows(warehouse, "db.t", range(90, 120), v=3)  # updates 90..99
    table = ShardedTable.open(warehouse, "db.t")
    planner = table.planner(num_shards)

    step = planner.plan_full(range(num_shards), last)

    assert step.kind is BatchKind.INITIAL
    assert (step.snapshot_id, step.next_snapshot) == (last, last + 1)
    assert set(step.splits) == set(range(num_shards))
    for splits in step.splits.values():
        assert all(not getattr(s, "is_streaming", False) for s in splits)  # merged view
    latest_v = {i: 1 for i in range(40)} | {i: 2 for i in range(40, 90)}
    latest_v |= {i: 3 for i in range(90, 120)}
    assert_shard_exact(table, num_shards, read_step(planner, step), latest_v.items())
    # The snapshot's manifests were read once for all shards.
    assert planner.stats.snapshots_read == 1
    assert planner.stats.manifest_lists_read == 2  # base + delta list


def test_full_scan_for_some_shards_reads_only_their_buckets(warehouse: str) -> None:
    make_pk_table(warehouse, "db.t", buckets=8)
    last = write_rows(warehouse, "db.t", range(200))
    table = ShardedTable.open(warehouse, "db.t")
    planner = table.planner(3)

    step = planner.plan_full([2, 0], last)

    assert set(step.splits) == {0, 2}
    rows = read_step(planner, step)
    expected = [(i, 0) for i in range(200) if bucket_of(table.table, i) % 3 in (0, 2)]
    assert_shard_exact(table, 3, rows, expected)


def test_shards_equal_to_buckets_give_one_bucket_per_shard(warehouse: str) -> None:
    make_pk_table(warehouse, "db.t", buckets=8)
    first = write_rows(warehouse, "db.t", range(100), v=1)
    table = ShardedTable.open(warehouse, "db.t")
    planner = table.planner(8)

    full = planner.plan_full(range(8), first)
    for shard, splits in full.splits.items():
        assert {s.bucket for s in splits} <= {shard}
    assert_shard_exact(table, 8, read_step(planner, full), [(i, 1) for i in range(100)])

    write_rows(warehouse, "db.t", range(50, 150), v=2)
    steps, tables, _ = follow(planner, range(8), full.next_snapshot)
    assert [s.kind for s in steps] == [BatchKind.DELTA]
    assert_shard_exact(table, 8, concat(tables, planner), [(i, 2) for i in range(50, 150)])


# -- delta follow-ups ---------------------------------------------------------------------


@pytest.mark.parametrize("num_shards", [3, 8])
def test_delta_follow_ups_are_shard_exact(warehouse: str, num_shards: int) -> None:
    make_pk_table(warehouse, "db.t", buckets=8)
    start = write_rows(warehouse, "db.t", range(50), v=0)
    expected: list[Row] = []
    for v in range(1, 6):
        ids = range(v * 20, v * 20 + 40)  # overlapping ids: updates
        write_rows(warehouse, "db.t", ids, v=v)
        expected += [(i, v) for i in ids]
    table = ShardedTable.open(warehouse, "db.t")
    planner = table.planner(num_shards)

    steps, tables, position = follow(planner, range(num_shards), start + 1)

    assert [s.kind for s in steps] == [BatchKind.DELTA] * 5
    assert [s.snapshot_id for s in steps] == list(range(start + 1, start + 6))
    assert position == start + 6
    for step in steps:
        for splits in step.splits.values():
            assert all(s.is_streaming for s in splits)
    assert_shard_exact(table, num_shards, concat(tables, planner), expected)


def test_each_delta_snapshot_reads_its_manifests_once_whatever_the_shard_count(
    warehouse: str,
) -> None:
    make_pk_table(warehouse, "db.t", buckets=8)
    snapshot = write_rows(warehouse, "db.t", range(300))
    table = ShardedTable.open(warehouse, "db.t")
    one, many = table.planner(8), table.planner(8)

    one.plan_next([5], snapshot)
    many.plan_next(range(8), snapshot)

    assert one.stats.snapshots_read == many.stats.snapshots_read == 1
    assert one.stats.manifest_lists_read == many.stats.manifest_lists_read == 1
    assert many.stats.manifests_read >= 1
    assert one.stats.manifests_read <= many.stats.manifests_read


def test_append_table_with_fixed_buckets_is_shard_exact(warehouse: str) -> None:
    make_append_table(warehouse, "db.a", buckets=4)
    first = write_rows(warehouse, "db.a", range(80), v=1)
    write_rows(warehouse, "db.a", range(80), v=2)  # append tables keep both
    table = ShardedTable.open(warehouse, "db.a")
    planner = table.planner(3)

    full = planner.plan_full(range(3), first)
    assert_shard_exact(table, 3, read_step(planner, full), [(i, 1) for i in range(80)])
    steps, tables, _ = follow(planner, range(3), full.next_snapshot)
    assert [s.kind for s in steps] == [BatchKind.DELTA]
    assert_shard_exact(table, 3, concat(tables, planner), [(i, 2) for i in range(80)])


# -- changelog follow-ups -----------------------------------------------------------------


@pytest.mark.parametrize("num_shards", [3, 8])
def test_changelog_follow_ups_are_shard_exact_with_row_kinds(
    warehouse: str, num_shards: int
) -> None:
    make_pk_table(warehouse, "db.c", buckets=8, changelog_producer="input", row_kind_field=True)
    write_rows(warehouse, "db.c", range(60), v=1)
    write_rows(warehouse, "db.c", range(30, 90), v=2)
    delete_rows(warehouse, "db.c", range(0, 20), v=3)
    table = ShardedTable.open(warehouse, "db.c")
    planner = table.planner(num_shards, include_row_kind=True)
    assert planner.schema.names[0] == "_row_kind"

    steps, tables, _ = follow(planner, range(num_shards), 1)

    assert [s.kind for s in steps] == [BatchKind.CHANGELOG] * 3
    per_shard = concat(tables, planner)
    expected = [(i, 1) for i in range(60)] + [(i, 2) for i in range(30, 90)]
    expected += [(i, 3) for i in range(20)]
    assert_shard_exact(table, num_shards, per_shard, expected)
    kinds = {}
    for rows in per_shard.values():
        assert rows.schema.names[0] == "_row_kind"
        for i, v, kind in zip(
            rows.column("id").to_pylist(),
            rows.column("v").to_pylist(),
            rows.column("_row_kind").to_pylist(),
            strict=True,
        ):
            kinds[(i, v)] = kind
    assert {kinds[(i, 3)] for i in range(20)} == {"-D"}
    assert {kinds[(i, 1)] for i in range(60)} == {"+I"}


# -- catch-up ---------------------------------------------------------------------------


def test_catch_up_after_a_long_gap_is_one_step_with_each_change_once(warehouse: str) -> None:
    make_pk_table(warehouse, "db.t", buckets=8)
    start = write_rows(warehouse, "db.t", range(40), v=0)
    expected: list[Row] = []
    for v in range(1, 13):
        ids = range(0, 40, 3) if v % 2 else range(1, 40, 2)
        write_rows(warehouse, "db.t", ids, v=v)
        expected += [(i, v) for i in ids]
        if v == 6:
            compact(warehouse, "db.t")  # rewrites rows delivered before and inside the gap
    table = ShardedTable.open(warehouse, "db.t")
    latest = table.latest_snapshot_id()
    assert latest == start + 13
    planner = table.planner(3, catch_up_threshold=10)

    step = planner.plan_next(range(3), start + 1)

    assert step is not None
    assert step.kind is BatchKind.CATCH_UP
    assert (step.first_snapshot, step.snapshot_id, step.next_snapshot) == (
        start + 1,
        latest,
        latest + 1,
    )
    for splits in step.splits.values():
        assert all(s.is_streaming for s in splits)
    per_shard = read_step(planner, step)
    assert_shard_exact(table, 3, per_shard, expected)
    # Changes of a key come out in commit order.
    for rows in per_shard.values():
        seen: dict[int, int] = {}
        for i, v in zip(rows.column("id").to_pylist(), rows.column("v").to_pylist(), strict=True):
            assert v > seen.get(i, -1), f"id {i}: version {v} after {seen[i]}"
            seen[i] = v
    # Streaming the batches gives the same rows in the same order.
    for shard, splits in step.splits.items():
        streamed = pa.Table.from_batches(list(planner.iter_batches(splits)), planner.schema)
        assert streamed.equals(per_shard[shard])
    assert planner.plan_next(range(3), step.next_snapshot) is None


def test_catch_up_threshold_counts_unread_snapshots(warehouse: str) -> None:
    make_pk_table(warehouse, "db.t", buckets=4)
    for v in range(10):
        write_rows(warehouse, "db.t", [v], v=v)
    table = ShardedTable.open(warehouse, "db.t")
    planner = table.planner(2, catch_up_threshold=10)

    at_threshold = planner.plan_next([0, 1], 1)  # 10 unread: ordinary follow-up
    assert at_threshold is not None and at_threshold.kind is BatchKind.DELTA
    write_rows(warehouse, "db.t", [10], v=10)
    beyond = planner.plan_next([0, 1], 1)  # 11 unread: catch-up
    assert beyond is not None and beyond.kind is BatchKind.CATCH_UP
    assert beyond.next_snapshot == 12


def test_changelog_catch_up_is_shard_exact(warehouse: str) -> None:
    make_pk_table(warehouse, "db.c", buckets=8, changelog_producer="input")
    expected: list[Row] = []
    for v in range(1, 15):
        ids = range(v * 5, v * 5 + 30)
        write_rows(warehouse, "db.c", ids, v=v)
        expected += [(i, v) for i in ids]
        if v in (4, 9):
            compact(warehouse, "db.c")
    table = ShardedTable.open(warehouse, "db.c")
    planner = table.planner(3, include_row_kind=True)

    steps, tables, _ = follow(planner, range(3), 1)

    assert [s.kind for s in steps] == [BatchKind.CATCH_UP]
    assert_shard_exact(table, 3, concat(tables, planner), expected)


def test_pypaimon_diff_catch_up_redelivers_rows_rewritten_by_compaction(warehouse: str) -> None:
    """Why catch-up is a union of increments and not pypaimon's IncrementalDiffScanner."""
    from pypaimon.read.scanner.incremental_diff_scanner import IncrementalDiffScanner

    make_pk_table(warehouse, "db.t", buckets=4)
    before = write_rows(warehouse, "db.t", range(40), v=0)  # delivered before the gap
    compact(warehouse, "db.t")
    end = write_rows(warehouse, "db.t", range(5), v=1)
    pt = open_table(warehouse, "db.t")
    manager = pt.snapshot_manager()

    diff = IncrementalDiffScanner(pt).scan(
        manager.get_snapshot_by_id(before), manager.get_snapshot_by_id(end)
    )
    diff_rows = pt.new_stream_read_builder().new_read().to_arrow(diff.splits())
    assert diff_rows.num_rows == 45  # the 40 old rows again, plus the 5 new ones

    table = ShardedTable.open(warehouse, "db.t")
    planner = table.planner(2, catch_up_threshold=1)
    step = planner.plan_next([0, 1], before + 1)
    assert step is not None and step.kind is BatchKind.CATCH_UP
    assert_shard_exact(table, 2, read_step(planner, step), [(i, 1) for i in range(5)])


# -- snapshots without data ---------------------------------------------------------------


def test_compact_and_empty_snapshots_advance_without_splits(warehouse: str) -> None:
    make_pk_table(warehouse, "db.t", buckets=8)
    first = write_rows(warehouse, "db.t", range(30), v=1)
    compacted = compact(warehouse, "db.t")
    empty = commit_empty(warehouse, "db.t")
    last = write_rows(warehouse, "db.t", range(10), v=2)
    table = ShardedTable.open(warehouse, "db.t")
    assert table.snapshot(compacted).commit_kind == "COMPACT"
    planner = table.planner(3)

    steps, tables, position = follow(planner, range(3), first + 1)

    assert [(s.kind, s.snapshot_id, s.is_empty) for s in steps] == [
        (BatchKind.DELTA, compacted, True),
        (BatchKind.DELTA, empty, True),
        (BatchKind.DELTA, last, False),
    ]
    assert all(set(s.splits) == {0, 1, 2} for s in steps)
    assert position == last + 1
    assert_shard_exact(table, 3, concat(tables, planner), [(i, 2) for i in range(10)])


def test_changelog_table_skips_compact_snapshots(warehouse: str) -> None:
    make_pk_table(warehouse, "db.c", buckets=4, changelog_producer="input")
    first = write_rows(warehouse, "db.c", range(20), v=1)
    compacted = compact(warehouse, "db.c")
    table = ShardedTable.open(warehouse, "db.c")
    planner = table.planner(4)

    step = planner.plan_next(range(4), first + 1)

    assert step is not None
    assert (step.kind, step.snapshot_id, step.next_snapshot) == (
        BatchKind.CHANGELOG,
        compacted,
        compacted + 1,
    )
    assert step.is_empty and set(step.splits) == {0, 1, 2, 3}


# -- positions that cannot be read --------------------------------------------------------


def test_empty_table_waits_for_snapshot_one(warehouse: str) -> None:
    make_pk_table(warehouse, "db.t", buckets=4)
    table = ShardedTable.open(warehouse, "db.t")
    planner = table.planner(2)
    assert table.latest_snapshot_id() is None
    assert planner.plan_next([0, 1], 1) is None

    write_rows(warehouse, "db.t", range(10))
    step = planner.plan_next([0, 1], 1)
    assert step is not None and step.kind is BatchKind.DELTA
    assert_shard_exact(table, 2, read_step(planner, step), [(i, 0) for i in range(10)])
    assert planner.plan_next([0, 1], 2) is None


def test_expired_position_raises_and_is_never_skipped(warehouse: str) -> None:
    make_pk_table(warehouse, "db.t", buckets=4)
    for v in range(5):
        write_rows(warehouse, "db.t", [v], v=v)
    expire_snapshots(warehouse, "db.t", keep_from=4)
    table = ShardedTable.open(warehouse, "db.t")
    assert table.earliest_snapshot_id() == 4
    planner = table.planner(2)

    with pytest.raises(SnapshotExpired) as info:
        planner.plan_next([0, 1], 2)
    assert not info.value.retriable
    message = str(info.value)
    assert "\n" not in message and "snapshot 2" in message and "db.t" in message
    assert "earliest retained: 4" in message
    with pytest.raises(SnapshotExpired):
        planner.plan_full([0, 1], 3)
    step = planner.plan_next([0, 1], 4)
    assert step is not None and step.snapshot_id == 4


def test_expired_position_raises_on_the_catch_up_path_too(warehouse: str) -> None:
    make_pk_table(warehouse, "db.t", buckets=4)
    for v in range(15):
        write_rows(warehouse, "db.t", [v], v=v)
    expire_snapshots(warehouse, "db.t", keep_from=3)
    planner = ShardedTable.open(warehouse, "db.t").planner(2)

    with pytest.raises(SnapshotExpired):
        planner.plan_next([0, 1], 2)
    step = planner.plan_next([0, 1], 3)
    assert step is not None and step.kind is BatchKind.CATCH_UP


def test_future_full_scan_is_an_error_not_an_expiry(warehouse: str) -> None:
    make_pk_table(warehouse, "db.t", buckets=4)
    write_rows(warehouse, "db.t", [1])
    planner = ShardedTable.open(warehouse, "db.t").planner(2)
    with pytest.raises(Exception) as info:
        planner.plan_full([0], 5)
    assert not isinstance(info.value, SnapshotExpired)
    assert "does not exist yet" in str(info.value)


# -- tables we refuse -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "partitioned", "words", "fix"),
    [
        ({"bucket": "-2"}, False, "postpone", "'changelog-producer'"),
        ({"bucket": "-1"}, True, "cross-partition", "primary key"),
    ],
)
def test_unshardable_tables_are_refused_with_one_line(
    warehouse: str, options: dict[str, str], partitioned: bool, words: str, fix: str
) -> None:
    schema = table_schema(partitioned=partitioned)
    cat = catalog(warehouse)
    cat.create_database("db", True)
    # The key does not hold the partition key: a cross-partition update table.
    cat.create_table("db.x", Schema.from_pyarrow_schema(
        schema, partition_keys=["part"] if partitioned else None, primary_keys=["id"],
        options=options), False)
    with pytest.raises(UnsupportedTable) as info:
        ShardedTable.open(warehouse, "db.x")
    message = str(info.value)
    assert isinstance(info.value, ConfigError)
    assert words in message and "db.x" in message and "\n" not in message
    assert fix in message  # says what to do


def test_missing_table_database_and_bad_name(warehouse: str) -> None:
    make_pk_table(warehouse, "db.t", buckets=4)
    for name in ("db.nope", "nodb.t"):
        with pytest.raises(TableNotFound) as info:
            ShardedTable.open(warehouse, name)
        message = str(info.value)
        assert name in message and warehouse in message and "\n" not in message
    with pytest.raises(TableNotFound):
        ShardedTable.open(warehouse + "-missing", "db.t")
    with pytest.raises(ConfigError) as bad:
        ShardedTable.open(warehouse, "just_a_name")
    assert "DATABASE.TABLE" in str(bad.value)


def test_open_reports_the_table(warehouse: str) -> None:
    make_pk_table(warehouse, "db.t", buckets=6, changelog_producer="input")
    table = ShardedTable.open(warehouse, "db.t")
    assert table.identifier == "db.t"
    assert table.num_buckets == 6
    assert table.changelog_producer == "input"
    assert table.table_path.endswith("t")
    assert table.latest_snapshot_id() is None and table.earliest_snapshot_id() is None
    snapshot = write_rows(warehouse, "db.t", [1])
    time_ms = table.snapshot_commit_time_ms(snapshot)
    assert isinstance(time_ms, int) and time_ms > 0
    assert table.snapshot_commit_time_ms(snapshot + 1) is None
    assert table.latest_snapshot_id() == snapshot


# -- reading, routing checks and the batch ---------------------------------------------------


def test_projection_and_row_kind_shape_the_schema(warehouse: str) -> None:
    make_pk_table(warehouse, "db.t", buckets=4)
    snapshot = write_rows(warehouse, "db.t", range(20), v=4)
    table = ShardedTable.open(warehouse, "db.t")
    planner = table.planner(2, include_row_kind=True, projection=["id", "v"])
    assert planner.schema.names == ["_row_kind", "id", "v"]

    full = planner.plan_full([0, 1], snapshot)
    delta = planner.plan_next([0, 1], snapshot)
    assert delta is not None
    for step in (full, delta):
        for splits in step.splits.values():
            rows = planner.read_arrow(splits)
            assert rows.schema.names == ["_row_kind", "id", "v"]
            assert set(rows.column("_row_kind").to_pylist()) <= {"+I"}
    empty = planner.read_arrow([])
    assert empty.num_rows == 0 and empty.schema.equals(planner.schema)
    assert list(planner.iter_batches([])) == []


def test_step_plan_refuses_a_split_routed_to_the_wrong_shard(warehouse: str) -> None:
    make_pk_table(warehouse, "db.t", buckets=4)
    snapshot = write_rows(warehouse, "db.t", range(40))
    planner = ShardedTable.open(warehouse, "db.t").planner(2)
    step = planner.plan_full([0, 1], snapshot)
    split_of_shard_1 = step.splits[1][0]

    with pytest.raises(PlanInvariantViolated):
        StepPlan(
            BatchKind.DELTA,
            snapshot_id=snapshot,
            next_snapshot=snapshot + 1,
            splits={0: [split_of_shard_1]},
            num_shards=2,
        )
    forged = StepPlan(BatchKind.DELTA, snapshot, snapshot + 1, {0: [split_of_shard_1]})
    with pytest.raises(PlanInvariantViolated):
        ShardBatch(
            group="g", member_id="m", shard=0, num_shards=2, epoch=1, plan=forged, planner=planner
        )
    with pytest.raises(PlanInvariantViolated):
        ShardBatch(
            group="g", member_id="m", shard=0, num_shards=3, epoch=1, plan=step, planner=planner
        )
    with pytest.raises(Exception, match="do not exist"):
        planner.plan_next([2], snapshot)


def test_shard_batch_reads_exactly_its_shard(warehouse: str) -> None:
    make_pk_table(warehouse, "db.t", buckets=8)
    snapshot = write_rows(warehouse, "db.t", range(100), v=3)
    table = ShardedTable.open(warehouse, "db.t")
    planner = table.planner(3)
    step = planner.plan_full(range(3), snapshot)

    batches = {
        k: ShardBatch(
            group="orders",
            member_id="m-1",
            shard=k,
            num_shards=3,
            epoch=41,
            plan=step,
            planner=planner,
        )
        for k in range(3)
    }

    batch = batches[1]
    assert (batch.group, batch.member_id, batch.shard, batch.num_shards, batch.epoch) == (
        "orders",
        "m-1",
        1,
        3,
        41,
    )
    assert (batch.kind, batch.snapshot_id, batch.next_snapshot) == (
        BatchKind.INITIAL,
        snapshot,
        snapshot + 1,
    )
    assert batch.num_splits == len(step.splits[1])
    assert all(b % 3 == 1 for b in batch.buckets)
    assert batch.estimated_rows == batch.to_arrow().num_rows
    text = repr(batch)
    assert len(text) < 120 and "shard 1/3" in text and "initial" in text
    streamed = pa.Table.from_batches(list(batch.iter_batches()), batch.schema)
    assert streamed.sort_by("id").equals(batch.to_arrow().sort_by("id"))
    assert_shard_exact(
        table, 3, {k: b.to_arrow() for k, b in batches.items()}, [(i, 3) for i in range(100)]
    )


# -- streaming reads --------------------------------------------------------------------------


def test_iter_batches_cuts_merged_buckets_into_bounded_batches(warehouse: str) -> None:
    # Three overlapping commits: every bucket's full scan is a primary-key
    # merge, which pypaimon's batch reader returns as one batch per bucket.
    make_pk_table(warehouse, "db.t", buckets=2)
    write_rows(warehouse, "db.t", range(300), v=1)
    write_rows(warehouse, "db.t", range(300), v=2)
    last = write_rows(warehouse, "db.t", range(100, 400), v=3)
    table = ShardedTable.open(warehouse, "db.t")
    planner = ShardPlanner(table, 2, batch_rows=16)
    step = planner.plan_full(range(2), last)

    per_shard = {}
    for shard, splits in step.splits.items():
        batches = list(planner.iter_batches(splits))
        assert len(batches) > 1
        assert all(0 < b.num_rows <= 16 for b in batches)
        streamed = pa.Table.from_batches(batches, planner.schema)
        assert streamed.sort_by("id").equals(planner.read_arrow(splits).sort_by("id"))
        per_shard[shard] = streamed
    expected = [(i, 2) for i in range(100)] + [(i, 3) for i in range(100, 400)]
    assert_shard_exact(table, 2, per_shard, expected)


def test_iter_batches_of_follow_ups_keep_row_kinds_and_commit_order(warehouse: str) -> None:
    make_pk_table(warehouse, "db.c", buckets=2, changelog_producer="input", row_kind_field=True)
    write_rows(warehouse, "db.c", range(50), v=1)
    write_rows(warehouse, "db.c", range(25, 75), v=2)
    delete_rows(warehouse, "db.c", range(10), v=3)
    table = ShardedTable.open(warehouse, "db.c")
    planner = ShardPlanner(
        table, 1, include_row_kind=True, catch_up_threshold=1, batch_rows=7
    )
    # One catch-up step over the three snapshots: streaming splits, in order.
    step = planner.plan_next([0], 1)
    assert step is not None and step.first_snapshot == 1

    batches = list(planner.iter_batches(step.splits[0]))
    assert all(0 < b.num_rows <= 7 for b in batches)
    streamed = pa.Table.from_batches(batches, planner.schema)
    assert streamed.equals(planner.read_arrow(step.splits[0]))
    assert streamed.schema.names[0] == "_row_kind"
    assert streamed.column("_row_kind").to_pylist().count("-D") == 10


def test_batch_rows_defaults_to_the_read_batch_size_option(warehouse: str) -> None:
    make_pk_table(warehouse, "db.t", buckets=2, options={"read.batch-size": "5"})
    last = write_rows(warehouse, "db.t", range(40), v=1)
    write_rows(warehouse, "db.t", range(40), v=2)
    table = ShardedTable.open(warehouse, "db.t")
    planner = table.planner(1)
    assert planner.batch_rows == 5
    assert ShardPlanner(table, 1).batch_rows == 5
    with pytest.raises(PaimonGroupError, match="batch_rows"):
        ShardPlanner(table, 1, batch_rows=0)
    step = planner.plan_full([0], last + 1)
    assert all(b.num_rows <= 5 for b in planner.iter_batches(step.splits[0]))


def test_shard_batch_counts_the_rows_it_produced(warehouse: str) -> None:
    make_pk_table(warehouse, "db.t", buckets=4)
    write_rows(warehouse, "db.t", range(100), v=1)
    last = write_rows(warehouse, "db.t", range(50), v=2)
    table = ShardedTable.open(warehouse, "db.t")
    planner = ShardPlanner(table, 2, batch_rows=8)
    step = planner.plan_full(range(2), last)
    batch = ShardBatch(group="g", member_id="m", shard=1, num_shards=2, epoch=1,
                       plan=step, planner=planner)

    assert batch.rows_read == 0
    rows = batch.to_arrow().num_rows
    assert 0 < rows < batch.estimated_rows  # merged: fewer rows than in the files
    assert batch.rows_read == rows
    streamed = batch.iter_batches()
    assert batch.rows_read == rows  # nothing read until iterated
    first = next(streamed)
    assert batch.rows_read == rows + first.num_rows
    for _ in streamed:
        pass
    assert batch.rows_read == 2 * rows


# -- why we plan ourselves ------------------------------------------------------------------------


def test_pypaimon_bucket_filtered_stream_reads_other_buckets_on_its_initial_plan(
    warehouse: str,
) -> None:
    """pypaimon 2.1.0: ``with_buckets([b])`` does not filter the initial full scan.

    Measured: a 4-bucket table; the stream of bucket 0 returns rows of all 4
    buckets on its first plan. Follow-up plans do honour the filter.
    """
    make_pk_table(warehouse, "db.t", buckets=4)
    write_rows(warehouse, "db.t", range(100))
    pt = open_table(warehouse, "db.t")
    builder = pt.new_stream_read_builder().with_buckets([0])
    scan = builder.new_streaming_scan()
    stream = scan.stream_sync()
    try:
        plan = next(stream)
        rows = builder.new_read().to_arrow(plan.splits())
    finally:
        stream.close()
        executor: Any = getattr(scan, "_prefetch_executor", None)
        if executor is not None:
            executor.shutdown(wait=False)
    buckets = {bucket_of(pt, i) for i in rows.column("id").to_pylist()}
    assert buckets == {0, 1, 2, 3}
    assert rows.num_rows == 100


@pytest.mark.slow
def test_writer_cli_commits_one_snapshot_per_chunk(warehouse: str) -> None:
    import json
    import subprocess
    import sys

    repo = Path(__file__).resolve().parent.parent
    base = [sys.executable, "-m", "tests.support.tables"]
    subprocess.run(
        [*base, "create", "--warehouse", warehouse, "--table", "db.w", "--buckets", "4"],
        cwd=repo,
        check=True,
        timeout=120,
    )
    where = ["--warehouse", warehouse, "--table", "db.w"]
    chunks = ["--start", "5", "--count", "25", "--per-snapshot", "10", "--interval-ms", "10"]
    done = subprocess.run(
        [*base, "write", *where, *chunks],
        cwd=repo,
        check=True,
        timeout=120,
        capture_output=True,
        text=True,
    )
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(x["snapshot"], x["first_id"], x["count"]) for x in lines] == [
        (1, 5, 10),
        (2, 15, 10),
        (3, 25, 5),
    ]
    table = ShardedTable.open(warehouse, "db.w")
    planner = table.planner(4)
    step = planner.plan_full(range(4), 3)
    assert_shard_exact(table, 4, read_step(planner, step), [(i, 0) for i in range(5, 30)])
    assert bucket_of(table, 7) == bucket_of(table.table, 7)
