"""Unit tests of the load-aware assignor: examples, properties and random churn.

The properties are checked against references written here: the repaired
previous (from the count assignor's own reference in test_assignor), a plain
sum of member loads, and for balance the bound greedy placement guarantees
(max member load <= mean + heaviest shard).
"""

from __future__ import annotations

import doctest
import random
import time
from collections.abc import Mapping, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from coordinators.errors import ConfigError, CorruptValue
from paimon_group.config.member import MemberConfig
from paimon_group.protocol import load_assignor
from paimon_group.protocol.assignor import assign, moves
from paimon_group.protocol.load_assignor import assign_by_load, member_loads, move_cap
from paimon_group.protocol.records import Assignment as AssignmentRecord
from paimon_group.protocol.records import GroupMeta
from tests.test_assignor import check_valid, repaired

Assignment = Mapping[str, Sequence[int]]
Loads = dict[int, int]


def orphaned(num_shards: int, members: Sequence[str], previous: Assignment | None) -> int:
    """Shards no live member may keep: these always move."""
    kept = sum(len(s) for s in repaired(num_shards, members, previous).values())
    return num_shards - kept if members else 0


def check_all(
    num_shards: int, members: Sequence[str], loads: Loads, previous: Assignment | None,
    share: float = 0.25,
) -> dict[str, list[int]]:
    result = assign_by_load(num_shards, members, loads, previous, max_move_share=share)
    check_valid(num_shards, members, result)
    repair = repaired(num_shards, members, previous)
    moved = moves(repair, result)
    cap = move_cap(num_shards, share, newcomers=sum(1 for s in repair.values() if not s),
                   members=len(repair))
    assert len(moved) <= cap + orphaned(num_shards, members, previous)
    if any(loads.get(s, 0) for s in range(num_shards)):
        # Balancing moves go between live members only; every other move
        # is the placement of a shard nobody kept.
        held = {s for shards in repair.values() for s in shards}
        balancing = [s for s in moved if s in held]
        assert len(balancing) <= cap
    return result


def settle(num_shards: int, members: Sequence[str], loads: Loads,
           previous: Assignment | None = None) -> dict[str, list[int]]:
    """Rebalance until nothing moves (each round capped); the rounds are bounded."""
    current = check_all(num_shards, members, loads, previous)
    for _ in range(4 * num_shards + 2):
        nxt = check_all(num_shards, members, loads, current)
        if nxt == current:
            return current
        current = nxt
    raise AssertionError("the assignment never settled")


def max_over_mean(assignment: Assignment, loads: Loads) -> float:
    per = member_loads(assignment, loads)
    mean = sum(per.values()) / len(per)
    return max(per.values()) / mean


# --------------------------------------------------------------------------
# Examples.
# --------------------------------------------------------------------------


def test_module_docstring_examples_run() -> None:
    failures, tried = doctest.testmod(load_assignor, raise_on_error=False)
    assert tried > 10
    assert failures == 0


def test_hot_partition_is_spread_one_hot_shard_per_member() -> None:
    # 16 shards; 4 hot ones (a partition with 80% of the rows, 4 buckets)
    # and 12 cold ones. Count balance puts two hot shards on one member.
    loads = {s: (200 if s in (0, 1, 4, 5) else 17) for s in range(16)}
    by_count = assign(16, ["a", "b", "c", "d"])
    assert max_over_mean(by_count, loads) > 1.5
    by_load = check_all(16, ["a", "b", "c", "d"], loads, None)
    assert max_over_mean(by_load, loads) <= 1.05
    assert all(len({0, 1, 4, 5} & set(s)) == 1 for s in by_load.values())


def test_from_a_count_assignment_moves_at_most_the_cap_per_round() -> None:
    loads = {s: (200 if s < 4 else 17) for s in range(16)}
    before = assign(16, ["a", "b", "c", "d"])  # a holds all four hot shards
    first = check_all(16, ["a", "b", "c", "d"], loads, before)
    assert 0 < len(moves(before, first)) <= 4
    final = settle(16, ["a", "b", "c", "d"], loads, before)
    assert max_over_mean(final, loads) <= 1.2


def test_a_joining_member_gets_its_share_in_one_rebalance() -> None:
    loads = {s: 10 + s for s in range(16)}
    alone = check_all(16, ["a"], loads, None)
    joined = check_all(16, ["a", "b"], loads, alone)
    assert len(moves(alone, joined)) == 6  # fewer than the 8 the count assignor moves
    assert max_over_mean(joined, loads) <= 1.05
    # No newcomer: the share caps the moves (4 of 16), here from a count
    # assignment that gave "a" the light half.
    skewed = {s: (1 if s < 8 else 30) for s in range(16)}
    by_count = assign(16, ["a", "b"])
    assert len(moves(by_count, check_all(16, ["a", "b"], skewed, by_count))) == 4


def test_an_exchange_when_no_single_move_gains() -> None:
    loads = {0: 10, 1: 10, 2: 6, 3: 6}
    before = {"a": [0, 1], "b": [2, 3]}  # 20 and 12: moving a 10 leaves 22 on "b"
    after = check_all(4, ["a", "b"], loads, before, share=0.5)
    assert after == {"a": [1, 2], "b": [0, 3]}  # 16 and 16, two moves
    # A cap of one move cannot make an exchange.
    assert check_all(4, ["a", "b"], loads, before, share=0.25) == before


def test_small_differences_move_nothing() -> None:
    loads = {0: 100, 1: 100, 2: 100, 3: 104}
    before = {"a": [0, 1], "b": [2, 3]}
    # Moving anything gains at most 0 < threshold 5% of the mean (202).
    assert check_all(4, ["a", "b"], loads, before) == before
    # Ten shards of 1 row: a move from "a" (6) to "b" (4) gains 1 row, 20% of
    # the mean (5): made at threshold 0.05, not at 0.25.
    ones = dict.fromkeys(range(10), 1)
    uneven = {"a": [0, 1, 2, 3, 4, 5], "b": [6, 7, 8, 9]}
    assert assign_by_load(10, ["a", "b"], ones, uneven, threshold=0.25) == uneven
    assert assign_by_load(10, ["a", "b"], ones, uneven) == {
        "a": [1, 2, 3, 4, 5], "b": [0, 6, 7, 8, 9]}


def test_zero_share_places_orphans_only() -> None:
    loads = {0: 90, 1: 5, 2: 5, 3: 5}
    before = {"a": [0, 1, 2], "gone": [3]}
    result = check_all(4, ["a", "b"], loads, before, share=0.0)
    assert result == {"a": [0, 1, 2], "b": [3]}


def test_all_zero_loads_fall_back_to_count() -> None:
    before = {"a": [0, 1, 2, 3]}
    assert assign_by_load(4, ["a", "b"], {0: 0}, before) == assign(4, ["a", "b"], before)


def test_zero_load_shards_spread_by_count_among_the_least_loaded() -> None:
    result = check_all(6, ["a", "b", "c"], {0: 10}, None)
    assert result == {"a": [0], "b": [1, 3, 5], "c": [2, 4]}


def test_no_members_and_no_shards() -> None:
    assert assign_by_load(4, [], {0: 1}) == {}
    assert assign_by_load(0, ["a"], {}) == {"a": []}


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"threshold": -0.1}, "invalid load threshold"),
    ({"threshold": float("nan")}, "invalid load threshold"),
    ({"max_move_share": 1.5}, "invalid move share"),
    ({"max_move_share": True}, "invalid move share"),
])
def test_bad_options_are_one_clear_error(kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        assign_by_load(4, ["a"], {0: 1}, **kwargs)


@pytest.mark.parametrize("bad", [-1, float("inf"), "3", None])
def test_bad_loads_are_one_clear_error(bad: object) -> None:
    with pytest.raises(ConfigError, match=r"invalid load .* of shard 2"):
        assign_by_load(4, ["a"], {0: 1, 2: bad})  # type: ignore[dict-item]


def test_bad_shard_count_is_the_count_assignors_error() -> None:
    with pytest.raises(ConfigError, match="invalid shard count"):
        assign_by_load(-1, ["a"], {})


def test_group_record_keeps_its_assignor_and_old_records_are_count() -> None:
    old = b'{"created_at":1.0,"format":1,"num_shards":4,"table":"db.t"}'
    assert GroupMeta.decode("k", old).assignor == "count"
    new = GroupMeta(num_shards=4, table="db.t", created_at=1.0, assignor="load")
    assert GroupMeta.decode("k", new.encode()).assignor == "load"
    with pytest.raises(CorruptValue, match="unknown assignor 'nope'"):
        GroupMeta.decode("k", old.replace(b'"table"', b'"assignor":"nope","table"'))


def test_assignment_record_carries_loads_and_old_records_have_none() -> None:
    old = b'{"generation":3,"leader":"a","leader_epoch":7,"shards":{"a":[0,1]}}'
    assert AssignmentRecord.decode("k", old).loads == []
    new = AssignmentRecord(generation=3, leader="a", leader_epoch=7, shards={"a": [0, 1]},
                           loads=[90, 10])
    assert AssignmentRecord.decode("k", new.encode()).loads == [90, 10]


def test_member_config_parses_the_assignor_in_one_line() -> None:
    base = {"group": "g", "warehouse": "/tmp/wh", "table": "db.t"}
    assert MemberConfig(**base, assignor="LOAD").assignor == "load"
    assert MemberConfig(**base).assignor is None
    with pytest.raises(ConfigError, match="unknown assignor 'rr': use one of count, load"):
        MemberConfig(**base, assignor="rr")


# --------------------------------------------------------------------------
# Properties.
# --------------------------------------------------------------------------

POOL = [f"m{i}" for i in range(10)] + ["A", "z.9"]
member_lists = st.lists(st.sampled_from(POOL), max_size=12)


@st.composite
def skewed_loads(draw: st.DrawFn, num_shards: int) -> Loads:
    """Zipf-like: a few shards carry most rows, many carry few or none."""
    kind = draw(st.sampled_from(["zipf", "hot", "uniform", "sparse"]))
    rnd = random.Random(draw(st.integers(0, 2**32)))
    if kind == "zipf":
        return {s: int(10_000 / (1 + rnd.randrange(num_shards or 1))) for s in range(num_shards)}
    if kind == "hot":
        return {s: (rnd.randint(500, 1000) if rnd.random() < 0.2 else rnd.randint(0, 50))
                for s in range(num_shards)}
    if kind == "uniform":
        return {s: rnd.randint(0, 100) for s in range(num_shards)}
    return {s: rnd.randint(1, 10**6) for s in range(num_shards) if rnd.random() < 0.3}


@st.composite
def any_cases(draw: st.DrawFn) -> tuple[int, list[str], Loads, dict[str, list[int]] | None]:
    num_shards = draw(st.integers(0, 48))
    members = draw(member_lists)
    loads = draw(skewed_loads(num_shards))
    shards = st.lists(st.integers(-2, num_shards + 3), max_size=num_shards + 3)
    previous = draw(st.none() | st.dictionaries(st.sampled_from(POOL), shards, max_size=8))
    return num_shards, members, loads, previous


@settings(max_examples=300, deadline=None)
@given(any_cases(), st.sampled_from([0.0, 0.1, 0.25, 1.0]))
def test_property_valid_and_moves_bounded(
    case: tuple[int, list[str], Loads, dict[str, list[int]] | None], share: float,
) -> None:
    num_shards, members, loads, previous = case
    check_all(num_shards, members, loads, previous, share)


@settings(max_examples=200, deadline=None)
@given(any_cases(), st.randoms(use_true_random=False))
def test_property_deterministic_under_permutation(
    case: tuple[int, list[str], Loads, dict[str, list[int]] | None], rnd: random.Random,
) -> None:
    num_shards, members, loads, previous = case
    expected = assign_by_load(num_shards, members, loads, previous)
    shuffled = list(members)
    rnd.shuffle(shuffled)
    load_items = list(loads.items())
    rnd.shuffle(load_items)
    shuffled_previous = None
    if previous is not None:
        items = [(m, rnd.sample(list(s), len(s))) for m, s in previous.items()]
        rnd.shuffle(items)
        shuffled_previous = dict(items)
    got = assign_by_load(num_shards, shuffled, dict(load_items), shuffled_previous)
    assert got == expected


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 8), st.integers(8, 96), st.integers(0, 2**32))
def test_property_balance_where_achievable(members: int, per_member: int, seed: int) -> None:
    """Greedy placement bounds the max member load by mean + heaviest shard;
    with shards no heavier than a fifth of the mean, max/mean <= 1.2, from a
    fresh group and after settling from a count assignment."""
    rnd = random.Random(seed)
    num_shards = members * per_member // 4 + members
    loads = {s: rnd.choice([1, 1, 2, 5, 40]) * rnd.randint(1, 100) for s in range(num_shards)}
    ids = [f"w{i}" for i in range(members)]
    mean = sum(loads.values()) / members
    fresh = check_all(num_shards, ids, loads, None)
    assert max(member_loads(fresh, loads).values()) <= mean + max(loads.values())
    if max(loads.values()) <= 0.2 * mean:
        assert max_over_mean(fresh, loads) <= 1.2
        assert max_over_mean(settle(num_shards, ids, loads, assign(num_shards, ids)),
                             loads) <= 1.2


# --------------------------------------------------------------------------
# Churn: joins, leaves and load shifts, each round checked against the last.
# --------------------------------------------------------------------------


def churn(seed: int, steps: int) -> None:
    rnd = random.Random(seed)
    num_shards = rnd.choice([1, 4, 16, 64, 256])
    loads = {s: int(1000 / (1 + rnd.randrange(num_shards))) for s in range(num_shards)}
    members: list[str] = []
    current: dict[str, list[int]] | None = None
    next_id = 0
    for _ in range(steps):
        action = rnd.random()
        if not members or (action < 0.4 and len(members) < 24):
            members.append(f"w{next_id}")
            next_id += 1
        elif action < 0.75:
            members.remove(rnd.choice(members))
        elif action < 0.9:
            hot = rnd.randrange(num_shards)  # the load moves to another shard
            loads[hot] = loads[hot] * 10 + 100
        current = check_all(num_shards, members, loads, current)


@pytest.mark.parametrize("seed", range(10))
def test_random_churn(seed: int) -> None:
    churn(seed, steps=120)


class LoadChurnMachine(RuleBasedStateMachine):
    """Hypothesis drives joins, leaves and load shifts; every step is checked
    against the last (valid, moves within the cap plus the orphaned shards)."""

    def __init__(self) -> None:
        super().__init__()
        self.num_shards = 1
        self.loads: Loads = {}
        self.members: list[str] = []
        self.current: dict[str, list[int]] | None = None
        self.next_id = 0

    @initialize(num_shards=st.integers(1, 256), seed=st.integers(0, 2**32))
    def start(self, num_shards: int, seed: int) -> None:
        self.num_shards = num_shards
        rnd = random.Random(seed)
        self.loads = {s: int(1000 / (1 + rnd.randrange(num_shards))) for s in range(num_shards)}

    def step(self) -> None:
        self.current = check_all(self.num_shards, self.members, self.loads, self.current)

    @precondition(lambda self: len(self.members) < 32)
    @rule(count=st.integers(1, 4))
    def join(self, count: int) -> None:
        for _ in range(count):
            self.members.append(f"j{self.next_id}")
            self.next_id += 1
        self.step()

    @precondition(lambda self: len(self.members) > 0)
    @rule(data=st.data())
    def leave(self, data: st.DataObject) -> None:
        gone = data.draw(st.lists(st.sampled_from(self.members), min_size=1, unique=True))
        self.members = [m for m in self.members if m not in gone]
        self.step()

    @rule(data=st.data())
    def shift(self, data: st.DataObject) -> None:
        """The rows move: one shard gets hot, another goes quiet."""
        hot = data.draw(st.integers(0, self.num_shards - 1))
        cold = data.draw(st.integers(0, self.num_shards - 1))
        self.loads[hot] = self.loads.get(hot, 0) * 5 + 500
        self.loads[cold] = 0
        self.step()

    @invariant()
    def members_match(self) -> None:
        if self.current is not None:
            assert list(self.current) == sorted(self.members)


TestLoadChurnMachine = LoadChurnMachine.TestCase
TestLoadChurnMachine.settings = settings(max_examples=30, stateful_step_count=30, deadline=None)


def test_large_group_is_valid_and_fast_enough() -> None:
    """200 members x 2048 shards, Zipf-like loads. Timing is printed, never asserted."""
    rnd = random.Random(7)
    loads = {s: int(10**6 / (1 + rnd.randrange(2048))) for s in range(2048)}
    members = [f"member-{i:03d}" for i in range(200)]
    started = time.perf_counter()
    first = check_all(2048, members, loads, None)
    elapsed_fresh = time.perf_counter() - started
    churned = members[20:] + [f"joined-{i:02d}" for i in range(25)]
    started = time.perf_counter()
    check_all(2048, churned, loads, first)
    elapsed_churn = time.perf_counter() - started
    print(f"200x2048 by load: fresh {elapsed_fresh * 1e3:.1f} ms, "
          f"churn {elapsed_churn * 1e3:.1f} ms")
