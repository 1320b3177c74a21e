"""An idle read round is not run again while nothing it looked at changed
(paimon_group/member/idle_round.py), and a group of many tables' idle member
plans again as soon as its head names a new snapshot."""

from __future__ import annotations

import asyncio
import uuid
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from paimon_group import GroupMember, MemberConfig
from paimon_group.member.head import HeadRecord, HeadView
from paimon_group.member.idle_round import IdleRounds
from paimon_group.member.state import OwnedShard, OwnedShards, ShardState
from paimon_group.member.tables import MemberTables
from paimon_group.reading.batch import ShardBatch
from tests.support.tables import make_pk_table, write_rows
from tests.support.waiting import eventually


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _held(*positions: int) -> list[OwnedShard]:
    return [OwnedShard(shard=k, epoch=1, generation=1, next_snapshot=p, committed=p)
            for k, p in enumerate(positions)]


def test_a_round_is_skipped_only_while_what_it_looked_at_stands() -> None:
    clock = Clock()
    head = HeadView(stale_after_s=15.0, clock=clock)
    tables = MemberTables([], single=False)
    held = _held(5, 5, 7)
    rounds = IdleRounds()
    assert IdleRounds.key(tables, head) is None  # no head seen: poll the store
    head.observe(HeadRecord(None, 1, tables={0: 4}))
    key = IdleRounds.key(tables, head)
    assert key is not None and not rounds.skip(key, head)
    rounds.ran(key, held, looked_only=True)
    assert rounds.skip(IdleRounds.key(tables, head), head)
    assert IdleRounds.key(MemberTables([], single=False), head) != key  # a new map
    head.observe(HeadRecord(None, 2, tables={0: 5}))  # a new snapshot named
    assert not rounds.skip(IdleRounds.key(tables, head), head)
    rounds.ran(IdleRounds.key(tables, head), held, looked_only=True)
    head.observe(HeadRecord(None, 3, tables={0: 5}))  # a beat alone
    assert rounds.skip(IdleRounds.key(tables, head), head)
    clock.now += 15.0  # no beat: the head is stale, the store is asked
    assert not rounds.skip(IdleRounds.key(tables, head), head)
    # A round that planned forgets the key; one not skipped forgets it too.
    rounds.ran(key, held, looked_only=False)
    assert not rounds.skip(key, head)


def _each_change(held: list[OwnedShard], owned: OwnedShards) -> list[Callable[[], object]]:
    """Each kind of change a held shard or a held set sees."""
    def put() -> None:
        owned[9] = OwnedShard(shard=9, epoch=1, generation=1, next_snapshot=5)

    return [lambda: setattr(held[0], "next_snapshot", 6),
            lambda: setattr(held[1], "epoch", 2),
            lambda: setattr(held[2], "state", ShardState.REVOKING),
            lambda: setattr(held[0], "committed", 6),
            lambda: _held(5),  # a new ownership (of another member, even)
            put, lambda: owned.pop(9), put, lambda: owned.forget(owned[9]),
            lambda: owned.update({1: held[1]}), lambda: owned.setdefault(4, held[0]),
            owned.popitem, owned.clear]


def test_any_change_of_a_held_shard_or_of_the_held_set_changes_the_key() -> None:
    head = HeadView(stale_after_s=15.0, clock=Clock())
    head.observe(HeadRecord(None, 1, tables={0: 4}))
    tables = MemberTables([], single=False)
    held = _held(5, 5, 7)
    owned = OwnedShards({o.shard: o for o in held})
    rounds = IdleRounds()
    for change in _each_change(held, owned):
        key = IdleRounds.key(tables, head)
        rounds.skip(key, head)
        rounds.ran(key, held, looked_only=True)
        assert rounds.skip(IdleRounds.key(tables, head), head)
        change()
        assert IdleRounds.key(tables, head) != key
        assert not rounds.skip(IdleRounds.key(tables, head), head)


def test_a_round_with_more_to_do_than_look_keeps_no_key() -> None:
    head = HeadView(stale_after_s=15.0, clock=Clock())
    head.observe(HeadRecord(None, 1, tables={0: 4}))
    tables = MemberTables([], single=False)
    unresolved = _held(5)
    unresolved[0].next_snapshot = None
    full_scan = _held(5)
    full_scan[0].full_scan = 4
    unsure = _held(5)
    unsure[0].uncertain = True
    for held in (unresolved, full_scan, unsure):
        rounds = IdleRounds()
        key = IdleRounds.key(tables, head)
        rounds.ran(key, [*_held(5), *held], looked_only=True)
        assert not rounds.skip(IdleRounds.key(tables, head), head)
    tables.any_file_rule = True  # a start that can move: looked for in every round
    assert IdleRounds.key(tables, head) is None


@pytest.mark.asyncio
async def test_an_idle_member_of_many_tables_skips_its_rounds_and_reads_what_comes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One member holding every shard of four tables: idle, its rounds stop
    walking its shards; rows written then reach it through the head."""
    rounds: list[bool] = []  # each round run (not skipped): whether it only looked
    real = IdleRounds.ran

    def counting(self: IdleRounds, key: object, active: Sequence[OwnedShard], *,
                 looked_only: bool) -> None:
        rounds.append(looked_only)
        real(self, key, active, looked_only=looked_only)

    monkeypatch.setattr(IdleRounds, "ran", counting)
    wh = tmp_path / "wh"
    for i in range(4):
        make_pk_table(wh, f"shop.t{i}", buckets=2)
        write_rows(wh, f"shop.t{i}", range(i * 100, i * 100 + 10))
    seen: dict[str, list[int]] = defaultdict(list)

    def handle(batch: ShardBatch) -> None:
        seen[batch.table].extend(batch.to_arrow().column("id").to_pylist())

    member = GroupMember(MemberConfig(
        group="g", warehouse=str(wh), table="shop.*", member_id="m", start="earliest",
        coordinator=f"memory://idle-{uuid.uuid4().hex}", poll_interval_ms=50,
        forming_wait_s=0), handle_signals=False)
    async with member:
        run = asyncio.create_task(member.run(handle))
        try:
            await eventually(lambda: sum(map(len, seen.values())) >= 40, limit_s=60)
            await asyncio.sleep(0.5)
            rounds.clear()
            await asyncio.sleep(1.0)  # 20 poll intervals, idle
            assert len(rounds) <= 2, rounds  # the first after a beat, at most
            write_rows(wh, "shop.t3", range(310, 315))
            await eventually(lambda: len(seen["shop.t3"]) >= 15 or run.done(), limit_s=30)
            assert not run.done(), run.exception()
        finally:
            run.cancel()
            await asyncio.gather(run, return_exceptions=True)
    assert sorted(seen["shop.t3"]) == [*range(300, 310), *range(310, 315)]
