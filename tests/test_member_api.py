"""The asyncio library API: ``async with`` a member, ``async for`` its batches,
automatic and explicit commits, rebalance listener hooks, and handoff between
two in-process members (in-memory coordinator, a real Paimon table)."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from paimon_group import GroupMember, MemberConfig
from paimon_group.protocol.group import GroupClient
from tests.support.tables import make_pk_table, write_rows


class Recorder:
    def __init__(self) -> None:
        self.assigned: list[list[int]] = []
        self.revoked: list[list[int]] = []
        self.lost: list[list[int]] = []

    def on_assigned(self, shards: list[int]) -> None:
        self.assigned.append(shards)

    def on_revoked(self, shards: list[int]) -> None:
        self.revoked.append(shards)

    def on_lost(self, shards: list[int]) -> None:
        self.lost.append(shards)


def _config(wh: Path, coord: str, member: str) -> MemberConfig:
    return MemberConfig(group="api", warehouse=str(wh), table="db.t", coordinator=coord,
                        member_id=member, session_timeout_s=3, poll_interval_ms=50)


@pytest.mark.asyncio
async def test_async_iteration_commits_and_hands_off(tmp_path: Path) -> None:
    wh = tmp_path / "wh"
    make_pk_table(str(wh), "db.t", buckets=4)
    write_rows(str(wh), "db.t", range(40))
    coord = f"memory://api-{uuid.uuid4().hex}"
    seen: dict[int, set[int]] = {}
    rec_a = Recorder()

    async with GroupMember(_config(wh, coord, "a"), listener=rec_a) as a:
        batches = a.batches()
        while sum(len(v) for v in seen.values()) < 40:
            batch = await asyncio.wait_for(batches.__anext__(), timeout=30)
            assert batch.kind.value == "initial" and batch.epoch > 0
            seen.setdefault(batch.shard, set()).update(batch.to_arrow().column("id").to_pylist())
        assert sorted(seen) == [0, 1, 2, 3]
        assert rec_a.assigned and sorted(s for g in rec_a.assigned for s in g) == [0, 1, 2, 3]

        # A second member joins: two shards move from a to b, cooperatively.
        rec_b = Recorder()
        async with GroupMember(_config(wh, coord, "b"), listener=rec_b) as b:
            reader = asyncio.ensure_future(batches.__anext__())  # a keeps consuming
            for _ in range(200):
                if len(b.owned_shards) == 2 and len(a.owned_shards) == 2:
                    break
                await asyncio.sleep(0.05)
            assert sorted(a.owned_shards + b.owned_shards) == [0, 1, 2, 3]
            assert [s for g in rec_a.revoked for s in g] == sorted(b.owned_shards)
            assert not rec_a.lost
            assert a.stats.shards_moved == {"revoked": 2, "released": 0, "lost": 0}
            reader.cancel()
        # b left gracefully: its shards were released, not lost (as Kafka's
        # cooperative protocol tells them apart, in logs and metrics).
        assert b.stats.shards_moved == {"revoked": 0, "released": 2, "lost": 0}
        assert not rec_b.lost
        await batches.aclose()
        positions = await GroupClient(a.core.coordinator, "api").positions()  # type: ignore[arg-type]
        assert {s: p.next_snapshot for s, p in positions.items()} == {0: 2, 1: 2, 2: 2, 3: 2}


@pytest.mark.asyncio
async def test_explicit_commit(tmp_path: Path) -> None:
    wh = tmp_path / "wh"
    make_pk_table(str(wh), "db.t", buckets=2)
    write_rows(str(wh), "db.t", range(10))
    coord = f"memory://api-{uuid.uuid4().hex}"
    member = GroupMember(_config(wh, coord, "a"), auto_commit=False)
    await member.start()
    try:
        batches = member.batches()
        batch = await asyncio.wait_for(batches.__anext__(), timeout=30)
        client = GroupClient(member.core.coordinator, "api")  # type: ignore[arg-type]
        position, _ = await client.position(batch.shard)
        # Before the batch is acknowledged only the start is pinned: the full
        # scan of snapshot 1 is still pending.
        assert position is not None and position.full_scan == batch.snapshot_id == 1
        # As Kafka's commitSync: durable in the coordinator when it returns
        # (the other shard of the step has not even been handed out yet).
        await member.commit(batch)
        position, _ = await client.position(batch.shard)
        assert position is not None and position.full_scan is None
        assert position.next_snapshot == batch.next_snapshot
        # wait=False only acknowledges: it returns before the commit.
        other = await asyncio.wait_for(batches.__anext__(), timeout=30)
        await member.commit(other, wait=False)
        position, _ = await client.position(other.shard)
        assert position is not None and position.full_scan == 1
        await batches.aclose()
    finally:
        await member.stop()


def test_sync_wrapper_runs_a_handler(tmp_path: Path) -> None:
    """``run_member`` drives a member with a plain function until stopped."""
    import os
    import signal
    import threading

    from paimon_group import run_member

    wh = tmp_path / "wh"
    make_pk_table(str(wh), "db.t", buckets=2)
    write_rows(str(wh), "db.t", range(10))
    got: list[int] = []

    def handle(batch: object) -> None:
        got.extend(batch.to_arrow().column("id").to_pylist())  # type: ignore[attr-defined]
        if len(got) >= 10:
            threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGUSR1)).start()

    run_member(_config(wh, f"sqlite://{tmp_path}/c.sqlite", "a"), handle,
               stop_signals=[signal.SIGUSR1])
    assert sorted(got) == list(range(10))


@pytest.mark.asyncio
async def test_shard_without_position_resumes_from_its_consumer_file(tmp_path: Path) -> None:
    """A group whose coordinator state is gone resumes from the Paimon consumer files
    (written by an earlier incarnation of the group with the same shard count)."""
    from paimon_group.reading.consumer_meta import ConsumerFilesOrigin
    from paimon_group.reading.mirror import ConsumerMirror
    from tests.support.tables import open_table

    wh = tmp_path / "wh"
    make_pk_table(str(wh), "db.t", buckets=2)
    write_rows(str(wh), "db.t", range(0, 10))  # snapshot 1: already consumed
    write_rows(str(wh), "db.t", range(10, 20))  # snapshot 2: not yet
    table = open_table(str(wh), "db.t")
    ConsumerMirror(table.file_io, table.table_path, "api").write(0, 2, force=True)
    ConsumerMirror(table.file_io, table.table_path, "api").write(1, 2, force=True)
    ConsumerFilesOrigin("api", "earlier", 2, "bucket").write(table.file_io, table.table_path)
    coord = f"memory://api-{uuid.uuid4().hex}"
    got: list[int] = []
    async with GroupMember(_config(wh, coord, "a")) as member:
        batches = member.batches()
        while len(got) < 10:
            batch = await asyncio.wait_for(batches.__anext__(), timeout=30)
            assert batch.kind.value == "delta" and batch.snapshot_id == 2
            got.extend(batch.to_arrow().column("id").to_pylist())
        await batches.aclose()
    assert sorted(got) == list(range(10, 20))


@pytest.mark.asyncio
async def test_a_member_given_its_opened_table_does_not_open_it_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``paimon-group run`` opens the table to check it before joining and gives
    it to the member (on an object store an open is a schema listing and
    reads): the member's start does not open it a second time."""
    from paimon_group.process import preflight
    from paimon_group.reading.table import ShardedTable

    wh = tmp_path / "wh"
    make_pk_table(str(wh), "db.t", buckets=2)
    write_rows(str(wh), "db.t", range(10))
    cfg = _config(wh, f"memory://opened-{uuid.uuid4().hex}", "a")
    table = preflight.check_table(cfg.warehouse, cfg.table, cfg.catalog_options, None)
    opened: list[str] = []
    real_open = ShardedTable.open.__func__  # type: ignore[attr-defined]

    def counting_open(cls: type[ShardedTable], *args: object, **kwargs: object) -> ShardedTable:
        opened.append(str(args[1]))
        return real_open(cls, *args, **kwargs)  # type: ignore[no-any-return]

    monkeypatch.setattr(ShardedTable, "open", classmethod(counting_open))
    async with GroupMember(cfg, table=table) as member:
        assert member.table is table
    assert opened == []
    async with GroupMember(cfg) as member:  # without one: opened at the start
        assert member.table is not table
    assert opened == ["db.t"]
