"""One start for the whole group (issue 21, H1), with real members.

Under the file rule of a bucket-unaware append table a row's shard is the
hash of the file that holds it, and a compaction rewrites rows into files of
other names: other shards. Follow-up steps skip COMPACT snapshots, so two
shards that start from different snapshots with a compaction between them
lose the rows the compaction moved into the earlier shard's files and read
twice the rows it moved the other way. Measured before the group start was
stored: 6 commits of 10 rows, 2 shards, a compaction between the two
members' pins: 30 of 60 rows delivered.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from paimon_group import GroupMember, MemberConfig
from paimon_group.protocol.group import GroupClient
from paimon_group.protocol.group_start import read_group_start
from paimon_group.protocol.sharding import Sharding, ShardRule
from tests.support.tables import (
    compact,
    current_entries,
    make_append_table,
    open_table,
    write_table,
)

TABLE = "db.a"


def _rows(ids: range) -> object:
    import pyarrow as pa

    from tests.support.tables import table_schema

    schema = table_schema()
    return pa.table({"id": list(ids), "v": [0] * len(ids),
                     "payload": [f"p{i}" for i in ids]}, schema=schema)


def _six_commits_over_both_shards(tmp_path: Path) -> str:
    """A warehouse whose table holds 6 commits of 10 rows (ids 0..59) in 6
    files that reach both of 2 shards. A file's shard is the hash of its
    random name, so all 6 land in one shard once in 32 tables: then the test
    would prove nothing (and its partial-read step could not happen), so such
    a table is written again in a new warehouse."""
    sharding = Sharding(ShardRule.FILE, 2)
    for attempt in range(20):
        wh = str(tmp_path / f"wh{attempt}")
        make_append_table(wh, TABLE, buckets=-1)
        table = open_table(wh, TABLE)
        for k in range(6):
            write_table(table, _rows(range(10 * k, 10 * k + 10)))
        if {sharding.shard_of_entry(e) for e in current_entries(table)} == {0, 1}:
            return wh
    raise AssertionError("20 tables in a row had all their files in one shard")


async def _until(condition: Callable[[], bool], timeout_s: float = 60.0) -> None:
    """Wait until ``condition()`` holds, or ``timeout_s`` passed (the caller
    asserts what it needs afterwards)."""
    deadline = time.monotonic() + timeout_s
    for _ in range(int(timeout_s / 0.05)):
        if condition() or time.monotonic() >= deadline:
            return
        await asyncio.sleep(0.05)


async def _drain(member: GroupMember, got: Counter[int], want: int) -> None:
    """Consume ``member``'s batches into ``got`` until ``want`` rows arrived
    in all (or 60 s passed: a loaded CI machine can be slow to plan)."""
    async def consume() -> None:
        async for batch in member.batches():
            got.update(batch.to_arrow().column("id").to_pylist())

    task = asyncio.ensure_future(consume())
    await _until(lambda: sum(got.values()) >= want or task.done())
    await asyncio.sleep(0.3)  # a duplicate would arrive now
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


@pytest.mark.asyncio
@pytest.mark.parametrize("backend", ["sqlite", "etcd"])
async def test_a_compaction_between_two_members_starts_loses_nothing(
        tmp_path: Path, backend: str, request: pytest.FixtureRequest) -> None:
    wh = _six_commits_over_both_shards(tmp_path)
    coordinator = (request.getfixturevalue("etcd_server").url_with_prefix()
                   if backend == "etcd" else f"sqlite://{tmp_path}/c.sqlite")

    def config(member: str) -> MemberConfig:
        return MemberConfig(group="h1", warehouse=wh, table=TABLE, coordinator=coordinator,
                            member_id=member, session_timeout_s=5, poll_interval_ms=50,
                            shards=2)

    a, b = GroupMember(config("a")), GroupMember(config("b"))
    await a.start()
    await b.start()
    try:
        # the assignment settles: one shard each, nothing read yet
        await _until(lambda: len(a.owned_shards) == 1 and len(b.owned_shards) == 1)
        assert sorted(a.owned_shards + b.owned_shards) == [0, 1]
        got: Counter[int] = Counter()
        # a pins its shard and reads it; then the writer compacts; then b pins.
        await _drain(a, got, want=1)
        compacted = compact(wh, TABLE)
        assert compacted == 7
        await _drain(b, got, want=60)
        start = await read_group_start(GroupClient(a.core.coordinator, "h1"))  # type: ignore[arg-type]
    finally:
        await a.stop()
        await b.stop()
    assert sorted(got) == list(range(60)), sorted(set(range(60)) - set(got))
    assert max(got.values()) == 1, [k for k, n in got.items() if n > 1]
    # Both shards started from the one start the group stored.
    assert start is not None and start.full_scan == 6 and start.start == "latest-full"


@pytest.mark.asyncio
@pytest.mark.parametrize("backend", ["sqlite", "etcd"])
async def test_a_shard_without_a_consumer_file_keeps_the_start_across_a_switch(
        tmp_path: Path, backend: str, request: pytest.FixtureRequest) -> None:
    """Issue 21, H4 (simulation seeds 1126 and 1943): after a switched (or
    wiped) coordinator, the shards with a consumer file resume from it, and a
    shard that was never pinned (no file) starts from the start its peers were
    read from, kept beside the files; resolved again it was a full scan of the
    compacted snapshot, whose files shard the rows otherwise."""
    wh = _six_commits_over_both_shards(tmp_path)

    def coordinator() -> str:
        if backend == "etcd":
            return str(request.getfixturevalue("etcd_server").url_with_prefix())
        return f"sqlite://{tmp_path}/c-{len(list(tmp_path.glob('c-*')))}.sqlite"

    def config(member: str, url: str) -> MemberConfig:
        return MemberConfig(group="h4", warehouse=wh, table=TABLE, coordinator=url,
                            member_id=member, session_timeout_s=5, poll_interval_ms=50,
                            shards=2)

    first = coordinator()
    a, b = GroupMember(config("a", first)), GroupMember(config("b", first))
    await a.start()
    await b.start()
    got: Counter[int] = Counter()
    try:
        await _until(lambda: len(a.owned_shards) == 1 and len(b.owned_shards) == 1)
        assert sorted(a.owned_shards + b.owned_shards) == [0, 1]
        await _drain(a, got, want=1)  # a's shard is pinned, read and mirrored; b's never
    finally:
        await a.stop()
        await b.stop()
    assert 0 < sum(got.values()) < 60
    assert compact(wh, TABLE) == 7
    second = coordinator()
    assert second != first
    c = GroupMember(config("c", second))  # a fresh coordinator: no positions, no start
    await c.start()
    try:
        await _drain(c, got, want=60)
    finally:
        await c.stop()
    assert sorted(got) == list(range(60)), sorted(set(range(60)) - set(got))
    assert max(got.values()) == 1, [k for k, n in got.items() if n > 1]
