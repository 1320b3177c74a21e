"""The Paimon sink under a group of several tables, with real members: each
source table's batches keep their own marks, so a batch in a target but not in
the coordinator is not written again, whichever table it is of, into one
target or each table into its own (``PaimonSinks``)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from paimon_group import GroupMember, MemberConfig
from paimon_group.reading.batch import ShardBatch
from paimon_group.sink import PaimonSink, PaimonSinks
from tests.support.tables import _create, make_pk_table, open_table, write_rows
from tests.support.waiting import eventually

OUT = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("v", pa.int64())])


def _config(wh: str, coordinator: str, member: str) -> MemberConfig:
    return MemberConfig(group="out", warehouse=wh, table="shop.*", coordinator=coordinator,
                        member_id=member, session_timeout_s=3, poll_interval_ms=50,
                        start="earliest", forming_wait_s=0)


def _ids(wh: str, name: str) -> list[int]:
    table = open_table(wh, name)
    builder = table.new_read_builder()
    rows = builder.new_read().to_arrow(builder.new_scan().plan().splits())
    return sorted(rows.column("id").to_pylist())


def _sources(wh: str) -> None:
    make_pk_table(wh, "shop.a", buckets=2)
    make_pk_table(wh, "shop.b", buckets=2)
    for k in range(3):
        write_rows(wh, "shop.a", range(10 * k, 10 * k + 10))
        write_rows(wh, "shop.b", range(100 + 10 * k, 110 + 10 * k))


@pytest.mark.asyncio
@pytest.mark.parametrize("targets", ["one", "each"])
async def test_a_batch_in_the_target_is_not_written_again_whichever_table(
        tmp_path: Path, targets: str) -> None:
    wh = str(tmp_path / "wh")
    _sources(wh)
    names = {"shop.a": "out.all", "shop.b": "out.all"} if targets == "one" else \
        {"shop.a": "out.a", "shop.b": "out.b"}
    for name in set(names.values()):
        _create(wh, name, OUT, primary_keys=[], options={"bucket": "-1"})  # keeps duplicates
    sink: Any = PaimonSink(wh, "out.all", commit_interval_s=0.2) if targets == "one" else \
        PaimonSinks(wh, names, commit_interval_s=0.2)
    coordinator = f"sqlite://{tmp_path}/coord.sqlite"
    hung, release = threading.Event(), threading.Event()

    def hangs_after_b_s_shard_0(batch: ShardBatch) -> None:
        sink.write(batch.to_arrow().select(["id", "v"]), batch)
        if batch.table == "shop.b" and batch.shard == 0 and not hung.is_set():
            hung.set()   # in the target; the member never commits its position
            release.wait(30)

    def writes(batch: ShardBatch) -> None:
        sink.write(batch.to_arrow().select(["id", "v"]), batch)

    a = GroupMember(_config(wh, coordinator, "a"), handle_signals=False)
    await a.start()
    run_a = asyncio.ensure_future(a.run(hangs_after_b_s_shard_0))
    await eventually(hung.is_set)
    await a.stop(timeout=0.5)                 # the hung batch is abandoned, not committed
    release.set()
    await asyncio.wait_for(asyncio.gather(run_a, return_exceptions=True), 10)

    async with GroupMember(_config(wh, coordinator, "b"), handle_signals=False) as b:
        run_b = asyncio.ensure_future(b.run(writes))
        write_rows(wh, "shop.a", range(30, 40))
        write_rows(wh, "shop.b", range(130, 140))
        if targets == "one":
            await eventually(lambda: _ids(wh, "out.all") == [*range(40), *range(100, 140)])
        else:
            await eventually(lambda: _ids(wh, "out.a") == list(range(40))
                             and _ids(wh, "out.b") == list(range(100, 140)))
        await asyncio.sleep(1.0)  # nothing more comes
        run_b.cancel()
        await asyncio.gather(run_b, return_exceptions=True)
    sink.close()
    # Each row once: the replayed batch of shop.b's shard 0 was found written.
    if targets == "one":
        assert _ids(wh, "out.all") == [*range(40), *range(100, 140)]
    else:
        assert _ids(wh, "out.a") == list(range(40))
        assert _ids(wh, "out.b") == list(range(100, 140))
