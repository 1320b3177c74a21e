"""The streaming source's replacing sink under two writers (issue 43, item 4).

:func:`paimon_group.spark.source.sink.write_replacing` used Spark's dynamic
partition overwrite (delete each partition directory, then rename the new
one in) with no lock and no epoch: two queries writing the same (shard,
snapshot) at once could interleave A.delete, B.delete, A.rename, B.rename
(B's directory renamed *into* A's: ``_pg_snapshot=2/_pg_snapshot=2``, and
the sink no longer reads), and the former owner's write, landing last,
replaced the new owner's. Now each shard's partitions are published under
the shard's lock of an epoch fence, as ``ParquetBatchSink`` does: a writer
with a lower epoch than one that has published the shard is refused.

Real PySpark (local mode, one session), real Parquet directories.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.requirements import require

pytestmark = pytest.mark.spark

if not os.environ.get("CI"):
    require("pyspark", "pip install '.[spark]' (tests/run.sh does)")

from paimon_group.spark.source.sink import read_sink, write_replacing  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SHARDS, SNAPSHOTS = 4, 25
COLUMNS = ["id", "writer", "_pg_shard", "_pg_snapshot", "_pg_epoch"]


def _rows(writer: str, epoch: int, shards: range) -> list[tuple[Any, ...]]:
    """Two rows per (shard, snapshot), told apart by ``writer``."""
    return [(shard * 1000 + snapshot * 10 + i, writer, shard, snapshot, epoch)
            for shard in shards for snapshot in range(1, SNAPSHOTS + 1) for i in range(2)]


def _frame(spark: Any, rows: list[tuple[Any, ...]], barrier: Path | None = None) -> Any:
    schema = ("id bigint, writer string, _pg_shard int, _pg_snapshot bigint, "
              "_pg_epoch bigint")
    df = spark.createDataFrame(rows, schema).coalesce(1)
    if barrier is None:
        return df
    writer = rows[0][1]

    def wait_for_both(batches: Iterator[Any]) -> Iterator[Any]:
        # Both writers' tasks finish together: their commits then run at once.
        (barrier / writer).touch()
        deadline = time.monotonic() + 60
        while len(list(barrier.iterdir())) < 2 and time.monotonic() < deadline:
            time.sleep(0.005)
        yield from batches

    return df.mapInArrow(wait_for_both, df.schema)


def _by_partition(spark: Any, sink: Path) -> dict[tuple[int, int], list[tuple[int, str]]]:
    nested = [p for p in sink.glob("_pg_shard=*/_pg_snapshot=*/*") if p.is_dir()]
    assert not nested, f"a partition nested in another: {nested[:3]}"
    out: dict[tuple[int, int], list[tuple[int, str]]] = {}
    for row in read_sink(spark, str(sink), ["_pg_shard", "_pg_snapshot", "id", "writer"]):
        out.setdefault((int(row[0]), int(row[1])), []).append((int(row[2]), str(row[3])))
    return {key: sorted(values) for key, values in out.items()}


def _expected(rows: list[tuple[Any, ...]]) -> dict[tuple[int, int], list[tuple[int, str]]]:
    out: dict[tuple[int, int], list[tuple[int, str]]] = {}
    for row in rows:
        out.setdefault((row[2], row[3]), []).append((row[0], row[1]))
    return {key: sorted(values) for key, values in out.items()}


def test_a_former_owner_writing_after_the_new_one_replaces_nothing_of_its_shards(
    spark: Any, tmp_path: Path
) -> None:
    """B (epoch 2) took shard 0 over from A (epoch 1) and wrote the batch; A,
    still writing it, lands last: its shard 0 partitions are refused, its
    shard 1 (still its own) is published."""
    sink = tmp_path / "out"
    newer = _rows("B", 2, range(0, 1))
    write_replacing(_frame(spark, newer), str(sink))
    former = _rows("A", 1, range(0, 2))
    done = write_replacing(_frame(spark, former), str(sink))
    assert _by_partition(spark, sink) == {**_expected(former), **_expected(newer)}
    assert sorted(done.refused) == [(0, s) for s in range(1, SNAPSHOTS + 1)]
    assert sorted(done.published) == [(1, s) for s in range(1, SNAPSHOTS + 1)]


def test_two_writers_at_once_never_nest_nor_let_the_former_owner_win(
    spark: Any, tmp_path: Path
) -> None:
    """A (epoch 1) and B (epoch 2) write the same 100 (shard, snapshot)
    partitions at once, their commits started together, three rounds: the
    sink reads, and holds exactly B's rows."""
    newer = _rows("B", 2, range(SHARDS))
    for attempt in range(3):
        sink, barrier = tmp_path / f"out{attempt}", tmp_path / f"barrier{attempt}"
        barrier.mkdir()
        errors: list[BaseException] = []

        def write(rows: list[tuple[Any, ...]], sink: Path = sink, barrier: Path = barrier,
                  errors: list[BaseException] = errors) -> None:
            try:
                write_replacing(_frame(spark, rows, barrier), str(sink))
            except BaseException as error:  # reported below
                errors.append(error)

        writers = [threading.Thread(target=write, args=(rows,))
                   for rows in (_rows("A", 1, range(SHARDS)), newer)]
        for thread in writers:
            thread.start()
        for thread in writers:
            thread.join(timeout=300)
        assert not errors, f"round {attempt}: {errors[0]!r}"
        assert _by_partition(spark, sink) == _expected(newer), f"round {attempt}"
