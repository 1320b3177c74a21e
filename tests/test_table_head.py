"""One poll of the table per group (paimon_group/member/head.py): the leader
polls and publishes the latest snapshot id, members watch it and skip the
store while it is fresh, and poll by themselves when it is not."""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from pathlib import Path
from typing import Any

import pytest

from paimon_group.member import head
from paimon_group.member.head import HeadPublisher, HeadRecord, HeadView, TablePoll
from tests.support.s3_server import S3Warehouse


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_member_skips_the_store_only_while_the_head_is_fresh() -> None:
    clock = Clock()
    view = HeadView(stale_after_s=15.0, clock=clock)
    assert not view.nothing_new_at(1)  # nothing seen: poll the store
    assert view.observe(HeadRecord(latest=4, beat=1))  # a new latest: look now
    assert view.nothing_new_at(5) and not view.nothing_new_at(4)
    assert not view.observe(HeadRecord(latest=4, beat=1))  # read again: not a beat
    clock.now += 14.9
    assert view.nothing_new_at(5)
    clock.now += 0.2  # no beat for 15 s: the publisher may be gone
    assert not view.nothing_new_at(5)
    assert not view.observe(HeadRecord(latest=4, beat=2))  # a beat, nothing new
    assert view.nothing_new_at(5)
    assert view.observe(HeadRecord(latest=None, beat=1)) is False  # table emptied (re-created)
    assert view.nothing_new_at(1)


def test_the_record_found_at_a_sessions_start_is_not_trusted_until_it_beats() -> None:
    clock = Clock()
    view = HeadView(stale_after_s=15.0, clock=clock)
    view.observe(HeadRecord(latest=100, beat=77), beat=False)  # a gone leader's last word
    assert not view.nothing_new_at(101)
    view.observe(HeadRecord(latest=150, beat=1))  # the new leader's first publication
    assert view.nothing_new_at(151) and not view.nothing_new_at(150)
    view.forget()
    assert not view.nothing_new_at(151)


def test_the_leader_publishes_on_a_change_and_on_the_beat() -> None:
    clock = Clock()
    publisher = HeadPublisher(beat_s=5.0, clock=clock)
    first = publisher.due(3)
    assert first == HeadRecord(3, 1)
    publisher.done(first)
    assert publisher.due(3) is None
    changed = publisher.due(4)
    assert changed == HeadRecord(4, 2)
    publisher.done(changed)
    clock.now += 5.0
    assert publisher.due(4) == HeadRecord(4, 3)
    publisher.reset()
    assert publisher.due(4) == HeadRecord(4, 1)
    assert HeadRecord.decode(HeadRecord(None, 9).encode()) == HeadRecord(None, 9)
    assert HeadRecord.decode(b"{not json") is None


def test_the_head_carries_the_snapshot_text_and_the_table_identity() -> None:
    """The leader's poll reads a new latest snapshot's file once and checks the
    table every ``check_every_s``; what it found goes into the record, which
    old records (latest and beat only) still decode to."""
    from paimon_group.member.head import HEAD_SNAPSHOT_MAX, TablePoller

    clock = Clock()
    reads: list[int] = []
    checks: list[str] = []
    state = {"latest": 3, "id": "schema-0@1"}

    def text(sid: int) -> str:
        reads.append(sid)
        return "x" * (HEAD_SNAPSHOT_MAX + 1) if sid == 5 else f'{{"id": {sid}}}'

    def identity() -> str:
        checks.append(state["id"])
        return state["id"]

    poller = TablePoller(latest=lambda: state["latest"], snapshot_text=text, identity=identity,
                         check_every_s=5.0, clock=clock)
    assert poller.poll() == TablePoll(3, '{"id": 3}', "schema-0@1")
    assert poller.poll() == TablePoll(3, '{"id": 3}', "schema-0@1")
    assert reads == [3] and len(checks) == 1  # read once; checked once in 5 s
    state["latest"] = 4
    state["id"] = ""  # dropped: seen at the next check only
    assert poller.poll() == TablePoll(4, '{"id": 4}', "schema-0@1")
    clock.now += 5.0
    assert poller.poll() == TablePoll(4, '{"id": 4}', "")
    state["latest"] = 5  # a snapshot file too large to carry
    assert poller.poll() == TablePoll(5, None, "")
    assert poller.poll().snapshot is None and reads == [3, 4, 5]  # not read again

    publisher = HeadPublisher(beat_s=5.0, clock=clock)
    record = publisher.due(TablePoll(4, '{"id": 4}', "schema-0@1"))
    assert record is not None
    publisher.done(record)
    assert HeadRecord.decode(record.encode()) == record
    assert publisher.due(TablePoll(4, '{"id": 4}', "schema-0@1")) is None
    # A changed identity is published at once, not at the next beat.
    assert publisher.due(TablePoll(4, '{"id": 4}', "")) == HeadRecord(4, 2, '{"id": 4}', "")
    assert HeadRecord.decode(b'{"latest": 7, "beat": 2}') == HeadRecord(7, 2)
    # Manifests go with the publication of a new latest, not with the beats.
    clock.now += 10.0
    files = {"manifest-list-1": b"\x00list", "manifest-1": b"\x01m"}
    fresh = publisher.due(TablePoll(5, None, "", files))
    assert fresh is not None and fresh.files == files
    assert HeadRecord.decode(fresh.encode()) == fresh
    publisher.done(fresh)
    clock.now += 5.0
    beat = publisher.due(TablePoll(5, None, "", files))
    assert beat is not None and beat.files is None


def test_handed_over_files_are_read_from_memory_and_the_rest_from_the_store() -> None:
    from paimon_group.store.handed_over import HandedOverFileIO, HandedOverFiles

    class Store:
        def __init__(self) -> None:
            self.opened: list[str] = []

        def new_input_stream(self, path: str) -> Any:
            import pyarrow as pa

            self.opened.append(path)
            return pa.BufferReader(b"from the store")

    files = HandedOverFiles(kept=7)  # bytes
    files.add({"manifest-list-1": b"list", "manifest-1": b"one"})
    store = Store()
    io = HandedOverFileIO(store, files, "s3://b/t/manifest/")
    with io.new_input_stream("s3://b/t/manifest/manifest-1") as source:
        assert source.read() == b"one"
    with io.new_input_stream("s3://b/t/manifest/manifest-2") as source:
        assert source.read() == b"from the store"
    with io.new_input_stream("s3://b/other/manifest-1") as source:  # another directory
        assert source.read() == b"from the store"
    assert store.opened == ["s3://b/t/manifest/manifest-2", "s3://b/other/manifest-1"]
    files.add({"manifest-2": b"two"})  # over 7 bytes: the oldest goes
    assert files.get("manifest-list-1") is None and len(files) == 2
    files.add({"too-large": b"12345678"})  # larger than all that is kept: not kept
    assert files.get("too-large") is None and len(files) == 2
    # One read of a file for two threads asking at once.
    import threading

    reads: list[int] = []
    gate = threading.Event()

    def slow_read() -> bytes:
        reads.append(1)
        gate.wait(5)
        return b"m3"

    got: list[bytes] = []
    first = threading.Thread(target=lambda: got.append(files.fetch("manifest-3", slow_read)))
    first.start()
    while not reads:
        pass
    second = threading.Thread(target=lambda: got.append(files.fetch("manifest-3", slow_read)))
    second.start()
    gate.set()
    first.join(5)
    second.join(5)
    assert got == [b"m3", b"m3"] and reads == [1]


def test_a_member_skips_its_table_check_only_for_a_fresh_head_naming_its_table() -> None:
    clock = Clock()
    view = HeadView(stale_after_s=15.0, clock=clock)
    assert not view.vouches_for("schema-0@1")  # nothing seen
    view.observe(HeadRecord(4, 1, None, "schema-0@1"))
    assert view.vouches_for("schema-0@1")
    assert view.vouches_for("")  # a group of an older version: any table in place
    assert not view.vouches_for("schema-0@2")  # another table: check (and stop)
    view.observe(HeadRecord(4, 2, None, ""))  # the leader found it gone
    assert not view.vouches_for("schema-0@1") and not view.vouches_for("")
    view.observe(HeadRecord(4, 3, None, None))  # the leader could not check
    assert not view.vouches_for("schema-0@1")
    view.observe(HeadRecord(4, 4, None, "schema-0@1"))
    clock.now += 7.4
    assert view.vouches_for("schema-0@1")
    clock.now += 0.2  # no beat for 7.5 s: still fresh for reads, no longer for the table
    assert view.fresh and not view.vouches_for("schema-0@1")
    clock.now += 15.0  # no beat: stale
    assert not view.fresh and not view.vouches_for("schema-0@1")


def test_beats_of_an_unchanged_table_map_decode_to_the_same_map() -> None:
    """A beat of a group of many tables carries every table's latest id: the
    map of two beats with the same ids is decoded once (the same mapping),
    a changed one anew, and a malformed one still makes the record unreadable."""
    ids = {first * 8: first for first in range(200)}
    beat1 = HeadRecord.decode(HeadRecord(None, 1, tables=ids, tables_checked=True).encode())
    beat2 = HeadRecord.decode(HeadRecord(None, 2, tables=ids, tables_checked=True).encode())
    assert beat1 is not None and beat2 is not None and beat2.beat == 2
    assert beat1.tables == ids and beat2.tables is beat1.tables
    moved = HeadRecord.decode(HeadRecord(None, 3, tables={**ids, 8: 2}).encode())
    assert moved is not None and moved.tables is not None
    assert moved.tables[8] == 2 and moved.tables is not beat1.tables and beat1.tables[8] == 1
    assert HeadRecord.decode(b'{"latest": null, "beat": 4, "tables": {"0": "x"}}') is None
    assert HeadRecord.decode(b'{"latest": null, "beat": 4, "tables": {"y": 1}}') is None


def test_a_head_of_several_tables_vouches_for_those_its_leader_found_in_place() -> None:
    """A group of several tables: the leader's poll lists only the tables its
    last identity check found in place, and says so (``tables_checked``);
    a member skips its own check of a table only while the record is fresh
    for that (HEAD_VOUCH_S after the last beat) and lists the table."""
    clock = Clock()
    publisher = HeadPublisher(beat_s=5.0, clock=clock)
    polled = TablePoll(None, tables={0: 4, 8: None}, tables_checked=True)
    record = publisher.due(polled)
    assert record == HeadRecord(None, 1, tables={0: 4, 8: None}, tables_checked=True)
    assert HeadRecord.decode(record.encode()) == record
    publisher.done(record)
    # A check that finds a table gone changes the record at once.
    assert publisher.due(TablePoll(None, tables={0: 4}, tables_checked=True)) is not None
    # The same tables, polled by a leader that did not check: published too.
    unchecked = publisher.due(TablePoll(None, tables={0: 4, 8: None}))
    assert unchecked is not None and not unchecked.tables_checked
    # A record of a version that knows no check decodes as unchecked.
    assert HeadRecord.decode(b'{"latest": null, "beat": 2, "tables": {"0": 4}}') == \
        HeadRecord(None, 2, tables={0: 4})

    view = HeadView(stale_after_s=15.0, clock=clock)
    assert not view.vouches_for_table(0)  # nothing seen
    view.observe(record)
    assert view.vouches_for_table(0) and view.vouches_for_table(8)
    assert not view.vouches_for_table(16)  # not found in place, or not polled
    view.observe(HeadRecord(None, 2, tables={0: 4, 8: None}))  # the leader did not check
    assert not view.vouches_for_table(0)
    view.observe(HeadRecord(None, 3, tables={0: 4}, tables_checked=True))  # 8 found gone
    assert view.vouches_for_table(0) and not view.vouches_for_table(8)
    clock.now += 7.5  # no beat for HEAD_VOUCH_S: fresh for reads, not for the tables
    assert view.fresh and not view.vouches_for_table(0)


async def _group(s3: S3Warehouse, tmp_path: Path, members: int, ids: list[int],
                 measure_s: float, after: Any = None) -> tuple[dict[str, int], set[int]]:
    from paimon_group import GroupMember, MemberConfig

    got: set[int] = set()
    changed = asyncio.Event()
    started = []
    for i in range(members):
        cfg = MemberConfig(group="g", warehouse=s3.uri, table="db.t", member_id=f"m{i}",
                           coordinator=f"sqlite://{tmp_path}/c.sqlite",
                           catalog_options=s3.options, poll_interval_ms=100,
                           session_timeout_s=5.0, mirror_interval_s=3600.0)
        started.append(await GroupMember(cfg).__aenter__())

    async def consume(member: Any) -> None:
        async for batch in member.batches():
            got.update(batch.to_arrow().column("id").to_pylist())
            await member.commit(batch)
            changed.set()

    tasks = [asyncio.create_task(consume(m)) for m in started]

    async def until(n: int) -> None:
        while len(got) < n:
            changed.clear()
            await asyncio.wait_for(changed.wait(), 60)

    try:
        await until(len(ids))
        await asyncio.sleep(5.0)  # joins settled, the head published
        s3.server.reset_counts()
        await asyncio.sleep(measure_s)
        counts = s3.server.counts()
        counts["schema"] = s3.server.counts(contains="/schema/")["total"]
        if after is not None:
            await after(until)
    finally:
        for t in tasks:
            t.cancel()
        for m in started:
            await m.__aexit__(None, None, None)
    return counts, got


def test_a_group_of_four_polls_the_store_once_per_interval(s3_warehouse: S3Warehouse,
                                                          tmp_path: Path) -> None:
    """Idle, four members make about one request per poll interval between them
    (the leader's), not four, and check the table once per group (the
    leader's check, published with the head), not once per member; a new
    snapshot's file is read once for the group, not by every member that
    plans it; and it still reaches every shard."""
    from tests.support.tables import make_pk_table, write_rows

    def reads(table: str, needle: str) -> int:
        return sum(n for k, n in s3_warehouse.server.paths().items()
                   if k.startswith(("GET ", "GET_RANGE ")) and f"/{table}/{needle}" in k)

    # What the writer itself reads of the snapshot it commits, on a twin table.
    for name in ("db.t", "db.twin"):
        make_pk_table(s3_warehouse.uri, name, buckets=4)
        write_rows(s3_warehouse.uri, name, range(200))
    s3_warehouse.server.reset_counts()
    write_rows(s3_warehouse.uri, "db.twin", range(200, 300))
    writer_reads = {what: reads("twin", what) for what in ("snapshot/snapshot-2", "manifest/")}
    after: dict[str, int] = {}

    async def write_more(until: Any) -> None:
        s3 = s3_warehouse.server
        s3.reset_counts()
        await asyncio.to_thread(write_rows, s3_warehouse.uri, "db.t", range(200, 300))
        await until(300)
        await asyncio.sleep(0.5)
        after.update({what: reads("t", what) - writer_reads[what] for what in writer_reads})

    measure_s = 10.0
    counts, got = asyncio.run(_group(s3_warehouse, tmp_path, 4, list(range(200)), measure_s,
                                     write_more))
    assert got == set(range(300))
    polls = measure_s / 0.1
    # The leader's poll (one HEAD each) and one table check per group every
    # 5 s (2 requests each); four members polling on their own made 4 a poll.
    assert counts["total"] - counts["schema"] <= polls + 8, counts
    # The table check: 2 requests every 5 s for the group; four members
    # checking each on their own made 16 in 10 s.
    assert counts["schema"] <= 2 * (measure_s / 5 + 1), counts
    # Four members each planning the new snapshot read its file, its delta
    # manifest list and its manifest once each before (4 + 8): once for the
    # group now (the leader's head poll, which hands them over).
    assert after == {"snapshot/snapshot-2": 1, "manifest/": 2}, (after, writer_reads)


def test_members_poll_by_themselves_when_the_head_goes_stale(
        s3_warehouse: S3Warehouse, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A leader that stops publishing (here: its polls fail) leaves the head
    stale; the members then poll the table themselves and miss nothing."""
    from tests.support.tables import make_pk_table, write_rows

    monkeypatch.setattr(head, "HEAD_STALE_S", 1.0)
    make_pk_table(s3_warehouse.uri, "db.t", buckets=2)
    write_rows(s3_warehouse.uri, "db.t", range(50))

    async def broken_publish(self: Any, epoch: int) -> None:
        return None

    async def stop_publishing(until: Any) -> None:
        monkeypatch.setattr(head.HeadLoop, "_publish", broken_publish)
        await asyncio.sleep(1.5)
        await asyncio.to_thread(write_rows, s3_warehouse.uri, "db.t", range(50, 80))
        await until(80)

    _, got = asyncio.run(_group(s3_warehouse, tmp_path, 2, list(range(50)), 0.5,
                                stop_publishing))
    assert got == set(range(80))


def test_a_head_read_that_fails_is_read_again_without_a_new_watch_event() -> None:
    """Simulation seed 359: a follower's read of the head failed (the coordinator
    did not answer) after its watch had fired; nothing fired again, and the
    member kept a latest that was one snapshot old: three rows never read.
    Now the read is tried again at the next tick."""
    from coordinators.errors import CoordinatorUnavailable
    from paimon_group.member.head import HeadLoop
    from paimon_group.protocol.names import GroupKeys

    class Entry:
        def __init__(self, record: HeadRecord) -> None:
            self.value = record.encode()

    class Watch:
        def __init__(self) -> None:
            self.fired = [True]  # one change, then silence

        async def wait(self, timeout: float | None = None) -> bool:
            await asyncio.sleep(0)
            return self.fired.pop() if self.fired else False

        async def close(self) -> None:
            pass

    class Coordinator:
        def __init__(self) -> None:
            self.gets = 0

        def watch(self, prefix: str, *, values: bool = True,
                  children: Collection[str] | None = None) -> Watch:
            return Watch()

        async def get(self, key: str) -> Entry:
            self.gets += 1
            if self.gets == 1:  # at the session's start
                return Entry(HeadRecord(9, 7))
            if self.gets == 2:  # the read after the watch fired: snapshot 10 is out
                raise CoordinatorUnavailable("no answer")
            return Entry(HeadRecord(10, 8))

    view = HeadView(stale_after_s=15.0)
    woken: list[bool] = []

    async def latest() -> TablePoll:
        return TablePoll(None)

    async def go() -> None:
        loop = HeadLoop(Coordinator(), GroupKeys("g"), view, poll_s=0.01,  # type: ignore[arg-type]
                        poll=latest, leader_epoch=lambda: None,
                        woken=lambda: woken.append(True))
        task = asyncio.create_task(loop.run())
        await asyncio.sleep(0.1)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(go())
    assert view.record == HeadRecord(10, 8) and view.fresh
    assert woken  # the read loop was told
    assert view.nothing_new_at(11) and not view.nothing_new_at(10)


def test_a_stopped_head_loop_ends_without_being_cancelled() -> None:
    """Simulation seed 418: the cancel of the head loop's task was swallowed by
    ``asyncio.wait_for`` (Python 3.11) as the watch fired, and a member's stop
    waited for the loop until the run ended. ``stop()`` ends it at its next tick."""
    from paimon_group.member.head import HeadLoop
    from paimon_group.protocol.names import GroupKeys

    class Watch:
        async def wait(self, timeout: float | None = None) -> bool:
            await asyncio.sleep(timeout or 0)
            return False

        async def close(self) -> None:
            pass

    class Coordinator:
        def watch(self, prefix: str, *, values: bool = True,
                  children: Collection[str] | None = None) -> Watch:
            return Watch()

        async def get(self, key: str) -> None:
            return None

    async def latest() -> TablePoll:
        return TablePoll(None)

    async def go() -> None:
        loop = HeadLoop(Coordinator(), GroupKeys("g"), HeadView(), poll_s=0.01,  # type: ignore[arg-type]
                        poll=latest, leader_epoch=lambda: None, woken=lambda: None)
        task = asyncio.create_task(loop.run())
        await asyncio.sleep(0.05)
        loop.stop()
        await asyncio.wait_for(task, 1.0)

    asyncio.run(go())
