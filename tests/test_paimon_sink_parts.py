"""A batch written into the Paimon sink in several parts (one
``sink.write`` per record batch of ``batch.iter_batches()``, the bounded-memory
way): every part is committed, together, once the handler returned; a
handler that raises after some parts commits none of them, and its retry
writes them once. Real members (the embedded SQLite coordinator) and real
pypaimon tables."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pytest

from paimon_group import GroupMember, MemberConfig
from paimon_group.errors import PaimonGroupError
from paimon_group.reading.batch import ShardBatch
from paimon_group.reading.planner import BatchKind
from paimon_group.sink import PaimonSink
from tests.support.tables import _create, make_pk_table, open_table, write_rows
from tests.test_paimon_sink_member import _target_ids, _until

OUT = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("v", pa.int64())])


def _config(wh: str, coordinator: str) -> MemberConfig:
    return MemberConfig(group="parts", warehouse=wh, table="db.src", coordinator=coordinator,
                        member_id="m", session_timeout_s=3, poll_interval_ms=50,
                        start="earliest", max_handler_attempts=3)


def _source(wh: str) -> None:
    # Two rows per record batch: a shard's batch of 12 rows comes in 6 parts.
    make_pk_table(wh, "db.src", buckets=2, options={"read.batch-size": "2"})
    _create(wh, "db.out", OUT, primary_keys=[], options={"bucket": "-1"})


@pytest.mark.asyncio
@pytest.mark.parametrize("interval", [0.2, 0.0])
async def test_every_part_of_a_batch_is_written_once(tmp_path: Path, interval: float) -> None:
    wh = str(tmp_path / "wh")
    _source(wh)
    write_rows(wh, "db.src", range(12))
    sink = PaimonSink(wh, "db.out", commit_interval_s=interval)
    parts: list[int] = []

    def handle(batch: ShardBatch) -> None:
        for rb in batch.iter_batches():
            parts.append(rb.num_rows)
            sink.write(pa.Table.from_batches([rb]).select(["id", "v"]), batch)

    async with GroupMember(_config(wh, f"sqlite://{tmp_path}/coord.sqlite")) as member:
        run = asyncio.ensure_future(member.run(handle))
        await _until(lambda: _target_ids(wh) == list(range(12)))
        write_rows(wh, "db.src", range(12, 24))
        await _until(lambda: _target_ids(wh) == list(range(24)))
        await asyncio.sleep(0.5)
        run.cancel()
    sink.close()
    assert _target_ids(wh) == list(range(24))
    assert max(parts) <= 2 and len(parts) >= 12  # it was written in parts


@pytest.mark.asyncio
async def test_a_handler_that_raises_after_some_parts_commits_none_and_its_retry_writes_once(
        tmp_path: Path) -> None:
    wh = str(tmp_path / "wh")
    _source(wh)
    write_rows(wh, "db.src", range(12))
    sink = PaimonSink(wh, "db.out", commit_interval_s=0.1)
    failed: set[int] = set()
    lock = threading.Lock()

    def handle(batch: ShardBatch) -> None:
        for i, rb in enumerate(batch.iter_batches()):
            sink.write(pa.Table.from_batches([rb]).select(["id", "v"]), batch)
            with lock:
                if i == 1 and batch.shard not in failed:
                    failed.add(batch.shard)
                    raise RuntimeError("the handler fails after two parts")

    async with GroupMember(_config(wh, f"sqlite://{tmp_path}/coord.sqlite")) as member:
        run = asyncio.ensure_future(member.run(handle))
        await _until(lambda: _target_ids(wh) == list(range(12)))
        await asyncio.sleep(0.5)
        run.cancel()
    sink.close()
    assert failed == {0, 1}
    assert _target_ids(wh) == list(range(12))


def test_a_batch_handed_back_refuses_more_parts(tmp_path: Path) -> None:
    wh = str(tmp_path / "wh")
    _source(wh)
    write_rows(wh, "db.src", range(4))

    async def first_batch() -> ShardBatch:
        async with GroupMember(_config(wh, f"sqlite://{tmp_path}/coord.sqlite")) as member:
            async for batch in member.batches():
                return batch
        raise AssertionError("no batch")

    batch = asyncio.run(first_batch())
    batch.close_output()
    with PaimonSink(wh, "db.out", commit_interval_s=0) as sink, \
            pytest.raises(PaimonGroupError, match="handed back already"):
        sink.write(pa.table({"id": pa.array([1], pa.int64()), "v": pa.array([1], pa.int64())}),
                   batch)
    assert _target_ids(wh) == []


@dataclass
class _Held:
    """A member's batch as the sink sees it: it holds the output until sealed."""

    shard: int = 0
    epoch: int = 1
    first_snapshot: int = 2
    snapshot_id: int = 8
    group: str = "g"
    kind: BatchKind = BatchKind.CATCH_UP

    @property
    def next_snapshot(self) -> int:
        return self.snapshot_id + 1

    def hold_output(self, sink: object) -> None:
        pass


@pytest.mark.parametrize("interval", [0.0, 0.1])
def test_a_key_s_later_change_in_a_later_part_wins(tmp_path: Path, interval: float) -> None:
    """Every row of a batch carries its source snapshot as the sequence
    value, so a key's rows of one batch tie there and Paimon orders them by
    its writer's own sequence numbers: the parts of a batch go to one writer,
    so a key's earlier change (an earlier part) never wins over its later one
    (a later part of a catch-up over several snapshots)."""
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("v", pa.int64()),
                        pa.field("seq", pa.int64())])
    _create(str(tmp_path), "db.pk", schema, primary_keys=["id"],
            options={"bucket": "1", "sequence.field": "seq"})

    def rows(ids: list[int], v: int) -> pa.Table:
        return pa.table({"id": pa.array(ids, pa.int64()), "v": pa.array([v] * len(ids),
                                                                        pa.int64())})

    with PaimonSink(str(tmp_path), "db.pk", commit_interval_s=interval) as sink:
        batch = _Held()
        sink.write(rows([7, 8], 4), batch)   # key 7's earlier change
        sink.write(rows([7], 6), batch)      # and its later one
        sink.seal(batch).result(timeout=30)
    table = open_table(str(tmp_path), "db.pk")
    builder = table.new_read_builder()
    read = builder.new_read().to_arrow(builder.new_scan().plan().splits())
    assert sorted(zip(read.column("id").to_pylist(), read.column("v").to_pylist(),
                      strict=True)) == [(7, 6), (8, 4)]
