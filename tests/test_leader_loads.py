"""Unit tests of the leader's load policy (paimon_group/member/balance.py):
when loads are measured again, when a round may move shards for balance,
which shards still have their full scan ahead. The measurement is a stub
(the real one is tested in test_shard_load.py); the clock is the real one,
with a refresh interval of 0 or of an hour."""

from __future__ import annotations

import asyncio
import time

import pytest

from paimon_group.member.balance import LeaderLoads, full_scan_pending
from paimon_group.protocol.assignors import LOAD
from paimon_group.protocol.records import Assignment, GroupStart, Position
from paimon_group.reading.shard_load import MeasuredLoad
from paimon_group.reading.start import parse_start

MEMBERS = ["a", "b"]


def measured(live: tuple[int, ...], recent: tuple[int, ...]) -> MeasuredLoad:
    return MeasuredLoad(7, live, recent, time.monotonic())


class Measurer:
    def __init__(self, *results: tuple[MeasuredLoad, set[int]] | Exception | None) -> None:
        self.results = list(results)
        self.calls = 0

    async def __call__(self) -> tuple[MeasuredLoad, set[int]] | None:
        self.calls += 1
        result = self.results.pop(0)
        if isinstance(result, Exception):
            raise result
        return result


def published(shards: dict[str, list[int]]) -> Assignment:
    return Assignment(generation=1, leader="a", leader_epoch=1, shards=shards)


def test_without_a_measurement_the_count_assignor_decides() -> None:
    loads = LeaderLoads()
    wanted, used = loads.assign(LOAD, 4, MEMBERS, {}, None)
    assert wanted == {"a": [0, 1], "b": [2, 3]} and used == {}


def test_measured_at_most_once_per_interval_and_a_failure_keeps_the_last() -> None:
    first = measured((0, 0, 0, 0), (90, 5, 3, 2))
    measure = Measurer((first, set()), RuntimeError("store down"))
    hourly = LeaderLoads(refresh_s=3600.0)
    asyncio.run(hourly.refresh(measure))
    asyncio.run(hourly.refresh(measure))
    assert measure.calls == 1 and hourly.measured is first
    always = LeaderLoads(refresh_s=0.0)
    asyncio.run(always.refresh(Measurer((first, set()))))
    asyncio.run(always.refresh(measure))  # raises inside: logged, the last one kept
    assert always.measured is first


def test_loads_count_the_backlog_of_shards_whose_full_scan_is_ahead() -> None:
    loads = LeaderLoads(refresh_s=0.0)
    asyncio.run(loads.refresh(Measurer((measured((100, 0, 0, 0), (0, 10, 10, 10)), {0}))))
    wanted, used = loads.assign(LOAD, 4, MEMBERS, {}, None)
    assert used == {0: 100, 1: 10, 2: 10, 3: 10}
    assert wanted == {"a": [0], "b": [1, 2, 3]}


def test_balance_only_rounds_wait_for_a_newer_measurement() -> None:
    loads = LeaderLoads(refresh_s=0.0)
    before = {"a": [0, 1], "b": [2, 3]}
    asyncio.run(loads.refresh(Measurer((measured((0,) * 4, (1, 1, 1, 1)), set()))))
    assert loads.assign(LOAD, 4, MEMBERS, before, published(before))[0] == before
    loads.published()
    # The load shifts; the same members, nothing orphaned: no move until
    # the next measurement is taken.
    loads.measured = measured((0,) * 4, (50, 50, 1, 1))
    loads.published()  # as if it went out with the last assignment
    assert loads.assign(LOAD, 4, MEMBERS, before, published(before))[0] == before
    asyncio.run(loads.refresh(Measurer((measured((0,) * 4, (50, 50, 1, 1)), set()))))
    assert (loads.assign(LOAD, 4, MEMBERS, before, published(before))[0]
            == {"a": [1], "b": [0, 2, 3]})


def test_a_join_moves_at_once_even_with_the_published_measurement() -> None:
    loads = LeaderLoads(refresh_s=3600.0)
    asyncio.run(loads.refresh(Measurer((measured((0,) * 4, (10, 10, 10, 10)), set()))))
    loads.published()
    before = {"a": [0, 1, 2, 3]}
    wanted, _ = loads.assign(LOAD, 4, MEMBERS, before, published(before))
    assert wanted == {"a": [2, 3], "b": [0, 1]}  # ties: the lowest shard moves first


def test_a_different_shard_count_is_assigned_by_count() -> None:
    loads = LeaderLoads(refresh_s=0.0)
    asyncio.run(loads.refresh(Measurer((measured((0, 0), (5, 1)), set()))))
    assert loads.assign(LOAD, 4, MEMBERS, {}, None)[1] == {}


@pytest.mark.parametrize(("start", "start_text", "expected"), [
    (None, "latest-full", {1, 3}),
    (None, "earliest", {1, 3}),
    (None, "latest", {3}),
    (GroupStart(next_snapshot=5, full_scan=4, start="latest-full"), "latest", {1, 3}),
    (GroupStart(next_snapshot=5, full_scan=None, start="latest"), "latest-full", {3}),
])
def test_full_scan_pending(start: GroupStart | None, start_text: str,
                           expected: set[int]) -> None:
    positions = {
        0: Position(next_snapshot=9, epoch=1, member_id="a", committed_at=0.0),
        2: Position(next_snapshot=5, epoch=1, member_id="a", committed_at=0.0),
        3: Position(next_snapshot=5, epoch=1, member_id="a", committed_at=0.0, full_scan=4),
    }
    assert full_scan_pending(4, positions, start, parse_start(start_text)) == expected
