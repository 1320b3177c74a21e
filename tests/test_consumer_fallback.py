"""The consumer-file fallback is tied to the group incarnation and its shard
count (issue 12, finding 2), on a real table.

A shard with no coordinator position (the coordinator was wiped or switched)
resumes from its Paimon consumer file only if the file was written under the
same shard count and rule. Shard k of a group with 4 shards holds other
buckets than shard k of one with 2: resuming from it lost all rows of a bucket
for 6 snapshots (measured)."""

from __future__ import annotations

import asyncio
import logging
import uuid
from pathlib import Path
from typing import Any

import pytest

from paimon_group import GroupMember, MemberConfig
from paimon_group.reading.mirror import ConsumerMirror
from tests.support.tables import bucket_of, make_pk_table, open_table, write_rows


def _config(wh: str, coordinator: str, shards: int) -> MemberConfig:
    return MemberConfig(group="fb", warehouse=wh, table="db.t", coordinator=coordinator,
                        member_id="a", session_timeout_s=3, poll_interval_ms=50,
                        start="earliest", shards=shards, mirror_interval_s=0.0)


async def _run_until(cfg: MemberConfig, position: int, got: list[int]) -> None:
    """Consume until every shard's next position is ``position`` (committed, or
    resumed from a consumer file)."""
    async with GroupMember(cfg) as member:
        batches = member.batches()

        async def consume() -> None:
            async for batch in batches:
                got.extend(batch.to_arrow().column("id").to_pylist())

        task = asyncio.ensure_future(consume())
        try:
            for _ in range(600):
                positions = {s: o.next_snapshot for s, o in member.core.owned.items()}
                if (len(positions) == member.num_shards
                        and all(p == position for p in positions.values())):
                    break
                if task.done():
                    task.result()
                await asyncio.sleep(0.05)
            else:
                raise AssertionError(f"positions never reached {position}: {positions}")
        finally:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task


async def _earlier_incarnation(wh: str, shards: int) -> dict[int, list[int]]:
    """Snapshots 1-3, read by a group of ``shards`` shards whose coordinator is
    then lost (its consumer files stay, at 4); then snapshots 4-9 are written.
    Returns the ids of each snapshot."""
    ids = {s: list(range((s - 1) * 20, s * 20)) for s in range(1, 10)}
    for s in (1, 2, 3):
        assert write_rows(wh, "db.t", ids[s]) == s
    got: list[int] = []
    await _run_until(_config(wh, f"memory://fb-{uuid.uuid4().hex}", shards), 4, got)
    assert sorted(got) == sorted(ids[1] + ids[2] + ids[3])
    for s in range(4, 10):
        assert write_rows(wh, "db.t", ids[s]) == s
    return ids


@pytest.mark.asyncio
async def test_files_of_another_shard_count_are_not_resumed_from(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    wh = str(tmp_path / "wh")
    make_pk_table(wh, "db.t", buckets=4)
    ids = await _earlier_incarnation(wh, shards=4)
    # In that incarnation, shard 0 (bucket 0) had read up to snapshot 9 while
    # the owner of shard 2 (bucket 2) was down: its file is at 10, shard 2's at 4.
    table = open_table(wh, "db.t")
    ConsumerMirror(table.file_io, table.table_path, "fb").write(0, 10, force=True)

    # A new coordinator: the group is created anew, with 2 shards. Its shard 0
    # holds buckets 0 and 2; resuming from file 0 would skip bucket 2's rows
    # of snapshots 4-9.
    got: list[int] = []
    with caplog.at_level(logging.WARNING, logger="paimon_group"):
        await _run_until(_config(wh, f"memory://fb-{uuid.uuid4().hex}", 2), 10, got)
    # Bucket 0's rows of snapshots 4-9 had been delivered by the earlier
    # incarnation; bucket 2's had not, by anyone.
    bucket2 = {i for s in range(4, 10) for i in ids[s] if bucket_of(table, i) == 2}
    missing = bucket2 - set(got)
    assert not missing, f"{len(missing)} rows of bucket 2 in snapshots 4-9 never delivered"
    notes = [r.getMessage() for r in caplog.records if "consumer files of an earlier" in
             r.getMessage()]
    assert len(notes) == 1 and "under 4 shards" in notes[0] and "\n" not in notes[0]


@pytest.mark.asyncio
async def test_files_of_the_same_shard_count_are_resumed_from(tmp_path: Path) -> None:
    wh = str(tmp_path / "wh")
    make_pk_table(wh, "db.t", buckets=4)
    ids = await _earlier_incarnation(wh, shards=4)
    got: list[int] = []
    await _run_until(_config(wh, f"memory://fb-{uuid.uuid4().hex}", 4), 10, got)
    # Resumed at 4: snapshots 1-3 are not delivered again, 4-9 are.
    assert sorted(got) == sorted(i for s in range(4, 10) for i in ids[s])


@pytest.mark.asyncio
async def test_files_without_an_origin_are_not_resumed_from(tmp_path: Path) -> None:
    """Files whose shard count is unknown (written before origins existed)."""
    wh = str(tmp_path / "wh")
    make_pk_table(wh, "db.t", buckets=2)
    write_rows(wh, "db.t", range(10))
    write_rows(wh, "db.t", range(10, 20))
    table: Any = open_table(wh, "db.t")
    for shard in (0, 1):
        ConsumerMirror(table.file_io, table.table_path, "fb").write(shard, 3, force=True)
    got: list[int] = []
    await _run_until(_config(wh, f"memory://fb-{uuid.uuid4().hex}", 2), 3, got)
    assert sorted(got) == list(range(20))  # started as configured: earliest


def test_a_creator_that_lost_the_race_hands_its_stamp_to_the_winner(tmp_path: Path) -> None:
    """Two members create the group at once: both vet the files alike, the one
    whose group record lost stamped last. It hands the origin to the winner,
    whose shards can then resume."""
    from paimon_group.protocol.records import GroupMeta
    from paimon_group.reading.consumer_meta import (
        ConsumerFilesOrigin,
        adopt_winner,
        prepare_new_group,
        resume_allowed,
    )

    wh = str(tmp_path / "wh")
    make_pk_table(wh, "db.t", buckets=4)
    write_rows(wh, "db.t", range(10))
    table: Any = open_table(wh, "db.t")
    mirror = ConsumerMirror(table.file_io, table.table_path, "fb")
    mirror.write(0, 2, force=True)
    ConsumerFilesOrigin("fb", "earlier", 4, "bucket").write(table.file_io, table.table_path)
    winner = ConsumerFilesOrigin("fb", "winner", 4, "bucket")
    loser = ConsumerFilesOrigin("fb", "loser", 4, "bucket")
    assert prepare_new_group(mirror, table.file_io, table.table_path, winner) is None
    assert prepare_new_group(mirror, table.file_io, table.table_path, loser) is None
    meta = GroupMeta(num_shards=4, table="db.t", created_at=0.0, incarnation="winner")
    origin = ConsumerFilesOrigin.read(table.file_io, table.table_path, "fb")
    assert not resume_allowed(meta, origin)
    assert adopt_winner(table.file_io, table.table_path, loser, meta)
    assert resume_allowed(meta, ConsumerFilesOrigin.read(table.file_io, table.table_path, "fb"))
    assert mirror.read(0) == 2  # kept: written under the same count and rule


def test_the_start_is_kept_beside_the_files_and_only_with_them(tmp_path: Path) -> None:
    """Issue 21, H4: the group's start is recorded in the origin of the
    incarnation that holds it (never another's, never over another start); a
    group re-created over kept files carries it, one whose files were
    discarded (another shard count) does not."""
    from paimon_group.protocol.records import GroupMeta, GroupStart
    from paimon_group.reading.consumer_meta import (
        ConsumerFilesOrigin,
        carried_start,
        prepare_new_group,
        record_start,
    )

    wh = str(tmp_path / "wh")
    make_pk_table(wh, "db.t", buckets=4)
    table: Any = open_table(wh, "db.t")
    io, path = table.file_io, table.table_path
    mirror = ConsumerMirror(io, path, "fb")
    start = GroupStart(next_snapshot=3, full_scan=2, start="latest-full")
    later = GroupStart(next_snapshot=9, full_scan=8, start="latest-full")

    def meta(incarnation: str, shards: int = 4) -> GroupMeta:
        return GroupMeta(num_shards=shards, table="db.t", created_at=0.0,
                         incarnation=incarnation)

    assert prepare_new_group(mirror, io, path, ConsumerFilesOrigin("fb", "one", 4, "bucket")) \
        is None
    assert not record_start(io, path, "fb", meta("other"), start)  # not its origin
    assert record_start(io, path, "fb", meta("one"), start)
    assert not record_start(io, path, "fb", meta("one"), later)  # a start is fixed
    assert carried_start(io, path, "fb", meta("one")) == start
    mirror.write(0, 5, force=True)
    # Re-created over the kept files (a switched coordinator): the start goes with them.
    prepare_new_group(mirror, io, path, ConsumerFilesOrigin("fb", "two", 4, "bucket"))
    assert carried_start(io, path, "fb", meta("two")) == start
    assert carried_start(io, path, "fb", meta("one")) is None  # not the stamped incarnation
    # Re-created with another count: files discarded, and the start with them.
    assert prepare_new_group(mirror, io, path, ConsumerFilesOrigin("fb", "three", 2, "bucket"))
    assert carried_start(io, path, "fb", meta("three", 2)) is None


@pytest.mark.asyncio
@pytest.mark.parametrize("backend", ["sqlite", "etcd"])
async def test_a_pending_full_scan_is_resumed_as_a_full_scan(
        tmp_path: Path, backend: str, request: pytest.FixtureRequest) -> None:
    """Issue 21, H2. Member A pins the group's start (a full scan of snapshot 2)
    and is still in its handler with the initial batch when its coordinator is
    lost. Member B, on a fresh coordinator, resumes from the consumer files A
    wrote: it must scan snapshot 2 in full (50 keys), not only what follows
    it. Before the consumer files marked a pending full scan, B delivered
    only the 10 keys written later: 50 were lost."""
    wh = str(tmp_path / "wh")
    make_pk_table(wh, "db.t", buckets=2)
    write_rows(wh, "db.t", range(25))
    write_rows(wh, "db.t", range(25, 50))
    if backend == "etcd":
        server = request.getfixturevalue("etcd_server")
        first, second = server.url_with_prefix(), server.url_with_prefix()
    else:
        first, second = f"sqlite://{tmp_path}/a.sqlite", f"sqlite://{tmp_path}/b.sqlite"

    def config(coordinator: str, member: str) -> MemberConfig:
        return MemberConfig(group="h2", warehouse=wh, table="db.t", coordinator=coordinator,
                            member_id=member, session_timeout_s=3, poll_interval_ms=50,
                            shards=2, mirror_interval_s=0.0)

    mirror = ConsumerMirror(open_table(wh, "db.t").file_io, open_table(wh, "db.t").table_path,
                            "h2")
    member_a = GroupMember(config(first, "a"), auto_commit=False)
    await member_a.start()
    for _ in range(200):
        # Both shards held before the read loop starts, so that its first step
        # pins both (a shard acquired after it waits behind the held batch,
        # never pinned: on etcd, acquisitions can come one round apart).
        if member_a.ready:
            break
        await asyncio.sleep(0.05)
    assert member_a.owned_shards == [0, 1]
    batches_a = member_a.batches()
    initial = await asyncio.wait_for(batches_a.__anext__(), timeout=60)
    assert initial.kind.value == "initial" and initial.snapshot_id == 2
    try:
        for _ in range(200):   # both shards pinned, their files written
            files = {s: mirror.read_position(s) for s in (0, 1)}
            if all(f is not None for f in files.values()):
                break
            await asyncio.sleep(0.05)
        assert all(f is not None and f.full_scan_pending and f.next_snapshot == 2
                   for f in files.values()), files
        # A is stuck in its handler; its coordinator is gone. B takes over on
        # a fresh one, from the consumer files.
        got: set[int] = set()
        async with GroupMember(config(second, "b")) as member_b:
            write_rows(wh, "db.t", range(50, 60))
            async def consume() -> None:
                async for batch in member_b.batches():
                    got.update(batch.to_arrow().column("id").to_pylist())

            task = asyncio.ensure_future(consume())
            for _ in range(300):   # until every key arrived, or 15 s
                if got >= set(range(60)) or task.done():
                    break
                await asyncio.sleep(0.05)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        assert got == set(range(60)), sorted(set(range(60)) - got)
    finally:
        await batches_a.aclose()
        await member_a.stop(timeout=2)


def test_an_unreadable_origin_keeps_the_files(tmp_path: Path) -> None:
    """Issue 29: an origin that cannot be parsed was taken as none, and the
    group's consumer files were deleted as files of no known origin; a group
    started with --start latest then skipped what they held. They are kept
    now (and not resumed from)."""
    from paimon_group.protocol.names import origin_path
    from paimon_group.reading.consumer_meta import (
        ConsumerFilesOrigin,
        UnreadableOrigin,
        prepare_new_group,
    )

    wh = str(tmp_path / "wh")
    make_pk_table(wh, "db.t", buckets=4)
    table: Any = open_table(wh, "db.t")
    mirror = ConsumerMirror(table.file_io, table.table_path, "fb")
    mirror.write(0, 2, force=True)
    Path(origin_path(table.table_path, "fb")).write_text('{"group": "fb", "incarn')
    with pytest.raises(UnreadableOrigin):
        prepare_new_group(mirror, table.file_io, table.table_path,
                          ConsumerFilesOrigin("fb", "new", 4, "bucket"))
    assert mirror.read(0) == 2


@pytest.mark.asyncio
async def test_fifty_members_creating_one_group_at_once_leave_one_readable_origin(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 29: 50 members start one new group at the same moment; the origin
    was written in place and read half-written by the others (over 100
    "unreadable consumer-file origin" warnings). Written whole now: no
    warning, and one origin, naming the group record's incarnation."""
    import asyncio
    import logging
    import os

    from coordinators import open_coordinator
    from paimon_group import GroupMember, MemberConfig
    from paimon_group.protocol.group import GroupClient
    from paimon_group.reading.consumer_meta import ConsumerFilesOrigin

    wh = str(tmp_path / "wh")
    make_pk_table(wh, "db.t", buckets=4)
    url = f"sqlite://{tmp_path}/c.sqlite"
    caplog.set_level(logging.WARNING)
    members = [GroupMember(MemberConfig(group="fifty", warehouse=wh, table="db.t",
                                        coordinator=url, member_id=f"m{i}",
                                        session_timeout_s=10)) for i in range(50)]
    try:
        await asyncio.gather(*(m.start() for m in members))
        async with open_coordinator(url) as coord:
            meta = await GroupClient(coord, "fifty").read_meta()
    finally:
        await asyncio.gather(*(m.stop() for m in members), return_exceptions=True)
    unreadable = [r.getMessage() for r in caplog.records if "unreadable" in r.getMessage()]
    assert not unreadable, unreadable[:3]
    table: Any = open_table(wh, "db.t")
    origin = ConsumerFilesOrigin.read(table.file_io, table.table_path, "fifty", strict=True)
    assert origin is not None and meta is not None
    assert origin.incarnation == meta.incarnation
    names = await asyncio.to_thread(os.listdir, os.path.join(table.table_path, "consumer"))
    leftovers = [name for name in names if name.endswith(".tmp")]
    assert not leftovers


def test_consumer_files_of_several_shards_are_written_at_once_on_an_object_store() -> None:
    """A group's start marks every shard's pending full scan before its first
    row: on an object store (three requests a file) those files are written
    in parallel, not one after another. Here every upload waits until all
    eight have started: written one by one, the first would wait in vain."""
    import io
    import threading

    started = threading.Barrier(8, timeout=10)
    written: dict[str, bytes] = {}

    class Sink(io.BytesIO):
        def __init__(self, path: str) -> None:
            super().__init__()
            self.path = path

        def close(self) -> None:
            written[self.path] = self.getvalue()
            super().close()

    class RemoteFs:  # stands in for pyarrow's S3FileSystem: not a local one
        def open_output_stream(self, path: str) -> Sink:
            started.wait()
            return Sink(path)

    class StoreFileIO:
        filesystem = RemoteFs()

        def to_filesystem_path(self, path: str) -> str:
            return path.removeprefix("s3://")

    mirror = ConsumerMirror(StoreFileIO(), "s3://b/wh/db.db/t", "g")
    failed = mirror.write_many(list(range(8)), 5, full_scan_pending=True)
    assert failed == {}
    assert len(written) == 8 and mirror.writes == 8
    assert all(b'"paimonGroupFullScan": 5' in data for data in written.values())
