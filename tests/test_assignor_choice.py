"""The group's assignors as objects (paimon_group/protocol/assignors.py): chosen
once by name from the group's record; the load assignor assigns by count
where loads cannot matter, and the leader's load policy (member/balance.py)
hands it what it measured."""

from __future__ import annotations

import time

import pytest

from coordinators.errors import ConfigError
from paimon_group.member.balance import LeaderLoads
from paimon_group.protocol.assignor import assign
from paimon_group.protocol.assignors import COUNT, LOAD, assignor_named
from paimon_group.protocol.load_assignor import assign_by_load
from paimon_group.reading.shard_load import MeasuredLoad

LOADS = {0: 90, 1: 5, 2: 3, 3: 2}


@pytest.mark.parametrize(("name", "chosen"), [
    ("load", LOAD), ("LOAD", LOAD), ("count", COUNT),
    # a group record stored before assignors could be chosen
    (None, COUNT), ("", COUNT),
])
def test_an_assignor_is_chosen_by_its_name(name: str | None, chosen: object) -> None:
    assert assignor_named(name) is chosen


def test_an_unknown_name_is_refused() -> None:
    with pytest.raises(ConfigError, match="unknown assignor"):
        assignor_named("round-robin")


def test_only_the_load_assignor_asks_for_loads() -> None:
    assert (COUNT.name, COUNT.needs_loads) == ("count", False)
    assert (LOAD.name, LOAD.needs_loads) == ("load", True)


@pytest.mark.parametrize("loads", [None, LOADS])
def test_the_count_assignor_never_looks_at_loads(loads: dict[int, int] | None) -> None:
    assert COUNT.assign(4, ["a", "b"], {}, loads=loads) == assign(4, ["a", "b"], {})


def test_the_load_assignor_balances_loads_when_every_shard_was_measured() -> None:
    assert LOAD.assign(4, ["a", "b"], {}, loads=LOADS) == assign_by_load(4, ["a", "b"], LOADS)
    assert LOAD.assign(4, ["a", "b"], {}, loads=LOADS) != assign(4, ["a", "b"], {})


@pytest.mark.parametrize(("members", "loads"), [
    # loads not measured, failed, or of another shard count (an empty table)
    (["a", "b"], None),
    # no member to assign to: nothing to balance
    ([], LOADS),
])
def test_the_load_assignor_assigns_by_count_where_loads_cannot_matter(
        members: list[str], loads: dict[int, int] | None) -> None:
    assert LOAD.assign(4, members, {}, loads=loads) == assign(4, members, {})


def test_the_load_policy_hands_the_assignor_what_was_measured() -> None:
    members = ["a", "b"]
    loads = LeaderLoads()
    # nothing measured: by count, no loads published
    assert loads.assign(LOAD, 4, members, {}, None) == (assign(4, members, {}), {})
    # a measurement of 3 shards for a group of 4: by count
    loads.measured = MeasuredLoad(7, (5, 5, 5), (0, 0, 0), time.monotonic())
    assert loads.assign(LOAD, 4, members, {}, None) == (assign(4, members, {}), {})
    # every shard measured: by load
    loads.measured = MeasuredLoad(7, (90, 5, 3, 2), (0, 0, 0, 0), time.monotonic())
    wanted, used = loads.assign(LOAD, 4, members, {}, None)
    assert set(used) == {0, 1, 2, 3}  # the loads it balanced
    assert sorted(s for m in wanted.values() for s in m) == [0, 1, 2, 3]
    # ... and the count assignor, given them, still assigns by count
    assert loads.assign(COUNT, 4, members, {}, None)[0] == assign(4, members, {})
