"""A group start whose full scan expired moves forward once, for every shard
(issue 37, D2), with real members on a real bucket-unaware table.

Under the file rule a compaction moves rows between files, hence shards, and
follow-up steps skip it: every shard must read from one full scan. Measured
before the fix (``--on-data-loss skip``, 2 shards, 6 commits of 10 rows):
member a scanned the start (6) for its shard; the writer compacted every row
into one file of a's shard (7), committed 8-11, and snapshots 1-6 expired;
member b, pinning its shard at the start, found 6 expired and re-pinned its
own shard alone at a full scan of 7, where none of its rows were left: its
rows of 0..59 were never delivered, though no row of the table expired.
"""

from __future__ import annotations

import asyncio
import contextlib
import types
import uuid
from collections import Counter
from pathlib import Path

import pytest

from coordinators import open_coordinator
from paimon_group import GroupMember, MemberConfig
from paimon_group.protocol.admin import GroupAdmin
from paimon_group.protocol.group import GroupClient
from paimon_group.protocol.group_start import move_group_start, read_group_start
from paimon_group.protocol.records import GroupStart
from paimon_group.protocol.sharding import Sharding, ShardRule
from paimon_group.reading.consumer_meta import ConsumerFilesOrigin
from tests.support.expiry import expire_like_paimon
from tests.support.tables import compact, current_entries, open_table, write_table
from tests.test_group_start import TABLE, _rows, _six_commits_over_both_shards, _until


def _compact_into_shard(wh: str, sharding: Sharding, shard: int) -> int:
    """Compact the table (every row into one new file, as Paimon's append
    compaction does) under a file name of ``shard``; the snapshot id."""
    import pypaimon.write.writer.data_writer as data_writer

    while True:
        name = uuid.uuid4()
        if sharding.shard_of((), 0, f"data-{name}-0.parquet") == shard:
            break
    real = data_writer.uuid
    data_writer.uuid = types.SimpleNamespace(uuid4=lambda: name)  # type: ignore[assignment]
    try:
        snapshot = compact(wh, TABLE)
    finally:
        data_writer.uuid = real
    shards = {sharding.shard_of_entry(e) for e in current_entries(open_table(wh, TABLE))}
    assert shards == {shard}, shards
    return snapshot


async def _consume(member: GroupMember, got: Counter[int]) -> None:
    """Every batch of ``member`` into ``got``, each committed before the next."""
    async for batch in member.batches():
        got.update(batch.to_arrow().column("id").to_pylist())
        with contextlib.suppress(Exception):  # a revoked shard: read again elsewhere
            await member.commit(batch)


async def _stop_consuming(tasks: list[asyncio.Future[None]]) -> None:
    await asyncio.sleep(0.3)  # a duplicate would arrive now
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task


@pytest.mark.asyncio
@pytest.mark.parametrize("backend", ["sqlite", "etcd"])
async def test_a_skipped_start_moves_once_for_every_shard(
        tmp_path: Path, backend: str, request: pytest.FixtureRequest) -> None:
    wh = _six_commits_over_both_shards(tmp_path)
    coordinator = (request.getfixturevalue("etcd_server").url_with_prefix()
                   if backend == "etcd" else f"sqlite://{tmp_path}/c.sqlite")

    def config(member: str) -> MemberConfig:
        return MemberConfig(group="d2", warehouse=wh, table=TABLE, coordinator=coordinator,
                            member_id=member, session_timeout_s=5, poll_interval_ms=50,
                            shards=2, on_data_loss="skip")

    a = GroupMember(config("a"), auto_commit=False)
    b = GroupMember(config("b"), auto_commit=False)
    await a.start()
    await b.start()
    got: Counter[int] = Counter()
    tasks: list[asyncio.Future[None]] = []
    try:
        await _until(lambda: len(a.owned_shards) == 1 and len(b.owned_shards) == 1)
        assert sorted(a.owned_shards + b.owned_shards) == [0, 1]
        (shard_a,) = a.owned_shards
        # a pins the group's start (a full scan of 6), reads its shard, commits.
        tasks.append(asyncio.ensure_future(_consume(a, got)))
        await _until(lambda: a.shard_positions().get(shard_a) == 7)
        assert a.shard_positions().get(shard_a) == 7 and 0 < len(got) < 60
        # Every row into one file of a's shard, 4 commits more, 1-6 expire.
        assert _compact_into_shard(wh, Sharding(ShardRule.FILE, 2), shard_a) == 7
        table = open_table(wh, TABLE)
        for k in range(6, 10):
            # One at a time through the leader's head: members keep the texts
            # of the newest four latests it published, and planning one of an
            # expired snapshot from memory is another matter (issue 37, D4).
            await asyncio.sleep(0.5)
            write_table(table, _rows(range(10 * k, 10 * k + 10)))
        await asyncio.sleep(0.5)
        assert expire_like_paimon(wh, TABLE, keep_from=7)
        # b pins its shard at the start (6): expired. Both read on.
        tasks.append(asyncio.ensure_future(_consume(b, got)))
        await _until(lambda: set(got) >= set(range(100)) or any(t.done() for t in tasks))
        await _stop_consuming(tasks)
        client = GroupClient(a.core.coordinator, "d2")  # type: ignore[arg-type]
        start = await read_group_start(client)
    finally:
        await _stop_consuming(tasks)
        await a.stop()
        await b.stop()
    missing = sorted(set(range(100)) - set(got))
    assert not missing, f"{len(missing)} rows never delivered: {missing}"
    # The start moved once, from 6 to a full scan of the latest snapshot.
    assert start is not None and (start.moves, start.moved_from, start.full_scan) == (1, 6, 11)
    origin = ConsumerFilesOrigin.read(table.file_io, table.table_path, "d2")
    assert origin is not None and origin.start == start  # carried across a switch


@pytest.mark.asyncio
async def test_two_members_moving_the_start_at_once_use_one_move(tmp_path: Path) -> None:
    """Both find the start's full scan expired and propose a move (to the
    latest snapshot each saw): one compare-and-set wins, both use it, and
    a later mover of the same start finds it moved already."""
    url = f"sqlite://{tmp_path}/c.sqlite"
    first = GroupStart(next_snapshot=7, full_scan=6, start="latest-full")
    async with open_coordinator(url) as one, open_coordinator(url) as two:
        assert await one.create(GroupClient(one, "g").keys.start, first.encode()) is not None

        def proposal(member: str, latest: int) -> GroupStart:
            return GroupStart(next_snapshot=latest + 1, full_scan=latest, start="latest-full",
                              resolved_by=member, moves=1, moved_from=6)

        moved = await asyncio.gather(
            move_group_start(GroupClient(one, "g"), 0, proposal("a", 11)),
            move_group_start(GroupClient(two, "g"), 0, proposal("b", 12)))
        assert moved[0] == moved[1]
        assert moved[0] in (proposal("a", 11), proposal("b", 12))
        stored = await read_group_start(GroupClient(one, "g"))
        assert stored == moved[0]
        # A member that learns late (its shard's position of the first start)
        # proposes again: the stored move stands.
        late = await move_group_start(GroupClient(two, "g"), 0, proposal("c", 13))
        assert late == moved[0]
        # The moved start's own full scan expiring moves it once more.
        again = GroupStart(next_snapshot=21, full_scan=20, start="latest-full", moves=2,
                           moved_from=moved[0].full_scan)
        assert await move_group_start(GroupClient(one, "g"), 1, again) == again


@pytest.mark.parametrize(("file", "lineage"), [
    ((11, True), 1),    # the pending full scan of the moved start
    ((12, False), 1),   # past it: read from it
    ((30, False), 1),
    ((6, True), 0),     # the pending full scan of the start before
    ((9, False), 0),    # follow-ups of the start before, short of the moved one
    ((11, False), 0),
])
def test_a_consumer_file_is_judged_against_the_moved_start(
        file: tuple[int, bool], lineage: int) -> None:
    """After a switch, a shard resuming from its consumer file scans the
    moved start unless the file shows it did (issue 37, D2)."""
    from paimon_group.member.ownership import file_start_moves
    from paimon_group.reading.mirror import MirroredPosition

    moved = GroupStart(next_snapshot=12, full_scan=11, start="latest-full", moves=1,
                       moved_from=6)
    mirrored = MirroredPosition(file[0], full_scan_pending=file[1])
    assert file_start_moves(mirrored, moved) == lineage
    first = GroupStart(next_snapshot=7, full_scan=6, start="latest-full")
    assert file_start_moves(mirrored, first) == 0
    assert file_start_moves(mirrored, None) == 0


def test_a_consumer_file_that_records_its_start_is_not_judged() -> None:
    """A file that records the moves of its start is taken at its word: a
    position of the start before that had read past the moved start's full
    scan is of the start before (judged, it looked like one of the moved
    start, and the shard was not re-pinned: simulation seed 298848)."""
    from paimon_group.member.ownership import file_start_moves
    from paimon_group.reading.mirror import MirroredPosition

    moved = GroupStart(next_snapshot=11, full_scan=10, start="latest-full", moves=1,
                       moved_from=3)
    assert file_start_moves(MirroredPosition(11), moved) == 1  # judged
    assert file_start_moves(MirroredPosition(11, start_moves=0), moved) == 0
    assert file_start_moves(MirroredPosition(11, start_moves=1), moved) == 1
    assert file_start_moves(MirroredPosition(10, True, start_moves=0), moved) == 0
    assert file_start_moves(MirroredPosition(4, start_moves=0), None) == 0


@pytest.mark.asyncio
async def test_a_shard_acquired_at_a_position_of_an_earlier_start_scans_the_moved_one(
        tmp_path: Path) -> None:
    """Positions record the moves of the start they derive from: a member
    that acquires a shard whose position derives from a start the group has
    moved past re-pins it at the moved start and scans it, once; a position
    an operator wrote (reset: no moves recorded) is taken as it is."""
    wh = _six_commits_over_both_shards(tmp_path)
    url = f"sqlite://{tmp_path}/c.sqlite"

    def config(member: str) -> MemberConfig:
        return MemberConfig(group="d2b", warehouse=wh, table=TABLE, coordinator=url,
                            member_id=member, session_timeout_s=5, poll_interval_ms=50,
                            shards=2, on_data_loss="skip")

    first = GroupMember(config("first"), auto_commit=False)
    await first.start()
    got: Counter[int] = Counter()
    tasks = [asyncio.ensure_future(_consume(first, got))]
    try:
        await _until(lambda: set(got) >= set(range(60)))
        await _until(lambda: first.shard_positions() == {0: 7, 1: 7})
    finally:
        await _stop_consuming(tasks)
        await first.stop()
    assert first.shard_positions() == {} and set(got) == set(range(60))
    table = open_table(wh, TABLE)
    write_table(table, _rows(range(60, 70)))  # snapshot 7
    async with open_coordinator(url) as coord:
        client = GroupClient(coord, "d2b")
        stored = await read_group_start(client)
        assert stored is not None and stored.full_scan == 6
        # The group's start moved (as a member under skip moves it) to 7;
        # shard 1's position is an operator's reset to 8 (no moves recorded).
        moved = GroupStart(next_snapshot=8, full_scan=7, start=stored.start, moves=1,
                           moved_from=6)
        assert await move_group_start(client, 0, moved) == moved
        assert await GroupAdmin(client.coordinator, client.group).reset_positions({1: 8}, "test")
    got.clear()
    second = GroupMember(config("second"), auto_commit=False)
    await second.start()
    tasks = [asyncio.ensure_future(_consume(second, got))]
    try:
        await _until(lambda: second.shard_positions().get(0) == 8)
        await asyncio.sleep(1.0)  # a second re-pin, or a read of shard 1, would come now
    finally:
        await _stop_consuming(tasks)
        async with open_coordinator(url) as coord:
            positions = await GroupClient(coord, "d2b").positions()
        await second.stop()
    # Shard 0 scanned the moved start (its rows of snapshot 7, 0..69 held by
    # its files), once; shard 1 stayed at the reset position (nothing at 8).
    sharding = Sharding(ShardRule.FILE, 2)
    shard0 = [e for e in current_entries(table) if sharding.shard_of_entry(e) == 0]
    want = sum(e.file.row_count for e in shard0)
    assert sum(got.values()) == want and max(got.values(), default=1) == 1
    assert (positions[0].next_snapshot, positions[0].full_scan,
            positions[0].start_moves) == (8, None, 1)
    assert (positions[1].next_snapshot, positions[1].start_moves) == (8, None)


@pytest.mark.asyncio
async def test_a_driven_member_never_commits_an_end_of_an_earlier_start_over_a_repin(
        tmp_path: Path) -> None:
    """Issue 43: the Spark source's member. A batch planned before the group's
    start moved ends past the moved start's full scan; once the shard is
    re-pinned at it, that end is not committed over the re-pin (it would skip
    the scan), and the query's next batch starts from the re-pin, though its
    own end got further (positions advance by the start's moves first)."""
    from paimon_group.spark.source.offsets import Cursor, ShardRange, start_cursor

    wh = _six_commits_over_both_shards(tmp_path)
    url = f"sqlite://{tmp_path}/c.sqlite"
    member = GroupMember(MemberConfig(group="d2q", warehouse=wh, table=TABLE, coordinator=url,
                                      member_id="q", session_timeout_s=5, poll_interval_ms=50,
                                      shards=2, on_data_loss="skip", start="latest-full"),
                         auto_commit=False)
    await member.start()
    try:
        await _until(lambda: len(member.held_shards()) == 2)
        settled = await member.settle_positions()
        assert {s: (p.next_snapshot, p.full_scan, p.start_moves)
                for s, p in settled.items()} == {0: (7, 6, 0), 1: (7, 6, 0)}
        member.mark_busy([0, 1])  # a batch planned: the full scan of 6, to 7
        table = open_table(wh, TABLE)
        write_table(table, _rows(range(60, 70)))  # snapshot 7
        async with open_coordinator(url) as coord:
            client = GroupClient(coord, "d2q")
            moved = GroupStart(next_snapshot=8, full_scan=7, start="latest-full", moves=1,
                               moved_from=6)
            assert await move_group_start(client, 0, moved) == moved
        # The batch completes: its end commits (the shards were busy: no re-pin yet).
        assert await member.commit_positions({0: 7, 1: 7}, moves={0: 0, 1: 0}) == {0: True,
                                                                                   1: True}
        member.mark_idle([0, 1])
        await _until(lambda: member.group_start == moved)  # a control round
        settled = await member.settle_positions()  # re-pinned now: idle
        assert {s: (p.next_snapshot, p.full_scan, p.start_moves)
                for s, p in settled.items()} == {0: (8, 7, 1), 1: (8, 7, 1)}
        # An end of the earlier start (a batch planned to 9 before the move)
        # is refused; the stored positions keep the moved start's full scan.
        assert await member.commit_positions({0: 9, 1: 9}, moves={0: 0, 1: 0}) == {0: False,
                                                                                   1: False}
        async with open_coordinator(url) as coord:
            stored = await GroupClient(coord, "d2q").positions()
        assert {s: (p.next_snapshot, p.full_scan, p.start_moves) for s, p in stored.items()} \
            == {0: (8, 7, 1), 1: (8, 7, 1)}
        coordinator = Cursor(next=8, full=7, moves=1)
        assert start_cursor(coordinator, ShardRange(0, 1, 7, None, 9), 9, 0) == coordinator
        # An end of the moved start commits on.
        assert await member.commit_positions({0: 9}, moves={0: 1}) == {0: True}
    finally:
        await member.stop()


@pytest.mark.asyncio
@pytest.mark.parametrize("compacted_into", ["a", "b"])
async def test_a_compaction_across_a_moved_start_loses_nothing_with_a_loop_resumed(
        tmp_path: Path, compacted_into: str) -> None:
    """Issue 52, E1: the shape of the test above, the compacted file in
    either member's shard, and member a's ``async for`` over ``batches()``
    broken out of after its scan and entered again after the move, both
    members then reading for 10 s. Before the fix a's shard stayed at 7 and
    10 to 40 rows were never delivered: the wait for the next batch of the
    loop broken out of outlived it and took the next loop's first batch off
    the queue, never to yield nor finish it, so the shard waited for it for
    good (and was never re-pinned)."""
    wh = _six_commits_over_both_shards(tmp_path)

    def config(member: str) -> MemberConfig:
        return MemberConfig(group="e1", warehouse=wh, table=TABLE,
                            coordinator=f"sqlite://{tmp_path}/c.sqlite", member_id=member,
                            session_timeout_s=5, poll_interval_ms=50, shards=2,
                            on_data_loss="skip")

    a = GroupMember(config("a"), auto_commit=False)
    b = GroupMember(config("b"), auto_commit=False)
    await a.start()
    await b.start()
    got: Counter[int] = Counter()
    tasks: list[asyncio.Future[None]] = []
    try:
        await _until(lambda: len(a.owned_shards) == 1 and len(b.owned_shards) == 1)
        (shard_a,), (shard_b,) = a.owned_shards, b.owned_shards
        first = asyncio.ensure_future(_consume(a, got))
        await _until(lambda: a.shard_positions().get(shard_a) == 7)
        await _stop_consuming([first])  # a's loop broken out of after its scan
        into = shard_a if compacted_into == "a" else shard_b
        assert _compact_into_shard(wh, Sharding(ShardRule.FILE, 2), into) == 7
        table = open_table(wh, TABLE)
        for k in range(6, 10):
            await asyncio.sleep(0.5)
            write_table(table, _rows(range(10 * k, 10 * k + 10)))
        await asyncio.sleep(0.5)
        assert expire_like_paimon(wh, TABLE, keep_from=7)
        tasks.append(asyncio.ensure_future(_consume(b, got)))  # b finds 6 expired: moves
        await _until(lambda: (b.shard_positions().get(shard_b) or 0) >= 11)
        tasks.append(asyncio.ensure_future(_consume(a, got)))  # a's loop entered again
        await _until(lambda: set(got) >= set(range(100)), timeout_s=10)
        await asyncio.sleep(1)
    finally:
        await _stop_consuming(tasks)
        await a.stop()
        await b.stop()
    missing = sorted(set(range(100)) - set(got))
    assert not missing, f"{len(missing)} rows never delivered: {missing}"


@pytest.mark.asyncio
async def test_a_loop_over_batches_broken_out_of_and_entered_again_reads_on(
        tmp_path: Path) -> None:
    """Breaking out of ``async for batch in member.batches()`` and iterating
    again (as after a ``break`` or a cancelled task) delivers the next
    batches: none is taken by the earlier loop's wait (issue 52, E1)."""
    wh = _six_commits_over_both_shards(tmp_path)
    member = GroupMember(MemberConfig(group="again", warehouse=wh, table=TABLE,
                                      coordinator=f"sqlite://{tmp_path}/c.sqlite",
                                      member_id="a", session_timeout_s=5,
                                      poll_interval_ms=50, shards=1), auto_commit=False)
    await member.start()
    got: Counter[int] = Counter()
    try:
        for round_ in range(3):
            loop = asyncio.ensure_future(_consume(member, got))
            await _until(lambda n=60 + 10 * round_: set(got) >= set(range(n)))
            await _stop_consuming([loop])
            write_table(open_table(wh, TABLE), _rows(range(60 + 10 * round_,
                                                           70 + 10 * round_)))
        loop = asyncio.ensure_future(_consume(member, got))
        await _until(lambda: set(got) >= set(range(90)))
        await _stop_consuming([loop])
    finally:
        await member.stop()
    assert sorted(set(range(90)) - set(got)) == []
