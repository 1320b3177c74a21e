"""Offsets of the Spark source without Spark: ranges, restart cursor, caps, re-planning."""

from __future__ import annotations

import logging
import pickle
from pathlib import Path

import pytest

from coordinators.errors import ConfigError, PaimonGroupError
from paimon_group.errors import SnapshotExpired
from paimon_group.reading.table import ShardedTable
from paimon_group.spark.source.offsets import (
    NO_CATCH_UP,
    Caps,
    Cursor,
    ShardRange,
    at_moved_start,
    decode_end_moves,
    decode_ends,
    decode_offset,
    encode_offset,
    moved_past_gap,
    plan_batch,
    plan_ranges,
    start_cursor,
)
from paimon_group.spark.source.options import SourceOptions
from tests.support.tables import expire_snapshots, make_pk_table, write_rows


def test_offset_round_trip_and_foreign_offsets_are_refused() -> None:
    ranges = {0: ShardRange(0, 7, 5, None, 9), 3: ShardRange(3, 8, 2, 1, 2)}
    assert decode_offset(encode_offset(ranges)) == ranges
    assert decode_offset({}) == {}
    with pytest.raises(PaimonGroupError, match="new checkpoint location"):
        decode_offset({"partition": 3})


def test_start_cursor_coordinator_wins_unless_the_checkpoint_got_further() -> None:
    coordinator = Cursor(next=5)
    # The previous batch (completed by Spark) ended beyond the coordinator's
    # position: its commit did not reach the coordinator before a crash.
    assert start_cursor(coordinator, ShardRange(0, 1, 3, None, 8)) == Cursor(next=8)
    # Another member moved the shard on meanwhile: its position wins.
    assert start_cursor(Cursor(next=12), ShardRange(0, 1, 3, None, 8)) == Cursor(next=12)
    # A pending full scan (pinned start) stays pending unless a batch got past it.
    assert start_cursor(Cursor(next=4, full=3), None) == Cursor(next=4, full=3)
    assert start_cursor(Cursor(next=4, full=3), ShardRange(0, 1, 4, 3, 3)) == Cursor(4, 3)
    assert start_cursor(Cursor(next=4, full=3), ShardRange(0, 1, 4, 3, 6)) == Cursor(next=6)


def test_offsets_carry_the_moves_of_the_group_start_and_order_by_them_first() -> None:
    """Issue 43: a bucket-unaware table's expired start moves for every shard;
    a range, and an end, record the moves of the start they derive from, and
    a re-pin at a moved start is past every end of the earlier one."""
    ranges = {0: ShardRange(0, 7, 8, 7, 9, moves=1), 1: ShardRange(1, 7, 5, None, 9)}
    offset = encode_offset(ranges, "inc", {0: 12, 1: 4, 2: 6}, {2: 1})
    assert decode_offset(offset) == ranges
    # Shard 0's end of the earlier start (12) gives way to the moved one's (9).
    assert decode_ends(offset) == {0: 9, 1: 9, 2: 6}
    assert decode_end_moves(offset) == {0: 1, 1: 0, 2: 1}
    assert "moves" not in offset["shards"]["1"]  # offsets without moves read as before
    repin = Cursor(next=8, full=7, moves=1)
    assert start_cursor(repin, ShardRange(0, 1, 5, None, 12)) == repin
    assert start_cursor(repin, None, 12, 0) == repin
    assert start_cursor(repin, None, 10, 1) == Cursor(next=10, moves=1)
    assert at_moved_start({0: Cursor(12), 1: Cursor(9, moves=1), 2: Cursor(3, 2)}, repin) == {
        0: repin, 1: Cursor(9, moves=1), 2: repin}


def test_a_shard_that_comes_back_starts_after_the_querys_own_furthest_end() -> None:
    """Issue 43, 2: offsets keep, per shard, the furthest end the query
    planned, also while it does not hold the shard."""
    first = encode_offset({0: ShardRange(0, 1, 2, None, 3), 1: ShardRange(1, 1, 2, None, 3)},
                          "inc")
    assert decode_ends(first) == {0: 3, 1: 3}
    # The next batch holds shard 0 only: shard 1's end is kept.
    second = encode_offset({0: ShardRange(0, 2, 3, None, 4)}, "inc", decode_ends(first))
    assert decode_ends(second) == {0: 4, 1: 3}
    assert sorted(decode_offset(second)) == [0]
    # Shard 1 comes back at the coordinator's older position: it starts after
    # what the query delivered, not at snapshot 2 again.
    assert start_cursor(Cursor(next=2), decode_offset(second).get(1), 3) == Cursor(next=3)
    # Another member moved it further: its position wins.
    assert start_cursor(Cursor(next=7), None, 3) == Cursor(next=7)
    # An offset written before ends existed: its ranges' ends.
    assert decode_ends({"v": 1, "shards": first["shards"]}) == {0: 3, 1: 3}


def test_plan_ranges_caps_and_deterministic_replay(tmp_path: Path) -> None:
    make_pk_table(tmp_path, "db.t", buckets=4)
    for k in range(6):
        write_rows(tmp_path, "db.t", range(10 * k, 10 * k + 10))
    table = ShardedTable.open(str(tmp_path), "db.t")
    planner = table.planner(2, catch_up_threshold=NO_CATCH_UP)
    cursors = {0: Cursor(next=3, full=2), 1: Cursor(next=5)}
    reached, pieces = plan_ranges(planner, cursors, latest=6, caps=Caps(max_snapshots=3))
    # The full scan of 2 is one step; then 3 and 4 for shard 0 (shard 1 starts at 5).
    assert reached == {0: 5, 1: 5}
    assert [p.snapshot for p in pieces[0]] == [2, 3, 4]
    assert 1 not in pieces
    everything, all_pieces = plan_ranges(planner, cursors, latest=6)
    assert everything == {0: 7, 1: 7}
    replayed_to, replayed = plan_ranges(planner, cursors, until=everything)
    assert replayed_to == everything
    assert pickle.dumps(replayed) == pickle.dumps(all_pieces)
    rows_capped, _ = plan_ranges(planner, {0: Cursor(next=1), 1: Cursor(next=1)}, latest=6,
                                 caps=Caps(max_rows=25))
    assert rows_capped == {0: 3, 1: 3}  # 10 rows per snapshot; a step is never cut


def test_options_are_checked_before_anything_runs(tmp_path: Path) -> None:
    opts = SourceOptions.parse({"group": "g", "warehouse": str(tmp_path), "table": "db.t",
                                "catalog.fs.key": "v", "coordinator_password": "s3cret"})
    assert opts.catalog_options == {"fs.key": "v"}
    assert "s3cret" not in repr(opts)
    assert opts.coordinator.startswith("sqlite://")
    with pytest.raises(ConfigError, match="unknown option"):
        SourceOptions.parse({"group": "g", "warehouse": "w", "table": "db.t", "grup": "x"})
    with pytest.raises(ConfigError, match="start"):
        SourceOptions.parse({"group": "g", "warehouse": "w", "table": "db.t", "start": "soon"})


def test_the_assignor_option_reaches_the_member_and_a_bad_one_is_one_line(
        tmp_path: Path) -> None:
    base = {"group": "g", "warehouse": str(tmp_path), "table": "db.t"}
    assert SourceOptions.parse({**base, "assignor": "load"}).member_config().assignor == "load"
    assert SourceOptions.parse(base).member_config().assignor is None
    with pytest.raises(ConfigError, match="unknown assignor 'fair': use one of count, load"):
        SourceOptions.parse({**base, "assignor": "fair"})


def test_an_expired_snapshot_fails_the_query_unless_fail_on_data_loss_is_false(
        tmp_path: Path) -> None:
    make_pk_table(tmp_path, "db.t", buckets=4)
    for k in range(6):
        write_rows(tmp_path, "db.t", range(10 * k, 10 * k + 10))
    table = ShardedTable.open(str(tmp_path), "db.t")
    planner = table.planner(2, catch_up_threshold=NO_CATCH_UP)
    cursors = {0: Cursor(next=2), 1: Cursor(next=2)}
    expire_snapshots(tmp_path, "db.t", keep_from=5)
    with pytest.raises(SnapshotExpired, match=r"shards 0, 1: snapshots 2\.\.4 of table db\.t "
                       r"expired before they were read \(earliest retained: 5\).*"
                       r"failOnDataLoss=false"):
        plan_ranges(planner, cursors, latest=6)
    reached, pieces = plan_ranges(planner, cursors, latest=6, fail_on_data_loss=False)
    assert reached == {0: 7, 1: 7}
    assert {p.snapshot for shard in pieces.values() for p in shard} == {5, 6}
    # A replay of the batch skips the same way.
    _, replayed = plan_ranges(planner, cursors, until=reached,
                              fail_on_data_loss=False)
    assert pickle.dumps(replayed) == pickle.dumps(pieces)
    base = {"group": "g", "warehouse": str(tmp_path), "table": "db.t"}
    assert SourceOptions.parse(base).fail_on_data_loss
    assert not SourceOptions.parse({**base, "failondataloss": "false"}).fail_on_data_loss
    with pytest.raises(ConfigError, match="failondataloss"):
        SourceOptions.parse({**base, "failondataloss": "maybe"})


def test_every_shard_whose_next_snapshot_is_in_the_gap_is_named(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Shard 1 is at snapshot 4, inside the gap 2..4 that shard 0 finds first:
    it skips 4 too, and the WARNING (or the line) names it with its own range."""
    make_pk_table(tmp_path, "db.t", buckets=4)
    for k in range(6):
        write_rows(tmp_path, "db.t", range(10 * k, 10 * k + 10))
    table = ShardedTable.open(str(tmp_path), "db.t")
    planner = table.planner(2, catch_up_threshold=NO_CATCH_UP)
    cursors = {0: Cursor(next=2), 1: Cursor(next=4)}
    expire_snapshots(tmp_path, "db.t", keep_from=5)
    with caplog.at_level(logging.WARNING, logger="paimon_group.spark_source"):
        reached, _ = plan_ranges(planner, cursors, latest=6, fail_on_data_loss=False)
    assert reached == {0: 7, 1: 7}
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "shard 0: snapshots 2..4 of table db.t expired before they were read (earliest "
        "retained: 5): skipping to snapshot 5 (failOnDataLoss=false); the rows of 3 "
        "snapshots are lost to the query",
        "shard 1: snapshot 4 of table db.t expired before they were read (earliest "
        "retained: 5): skipping to snapshot 5 (failOnDataLoss=false); the rows of 1 "
        "snapshots are lost to the query"]
    config = SourceOptions.parse({"group": "g", "warehouse": str(tmp_path),
                                  "table": "db.t"}).member_config()
    with pytest.raises(SnapshotExpired) as caught:
        plan_ranges(planner, cursors, latest=6, config=config)
    line = str(caught.value)
    assert line.startswith("shard 0: snapshots 2..4 of table db.t expired before they were "
                           "read (earliest retained: 5); shard 1: snapshot 4 of table db.t ")
    assert "--to-earliest --shard 0 --shard 1 --execute; then restart the query" in line


def test_an_expired_pending_full_scan_is_planned_at_the_earliest_snapshot(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    make_pk_table(tmp_path, "db.t", buckets=4)
    for k in range(6):
        write_rows(tmp_path, "db.t", range(10 * k, 10 * k + 10))
    table = ShardedTable.open(str(tmp_path), "db.t")
    planner = table.planner(2, catch_up_threshold=NO_CATCH_UP)
    cursors = {0: Cursor(next=3, full=2), 1: Cursor(next=6)}
    expire_snapshots(tmp_path, "db.t", keep_from=5)
    with caplog.at_level(logging.WARNING, logger="paimon_group.spark_source"):
        moved, reached, pieces = plan_batch(planner, cursors, latest=6,
                                            fail_on_data_loss=False)
    assert moved == {0: Cursor(next=6, full=5), 1: Cursor(next=6)}
    assert reached == {0: 7, 1: 7}
    assert [(p.snapshot, p.kind) for p in pieces[0]] == [(5, "initial"), (6, "delta")]
    assert [r.getMessage() for r in caplog.records] == [
        "shard 0: snapshot 2 of table db.t, whose full scan was still to be delivered, "
        "expired (earliest retained: 5): scanning snapshot 5 in full instead "
        "(failOnDataLoss=false)"]
    with pytest.raises(SnapshotExpired, match=r"^shard 0: snapshot 2 of table db\.t, whose "
                       r"full scan was still to be delivered, expired \(earliest retained: "
                       r"5\): .*failOnDataLoss=false scans the earliest retained snapshot"):
        plan_batch(planner, cursors, latest=6)


def test_an_expired_pending_full_scan_of_a_bucket_unaware_table_moves_the_group_start(
        tmp_path: Path) -> None:
    """Issue 43, 5: the file rule. Without failOnDataLoss the host moves the
    group's start for every shard (``move_start``) and the batch plans from
    the cursors it returns; a host that cannot move it stops with the line."""
    from paimon_group.protocol.sharding import ShardRule
    from tests.support.tables import make_append_table

    make_append_table(tmp_path, "db.t", buckets=-1)
    for k in range(6):
        write_rows(tmp_path, "db.t", range(10 * k, 10 * k + 10))
    planner = ShardedTable.open(str(tmp_path), "db.t").planner(
        2, rule=ShardRule.FILE, catch_up_threshold=NO_CATCH_UP)
    cursors = {0: Cursor(next=3, full=2), 1: Cursor(next=5)}
    expire_snapshots(tmp_path, "db.t", keep_from=5)
    asked = []

    def move_start(losts: object, given: dict[int, Cursor]) -> dict[int, Cursor]:
        asked.append((losts, given))
        return at_moved_start(given, Cursor(next=7, full=6, moves=1))

    moved, reached, pieces = plan_batch(planner, cursors, latest=6, fail_on_data_loss=False,
                                        move_start=move_start)
    [(losts, given)] = asked
    assert [(lost.shards, lost.first, lost.earliest) for lost in losts] == [((0,), 2, 5)]
    assert given == cursors
    assert moved == {0: Cursor(next=7, full=6, moves=1), 1: Cursor(next=7, full=6, moves=1)}
    assert reached == {0: 7, 1: 7}
    scanned = sum(len(p.splits) for s in (0, 1) for p in pieces.get(s, ()))
    assert scanned >= 1 and {p.kind for s in pieces for p in pieces[s]} == {"initial"}
    with pytest.raises(SnapshotExpired, match="this reader cannot move the group's start"):
        plan_batch(planner, cursors, latest=6, fail_on_data_loss=False)


def test_a_rerun_batch_reads_from_the_group_position_moved_past_its_expired_range() -> None:
    cursors = {0: Cursor(next=2), 1: Cursor(next=2), 2: Cursor(next=3, full=2),
               3: Cursor(next=6)}
    until = {0: 7, 1: 4, 2: 7, 3: 7}
    stored = {0: Cursor(next=5), 1: Cursor(next=5), 2: Cursor(next=3, full=2),
              3: Cursor(next=6)}
    moved, limit, shards = moved_past_gap(cursors, until, stored, earliest=5)
    # 0: reset to 5, reads 5..6; 1: reset beyond its range, reads nothing;
    # 2: still in the gap (the data-loss line or the skip); 3: not in the gap.
    assert moved == {0: Cursor(next=5), 2: Cursor(next=3, full=2), 3: Cursor(next=6)}
    assert limit == {0: 7, 2: 7, 3: 7}
    assert shards == [0, 1]
    assert moved_past_gap(cursors, until, stored, None) == (cursors, until, [])
