"""The source's Paimon sink (issue 56, S4): a micro-batch's shards judged against
the target's marks and committed once.

The pure part: a shard's range of a micro-batch as the batches the marks judge
(:func:`shard_batches`), and their verdicts in order (:func:`judge_batches`).
Then :meth:`PaimonBatchSink.write` on real pypaimon targets, with the offsets
a query's offset log holds (no Spark here; the queries are in
tests/test_spark_source_to_paimon_e2e.py): a re-run micro-batch writes nothing
twice, a former owner nothing at all, a key's later snapshot wins, and each
micro-batch is one target commit.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from tests.support.requirements import require

require("pyspark", "pip install '.[spark]' (tests/run.sh does)")

from paimon_group.errors import ConfigError  # noqa: E402
from paimon_group.reading.planner import BatchKind  # noqa: E402
from paimon_group.sink.marks import GroupMarks, ShardMark, Source  # noqa: E402
from paimon_group.spark.source.offsets import ShardRange  # noqa: E402
from paimon_group.spark.source.to_paimon import (  # noqa: E402
    BatchWritten,
    PaimonBatchSink,
    batch_offset,
    judge_batches,
    shard_batches,
)
from tests.support.tables import _create, open_table  # noqa: E402

BUCKET = Source("schema-0@1", 4, "bucket")
FILE = Source("schema-0@1", 4, "file")


def _kinds(marks: GroupMarks, r: ShardRange, snapshots: list[int], *,
           incarnation: str = "a", source: Source = BUCKET) -> list[tuple[int, str]]:
    batches = shard_batches("g", r, snapshots, incarnation=incarnation, source=source)
    verdicts, _ = judge_batches(marks, batches)
    return [(b.snapshot_id, v.kind) for b, v in zip(batches, verdicts, strict=True)]


def _marks(shard: int, mark: ShardMark, source: Source = BUCKET) -> GroupMarks:
    return GroupMarks(source, {shard: mark})


def test_a_range_is_its_full_scan_then_a_batch_from_each_snapshot_with_rows() -> None:
    r = ShardRange(shard=1, epoch=3, next=5, full=4, to=10, moves=0)
    batches = shard_batches("g", r, [4, 6, 8], incarnation="a", source=BUCKET)
    assert [(b.kind, b.first_snapshot, b.next_snapshot) for b in batches] == [
        (BatchKind.INITIAL, 4, 5), (BatchKind.DELTA, 5, 6), (BatchKind.DELTA, 6, 8),
        (BatchKind.DELTA, 8, 10)]
    # No rows at all: one batch over the range, which moves the mark to its end.
    empty = shard_batches("g", ShardRange(1, 3, 5, None, 9), [], source=BUCKET)
    assert [(b.first_snapshot, b.next_snapshot) for b in empty] == [(5, 9)]
    _, marks = judge_batches(GroupMarks(), batches)
    assert marks.shards[1] == ShardMark(3, 10, "a", 0, 4)


def test_a_replayed_range_is_all_in_the_target() -> None:
    r = ShardRange(shard=1, epoch=3, next=5, full=4, to=10)
    _, marks = judge_batches(GroupMarks(), shard_batches("g", r, [4, 6], incarnation="a",
                                                         source=BUCKET))
    assert _kinds(marks, r, [4, 6]) == [(4, "already"), (5, "already"), (6, "already")]
    # ... by another owner of a later epoch too (it started from a position behind).
    later = ShardRange(shard=1, epoch=4, next=5, full=None, to=12)
    assert _kinds(marks, later, [6, 11]) == [(5, "already"), (6, "already"), (11, "write")]


def test_a_mark_inside_the_range_writes_the_snapshots_after_it() -> None:
    marks = _marks(0, ShardMark(2, 7, "a"))
    r = ShardRange(shard=0, epoch=2, next=4, full=None, to=10)
    assert _kinds(marks, r, [4, 6, 7, 9]) == [(4, "already"), (6, "already"), (7, "write"),
                                              (9, "write")]


def test_a_former_owner_writes_nothing_of_the_shard() -> None:
    marks = _marks(0, ShardMark(5, 7, "a"))
    r = ShardRange(shard=0, epoch=4, next=7, full=None, to=10)
    assert _kinds(marks, r, [8]) == [(7, "stale"), (8, "stale")]
    # Epochs of another incarnation (a re-created group) are not compared.
    assert _kinds(marks, r, [8], incarnation="b") == [(7, "write"), (8, "write")]


def test_a_full_scan_follows_the_marks_rules() -> None:
    # Bucket rules: a scan behind the mark is in; the deltas after the mark are not.
    marks = _marks(0, ShardMark(2, 8, "a", 0, 3))
    r = ShardRange(shard=0, epoch=3, next=7, full=6, to=10)
    assert _kinds(marks, r, [6, 7, 9], incarnation="b") == [
        (6, "already"), (7, "already"), (9, "write")]
    # The file rule: a scan the mark does not name is written whole (a
    # compaction may have moved rows into the shard), the deltas the mark
    # holds are not; the scan the mark names is a replay.
    file_marks = _marks(0, ShardMark(2, 8, "a", 0, 3), FILE)
    assert _kinds(file_marks, r, [6, 7, 9], incarnation="b", source=FILE) == [
        (6, "write"), (7, "already"), (9, "write")]
    named = _marks(0, ShardMark(2, 8, "a", 0, 6), FILE)
    assert _kinds(named, r, [6, 7, 9], incarnation="b", source=FILE) == [
        (6, "already"), (7, "already"), (9, "write")]
    # A moved start's scan: written; the deltas the mark holds are not (a
    # delta never moves between shards, whatever start it was read from).
    moved = ShardRange(shard=0, epoch=3, next=7, full=6, to=10, moves=1)
    assert _kinds(marks, moved, [6, 7, 9]) == [(6, "write"), (7, "already"), (9, "write")]


# -- real targets ------------------------------------------------------------

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("v", pa.int64())])


def _targets(wh: Path) -> None:
    _create(wh, "db.pk", pa.schema([*SCHEMA, pa.field("seq", pa.int64()),
                                    pa.field("pg_row_kind", pa.string())]),
            primary_keys=["id"], options={"bucket": "2", "sequence.field": "seq",
                                          "rowkind.field": "pg_row_kind"})
    _create(wh, "db.log", pa.schema([*SCHEMA, pa.field("_row_kind", pa.string())]),
            primary_keys=[], options={"bucket": "-1"})


def _offset(*ranges: ShardRange, group: str = "g", incarnation: str = "a") -> dict[str, Any]:
    return {"v": 1, "group": incarnation,
            "shards": {str(r.shard): r.to_json() for r in ranges},
            "source": {"group": group, **BUCKET.__dict__}}


def _rows(rows: list[tuple[int, int, int, int, int]], kinds: list[str] | None = None
          ) -> pa.Table:
    """(id, v, shard, snapshot, epoch) rows."""
    columns = list(zip(*rows, strict=True)) if rows else [[]] * 5
    table = pa.table({"id": pa.array(columns[0], pa.int64()), "v": pa.array(columns[1], pa.int64()),
                      "_pg_shard": pa.array(columns[2], pa.int32()),
                      "_pg_snapshot": pa.array(columns[3], pa.int64()),
                      "_pg_epoch": pa.array(columns[4], pa.int64())})
    if kinds is not None:
        table = table.append_column("_row_kind", pa.array(kinds, pa.string()))
    return table


def _read(wh: Path, name: str, *columns: str) -> list[tuple[Any, ...]]:
    table = open_table(wh, name)
    builder = table.new_read_builder()
    rows = builder.new_read().to_arrow(builder.new_scan().plan().splits())
    return sorted(zip(*(rows.column(c).to_pylist() for c in columns), strict=True))


def _snapshots(wh: Path, name: str) -> int:
    latest = open_table(wh, name).snapshot_manager().get_latest_snapshot()
    return 0 if latest is None else int(latest.id)


def test_a_re_run_micro_batch_writes_nothing_twice(tmp_path: Path) -> None:
    _targets(tmp_path)
    sink = PaimonBatchSink(str(tmp_path), "db.log", str(tmp_path / "ckpt"))
    offset = _offset(ShardRange(0, 1, 3, 2, 6), ShardRange(1, 1, 4, None, 6))
    rows = _rows([(1, 2, 0, 2, 1), (2, 2, 0, 2, 1), (3, 4, 0, 4, 1), (4, 5, 1, 5, 1),
                  (5, 4, 1, 4, 1)])
    first = sink.write(rows, offset, 0)
    assert sorted(first.written) == [(0, 2), (0, 4), (1, 4), (1, 5)]
    assert _snapshots(tmp_path, "db.log") == 1  # one commit for every shard
    again = sink.write(rows, offset, 0)  # Spark re-runs the batch after a restart
    assert again.written == () and sorted(again.already) == sorted(first.written)
    assert _snapshots(tmp_path, "db.log") == 1
    assert _read(tmp_path, "db.log", "id") == [(i,) for i in range(1, 6)]
    # The next micro-batch goes on from the ranges' ends.
    sink.write(_rows([(6, 6, 1, 6, 1)]), _offset(ShardRange(1, 1, 6, None, 7)), 1)
    assert _read(tmp_path, "db.log", "id") == [(i,) for i in range(1, 7)]


def test_a_former_owner_s_micro_batch_is_refused_with_a_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    _targets(tmp_path)
    sink = PaimonBatchSink(str(tmp_path), "db.log", str(tmp_path / "ckpt"))
    sink.write(_rows([(1, 3, 0, 3, 2), (9, 3, 1, 3, 2)]),
               _offset(ShardRange(0, 2, 3, None, 4), ShardRange(1, 2, 3, None, 4)), 5)
    # The former owner of shard 0 (epoch 1) writes its later micro-batch;
    # shard 1 is still its own (no newer owner wrote it).
    with caplog.at_level(logging.WARNING, "paimon_group.spark_source"):
        done = sink.write(_rows([(2, 4, 0, 4, 1), (10, 4, 1, 4, 2)]),
                          _offset(ShardRange(0, 1, 4, None, 5), ShardRange(1, 2, 4, None, 5)), 3)
    assert done.refused == ((0, 4),) and done.written == ((1, 4),)
    assert "shard 0: a newer owner than epoch 1" in caplog.text
    assert _read(tmp_path, "db.log", "id") == [(1,), (9,), (10,)]


def test_a_key_s_later_snapshot_wins_and_deletes_apply_on_a_primary_key_target(
        tmp_path: Path) -> None:
    _targets(tmp_path)
    sink = PaimonBatchSink(str(tmp_path), "db.pk", str(tmp_path / "ckpt"))
    # Key 1 at snapshots 2 (full scan), 3 and 4, given out of order; key 2 deleted at 4.
    rows = _rows([(1, 40, 0, 4, 1), (2, 0, 0, 4, 1), (1, 30, 0, 3, 1), (1, 20, 0, 2, 1),
                  (2, 20, 0, 2, 1)], ["+U", "-D", "+U", "+I", "+I"])
    sink.write(rows, _offset(ShardRange(0, 1, 3, 2, 5)), 0)
    assert _live(_read(tmp_path, "db.pk", "id", "v", "seq", "pg_row_kind")) == [(1, 40, 4)]
    # A later micro-batch deletes key 1 (in the target since the earlier one).
    sink.write(_rows([(1, 40, 0, 6, 1)], ["-D"]), _offset(ShardRange(0, 1, 5, None, 7)), 1)
    assert _live(_read(tmp_path, "db.pk", "id", "v", "seq", "pg_row_kind")) == []


def _live(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """The rows of a primary-key target, its kind column dropped: none is a
    retraction. A key inserted and deleted within one micro-batch ends in a
    file as its delete alone; the sink records the file's deletes, so Paimon
    (and pypaimon) merges it away instead of reading it raw as a row
    (paimon_group/sink/deletes.py)."""
    assert not [r for r in rows if r[-1] in ("-D", "-U")], rows
    return [r[:-1] for r in rows]


def test_a_micro_batch_of_no_shard_writes_nothing(tmp_path: Path) -> None:
    """A query's first micro-batch may hold no shard (its member owns none
    yet: the offset is ``{"v": 1, "shards": {}}``, naming no group): nothing
    to judge or commit, and no group asked for (the fault test's first run
    stopped on it)."""
    _targets(tmp_path)
    sink = PaimonBatchSink(str(tmp_path), "db.log", str(tmp_path / "ckpt"))
    assert sink.write(_rows([]), {"v": 1, "shards": {}}, 0) == BatchWritten()
    assert sink.sink.commits == 0


def test_bad_input_is_one_line(tmp_path: Path) -> None:
    _targets(tmp_path)
    with pytest.raises(Exception, match="check the sink's warehouse and table"):
        PaimonBatchSink(str(tmp_path), "db.missing", str(tmp_path / "ckpt"))
    _create(tmp_path, "db.dyn", pa.schema([*SCHEMA, pa.field("seq", pa.int64())]),
            primary_keys=["id"], options={"bucket": "-1", "sequence.field": "seq"})
    with pytest.raises(ConfigError, match="dynamic buckets"):
        PaimonBatchSink(str(tmp_path), "db.dyn", str(tmp_path / "ckpt"))
    with pytest.raises(ConfigError, match="no offsets of micro-batch 7"):
        batch_offset(str(tmp_path / "ckpt"), 7)
    sink = PaimonBatchSink(str(tmp_path), "db.log", str(tmp_path / "ckpt"))
    with pytest.raises(Exception, match=r"that its offset .* does not hold"):
        sink.write(_rows([(1, 1, 2, 3, 1)]), _offset(ShardRange(0, 1, 3, None, 4)), 0)


def test_the_offset_is_read_from_the_query_s_offset_log(tmp_path: Path) -> None:
    offsets = tmp_path / "ckpt" / "offsets"
    offsets.mkdir(parents=True)
    ours = _offset(ShardRange(0, 1, 3, None, 4))
    import json

    (offsets / "4").write_text(f'v1\n{{"batchWatermarkMs":0}}\n{json.dumps(ours)}')
    assert batch_offset(str(tmp_path / "ckpt"), 4) == ours
    assert batch_offset(f"file://{tmp_path}/ckpt", 4) == ours
