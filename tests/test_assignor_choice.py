"""Which assignor a leader's round uses (paimon_group/protocol/assignor.py,
``choose_assignor``), asked by the control loop before measuring and by the
leader's load policy (member/balance.py) with what it measured."""

from __future__ import annotations

import time

import pytest

from paimon_group.member.balance import LeaderLoads
from paimon_group.protocol.assignor import assign, choose_assignor
from paimon_group.reading.shard_load import MeasuredLoad


@pytest.mark.parametrize(("group_assignor", "members", "covered", "chosen"), [
    ("load", 2, True, "load"),
    ("load", 1, True, "load"),
    # no member to assign to: nothing to balance
    ("load", 0, True, "count"),
    # loads not measured, failed, or of another shard count (an empty table)
    ("load", 2, False, "count"),
    # a group created with the count assignor, or no group record read
    ("count", 2, True, "count"),
    ("count", 2, False, "count"),
    (None, 2, True, "count"),
])
def test_choose_assignor(group_assignor: str | None, members: int, covered: bool,
                         chosen: str) -> None:
    assert choose_assignor(group_assignor, members, loads_cover_shards=covered) == chosen


def test_before_measuring_only_the_group_and_its_members_decide() -> None:
    assert choose_assignor("load", 3) == "load"
    assert choose_assignor("count", 3) == choose_assignor("load", 0) == "count"


def test_the_load_policy_asks_it_with_what_was_measured() -> None:
    members = ["a", "b"]
    loads = LeaderLoads()
    # nothing measured: by count, no loads published
    assert loads.assign(4, members, {}, None) == (assign(4, members, {}), {})
    # a measurement of 3 shards for a group of 4: by count
    loads.measured = MeasuredLoad(7, (5, 5, 5), (0, 0, 0), time.monotonic())
    assert loads.assign(4, members, {}, None) == (assign(4, members, {}), {})
    # every shard measured: by load
    loads.measured = MeasuredLoad(7, (90, 5, 3, 2), (0, 0, 0, 0), time.monotonic())
    wanted, used = loads.assign(4, members, {}, None)
    assert set(used) == {0, 1, 2, 3}  # the loads it balanced
    assert sorted(s for m in wanted.values() for s in m) == [0, 1, 2, 3]
    # ... unless the group's record says count
    assert loads.assign(4, members, {}, None, group_assignor="count")[1] == {}
