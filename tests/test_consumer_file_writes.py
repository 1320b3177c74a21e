"""A consumer file read while it is rewritten (issue 37, D3), on a real table.

A pending full scan is mirrored as ``{"nextSnapshot": F, "paimonGroupFullScan": F}``.
Rewritten in place (truncate, then write), a reader in between read ``''``
and fell back to pypaimon's ``Consumer.from_path``, which gives a plain
``nextSnapshot``: the shard resumed as follow-ups and lost the table's
content before ``F``. Files are written whole now, and a file that does not
parse is read again, then refused in one line, never taken as a plain
position."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from pypaimon.consumer.consumer import Consumer
from pypaimon.consumer.consumer_manager import ConsumerManager

from paimon_group.reading.mirror import ConsumerMirror, MirroredPosition, UnreadableConsumerFile
from tests.support.tables import make_pk_table, open_table


def _mirror(tmp_path: Path) -> tuple[Any, ConsumerMirror]:
    wh = str(tmp_path / "wh")
    make_pk_table(wh, "db.t", buckets=2)
    table: Any = open_table(wh, "db.t")
    return table, ConsumerMirror(table.file_io, table.table_path, "g", interval_s=0.0)


def _file(table: Any, shard: int) -> Path:
    return Path(table.table_path) / "consumer" / f"consumer-pg-g-shard-{shard}"


def test_a_reader_racing_a_rewriter_sees_the_old_or_the_new_value_with_its_marker(
        tmp_path: Path) -> None:
    """A writer rewrites a pending full scan's file (F = 5, then 6, then 5...)
    while a reader reads it, and Paimon's own listing lists the directory:
    every read is one of the two values with its marker; the listing never
    names a temporary file."""
    table, mirror = _mirror(tmp_path)
    mirror.write(0, 5, force=True, full_scan_pending=True)
    stop = threading.Event()
    writes = 0

    def rewrite() -> None:
        nonlocal writes
        while not stop.is_set():
            mirror.write(0, 5 + writes % 2, force=True, full_scan_pending=True)
            writes += 1

    seen: list[MirroredPosition | None] = []
    listed: set[str] = set()
    manager = ConsumerManager(table.file_io, table.table_path)
    writer = threading.Thread(target=rewrite)
    writer.start()
    try:
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            seen.append(mirror.read_position(0))
            listed.update(manager.list_all_ids())
    finally:
        stop.set()
        writer.join()
    assert writes > 100 and len(seen) > 10, (writes, len(seen))
    wrong = [p for p in seen if p is None or not p.full_scan_pending
             or p.next_snapshot not in (5, 6)]
    assert not wrong, f"{len(wrong)} of {len(seen)} reads: {wrong[:3]}"
    assert listed == {"pg-g-shard-0"}
    assert not [n for n in os.listdir(_file(table, 0).parent) if n.endswith(".tmp")]


def test_a_file_torn_while_it_is_read_keeps_its_full_scan(tmp_path: Path) -> None:
    """The file reads ``''`` (a writer of an older version truncated it), and
    is complete, with its marker, moments later: the read waits for it and
    keeps the full scan (before: the fallback read the completed file as a
    plain position, and the shard followed up from F)."""
    table, mirror = _mirror(tmp_path)
    path = _file(table, 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("")
    completed = threading.Timer(
        0.15, lambda: path.write_text('{"nextSnapshot": 2, "paimonGroupFullScan": 2}'))
    completed.start()
    try:
        assert mirror.read_position(0) == MirroredPosition(2, full_scan_pending=True)
    finally:
        completed.cancel()


@pytest.mark.parametrize("content", ["", '{"nextSnapshot": 2, "paimonGr', "[2]", "{}"])
def test_a_file_that_stays_torn_stops_the_shard_in_one_line(
        tmp_path: Path, content: str) -> None:
    """A file that does not parse however often it is read: its position is
    unknown, so it is neither a plain position nor no file (which would
    start the shard as configured): one line naming the shard and the file."""
    table, mirror = _mirror(tmp_path)
    path = _file(table, 1)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content)
    started = time.monotonic()
    with pytest.raises(UnreadableConsumerFile) as info:
        mirror.read_position(1)
    assert time.monotonic() - started < 2.0
    message = str(info.value)
    assert "\n" not in message and not info.value.retriable
    assert "shard 1" in message and str(path) in message and "--shard 1" in message


@pytest.mark.asyncio
async def test_a_member_resuming_a_shard_from_a_torn_file_stops_in_one_line(
        tmp_path: Path) -> None:
    """A group whose record and origin exist (created by a member that died
    before it committed a position), over a consumer file that reads ``''``:
    the member that acquires the shard stops with the one line, and delivers
    nothing of that shard (before: pypaimon's ``RuntimeError: Retry fail after
    10 times``, after 2 s)."""
    import asyncio

    from coordinators import open_coordinator
    from paimon_group import GroupMember, MemberConfig
    from paimon_group.protocol.group import GroupClient
    from paimon_group.protocol.identity import table_identity
    from paimon_group.reading.consumer_meta import ConsumerFilesOrigin
    from tests.support.tables import write_rows

    table, mirror = _mirror(tmp_path)
    wh = str(tmp_path / "wh")
    write_rows(wh, "db.t", range(20))
    url = f"sqlite://{tmp_path}/c.sqlite"
    async with open_coordinator(url) as coord:
        await GroupClient(coord, "g").ensure_meta(
            2, "db.t", sharding="bucket", incarnation="first", table_id=table_identity(table),
            warehouse=wh)
    ConsumerFilesOrigin("g", "first", 2, "bucket").write(table.file_io, table.table_path)
    mirror.write(1, 1, force=True, full_scan_pending=True)
    _file(table, 0).write_text("")
    got: list[tuple[int, int]] = []
    cfg = MemberConfig(group="g", warehouse=wh, table="db.t", member_id="m", coordinator=url,
                       session_timeout_s=5, poll_interval_ms=50)
    async with GroupMember(cfg) as member:
        with pytest.raises(UnreadableConsumerFile) as info:
            await asyncio.wait_for(member.run(lambda b: got.append((b.shard, b.snapshot_id))),
                                   60)
    message = str(info.value)
    assert "\n" not in message and "shard 0: consumer file" in message, message
    assert 0 not in {shard for shard, _ in got}


def test_a_position_carries_the_moves_of_its_start(tmp_path: Path) -> None:
    """The file records the moves of the group start its position derives
    from, and Paimon's own reader still reads its ``nextSnapshot``; a file
    without them (Paimon's layout, an operator's reset) reads as None."""
    from pypaimon.consumer.consumer_manager import ConsumerManager

    table, mirror = _mirror(tmp_path)
    assert mirror.write(0, 12, force=True, start_moves=0)
    assert mirror.read_position(0) == MirroredPosition(12, start_moves=0)
    assert mirror.write(1, 11, force=True, full_scan_pending=True, start_moves=1)
    assert mirror.read_position(1) == MirroredPosition(11, full_scan_pending=True, start_moves=1)
    assert mirror.write(2, 9, force=True)
    assert mirror.read_position(2) == MirroredPosition(9)
    # the same value with other moves is a new value: written
    assert mirror.write(0, 12, start_moves=1, force=True)
    assert mirror.read_position(0) == MirroredPosition(12, start_moves=1)
    manager = ConsumerManager(table.file_io, table.table_path)
    assert manager.consumer("pg-g-shard-0").next_snapshot == 12
    assert mirror.all() == {0: 12, 1: 11, 2: 9}


def test_a_groups_files_are_read_without_reading_the_others(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``all()`` reads this group's consumer files only: a table's directory
    also holds other groups' and other readers' (a new group's start vets
    its files in every table it reads)."""
    table, mirror = _mirror(tmp_path)
    assert mirror.write(0, 7, force=True) and mirror.write(3, 5, force=True)
    manager = ConsumerManager(table.file_io, table.table_path)
    for cid in ("pg-other-shard-0", "pg-g2-shard-1", "flink-job", "pg-g-shard-x"):
        manager.reset_consumer(cid, Consumer(next_snapshot=3))
    read: list[str] = []
    real = ConsumerManager.consumer

    def counted(self: ConsumerManager, cid: str) -> Any:
        read.append(cid)
        return real(self, cid)

    monkeypatch.setattr(ConsumerManager, "consumer", counted)
    assert mirror.all() == {0: 7, 3: 5}
    assert sorted(read) == ["pg-g-shard-0", "pg-g-shard-3"]
