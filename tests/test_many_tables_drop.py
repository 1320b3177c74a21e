"""A table of a group of several dropped while the member reads it.

Its files go with it: a batch of it being read, or a step being planned,
meets a missing file; one re-created of another kind under its name fails
the plan of the old one's next snapshot. That table is no longer read (one
WARNING, its batch not committed); the member goes on with the group's
other tables.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from paimon_group import GroupMember, MemberConfig
from paimon_group.reading.batch import ShardBatch
from tests.support.tables import catalog, make_append_table, make_pk_table, write_rows
from tests.support.waiting import eventually

Seen = dict[str, list[int]]


def _member(tmp_path: Path, wh: Path, tables_refresh_s: float) -> GroupMember:
    """One member of group ``g`` over ``shop.*``, on an embedded coordinator."""
    return GroupMember(MemberConfig(
        group="g", warehouse=str(wh), table="shop.*",
        coordinator=f"sqlite://{tmp_path}/c.sqlite", member_id="m", start="earliest",
        poll_interval_ms=50, forming_wait_s=0, tables_refresh_s=tables_refresh_s),
        handle_signals=False)


def _shop(tmp_path: Path, *, append_b: bool, b_rows: int) -> Path:
    """A warehouse with ``shop.a`` (primary key, 2 buckets, ids 0-9) and ``shop.b``
    (append, 1 bucket, or primary key, 2 buckets; ``b_rows`` ids from 100)."""
    wh = tmp_path / "wh"
    make_pk_table(wh, "shop.a", buckets=2)
    if append_b:
        make_append_table(wh, "shop.b", buckets=1)
    else:
        make_pk_table(wh, "shop.b", buckets=2)
    write_rows(wh, "shop.a", range(10))
    write_rows(wh, "shop.b", range(100, 100 + b_rows))
    return wh


def _collecting(seen: Seen) -> Callable[[ShardBatch], None]:
    def handle(batch: ShardBatch) -> None:
        seen[batch.table].extend(batch.to_arrow().column("id").to_pylist())
    return handle


@contextlib.asynccontextmanager
async def _running(member: GroupMember, handle: Callable[[ShardBatch], None]
                   ) -> AsyncIterator[asyncio.Task[None]]:
    """``member`` started and running ``handle``; its run task, stopped at the end."""
    async with member:
        run = asyncio.create_task(member.run(handle))
        try:
            yield run
        finally:
            run.cancel()
            await asyncio.gather(run, return_exceptions=True)


@pytest.mark.asyncio
async def test_a_table_dropped_under_a_batch_being_read_stops_only_that_table(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    wh = tmp_path / "wh"
    make_pk_table(wh, "shop.a", buckets=2)
    make_append_table(wh, "shop.b", buckets=1)
    write_rows(wh, "shop.a", range(10))
    seen: Seen = defaultdict(list)
    collect = _collecting(seen)

    def handle(batch: ShardBatch) -> None:
        if batch.table == "shop.b" and batch.splits:
            catalog(wh).drop_table("shop.b")  # before its files are read
        collect(batch)

    member = _member(tmp_path, wh, tables_refresh_s=0.5)
    async with _running(member, handle) as run:
        await eventually(lambda: len(seen["shop.a"]) >= 10, limit_s=60)
        write_rows(wh, "shop.b", range(100, 105))
        await eventually(lambda: _dropped(member, "shop.b") or run.done(), limit_s=60)
        write_rows(wh, "shop.a", range(10, 15))
        await eventually(lambda: len(seen["shop.a"]) >= 15 or run.done(), limit_s=60)
        assert not run.done(), run.exception()
    assert sorted(seen["shop.a"]) == list(range(15))
    assert seen["shop.b"] == []
    assert "table shop.b was dropped" in caplog.text


@contextlib.asynccontextmanager
async def _all_read(tmp_path: Path, wh: Path, tables_refresh_s: float, *, b_rows: int
                    ) -> AsyncIterator[tuple[GroupMember, asyncio.Task[None], Seen]]:
    """The member of :func:`_shop`'s tables running, once it read their rows."""
    seen: Seen = defaultdict(list)
    member = _member(tmp_path, wh, tables_refresh_s=tables_refresh_s)
    async with _running(member, _collecting(seen)) as run:
        await eventually(lambda: len(seen["shop.a"]) >= 10 and len(seen["shop.b"]) >= b_rows,
                         limit_s=60)
        yield member, run, seen


def _dropped(member: Any, name: str) -> bool:
    meta = member.core.meta
    return bool(meta is not None and meta.tables is not None
                and not any(t.name == name for t in meta.tables.live()))


@pytest.mark.asyncio
async def test_a_table_dropped_under_a_step_being_planned_stops_only_that_table(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    wh = _shop(tmp_path, append_b=True, b_rows=5)
    async with _all_read(tmp_path, wh, 30, b_rows=5) as (member, run, seen):
        tables = member.core.tables
        assert tables is not None
        b = next(t for t in tables if t.name == "shop.b")

        def missing(*args: Any, **kwargs: Any) -> Any:
            raise FileNotFoundError("a manifest of shop.b")

        # Dropped between the listing of the catalog (every 30 s here)
        # and a plan that meets one of its files gone.
        catalog(wh).drop_table("shop.b")
        b.planner.plan_next = missing  # type: ignore[method-assign]
        write_rows(wh, "shop.a", range(10, 15))
        # Planned (or, while the group's head says it has nothing new,
        # checked in place within the table check's bound): stopped only.
        await eventually(lambda: (len(seen["shop.a"]) >= 15 and b.gone == "dropped")
                         or run.done(), limit_s=60)
        assert not run.done(), run.exception()
    assert sorted(seen["shop.a"]) == list(range(15))
    assert sorted(seen["shop.b"]) == list(range(100, 105))
    assert "table shop.b was dropped" in caplog.text


@pytest.mark.asyncio
async def test_a_table_re_created_of_another_kind_before_a_check_stops_only_that_table(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    wh = tmp_path / "wh"
    make_pk_table(wh, "shop.a", buckets=2)
    make_pk_table(wh, "shop.b", buckets=1)
    write_rows(wh, "shop.a", range(10))
    write_rows(wh, "shop.b", range(100, 105))
    seen: Seen = defaultdict(list)
    member = _member(tmp_path, wh, tables_refresh_s=30)
    async with _running(member, _collecting(seen)) as run:
        await eventually(lambda: len(seen["shop.a"]) >= 10 and len(seen["shop.b"]) >= 5,
                         limit_s=60)
        # Between two listings of the catalog (every 30 s here): the
        # member plans its old shop.b's next snapshot in the new one.
        catalog(wh).drop_table("shop.b")
        make_append_table(wh, "shop.b", buckets=-1)
        for k in range(3):
            write_rows(wh, "shop.b", range(200 + 10 * k, 205 + 10 * k))
        write_rows(wh, "shop.a", range(10, 15))
        old_b = next(t for t in member.core.tables or () if t.name == "shop.b")
        # Planned (or checked in place within the table check's bound).
        await eventually(lambda: (len(seen["shop.a"]) >= 15 and old_b.gone is not None)
                         or run.done(), limit_s=60)
        assert not run.done(), run.exception()
    assert sorted(seen["shop.a"]) == list(range(15))
    assert sorted(seen["shop.b"]) == list(range(100, 105)), "the new shop.b read as the old"
    # (found "dropped" by a check that came in the middle of the drop)
    assert re.search(r"table shop\.b was (re-created|dropped)", caplog.text)


@pytest.mark.asyncio
async def test_members_leave_table_checks_to_the_leader_until_it_finds_one_gone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """While the group's head says the leader's last check found a table in
    place, no member checks that table itself (one small read per table for
    the group, not one per member and table held). A table dropped: the
    leader's check leaves it out of the head, and the member reading it
    checks it itself and stops reading it, before any listing of the
    catalog has taken it out of the group's map."""
    import paimon_group.member.head as head
    import paimon_group.member.read_loop as read_loop
    import paimon_group.member.table_refresh as table_refresh
    from paimon_group.member.tables import MemberTable

    for module in (head, read_loop, table_refresh):
        monkeypatch.setattr(module, "TABLE_CHECK_S", 0.5)
    checked: list[str] = []
    real_in_place = MemberTable.in_place

    def in_place(self: MemberTable) -> bool:
        checked.append(self.name)
        return real_in_place(self)

    monkeypatch.setattr(MemberTable, "in_place", in_place)
    wh = _shop(tmp_path, append_b=False, b_rows=10)
    async with _all_read(tmp_path, wh, 3600.0, b_rows=10) as (member, run, seen):
        checked.clear()  # those before the head's first publication
        await asyncio.sleep(2.0)  # four checks due: the leader's each time
        assert checked == []
        catalog(wh).drop_table("shop.b")
        await eventually(lambda: "table shop.b was dropped" in caplog.text or run.done(),
                         limit_s=30)
        assert set(checked) == {"shop.b"}, checked
        assert not _dropped(member, "shop.b")  # no listing yet: the check found it
        write_rows(wh, "shop.a", range(10, 15))
        await eventually(lambda: len(seen["shop.a"]) >= 15 or run.done(), limit_s=60)
        assert not run.done(), run.exception()
    assert sorted(seen["shop.a"]) == list(range(15))
