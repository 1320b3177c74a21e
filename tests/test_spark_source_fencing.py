"""The source's stream reader without a Spark job: handoffs between planning and commit.

The reader's offset calls are plain Python (Spark calls them from the
source's driver process), so two readers in this process are two members of
one group, and a handoff can be placed exactly between a batch's planning
(``latestOffset``) and its commit.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.requirements import require
from tests.support.tables import make_pk_table, write_rows
from tests.support.waiting import wait_for as wait_until

pytestmark = pytest.mark.spark

if not os.environ.get("CI"):
    require("pyspark", "pip install '.[spark]' (tests/run.sh does)")

from paimon_group.spark.source import PaimonGroupStreamReader, SourceOptions  # noqa: E402
from paimon_group.spark.source.offsets import decode_offset  # noqa: E402


def reader(warehouse: Path, member: str, **extra: str) -> PaimonGroupStreamReader:
    return PaimonGroupStreamReader(SourceOptions.parse({
        "group": "g", "warehouse": str(warehouse), "table": "db.t", "member_id": member,
        "session_timeout_s": "4", "ready_timeout_s": "20", **extra}))


def stored_positions(warehouse: Path) -> dict[int, Any]:
    from coordinators.registry import open_coordinator
    from paimon_group.config.member import default_coordinator_url
    from paimon_group.protocol.group import GroupClient

    async def go() -> dict[int, Any]:
        async with open_coordinator(default_coordinator_url(str(warehouse))) as coord:
            return await GroupClient(coord, "g").positions()

    return asyncio.run(go())


def test_a_shard_revoked_between_planning_and_commit_is_not_committed_over_its_new_owner(
    tmp_path: Path,
) -> None:
    make_pk_table(tmp_path, "db.t", buckets=4)
    write_rows(tmp_path, "db.t", range(40))
    a = reader(tmp_path, "a", revoke_timeout_s="1", hold_timeout_s="1")
    b = reader(tmp_path, "b")
    try:
        end_a = a.latestOffset(a.initialOffset(), None)
        planned = decode_offset(end_a)
        assert sorted(planned) == [0, 1, 2, 3]  # alone: every shard, full scan of 1
        assert len(a.partitions(a.initialOffset(), end_a)) == 4
        # b joins while a's batch is in flight: two shards move to b. a's
        # revocation waits for the batch's commit (held), gives up after
        # revoke_timeout_s, and releases at the position the coordinator has.
        b.initialOffset()
        wait_until("the handoff", lambda: len(a.driver.member.owned_shards) == 2
                   and len(b.driver.member.owned_shards) == 2)
        moved = b.driver.member.owned_shards
        end_b = b.latestOffset(b.initialOffset(), None)
        b.commit(end_b)
        after_b = stored_positions(tmp_path)
        # a's late commit: its own shards move on, the moved ones stay b's.
        a.commit(end_a)
        after_a = stored_positions(tmp_path)
        for shard in moved:
            assert after_a[shard] == after_b[shard]
            assert after_a[shard].member_id == "b"
        for shard in a.driver.member.owned_shards:
            assert after_a[shard].member_id == "a"
            assert after_a[shard].next_snapshot == planned[shard].to
    finally:
        a.stop()
        b.stop()


def test_a_revocation_waits_for_the_commit_of_the_batch_in_flight(tmp_path: Path) -> None:
    make_pk_table(tmp_path, "db.t", buckets=4)
    write_rows(tmp_path, "db.t", range(40))
    a = reader(tmp_path, "a", revoke_timeout_s="60")
    b = reader(tmp_path, "b")
    try:
        end_a = a.latestOffset(a.initialOffset(), None)
        b.initialOffset()
        member_a = a.driver.member
        wait_until("the rebalance", lambda: member_a.assignment is not None
                   and len(member_a.assignment.shards_of("a")) == 2)
        # Published: a's revocation waits for the commit of the batch in flight.
        assert len(member_a.owned_shards) == 4
        a.commit(end_a)  # the batch in flight ends: the shards go, with its positions
        wait_until("the handoff", lambda: len(b.driver.member.owned_shards) == 2)
        positions = stored_positions(tmp_path)
        for shard in b.driver.member.owned_shards:
            assert positions[shard].next_snapshot == decode_offset(end_a)[shard].to
        # b continues after a's batch: nothing of it is planned again.
        end_b = b.latestOffset(b.initialOffset(), None)
        assert end_b == b.initialOffset() or all(r.empty for r in decode_offset(end_b).values())
    finally:
        a.stop()
        b.stop()


def test_a_revocation_waits_past_revoke_timeout_for_sparks_next_trigger(tmp_path: Path) -> None:
    """Issue 43, 3, in Spark's call order: a batch is planned, a rebalance
    comes, and Spark's next trigger (``latestOffset(end)``: the batch is
    complete) comes after ``revoke_timeout_s``. The shards stay held until
    then and go at the batch's end; before, they went after 1 s at its
    start, and the new owner read the batch again."""
    make_pk_table(tmp_path, "db.t", buckets=4)
    write_rows(tmp_path, "db.t", range(40))
    a = reader(tmp_path, "a", revoke_timeout_s="1")
    b = reader(tmp_path, "b")
    try:
        end_a = a.latestOffset(a.initialOffset(), None)
        b.initialOffset()
        member_a = a.driver.member
        wait_until("the rebalance", lambda: member_a.assignment is not None
                   and len(member_a.assignment.shards_of("a")) == 2)
        time.sleep(3.0)  # three revoke timeouts: the trigger has not come
        assert len(member_a.owned_shards) == 4
        assert a.latestOffset(end_a, None) == end_a  # the next trigger: nothing new
        wait_until("the handoff", lambda: len(b.driver.member.owned_shards) == 2)
        positions = stored_positions(tmp_path)
        for shard in b.driver.member.owned_shards:
            assert positions[shard].next_snapshot == decode_offset(end_a)[shard].to
            assert positions[shard].full_scan is None
    finally:
        a.stop()
        b.stop()


def test_a_column_added_while_the_query_runs_is_not_read_until_it_restarts(
    tmp_path: Path,
) -> None:
    from paimon_group.spark.source import PaimonGroupDataSource
    from tests.test_schema_change import _add_column, _write_with_extra

    make_pk_table(tmp_path, "db.t", buckets=2)
    write_rows(tmp_path, "db.t", range(10))
    source = PaimonGroupDataSource({"group": "g", "warehouse": str(tmp_path), "table": "db.t",
                                    "member_id": "a", "metadata_columns": "true"})
    schema = source.schema()  # fixed when the query is defined
    stream = source.streamReader(schema)
    assert isinstance(stream, PaimonGroupStreamReader)
    try:
        start = stream.initialOffset()
        _add_column(str(tmp_path), "db.t")
        _write_with_extra(str(tmp_path), "db.t", range(10, 20))
        end = stream.latestOffset(start, None)
        batches = [b for p in stream.partitions(start, end) for b in stream.read(p)]
        assert {tuple(b.schema.names) for b in batches} == {tuple(schema.fieldNames())}
        assert sorted(i for b in batches for i in b.column("id").to_pylist()) == list(range(20))
    finally:
        stream.stop()


def test_a_checkpoint_of_an_earlier_incarnation_does_not_move_the_new_groups_positions(
    tmp_path: Path,
) -> None:
    """Issue 21, a suspected case, real: a query restarted with the checkpoint
    of a group that was deleted and re-created under the same name (another
    start pin) committed its old offsets into the new group, forward, and
    started from them: the new group's full scan was skipped."""
    from coordinators.registry import open_coordinator
    from paimon_group.config.member import default_coordinator_url
    from paimon_group.protocol.admin import GroupAdmin
    from paimon_group.reading.mirror import ConsumerMirror
    from tests.support.tables import open_table

    make_pk_table(tmp_path, "db.t", buckets=2)
    for k in range(5):
        write_rows(tmp_path, "db.t", range(10 * k, 10 * k + 10))
    old = reader(tmp_path, "q")
    try:
        old_end = old.latestOffset(old.initialOffset(), None)
        old.commit(old_end)
        old_end = old.latestOffset(old_end, None)  # nothing new: the same offset
    finally:
        old.stop()
    assert {r.to for r in decode_offset(old_end).values()} == {6}

    async def delete_and_recreate() -> None:
        # As `paimon-group delete` does: the coordinator's keys and the
        # group's consumer files.
        async with open_coordinator(default_coordinator_url(str(tmp_path))) as coord:
            assert await GroupAdmin(coord, "g").delete_all()
        table = open_table(tmp_path, "db.t")
        ConsumerMirror(table.file_io, table.table_path, "g").delete_all()

    asyncio.run(delete_and_recreate())
    new = reader(tmp_path, "q", start="earliest")   # the new group: a full scan of 1
    try:
        new.initialOffset()
        end = new.latestOffset(old_end, None)   # Spark hands it the old checkpoint's end
        ranges = decode_offset(end)
        assert {r.full for r in ranges.values()} == {1}, ranges
        assert all(p.next_snapshot == 2 and p.full_scan == 1
                   for p in stored_positions(tmp_path).values())
        assert end.get("group") == new.driver.incarnation != ""
    finally:
        new.stop()


def recreate_group(warehouse: Path) -> None:
    """Delete group g as `paimon-group delete` does (the coordinator's keys
    and the group's consumer files); the next member creates it anew."""
    from coordinators.registry import open_coordinator
    from paimon_group.config.member import default_coordinator_url
    from paimon_group.protocol.admin import GroupAdmin
    from paimon_group.reading.mirror import ConsumerMirror
    from tests.support.tables import open_table

    async def delete() -> None:
        async with open_coordinator(default_coordinator_url(str(warehouse))) as coord:
            assert await GroupAdmin(coord, "g").delete_all()
        table = open_table(warehouse, "db.t")
        ConsumerMirror(table.file_io, table.table_path, "g").delete_all()

    asyncio.run(delete())


def test_a_commit_of_an_earlier_incarnations_offset_does_not_move_the_new_groups_positions(
    tmp_path: Path,
) -> None:
    """Issue 43, 1: restarted from its checkpoint after the group was deleted
    and re-created, a query gets Spark's calls in Spark's order:
    ``latestOffset(old_end)`` (rightly ignored: a full scan of 1 is planned),
    then ``commit(old_end)`` for the batch before the restart. That commit
    must be ignored too: writing 6 over the pinned full scan lost snapshots
    2-5 (to this query, one snapshot a batch, and to any member)."""
    make_pk_table(tmp_path, "db.t", buckets=2)
    for k in range(5):
        write_rows(tmp_path, "db.t", range(10 * k, 10 * k + 10))
    old = reader(tmp_path, "q")
    try:
        old_end = old.latestOffset(old.initialOffset(), None)
        old.commit(old_end)
    finally:
        old.stop()
    assert {r.to for r in decode_offset(old_end).values()} == {6}
    recreate_group(tmp_path)
    new = reader(tmp_path, "q", start="earliest", max_snapshots_per_batch="1")
    read: dict[int, list[int]] = {}
    try:
        new.initialOffset()
        start, end = old_end, new.latestOffset(old_end, None)
        new.commit(old_end)  # Spark commits the previous batch once the next is planned
        pinned = stored_positions(tmp_path)
        assert {(p.full_scan, p.next_snapshot) for p in pinned.values()} == {(1, 2)}, pinned
        while end != start:
            if start is not old_end:
                new.commit(start)
            for part in new.partitions(start, end):
                read.setdefault(part.shard, []).extend(p.snapshot for p in part.pieces)
            start, end = end, new.latestOffset(end, None)
    finally:
        new.stop()
    assert read == {0: [1, 2, 3, 4, 5], 1: [1, 2, 3, 4, 5]}, read
    assert {p.next_snapshot for p in stored_positions(tmp_path).values()} == {6}
