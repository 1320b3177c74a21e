"""The Paimon sink on real pypaimon tables: a batch's output committed once,
its replays found in the target's marks, a former owner refused, writers
racing for the target's next snapshot, a key's later source version winning,
and few snapshots. Batches are stand-ins carrying what the sink reads of a
:class:`~paimon_group.reading.batch.ShardBatch`; the member's side is in
tests/test_paimon_sink_member.py."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from paimon_group.errors import (
    AlreadyWritten,
    ConfigError,
    CorruptValue,
    IncompatibleVersion,
    PaimonGroupError,
)
from paimon_group.reading.planner import BatchKind
from paimon_group.sink import PaimonSink, ShardMark
from paimon_group.spark.fence import StaleSinkWrite
from tests.support.tables import _create, expire_snapshots, open_table

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("v", pa.int64()),
                    pa.field("seq", pa.int64())])


@dataclass
class Batch:
    shard: int
    epoch: int
    first_snapshot: int
    snapshot_id: int
    group: str = "g"
    kind: BatchKind = BatchKind.DELTA
    incarnation: str = ""
    start_moves: int = 0
    retractions: int = 0
    table_id: str = ""
    num_shards: int = 0
    sharding: str = ""

    @property
    def next_snapshot(self) -> int:
        return self.snapshot_id + 1


def _targets(wh: Path) -> tuple[str, str]:
    _create(wh, "db.pk", SCHEMA, primary_keys=["id"],
            options={"bucket": "2", "sequence.field": "seq"})
    _create(wh, "db.log", SCHEMA, primary_keys=[], options={"bucket": "-1"})
    return "db.pk", "db.log"


def _rows(ids: range, v: int) -> pa.Table:
    return pa.table({"id": pa.array(list(ids), pa.int64()),
                     "v": pa.array([v] * len(ids), pa.int64())})


def _read(wh: Path, name: str) -> list[tuple[int, int]]:
    table = open_table(wh, name)
    builder = table.new_read_builder()
    splits = builder.new_scan().plan().splits()
    rows = builder.new_read().to_arrow(splits)
    return sorted(zip(rows.column("id").to_pylist(), rows.column("v").to_pylist(), strict=True))


def _read_columns(wh: Path, name: str, *columns: str) -> list[tuple[Any, ...]]:
    table = open_table(wh, name)
    builder = table.new_read_builder()
    rows = builder.new_read().to_arrow(builder.new_scan().plan().splits())
    return sorted(zip(*(rows.column(c).to_pylist() for c in columns), strict=True))


@pytest.mark.parametrize("target", ["db.pk", "db.log"])
def test_a_replay_is_found_in_the_target_and_not_written_again(
        tmp_path: Path, target: str) -> None:
    _targets(tmp_path)
    with PaimonSink(str(tmp_path), target, commit_interval_s=0) as sink:
        sink.write(_rows(range(10), 1), Batch(0, 1, 1, 1))
        with pytest.raises(AlreadyWritten) as found:
            sink.write(_rows(range(10), 1), Batch(0, 1, 1, 1))  # a replay
        assert (found.value.shard, found.value.next_snapshot) == (0, 2)
        with pytest.raises(AlreadyWritten) as longer:
            sink.write(_rows(range(30), 1), Batch(0, 1, 1, 3))  # a longer catch-up
        assert longer.value.next_snapshot == 2
        sink.write(_rows(range(10, 20), 2), Batch(0, 1, 2, 3))  # reads on from 2
        assert sink.marks("g") == {0: ShardMark(epoch=1, next_snapshot=4)}
    assert _read(tmp_path, target) == [(i, 1) for i in range(10)] + [(i, 2) for i in range(10, 20)]


def test_a_former_owner_is_refused_after_a_newer_one_wrote(tmp_path: Path) -> None:
    _targets(tmp_path)
    with PaimonSink(str(tmp_path), "db.log", commit_interval_s=0) as sink:
        sink.write(_rows(range(5), 1), Batch(0, 2, 1, 1))
        with pytest.raises(StaleSinkWrite):
            sink.write(_rows(range(5, 9), 1), Batch(0, 1, 2, 2))  # epoch 1 < 2
    assert _read(tmp_path, "db.log") == [(i, 1) for i in range(5)]


def test_an_initial_scan_replayed_is_already_written(tmp_path: Path) -> None:
    """A crash after the initial scan's target commit: the new owner scans the
    pinned snapshot again (a pending full scan is replayed on the same
    snapshot); the target holds it, and a later one of the same shard."""
    _targets(tmp_path)
    with PaimonSink(str(tmp_path), "db.log", commit_interval_s=0) as sink:
        sink.write(_rows(range(5), 1), Batch(0, 1, 3, 3, kind=BatchKind.INITIAL))
        with pytest.raises(AlreadyWritten) as found:
            sink.write(_rows(range(5), 1), Batch(0, 2, 3, 3, kind=BatchKind.INITIAL))
        assert found.value.next_snapshot == 4
        sink.write(_rows(range(5, 7), 2), Batch(0, 2, 4, 5))
        with pytest.raises(AlreadyWritten) as later:
            sink.write(_rows(range(7), 1), Batch(0, 3, 3, 3, kind=BatchKind.INITIAL))
        assert later.value.next_snapshot == 6


def test_a_full_scan_past_the_mark_is_written(tmp_path: Path) -> None:
    """A full scan of a snapshot the shard's mark has not reached (a group
    re-created with no position left, a start re-pinned past an expired
    snapshot) holds rows the target lacks: it is written, never taken for
    written (which moved the shard's position back to the mark, before the
    scan's snapshot: simulation seed 2 of the sink's seeds)."""
    _targets(tmp_path)
    with PaimonSink(str(tmp_path), "db.pk", commit_interval_s=0) as sink:
        sink.write(_rows(range(5), 1), Batch(0, 1, 2, 2, incarnation="a"))
        sink.write(_rows(range(8), 2), Batch(0, 1, 9, 9, kind=BatchKind.INITIAL,
                                             incarnation="b"))
        assert sink.marks("g") == {0: ShardMark(1, 10, "b", scan=9)}
    assert _read(tmp_path, "db.pk") == [(i, 2) for i in range(8)]


def test_a_new_life_s_full_scan_behind_the_mark_is_written_under_the_file_rule(
        tmp_path: Path) -> None:
    """Under the file rule a compaction moves rows between shards: a full
    scan of a group's new life is written though the shard's mark is past
    it (its rows may be another shard's that the former life never wrote:
    simulation seed 502414), unless the target holds that very scan (a
    replay after a coordinator wipe: seed 305872). Under the bucket rule
    the mark alone says the scan is in."""
    _, log_table = _targets(tmp_path)

    def batch(epoch: int, first: int, snapshot: int, life: str, sharding: str, *,
              initial: bool = False) -> Batch:
        return Batch(0, epoch, first, snapshot, incarnation=life, sharding=sharding,
                     kind=BatchKind.INITIAL if initial else BatchKind.DELTA)

    with PaimonSink(str(tmp_path), log_table, commit_interval_s=0) as sink:
        sink.write(_rows(range(3), 1), batch(1, 2, 2, "a", "file", initial=True))
        sink.write(_rows(range(3, 6), 1), batch(1, 3, 10, "a", "file"))
        assert sink.marks("g") == {0: ShardMark(1, 11, "a", scan=2)}
        sink.write(_rows(range(10), 2), batch(1, 6, 6, "b", "file", initial=True))
        # The shard's deltas up to 10 stay in: the mark keeps its position.
        assert sink.marks("g") == {0: ShardMark(1, 11, "b", scan=6)}
        with pytest.raises(AlreadyWritten):  # the same scan, replayed in a third life
            sink.write(_rows(range(10), 2), batch(1, 6, 6, "c", "file", initial=True))
        # Under the bucket rule the position alone says the scan is in.
        sink.write(_rows(range(3), 1), Batch(1, 1, 2, 2, group="h", incarnation="a",
                                             sharding="bucket", kind=BatchKind.INITIAL))
        sink.write(_rows(range(3, 6), 1), Batch(1, 1, 3, 10, group="h", incarnation="a",
                                                sharding="bucket"))
        with pytest.raises(AlreadyWritten):
            sink.write(_rows(range(10), 3), Batch(1, 1, 6, 6, group="h", incarnation="b",
                                                  sharding="bucket", kind=BatchKind.INITIAL))
    assert sorted(_read(tmp_path, log_table)) == sorted(
        [(i, 1) for i in range(6)] * 2 + [(i, 2) for i in range(10)])


def test_the_full_scan_of_a_moved_start_is_written_though_the_mark_is_past_it(
        tmp_path: Path) -> None:
    """A shard re-pinned at the group's moved start (``--on-data-loss
    skip``) scans a snapshot its mark may be past: the scan is of a later
    start (more moves), so it is written whole; judged by position alone it
    was taken for written, and the rows a compaction had moved into the
    shard's files under the file rule were lost (simulation seed 305872). A
    replay of it is found; a batch of the earlier start is not taken for one
    of the moved start. The deltas the shard read from the earlier start
    past the scan, read again after it, are found: the mark keeps its
    position (seed 522610: they were written twice)."""
    _targets(tmp_path)
    with PaimonSink(str(tmp_path), "db.log", commit_interval_s=0) as sink:
        sink.write(_rows(range(5), 1), Batch(0, 3, 5, 10))  # read to 11 from the first start
        sink.write(_rows(range(20, 22), 1), Batch(0, 3, 11, 12))  # and to 13
        scan = Batch(0, 3, 10, 10, kind=BatchKind.INITIAL, start_moves=1)
        sink.write(_rows(range(5, 9), 1), scan)
        assert sink.marks("g") == {0: ShardMark(3, 13, "", 1, scan=10)}
        with pytest.raises(AlreadyWritten):
            sink.write(_rows(range(5, 9), 1), scan)  # its replay
        with pytest.raises(AlreadyWritten):  # of the start before, behind the mark
            sink.write(_rows(range(5), 1), Batch(0, 3, 5, 10))
        with pytest.raises(AlreadyWritten) as again:  # read again after the scan
            sink.write(_rows(range(20, 22), 1), Batch(0, 3, 11, 12, start_moves=1))
        assert again.value.next_snapshot == 13
    assert _read(tmp_path, "db.log") == [(i, 1) for i in [*range(9), 20, 21]]


def test_a_group_re_created_on_another_coordinator_writes_on(tmp_path: Path) -> None:
    """After a coordinator switch or wipe the group is re-created (another
    incarnation) and its epochs start anew: its owners, at epochs below the
    former life's, are not refused as stale; a replay of what the former
    life wrote is still found (simulation seed 2 of the sink's seeds)."""
    _targets(tmp_path)
    with PaimonSink(str(tmp_path), "db.log", commit_interval_s=0) as sink:
        sink.write(_rows(range(5), 1), Batch(0, 9, 1, 3, incarnation="a"))
        with pytest.raises(AlreadyWritten) as found:   # resumed from its consumer file
            sink.write(_rows(range(5), 1), Batch(0, 2, 2, 3, incarnation="b"))
        assert found.value.next_snapshot == 4
        sink.write(_rows(range(5, 9), 4), Batch(0, 2, 4, 4, incarnation="b"))
        with pytest.raises(StaleSinkWrite):  # within one incarnation, epochs are compared
            sink.write(_rows(range(9, 11), 5), Batch(0, 1, 5, 5, incarnation="b"))
        assert sink.marks("g") == {0: ShardMark(2, 5, "b")}
    assert _read(tmp_path, "db.log") == [(i, 1) for i in range(5)] + [(i, 4) for i in range(5, 9)]


def test_writers_racing_for_the_next_snapshot_keep_every_mark(tmp_path: Path) -> None:
    """Two sinks (two members) commit at once, shard by shard: each commit is
    judged on the snapshot it is made on, so no commit drops the other's
    marks and every batch is in once."""
    _targets(tmp_path)
    sinks = [PaimonSink(str(tmp_path), "db.log", commit_interval_s=0) for _ in range(2)]
    errors: list[BaseException] = []

    def member(k: int) -> None:
        try:
            for step in range(1, 9):
                ids = range(k * 1000 + step * 10, k * 1000 + step * 10 + 10)
                sinks[k].write(_rows(ids, step), Batch(k, 1, step, step))
        except BaseException as err:  # pragma: no cover - reported below
            errors.append(err)

    threads = [threading.Thread(target=member, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for sink in sinks:
        sink.close()
    assert errors == []
    assert sinks[0].marks("g") == {0: ShardMark(1, 9), 1: ShardMark(1, 9)}
    rows = _read(tmp_path, "db.log")
    assert len(rows) == len(set(rows)) == 2 * 8 * 10


def test_a_key_s_later_source_version_wins_whoever_wrote_it(tmp_path: Path) -> None:
    """A new owner that restored earlier writes a key's version of snapshot 7
    after the old owner wrote that of snapshot 5 (and the other way round):
    the target keeps the version of the later source snapshot."""
    _targets(tmp_path)
    with PaimonSink(str(tmp_path), "db.pk", commit_interval_s=0) as old, \
            PaimonSink(str(tmp_path), "db.pk", commit_interval_s=0) as new:
        new.write(_rows(range(3), 7), Batch(0, 2, 7, 7))
        old.write(_rows(range(3), 5), Batch(1, 1, 5, 5))  # another shard, same keys
    assert _read(tmp_path, "db.pk") == [(i, 7) for i in range(3)]


def test_batches_of_one_interval_share_one_snapshot(tmp_path: Path) -> None:
    _targets(tmp_path)
    with PaimonSink(str(tmp_path), "db.log", commit_interval_s=2.0) as sink:
        sink.write(_rows(range(1), 0), Batch(9, 1, 1, 1))  # the first commit, at once
        before = sink.commits
        threads = [threading.Thread(target=sink.write, args=(
            _rows(range(s * 10, s * 10 + 10), 1), Batch(s, 1, 1, 1))) for s in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert sink.commits - before == 1
    assert len(_read(tmp_path, "db.log")) == 61


def test_a_primary_key_target_without_a_sequence_field_is_refused_in_one_line(
        tmp_path: Path) -> None:
    _create(tmp_path, "db.bare", SCHEMA, primary_keys=["id"], options={"bucket": "2"})
    with pytest.raises(ConfigError, match=r"sequence\.field"):
        PaimonSink(str(tmp_path), "db.bare")


def test_output_without_rows_still_moves_the_mark(tmp_path: Path) -> None:
    _targets(tmp_path)
    with PaimonSink(str(tmp_path), "db.log", commit_interval_s=0) as sink:
        sink.write(_rows(range(0), 1), Batch(0, 1, 1, 4))
        assert sink.marks("g") == {0: ShardMark(1, 5)}




def test_a_commit_that_loses_the_race_is_judged_again_on_the_winner_s_snapshot(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Sink A judges its batch on snapshot N; sink B commits N+1 before A
    commits. A's commit must not land on N+1 with marks judged on N (B's mark
    would be dropped, and B's replay written again): it loses the race for
    N+1, reads B's marks and commits N+2 with both."""
    _targets(tmp_path)
    a = PaimonSink(str(tmp_path), "db.log", commit_interval_s=0)
    b = PaimonSink(str(tmp_path), "db.log", commit_interval_s=0)
    b.write(_rows(range(1), 0), Batch(7, 1, 1, 1))  # the table has a snapshot
    real = type(a.target).commit_once
    raced: list[bool] = []

    def commit_once(self: Any, *args: Any, **kwargs: Any) -> bool:
        if self is a.target and not raced:
            raced.append(True)
            b.write(_rows(range(100, 110), 1), Batch(1, 1, 1, 1))  # B wins N+1
        won: bool = real(self, *args, **kwargs)
        if self is a.target and len(raced) == 1:
            raced.append(won)
        return won

    monkeypatch.setattr(type(a.target), "commit_once", commit_once)
    a.write(_rows(range(10), 1), Batch(0, 1, 1, 1))
    assert raced[:2] == [True, False]  # A's first try lost
    assert a.marks("g") == {0: ShardMark(1, 2), 1: ShardMark(1, 2), 7: ShardMark(1, 2)}
    with pytest.raises(AlreadyWritten):
        b.write(_rows(range(100, 110), 1), Batch(1, 1, 1, 1))
    a.close()
    b.close()


def test_a_commit_that_keeps_losing_races_waits_at_random_then_fails_its_batches(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every try loses the snapshot id to another writer: the sink judges and
    tries again after a short random wait (two writers committing back to
    back otherwise took turns badly), 50 tries in all, then the batch fails
    in one line and nothing of it is in the target."""
    _targets(tmp_path)
    waits: list[float] = []
    with PaimonSink(str(tmp_path), "db.log", commit_interval_s=0) as sink:
        sink._sleep = waits.append
        monkeypatch.setattr(type(sink.target), "commit_once", lambda *a, **k: False)
        with pytest.raises(PaimonGroupError,
                           match=r"^the sink's commit lost 50 races in a row to other writers "
                                 r"of the target; the batches are retried$"):
            sink.write(_rows(range(10), 1), Batch(0, 1, 1, 1))
    assert len(waits) == 49 and all(0 <= w <= 0.2 for w in waits), waits
    assert len(set(waits)) > 40  # random, not a fixed step
    assert _read(tmp_path, "db.log") == []


def test_a_step_s_batches_share_one_commit_when_their_files_take_longer_to_write(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A member's parallel handlers start a step's batches at once, but their
    files are ready one after the other (larger batches, a loaded machine):
    the committer waits for the writes under way (up to one interval) rather
    than committing the first batch alone and making the others wait a whole
    interval for the next commit."""
    _targets(tmp_path)
    with PaimonSink(str(tmp_path), "db.log") as sink:   # the default interval
        write_files = sink.target.write_files

        def slow(rows: pa.Table, user: str) -> list[Any]:
            time.sleep(0.15 * (int(rows.column("id")[0].as_py()) // 10))  # shard k: 0.15 k s
            return write_files(rows, user)

        monkeypatch.setattr(sink.target, "write_files", slow)
        threads = [threading.Thread(target=sink.write, args=(
            _rows(range(s * 10, s * 10 + 10), 1), Batch(s, 1, 1, 1))) for s in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert sink.commits == 1
    assert len(_read(tmp_path, "db.log")) == 40


def test_a_closed_sink_leaves_its_member_s_registry(tmp_path: Path) -> None:
    """A sink registers with the member whose batch it writes (the batch
    carries the member's registry), and is published by that member while
    it writes; closed, it leaves the registry with its last holder (an open
    one kept publishing every closed sink's target at each full control
    round). A batch without a registry registers nowhere."""
    from paimon_group.protocol.sinks import SinkRegistry

    _targets(tmp_path)
    member, other = SinkRegistry(), SinkRegistry()
    first = PaimonSink(str(tmp_path), "db.log", commit_interval_s=0)
    second = PaimonSink(str(tmp_path), "db.log", commit_interval_s=0)
    first.write(_rows(range(3), 1), _carrying(Batch(0, 1, 1, 1, group="reg"), member))
    second.write(_rows(range(3, 6), 1), _carrying(Batch(1, 1, 1, 1, group="reg"), member))
    second.write(_rows(range(6, 9), 1), Batch(2, 1, 1, 1, group="reg"))
    assert [r.table for r in member.records()] == ["db.log"]
    assert other.records() == []
    first.close()
    assert [r.table for r in member.records()] == ["db.log"]  # the second still writes
    second.close()
    assert member.records() == []


def _carrying(batch: Batch, registry: Any) -> Any:
    """``batch`` as a member delivers it: with the member's sink registry."""
    @dataclass
    class MemberBatch(Batch):
        sinks: Any = None

    return MemberBatch(**{**vars(batch), "sinks": registry})


def test_a_missing_target_is_one_line_naming_the_sink_s_arguments(tmp_path: Path) -> None:
    """A target table that does not exist: one line naming the sink's own
    arguments (not the command line's flags), and nothing created."""
    from paimon_group.errors import TableNotFound

    with pytest.raises(TableNotFound) as err:
        PaimonSink(str(tmp_path / "wh"), "db.nope")
    line = str(err.value)
    assert "\n" not in line and "db.nope" in line, line
    assert "the sink's warehouse and table" in line and "--" not in line, line
    assert not (tmp_path / "wh").exists()


@pytest.mark.parametrize("bucket", ["-1", "-2"])
def test_a_dynamic_or_postponed_bucket_primary_key_target_is_refused_in_one_line(
        tmp_path: Path, bucket: str) -> None:
    """Paimon lets one writer job write a dynamic-bucket primary-key table
    (each writer keeps the keys' hash index and replaces the other's: keys
    with two rows) and a postponed-bucket one; the sink's writers are many.
    The sink refuses such a target when it opens, in one line saying to give
    it a fixed bucket count; an append target with bucket -1 is written."""
    _create(tmp_path, "db.dyn", SCHEMA, primary_keys=["id"],
            options={"bucket": bucket, "sequence.field": "seq"})
    with pytest.raises(ConfigError) as err:
        PaimonSink(str(tmp_path), "db.dyn")
    line = str(err.value)
    assert "\n" not in line and f"'bucket' = '{bucket}'" in line, line
    assert "fixed number of buckets" in line, line
    _targets(tmp_path)
    with PaimonSink(str(tmp_path), "db.log", commit_interval_s=0) as sink:
        sink.write(_rows(range(3), 1), Batch(0, 1, 1, 1))
    assert _read(tmp_path, "db.log") == [(i, 1) for i in range(3)]


@pytest.mark.parametrize("kind", [pa.string(), pa.int32(), pa.float64()])
def test_a_sequence_field_that_is_not_bigint_is_refused_in_one_line(
        tmp_path: Path, kind: pa.DataType) -> None:
    """A STRING sequence field orders "9" after "10" (an INT one cannot hold
    every snapshot id): the sink fills it with the source snapshot, so it
    must be a BIGINT, said in one line when the sink opens."""
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("v", pa.int64()),
                        pa.field("seq", kind)])
    _create(tmp_path, "db.pk", schema, primary_keys=["id"],
            options={"bucket": "2", "sequence.field": "seq"})
    with pytest.raises(ConfigError) as err:
        PaimonSink(str(tmp_path), "db.pk")
    line = str(err.value)
    assert "\n" not in line and "'seq'" in line and "BIGINT" in line, line


def test_rows_carrying_the_sequence_column_as_null_are_ordered_by_source_snapshot(
        tmp_path: Path) -> None:
    """Output rows that carry the sequence column with nulls get the batch's
    source snapshot there (a null orders before every value, so the newer
    version lost to whichever was written later); values they carry stay."""
    _targets(tmp_path)

    def nulls(rows: pa.Table) -> pa.Table:
        return rows.append_column("seq", pa.nulls(rows.num_rows, pa.int64()))

    with PaimonSink(str(tmp_path), "db.pk", commit_interval_s=0) as old, \
            PaimonSink(str(tmp_path), "db.pk", commit_interval_s=0) as new:
        new.write(nulls(_rows(range(3), 7)), Batch(0, 2, 7, 7))
        old.write(nulls(_rows(range(3), 5)), Batch(1, 1, 5, 5))  # committed last, older
        carried = _rows(range(3, 5), 9).append_column("seq", pa.array([100, None], pa.int64()))
        new.write(carried, Batch(0, 2, 8, 8))
    assert _read(tmp_path, "db.pk") == [(i, 7) for i in range(3)] + [(3, 9), (4, 9)]
    table = open_table(tmp_path, "db.pk")
    builder = table.new_read_builder()
    rows = builder.new_read().to_arrow(builder.new_scan().plan().splits())
    assert sorted(zip(rows.column("id").to_pylist(), rows.column("seq").to_pylist(),
                      strict=True)) == [(0, 7), (1, 7), (2, 7), (3, 100), (4, 8)]


def test_the_sink_follows_the_target_s_schema_while_it_runs(tmp_path: Path) -> None:
    """``ALTER TABLE ... RENAME v TO amount, ADD region`` while the sink runs:
    its next write takes the new columns (they were dropped as columns the
    target lacks, and the commit carried the old schema id, until a
    restart). A column the target lacks after all is one line, and nothing
    of that batch is written."""
    from pypaimon.schema.data_types import AtomicType
    from pypaimon.schema.schema_change import SchemaChange

    from tests.support.tables import catalog

    _targets(tmp_path)
    with PaimonSink(str(tmp_path), "db.log", commit_interval_s=0) as sink:
        sink.write(_rows(range(3), 1), Batch(0, 1, 1, 1))
        catalog(tmp_path).alter_table("db.log", [
            SchemaChange.rename_column("v", "amount"),
            SchemaChange.add_column("region", AtomicType("STRING"))])
        sink.write(pa.table({"id": pa.array([3, 4], pa.int64()),
                             "amount": pa.array([2, 2], pa.int64()),
                             "region": ["eu", "us"]}), Batch(0, 1, 2, 2))
        assert _read_columns(tmp_path, "db.log", "id", "amount", "region")[3:] == [
            (3, 2, "eu"), (4, 2, "us")]
        with pytest.raises(ConfigError) as err:
            sink.write(pa.table({"id": pa.array([5], pa.int64()), "amount": [3],
                                 "colour": ["red"]}), Batch(0, 1, 3, 3))
        line = str(err.value)
        assert "\n" not in line and "colour" in line and "db.log" in line, line
        assert sink.marks("g") == {0: ShardMark(1, 3)}
    table = open_table(tmp_path, "db.log")
    assert table.snapshot_manager().get_latest_snapshot().schema_id == table.table_schema.id
    assert _read_columns(tmp_path, "db.log", "id", "amount", "region") == [
        (0, 1, None), (1, 1, None), (2, 1, None), (3, 2, "eu"), (4, 2, "us")]


KINDS = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("v", pa.int64()),
                   pa.field("seq", pa.int64()), pa.field("kind", pa.string())])


def _changes(changes: list[tuple[str, int, int]]) -> pa.Table:
    kinds, ids, vs = zip(*changes, strict=True)
    return pa.table({"_row_kind": list(kinds), "id": pa.array(ids, pa.int64()),
                     "v": pa.array(vs, pa.int64())})


def test_row_kinds_are_applied_on_a_primary_key_target_and_recorded_on_an_append_one(
        tmp_path: Path) -> None:
    """Output rows carrying ``_row_kind``: a primary-key target declaring
    ``'rowkind.field'`` gets them with their kinds (the sink fills that
    column), so Paimon applies them: a ``-D`` removes its key, a ``-U``
    followed by its ``+U`` leaves the ``+U``, a ``-U`` alone retracts its key
    as Paimon's merge does; an append target records each change with its
    kind in its ``_row_kind`` column."""
    _create(tmp_path, "db.pk", KINDS, primary_keys=["id"],
            options={"bucket": "2", "sequence.field": "seq", "rowkind.field": "kind"})
    _create(tmp_path, "db.log", pa.schema([*SCHEMA, pa.field("_row_kind", pa.string())]),
            primary_keys=[], options={"bucket": "-1"})
    first = _changes([("+I", i, 1) for i in range(6)])
    later = _changes([("-D", 0, 1), ("-U", 1, 1), ("+U", 1, 2), ("-U", 2, 1), ("+U", 3, 2)])
    for name in ("db.pk", "db.log"):
        with PaimonSink(str(tmp_path), name, commit_interval_s=0) as sink:
            sink.write(first, Batch(0, 1, 1, 1))
            sink.write(later, Batch(0, 1, 2, 2, retractions=3))
    assert _read(tmp_path, "db.pk") == [(1, 2), (3, 2), (4, 1), (5, 1)]
    assert _read_columns(tmp_path, "db.pk", "id", "kind", "seq") == [
        (1, "+U", 2), (3, "+U", 2), (4, "+I", 1), (5, "+I", 1)]
    assert _read_columns(tmp_path, "db.log", "id", "v", "_row_kind", "seq") == sorted(
        [(i, 1, "+I", None) for i in range(6)] + [
            (0, 1, "-D", None), (1, 1, "-U", None), (1, 2, "+U", None), (2, 1, "-U", None),
            (3, 2, "+U", None)])


def test_a_delete_alone_in_its_bucket_s_only_file_is_read_as_a_delete(tmp_path: Path) -> None:
    """A key inserted and deleted in one batch (or deleted where its bucket
    has no other file) ends in a data file that is its bucket's only one.
    Paimon reads such a file raw, unmerged, unless its metadata counts a
    delete; pypaimon's writer counts none, so the deleted key read as present
    in any engine (simulation seed 520586). The sink records the file's
    deletes (for parts too, :class:`PartsWriter`): the key is gone."""
    from tests.support.tables import open_table

    _create(tmp_path, "db.pk", KINDS, primary_keys=["id"],
            options={"bucket": "1", "sequence.field": "seq", "rowkind.field": "kind"})
    rows = _changes([("+I", 0, 1), ("+I", 1, 1), ("-D", 0, 1), ("-U", 2, 1)])
    with PaimonSink(str(tmp_path), "db.pk", commit_interval_s=0) as sink:
        sink.write(rows, Batch(0, 1, 1, 1, retractions=2))
    assert _read(tmp_path, "db.pk") == [(1, 1)]
    table = open_table(tmp_path, "db.pk")
    files = [f for split in table.new_read_builder().new_scan().plan().splits()
             for f in split.files]
    assert [(f.row_count, f.delete_row_count) for f in files] == [(3, 2)]


def test_row_kinds_a_target_cannot_hold_or_the_output_dropped_are_refused_in_one_line(
        tmp_path: Path) -> None:
    """Deletes or update-befores the target cannot represent (a primary-key
    target without ``'rowkind.field'``, an append target without a
    ``_row_kind`` column), kinds that are not Paimon's, and output without
    ``_row_kind`` from a batch that read retractions: one line each, and
    nothing of the batch written. Inserts and update-afters need neither."""
    _targets(tmp_path)
    for name in ("db.pk", "db.log"):
        with PaimonSink(str(tmp_path), name, commit_interval_s=0) as sink:
            sink.write(_changes([("+I", 0, 1), ("+U", 1, 1)]), Batch(0, 1, 1, 1))
            with pytest.raises(ConfigError) as held:
                sink.write(_changes([("+I", 2, 2), ("-D", 0, 1)]), Batch(0, 1, 2, 2))
            line = str(held.value)
            assert "\n" not in line and "cannot represent" in line, line
            assert ("rowkind.field" if name == "db.pk" else "ADD _row_kind STRING") in line
            with pytest.raises(ConfigError) as dropped:
                sink.write(_rows(range(2, 4), 2), Batch(0, 1, 2, 2, retractions=1))
            line = str(dropped.value)
            assert "\n" not in line and "--include-row-kind" in line, line
            assert "keep the _row_kind column" in line, line
            with pytest.raises(ConfigError, match=r"carry _row_kind '\+X'"):
                sink.write(_changes([("+X", 2, 2)]), Batch(0, 1, 2, 2))
            assert sink.marks("g") == {0: ShardMark(1, 2)}
        assert _read(tmp_path, name) == [(0, 1), (1, 1)]


def _properties(wh: Path, name: str) -> dict[str, str]:
    """The newest snapshot's properties."""
    latest = open_table(wh, name).snapshot_manager().get_latest_snapshot()
    return dict(latest.properties or {})


def _commit_properties(wh: Path, name: str, properties: dict[str, str]) -> None:
    """A commit without rows carrying ``properties`` (as another writer's)."""
    table = open_table(wh, name).copy({"snapshot.ignore-empty-commit": "false"})
    commit = table.new_batch_write_builder().new_commit()
    commit.commit([], snapshot_properties=properties)
    commit.close()


def _queued_in_order(sink: PaimonSink, writes: list[tuple[pa.Table, Batch]]
                     ) -> list[BaseException | None]:
    """``writes`` queued one after the other within one commit interval; what
    each write raised."""
    outcomes: list[BaseException | None] = [None] * len(writes)

    def write(k: int) -> None:
        try:
            sink.write(*writes[k])
        except BaseException as err:
            outcomes[k] = err

    threads = [threading.Thread(target=write, args=(k,)) for k in range(len(writes))]
    for t in threads:
        t.start()
        time.sleep(0.3)  # queued after the one before
    for t in threads:
        t.join(60)
    return outcomes


@pytest.mark.parametrize("new_first", [False, True])
def test_two_owners_of_one_shard_in_one_commit_are_judged_in_order(
        tmp_path: Path, new_first: bool) -> None:
    """A former owner (epoch 6) and the new owner (epoch 18) of one shard
    both queue the same batch before the sink's next commit: the later in the
    queue is judged against the mark the earlier leaves, so the batch is in
    the target once (the former owner first: the new owner's is found
    written; the new owner first: the former owner's is refused)."""
    _targets(tmp_path)
    with PaimonSink(str(tmp_path), "db.log", commit_interval_s=2.0) as sink:
        sink.write(_rows(range(5), 1), Batch(0, 6, 1, 4))  # the first commit, at once
        before = sink.commits
        old, new = (_rows(range(5, 9), 2), Batch(0, 6, 5, 5)), (_rows(range(5, 9), 2),
                                                             Batch(0, 18, 5, 5))
        outcomes = _queued_in_order(sink, [new, old] if new_first else [old, new])
        assert sink.commits - before == 1
        if new_first:
            assert outcomes[0] is None and isinstance(outcomes[1], StaleSinkWrite), outcomes
            assert sink.marks("g") == {0: ShardMark(18, 6)}
        else:
            assert outcomes[0] is None and isinstance(outcomes[1], AlreadyWritten), outcomes
            assert sink.marks("g") == {0: ShardMark(6, 6)}
    assert _read(tmp_path, "db.log") == [(i, 1) for i in range(5)] + [(i, 2) for i in range(5, 9)]


def test_every_commit_carries_the_marks_of_every_group_on_the_target(tmp_path: Path) -> None:
    """Two groups write one target; one goes idle while the other commits on
    and the target's older snapshots expire: the idle group's marks are in
    every later commit, so its replay is still found."""
    _targets(tmp_path)
    with PaimonSink(str(tmp_path), "db.log", commit_interval_s=0) as sink:
        sink.write(_rows(range(5), 1), Batch(0, 1, 1, 1, group="idle"))
        for step in range(1, 4):
            sink.write(_rows(range(100 * step, 100 * step + 3), 2),
                       Batch(0, 1, step, step, group="busy"))
        assert set(_properties(tmp_path, "db.log")) >= {
            "paimon-group.sink.idle", "paimon-group.sink.busy"}
    expire_snapshots(tmp_path, "db.log", keep_from=4)  # only the busy group's commits left
    with PaimonSink(str(tmp_path), "db.log", commit_interval_s=0) as sink:
        with pytest.raises(AlreadyWritten):
            sink.write(_rows(range(5), 1), Batch(0, 2, 1, 1, group="idle"))
        assert sink.marks("idle") == {0: ShardMark(1, 2)}
    assert sorted(i for i, _ in _read(tmp_path, "db.log")) == [
        *range(5), *range(100, 103), *range(200, 203), *range(300, 303)]


def test_a_group_named_commit_finds_its_replays(tmp_path: Path) -> None:
    """``commit`` is a valid group name: its marks are not confused with the
    property naming a sink commit, and its replay is found."""
    _targets(tmp_path)
    with PaimonSink(str(tmp_path), "db.log", commit_interval_s=0) as sink:
        sink.write(_rows(range(5), 1), Batch(0, 1, 1, 1, group="commit"))
        with pytest.raises(AlreadyWritten):
            sink.write(_rows(range(5), 1), Batch(0, 1, 1, 1, group="commit"))
        assert sink.marks("commit") == {0: ShardMark(1, 2)}
    assert _read(tmp_path, "db.log") == [(i, 1) for i in range(5)]


def test_a_former_commit_s_nonce_is_not_a_group_s_marks(tmp_path: Path) -> None:
    """Snapshots committed before the nonce had a property of its own hold it
    under ``paimon-group.sink.commit``: a hex nonce there is no group's
    marks, and the other groups' marks of that snapshot are read."""
    _targets(tmp_path)
    _commit_properties(tmp_path, "db.log", {
        "paimon-group.sink.commit": "0123456789abcdef0123456789abcdef",
        "paimon-group.sink.g": '{"v":1,"shards":{"0":[3,9,"a",0]}}'})
    with PaimonSink(str(tmp_path), "db.log", commit_interval_s=0) as sink:
        assert sink.marks("commit") == {}
        assert sink.marks("g") == {0: ShardMark(3, 9, "a")}
        sink.write(_rows(range(3), 1), Batch(0, 1, 1, 1, group="commit"))
        assert sink.marks("commit") == {0: ShardMark(1, 2)}
        assert sink.marks("g") == {0: ShardMark(3, 9, "a")}


@pytest.mark.parametrize("unreadable", ["{not json", '{"v": 99, "shards": {}}'])
def test_marks_the_sink_cannot_read_fail_their_own_group_only(
        tmp_path: Path, unreadable: str) -> None:
    """A group's marks property that is corrupt, or of a newer format: that
    group's batches fail in one line; the other groups on the target write
    on, and their commits carry the property as it was."""
    _targets(tmp_path)
    _commit_properties(tmp_path, "db.log", {"paimon-group.sink.other": unreadable})
    with PaimonSink(str(tmp_path), "db.log", commit_interval_s=0) as sink:
        sink.write(_rows(range(3), 1), Batch(0, 1, 1, 1))
        with pytest.raises(AlreadyWritten):
            sink.write(_rows(range(3), 1), Batch(0, 1, 1, 1))
        with pytest.raises(CorruptValue if unreadable.startswith("{not") else IncompatibleVersion):
            sink.write(_rows(range(3, 5), 1), Batch(0, 1, 1, 1, group="other"))
    assert _properties(tmp_path, "db.log")["paimon-group.sink.other"] == unreadable
    assert _read(tmp_path, "db.log") == [(i, 1) for i in range(3)]


def test_a_batch_of_another_source_is_written_and_replaces_the_group_s_marks(
        tmp_path: Path) -> None:
    """The group's marks belong to a source (the table's identity, the shard
    count, the sharding rule): a batch of another one (a table dropped and
    re-created, a group started again with another shard count) is written
    whatever the marks say, and the marks become the new source's alone."""
    from paimon_group.sink.marks import Source

    _targets(tmp_path)
    old = {"table_id": "schema-0@1", "num_shards": 2, "sharding": "bucket"}
    with PaimonSink(str(tmp_path), "db.pk", commit_interval_s=0) as sink:
        sink.write(_rows(range(4), 1), Batch(0, 1, 1, 9, **old))
        sink.write(_rows(range(4, 8), 1), Batch(1, 1, 1, 9, **old))
        assert sink.target.group_marks("g").source == Source("schema-0@1", 2, "bucket")
        recreated = Batch(0, 1, 1, 1, kind=BatchKind.INITIAL, table_id="schema-0@2",
                          num_shards=2, sharding="bucket")
        sink.write(_rows(range(100, 103), 2), recreated)
        assert sink.marks("g") == {0: ShardMark(1, 2, scan=1)}
        assert sink.target.group_marks("g").source == Source("schema-0@2", 2, "bucket")
        fewer = Batch(0, 1, 1, 1, kind=BatchKind.INITIAL, table_id="schema-0@2",
                      num_shards=1, sharding="bucket")
        sink.write(_rows(range(100, 103), 3), fewer)
        other_rule = Batch(0, 1, 1, 1, kind=BatchKind.INITIAL, table_id="schema-0@2",
                           num_shards=1, sharding="file")
        sink.write(_rows(range(100, 103), 4), other_rule)
        with pytest.raises(AlreadyWritten):  # a batch that does not say its source
            sink.write(_rows(range(100, 103), 5), Batch(0, 1, 1, 1, kind=BatchKind.INITIAL))
    assert _read(tmp_path, "db.pk") == [(i, 1) for i in range(8)] + [
        (i, 4) for i in range(100, 103)]


def test_marks_of_format_1_are_judged_whatever_the_batch_s_source(tmp_path: Path) -> None:
    """Marks written before they recorded their source (format 1) hold for
    any batch of their group, as they did; the next commit records the
    source."""
    from paimon_group.sink.marks import Source, encode

    _targets(tmp_path)
    _commit_properties(tmp_path, "db.log", {
        "paimon-group.sink.g": '{"v":1,"shards":{"0":[3,9,"",0]}}'})
    source = {"table_id": "schema-0@1", "num_shards": 2, "sharding": "bucket"}
    with PaimonSink(str(tmp_path), "db.log", commit_interval_s=0) as sink:
        with pytest.raises(AlreadyWritten):
            sink.write(_rows(range(3), 1), Batch(0, 3, 5, 8, **source))
        sink.write(_rows(range(3), 1), Batch(1, 3, 5, 8, **source))
        assert sink.target.group_marks("g").source == Source("schema-0@1", 2, "bucket")
        assert sink.marks("g") == {0: ShardMark(3, 9), 1: ShardMark(3, 9)}
    assert encode({}, Source("t", 1, "bucket")).startswith('{"v":2,')
