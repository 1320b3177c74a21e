"""Batch-keyed sinks and the epoch fence, without Spark (Arrow writes), and the
optional-dependency behaviour of :mod:`paimon_group.spark.handler`.

The sink only reads a few attributes of a batch (:class:`BatchLike`), so
these unit tests use a plain record for it; ``tests/test_spark.py`` and
``tests/test_spark_e2e.py`` use real batches.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pytest

from coordinators.errors import ConfigError
from paimon_group.reading.planner import BatchKind
from paimon_group.spark.sinks import BatchKey, EpochFence, ParquetBatchSink, StaleSinkWrite
from tests.support.requirements import require


@dataclass(frozen=True)
class Batch:
    group: str = "g"
    shard: int = 0
    epoch: int = 1
    kind: BatchKind = BatchKind.DELTA
    first_snapshot: int = 5
    snapshot_id: int = 5


def rows(*ids: int) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64())})


def ids(sink: ParquetBatchSink) -> list[int]:
    return sorted(sink.read_arrow().column("id").to_pylist())


def test_replay_of_a_batch_replaces_the_earlier_attempt(tmp_path: Path) -> None:
    sink = ParquetBatchSink(tmp_path)
    first = sink.write_arrow(rows(1, 2, 3), Batch(epoch=1))
    assert not first.replaced
    assert ids(sink) == [1, 2, 3]
    replay = sink.write_arrow(rows(1, 2, 3), Batch(epoch=2))
    assert replay.replaced
    assert ids(sink) == [1, 2, 3]
    sink.write_arrow(rows(4), Batch(epoch=2, first_snapshot=6, snapshot_id=6))
    assert ids(sink) == [1, 2, 3, 4]
    assert sink.batch_keys() == [BatchKey("g", 0, 5), BatchKey("g", 0, 6)]
    table = sink.read_arrow()
    assert set(table.column_names) == {"id", "pg_group", "pg_shard", "pg_snapshot"}
    assert [p["replaced"] for p in sink.publications()] == [False, True, False]
    assert not list((sink.state_dir / "_staging").glob("*/*/*"))


def test_catch_up_replay_is_keyed_by_its_first_snapshot(tmp_path: Path) -> None:
    """A catch-up planned again later ends later and holds more; same first snapshot."""
    sink = ParquetBatchSink(tmp_path)
    sink.write_arrow(rows(1, 2), Batch(kind=BatchKind.DELTA, first_snapshot=5, snapshot_id=5))
    sink.write_arrow(rows(1, 2, 3, 4),
                     Batch(epoch=2, kind=BatchKind.CATCH_UP, first_snapshot=5, snapshot_id=19))
    assert ids(sink) == [1, 2, 3, 4]
    assert sink.batch_keys() == [BatchKey("g", 0, 5)]


def test_initial_batch_supersedes_the_shards_other_batches(tmp_path: Path) -> None:
    sink = ParquetBatchSink(tmp_path)
    sink.write_arrow(rows(1, 2), Batch(kind=BatchKind.INITIAL, first_snapshot=3, snapshot_id=3))
    sink.write_arrow(rows(9), Batch(shard=1, kind=BatchKind.INITIAL, first_snapshot=3,
                                    snapshot_id=3))
    again = sink.write_arrow(
        rows(1, 2, 3), Batch(epoch=2, kind=BatchKind.INITIAL, first_snapshot=7, snapshot_id=7))
    assert again.superseded == (3,)
    assert ids(sink) == [1, 2, 3, 9]  # shard 1 untouched
    assert sink.batch_keys() == [BatchKey("g", 0, 7), BatchKey("g", 1, 3)]


def test_stale_epoch_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    sink = ParquetBatchSink(tmp_path)
    sink.write_arrow(rows(1), Batch(epoch=7))
    with pytest.raises(StaleSinkWrite, match="refusing epoch 6"):
        sink.write_arrow(rows(666), Batch(epoch=6))
    with pytest.raises(StaleSinkWrite):  # any batch of that shard, not only the same key
        sink.write_arrow(rows(666), Batch(epoch=6, first_snapshot=6, snapshot_id=6))
    assert ids(sink) == [1]
    sink.write_arrow(rows(2), Batch(epoch=7, first_snapshot=6, snapshot_id=6))  # same owner
    sink.write_arrow(rows(3), Batch(shard=1, epoch=2))  # other shards have their own epochs
    assert sink.fence.highest("g", 0) == 7
    assert sink.fence.highest("g", 1) == 2
    assert sink.fence.highest("other", 0) is None
    assert ids(sink) == [1, 2, 3]
    # Without the fence a stale writer gets through (the sink is then at-least-once
    # against zombies: documented).
    unfenced = ParquetBatchSink(tmp_path, fence=False)
    unfenced.write_arrow(rows(4), Batch(epoch=1))
    assert ids(sink) == [2, 3, 4]


def test_the_fence_check_and_publish_are_atomic_against_concurrent_writers(
    tmp_path: Path,
) -> None:
    """Writers of one key with epochs 1..8 race: the highest epoch's rows win, always."""
    sink = ParquetBatchSink(tmp_path)
    barrier = threading.Barrier(8)
    outcomes: dict[int, str] = {}

    def writer(epoch: int) -> None:
        barrier.wait()
        try:
            sink.write_arrow(rows(epoch * 100, epoch * 100 + 1), Batch(epoch=epoch))
            outcomes[epoch] = "published"
        except StaleSinkWrite:
            outcomes[epoch] = "refused"

    threads = [threading.Thread(target=writer, args=(e,)) for e in range(1, 9)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert outcomes[8] == "published"
    assert ids(sink) == [800, 801]
    published = [p["epoch"] for p in sink.publications()]
    assert published == sorted(published)  # a lower epoch never published after a higher one
    assert sorted(published) == sorted(e for e, o in outcomes.items() if o == "published")


def test_a_publish_that_crashed_half_way_is_repaired_by_the_replay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sink = ParquetBatchSink(tmp_path)
    sink.write_arrow(rows(1), Batch(epoch=1))
    real_rename = os.rename
    calls: list[str] = []

    def crash_on_second_rename(src: str, dst: str) -> None:
        calls.append(str(dst))
        if len(calls) == 2:
            raise KeyboardInterrupt("process killed between the two renames")
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", crash_on_second_rename)
    with pytest.raises(KeyboardInterrupt):
        sink.write_arrow(rows(1), Batch(epoch=2))
    monkeypatch.setattr(os, "rename", real_rename)
    assert sink.batch_keys() == []  # missing for now, never doubled
    sink.write_arrow(rows(1), Batch(epoch=2))  # the replay the crash causes
    assert ids(sink) == [1]
    assert not list((sink.state_dir / "_staging").glob("*/*/*"))


def test_fence_hold_records_the_epoch(tmp_path: Path) -> None:
    fence = EpochFence(tmp_path)
    with fence.hold(Batch(epoch=4)):
        assert fence.highest("g", 0) == 4
    with pytest.raises(StaleSinkWrite), fence.hold(Batch(epoch=3)):
        pytest.fail("entered with a stale epoch")
    fence.check(Batch(epoch=4))
    with pytest.raises(StaleSinkWrite):
        fence.check(Batch(epoch=1))


# Every package but the streaming source (which needs PySpark >= 4.2 at import).
WITHOUT_PYSPARK = (
    "paimon_group", "paimon_group.cli", "paimon_group.process", "paimon_group.ops",
    "paimon_group.member", "paimon_group.reading", "paimon_group.arrowread",
    "paimon_group.config", "paimon_group.protocol", "paimon_group.store",
    "paimon_group.spark", "paimon_group.spark.handler", "paimon_group.spark.sinks",
)


def test_importing_the_package_does_not_import_pyspark() -> None:
    code = (
        "import importlib, sys\n"
        f"for name in {WITHOUT_PYSPARK!r}:\n"
        "    importlib.import_module(name)\n"
        "import paimon_group.spark as spark\n"
        "spark.SparkBatchHandler, spark.spark_handler_from_spec, spark.ARROW_CONF\n"
        "assert 'pyspark' not in sys.modules, 'pyspark imported eagerly'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_the_packages_import_where_pyspark_is_not_installed() -> None:
    code = (
        "import importlib, sys\n"
        "sys.modules['pyspark'] = None  # as if not installed: importing it raises\n"
        f"for name in {WITHOUT_PYSPARK!r}:\n"
        "    importlib.import_module(name)\n"
        "print('imported')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "imported"


def test_missing_pyspark_is_one_config_error_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from paimon_group.spark.handler import SparkBatchHandler, spark_handler_from_spec

    for name in ("pyspark", "pyspark.sql"):
        monkeypatch.setitem(sys.modules, name, None)  # import raises ImportError
    with pytest.raises(ConfigError) as info:
        spark_handler_from_spec("json:dumps", master="local[1]")
    assert "pip install '.[spark]'" in str(info.value)
    assert "\n" not in str(info.value)
    with pytest.raises(ConfigError):
        SparkBatchHandler(lambda df, b: None).start()


def test_a_malformed_spark_connect_address_is_a_config_error() -> None:
    require("pyspark", "pip install '.[spark]' (tests/run.sh does)")
    from paimon_group.spark.handler import build_spark_session

    with pytest.raises(ConfigError, match="sc://HOST:PORT"):
        build_spark_session(remote="localhost:15002")


def test_clean_staging_removes_only_old_attempts(tmp_path: Path) -> None:
    sink = ParquetBatchSink(tmp_path)
    old = sink.state_dir / "_staging" / "pg_group=g" / "pg_shard=0" / "attempt-5-dead"
    old.mkdir(parents=True)
    os.utime(old, (1, 1))
    fresh = old.with_name("attempt-5-running")
    fresh.mkdir()
    assert sink.clean_staging(older_than_s=3600) == 1
    assert not old.exists() and fresh.exists()


def _keep_writing(sink: ParquetBatchSink, stop: threading.Event, shard: int, *,
                  replays: bool) -> None:
    """Publish batches of ``shard`` until ``stop`` (up to 400, or 120 new keys:
    each read of the output lists every published batch, so more only slows
    the test down): new keys, and (with ``replays``) a replay of an earlier
    key every other time."""
    n = 0
    while not stop.is_set() and n < (400 if replays else 120):
        n += 1
        snapshot = n % 4 + 1 if replays and n % 2 else n
        sink.write_arrow(rows(n), Batch(shard=shard, first_snapshot=snapshot,
                                        snapshot_id=snapshot))


@pytest.mark.parametrize("replays", [False, True], ids=["new-batches", "replays"])
def test_reading_a_live_sink_never_fails_because_a_writer_works(
    tmp_path: Path, replays: bool
) -> None:
    """The race behind a failed Spark end-to-end run: a reader walked the
    sink's staging directory while a writer renamed an attempt out of it
    (FileNotFoundError). Readers of the output, ours and pyarrow's own
    discovery of the directory, see only published files."""
    import pyarrow.dataset as ds

    out = tmp_path / "out"
    sink = ParquetBatchSink(out)
    sink.write_arrow(rows(0), Batch(shard=0, first_snapshot=100, snapshot_id=100))
    stop = threading.Event()
    writers = [threading.Thread(target=_keep_writing, args=(sink, stop, shard),
                                kwargs={"replays": replays}) for shard in (1, 2, 3)]
    for w in writers:
        w.start()
    try:
        for _ in range(150 if replays else 60):
            table = sink.read_arrow()
            assert 0 in table.column("id").to_pylist()
            assert set(table.column_names) == {"id", "pg_group", "pg_shard", "pg_snapshot"}
            if not replays:  # a replay's rename-aside is visible to readers without the lock
                ds.dataset(str(out), format="parquet", partitioning="hive").to_table()
    finally:
        stop.set()
        for w in writers:
            w.join(timeout=60)


def test_the_output_directory_holds_only_published_batches(tmp_path: Path) -> None:
    """``pyarrow.dataset.dataset(out)`` reads the output as it is, with the
    batch key as Hive partition columns, no ignore_prefixes needed."""
    import pyarrow.dataset as ds

    out = tmp_path / "out"
    sink = ParquetBatchSink(out)
    sink.write_arrow(rows(1, 2), Batch(shard=0, first_snapshot=3, snapshot_id=3))
    sink.write_arrow(rows(3), Batch(shard=1, first_snapshot=4, snapshot_id=4))
    assert sorted(p.name for p in out.iterdir()) == ["pg_group=g"]
    table = ds.dataset(str(out), format="parquet", partitioning="hive").to_table()
    assert sorted(table.column("id").to_pylist()) == [1, 2, 3]
    assert sorted(table.column("pg_shard").to_pylist()) == [0, 0, 1]
    assert sink.state_dir.name == ".out.pg-sink" and sink.publications()


def test_a_sink_of_an_earlier_layout_keeps_its_fence_inside(tmp_path: Path) -> None:
    """A sink created by an earlier version (``_fence`` inside the output) keeps
    using it, so the epochs it recorded still refuse stale writers."""
    out = tmp_path / "out"
    fence = EpochFence(out / "_fence")
    with fence.hold(Batch(epoch=7)):
        pass
    sink = ParquetBatchSink(out)
    assert sink.state_dir == out
    with pytest.raises(StaleSinkWrite):
        sink.write_arrow(rows(1), Batch(epoch=6))
    sink.write_arrow(rows(1), Batch(epoch=7))
    assert ids(sink) == [1]
