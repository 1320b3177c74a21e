"""Unit tests of the shard assignor: examples, properties and long random churn.

The properties are checked against a reference written here, independently
of the module: a plain repair of the previous assignment, and for small
groups a brute force over every balanced assignment to confirm that
``minimum_moves`` really is the minimum.
"""

from __future__ import annotations

import doctest
import itertools
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

from coordinators.errors import ConfigError
from paimon_group.protocol import assignor
from paimon_group.protocol.assignor import assign, minimum_moves, moves

Assignment = Mapping[str, Sequence[int]]


# --------------------------------------------------------------------------
# Reference checks, written without the module's internals.
# --------------------------------------------------------------------------


def repaired(
    num_shards: int, members: Sequence[str], previous: Assignment | None
) -> dict[str, set[int]]:
    """The previous shards each live member may keep: in range, first owner by id wins."""
    claimed: set[int] = set()
    result: dict[str, set[int]] = {}
    for member in sorted(set(members)):
        own = {s for s in (previous or {}).get(member, []) if 0 <= s < num_shards}
        result[member] = own - claimed
        claimed |= own
    return result


def has_duplicates(previous: Assignment) -> bool:
    seen: set[int] = set()
    for shards in previous.values():
        for shard in shards:
            if shard in seen:
                return True
            seen.add(shard)
    return False


def check_valid(num_shards: int, members: Sequence[str], result: Assignment) -> None:
    """Each shard exactly once, only to given members, every member present, sorted lists."""
    assert list(result) == sorted(set(members))
    for shards in result.values():
        assert list(shards) == sorted(shards)
    every = [s for shards in result.values() for s in shards]
    if members:
        assert sorted(every) == list(range(num_shards))
    else:
        assert result == {}


def check_balanced(num_shards: int, members: Sequence[str], result: Assignment) -> None:
    if not members:
        return
    counts = [len(shards) for shards in result.values()]
    assert max(counts) - min(counts) <= 1
    if len(set(members)) > num_shards:
        assert max(counts) <= 1


def check_sticky(
    num_shards: int, members: Sequence[str], previous: Assignment | None, result: Assignment
) -> None:
    """As few moves as possible; members keep what fits in their quota, nothing else moves."""
    need = minimum_moves(num_shards, members, previous)
    repair = repaired(num_shards, members, previous)
    # Against the repaired previous the count is exact, corrupt input or not.
    held = {s for shards in (previous or {}).values() for s in shards}
    out_of_range = {s for s in held if not 0 <= s < num_shards} if members else held
    assert len(moves(repair, result)) + len(out_of_range) == need
    if previous is None or not has_duplicates(previous):
        assert len(moves(previous, result)) == need
    else:
        assert len(moves(previous, result)) <= need
    if not members:
        return
    floor = num_shards // len(set(members))
    for member, keep in repair.items():
        now = set(result[member])
        # A member either kept everything it could, or only lost shards (excess).
        assert keep <= now or now <= keep
        if len(keep) <= floor:
            assert keep <= now


def check_all(
    num_shards: int, members: Sequence[str], previous: Assignment | None
) -> dict[str, list[int]]:
    result = assign(num_shards, members, previous)
    check_valid(num_shards, members, result)
    check_balanced(num_shards, members, result)
    check_sticky(num_shards, members, previous, result)
    return result


def brute_force_minimum(num_shards: int, members: Sequence[str], previous: Assignment) -> int:
    """The fewest moves over every balanced assignment (tiny inputs only)."""
    ids = sorted(set(members))
    best: int | None = None
    for owners in itertools.product(ids, repeat=num_shards):
        counts = [owners.count(m) for m in ids]
        if max(counts) - min(counts) > 1:
            continue
        candidate = {m: [s for s, o in enumerate(owners) if o == m] for m in ids}
        n = len(moves(previous, candidate))
        best = n if best is None else min(best, n)
    assert best is not None
    return best


# --------------------------------------------------------------------------
# Examples.
# --------------------------------------------------------------------------


def test_module_docstring_examples_run() -> None:
    failures, tried = doctest.testmod(assignor, raise_on_error=False)
    assert tried > 10
    assert failures == 0


def test_fresh_group_gets_contiguous_balanced_ranges() -> None:
    result = check_all(10, ["m2", "m0", "m1"], None)
    assert result == {"m0": [0, 1, 2, 3], "m1": [4, 5, 6], "m2": [7, 8, 9]}
    assert moves(None, result) == {s: (None, result_owner(result, s)) for s in range(10)}


def result_owner(result: Assignment, shard: int) -> str:
    return next(m for m, shards in result.items() if shard in shards)


def test_single_member_takes_everything() -> None:
    assert check_all(4, ["only"], None) == {"only": [0, 1, 2, 3]}


def test_join_moves_only_the_excess() -> None:
    before = {"a": [0, 1, 2, 3], "b": [4, 5, 6, 7]}
    after = check_all(8, ["a", "b", "c"], before)
    assert minimum_moves(8, ["a", "b", "c"], before) == 2
    assert set(after["a"]) <= set(before["a"])
    assert set(after["b"]) <= set(before["b"])
    assert len(after["c"]) == 2
    assert all(old in ("a", "b") and new == "c" for old, new in moves(before, after).values())


def test_leave_moves_only_the_departed_members_shards() -> None:
    before = {"a": [0, 1, 2], "b": [3, 4, 5], "c": [6, 7]}
    after = check_all(8, ["a", "c"], before)
    assert after == {"a": [0, 1, 2, 3], "c": [4, 5, 6, 7]}
    assert moves(before, after) == {3: ("b", "a"), 4: ("b", "c"), 5: ("b", "c")}


def test_extra_shard_goes_to_the_member_already_holding_it() -> None:
    # 7 shards over 2 members: quotas 4 and 3. "b" holds 4, so "b" gets the 4.
    before = {"a": [0, 1, 2], "b": [3, 4, 5, 6]}
    assert check_all(7, ["a", "b"], before) == before
    assert minimum_moves(7, ["a", "b"], before) == 0


def test_tie_for_the_extra_shard_breaks_by_member_id() -> None:
    before = {"b": [0, 1], "a": [2, 3], "gone": [4]}
    after = check_all(5, ["b", "a"], before)
    assert after == {"a": [2, 3, 4], "b": [0, 1]}


def test_more_members_than_shards() -> None:
    result = check_all(3, ["e", "d", "c", "b", "a"], None)
    assert result == {"a": [0], "b": [1], "c": [2], "d": [], "e": []}
    # Members that already hold a shard keep it; the newcomers get none.
    again = check_all(3, ["a", "b", "c", "d", "e", "f"], {"c": [0], "e": [1], "f": [2]})
    assert again == {"a": [], "b": [], "c": [0], "d": [], "e": [1], "f": [2]}


def test_zero_shards() -> None:
    assert check_all(0, ["a", "b"], None) == {"a": [], "b": []}
    assert check_all(0, ["a"], {"a": [0, 1]}) == {"a": []}
    assert minimum_moves(0, ["a"], {"a": [0, 1]}) == 2
    assert moves({"a": [0, 1]}, {"a": []}) == {0: ("a", None), 1: ("a", None)}


def test_no_members() -> None:
    assert assign(4, [], None) == {}
    assert assign(4, [], {"a": [0, 1]}) == {}
    assert minimum_moves(4, [], {"a": [0, 1], "b": [1, 7]}) == 3
    assert minimum_moves(4, [], None) == 0


def test_previous_with_departed_members() -> None:
    before = {"gone1": [0, 1], "a": [2, 3], "gone2": [4, 5]}
    after = check_all(6, ["a", "b", "c"], before)
    assert after == {"a": [2, 3], "b": [0, 1], "c": [4, 5]}
    assert moves(before, after) == {
        0: ("gone1", "b"),
        1: ("gone1", "b"),
        4: ("gone2", "c"),
        5: ("gone2", "c"),
    }


def test_corrupt_previous_is_repaired() -> None:
    before = {
        "b": [1, 2, 2, 9, -1],  # duplicate within, out of range, negative
        "a": [0, 1],  # shard 1 also listed under "b": "a" (first by id) keeps it
        "c": [2, 3],  # shard 2 also under "b": "b" keeps it
    }
    after = check_all(4, ["a", "b", "c"], before)
    assert after == {"a": [0, 1], "b": [2], "c": [3]}
    assert minimum_moves(4, ["a", "b", "c"], before) == 2  # shards 9 and -1 lose their owner
    assert moves(before, after) == {-1: ("b", None), 9: ("b", None)}


def test_order_and_duplicates_of_inputs_do_not_matter() -> None:
    before = {"x": [5, 1, 3], "y": [0, 2], "z": [4]}
    reordered = {"z": [4], "y": [2, 0], "x": [3, 5, 1]}
    first = assign(6, ["x", "y", "w"], before)
    assert assign(6, ("w", "y", "x", "y"), reordered) == first
    assert assign(6, iter(["y", "w", "x"]), before) == first


def test_same_input_twice_changes_nothing() -> None:
    result = assign(9, ["a", "b", "c", "d"], {"a": [8, 7, 6, 5, 4], "b": [0]})
    assert assign(9, ["a", "b", "c", "d"], result) == result
    assert moves(result, result) == {}


@pytest.mark.parametrize("bad", [-1, True, 2.0, "4", None])
def test_bad_shard_count_is_one_clear_error(bad: object) -> None:
    with pytest.raises(ConfigError, match="invalid shard count"):
        assign(bad, ["a"])  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="invalid shard count"):
        minimum_moves(bad, ["a"])  # type: ignore[arg-type]


def test_members_as_a_single_string_is_rejected() -> None:
    with pytest.raises(ConfigError, match="collection of member ids"):
        assign(4, "abc")


def test_moves_reports_origin_and_destination() -> None:
    previous = {"a": [0, 1], "b": [2, 3], "c": [4]}
    current = {"a": [0], "b": [2, 3, 1], "d": [5]}
    assert moves(previous, current) == {1: ("a", "b"), 4: ("c", None), 5: (None, "d")}
    # A shard listed twice in previous: not a move if its new owner was one of them.
    assert moves({"a": [0], "b": [0]}, {"b": [0]}) == {}
    assert moves({"b": [0], "a": [0]}, {"c": [0]}) == {0: ("a", "c")}


def test_large_group_is_valid_and_fast_enough() -> None:
    """200 members x 2048 shards. Timing is measured for the record, never asserted."""
    members = [f"member-{i:03d}" for i in range(200)]
    started = time.perf_counter()
    first = assign(2048, members)
    elapsed_fresh = time.perf_counter() - started
    churned = members[20:] + [f"joined-{i:02d}" for i in range(25)]
    started = time.perf_counter()
    second = assign(2048, churned, first)
    elapsed_churn = time.perf_counter() - started
    check_valid(2048, churned, second)
    check_balanced(2048, churned, second)
    check_sticky(2048, churned, first, second)
    print(f"200x2048: fresh {elapsed_fresh * 1e3:.2f} ms, churn {elapsed_churn * 1e3:.2f} ms")


# --------------------------------------------------------------------------
# Properties.
# --------------------------------------------------------------------------

POOL = [f"m{i}" for i in range(12)] + ["A", "z.9", "_-_", "x" * 128]
member_ids = st.sampled_from(POOL)
member_lists = st.lists(member_ids, max_size=14)


@st.composite
def clean_cases(draw: st.DrawFn) -> tuple[int, list[str], dict[str, list[int]] | None]:
    """A realistic previous: what assign produced for some earlier membership."""
    num_shards = draw(st.integers(0, 64))
    members = draw(member_lists)
    earlier = draw(member_lists)
    previous = draw(st.none() | st.just(assign(num_shards, earlier)))
    return num_shards, members, previous


@st.composite
def any_cases(draw: st.DrawFn) -> tuple[int, list[str], dict[str, list[int]] | None]:
    """Any previous at all: departed members, shards out of range, duplicates."""
    num_shards = draw(st.integers(0, 40))
    members = draw(member_lists)
    shards = st.lists(st.integers(-3, num_shards + 5), max_size=num_shards + 4)
    previous = draw(st.none() | st.dictionaries(member_ids, shards, max_size=10))
    return num_shards, members, previous


@settings(max_examples=300, deadline=None)
@given(clean_cases())
def test_property_clean_previous(case: tuple[int, list[str], dict[str, list[int]] | None]) -> None:
    check_all(*case)


@settings(max_examples=300, deadline=None)
@given(any_cases())
def test_property_any_previous(case: tuple[int, list[str], dict[str, list[int]] | None]) -> None:
    check_all(*case)


@settings(max_examples=200, deadline=None)
@given(any_cases(), st.randoms(use_true_random=False))
def test_property_deterministic_under_permutation(
    case: tuple[int, list[str], dict[str, list[int]] | None], rnd: random.Random
) -> None:
    num_shards, members, previous = case
    expected = assign(num_shards, members, previous)
    shuffled_members = list(members)
    rnd.shuffle(shuffled_members)
    shuffled_previous = None
    if previous is not None:
        items = [(m, rnd.sample(list(s), len(s))) for m, s in previous.items()]
        rnd.shuffle(items)
        shuffled_previous = dict(items)
    assert assign(num_shards, shuffled_members, shuffled_previous) == expected
    assert minimum_moves(num_shards, shuffled_members, shuffled_previous) == minimum_moves(
        num_shards, members, previous
    )


@settings(max_examples=200, deadline=None)
@given(any_cases())
def test_property_assignment_is_a_fixed_point(
    case: tuple[int, list[str], dict[str, list[int]] | None],
) -> None:
    num_shards, members, previous = case
    result = assign(num_shards, members, previous)
    assert assign(num_shards, members, result) == result
    assert minimum_moves(num_shards, members, result) == 0


@st.composite
def tiny_cases(draw: st.DrawFn) -> tuple[int, list[str], dict[str, list[int]]]:
    """Small enough to try every assignment; previous without duplicated shards."""
    num_shards = draw(st.integers(0, 6))
    members = draw(st.lists(st.sampled_from("abcd"), min_size=1, max_size=4, unique=True))
    owners = draw(
        st.lists(
            st.sampled_from([None, "a", "b", "c", "d", "e"]),
            min_size=num_shards + 2,
            max_size=num_shards + 2,
        )
    )  # two extra shards beyond the range, "e" never a member
    previous: dict[str, list[int]] = {}
    for shard, owner in enumerate(owners):
        if owner is not None:
            previous.setdefault(owner, []).append(shard)
    return num_shards, members, previous


@settings(max_examples=250, deadline=None)
@given(tiny_cases())
def test_property_minimum_moves_is_the_true_minimum(
    case: tuple[int, list[str], dict[str, list[int]]],
) -> None:
    num_shards, members, previous = case
    check_all(num_shards, members, previous)
    assert minimum_moves(num_shards, members, previous) == brute_force_minimum(
        num_shards, members, previous
    )


# --------------------------------------------------------------------------
# Churn: long random sequences of joins and leaves.
# --------------------------------------------------------------------------


def churn(seed: int, steps: int) -> None:
    rnd = random.Random(seed)
    num_shards = rnd.choice([1, 2, 3, 7, 16, 63, 64, 100, 256, 1000, 2048, rnd.randint(1, 2048)])
    next_id = 0
    members: list[str] = []
    current: dict[str, list[int]] | None = None
    for _ in range(steps):
        action = rnd.random()
        if not members or (action < 0.45 and len(members) < 64):
            for _ in range(rnd.choice([1, 1, 1, 2, 5])):
                if len(members) < 64:
                    members.append(f"w{next_id}")
                    next_id += 1
        elif action < 0.9:
            for _ in range(min(rnd.choice([1, 1, 1, 2, 5]), len(members) - 1) or 1):
                members.remove(rnd.choice(members))
        else:
            # Leader failover or a noisy listing: the same membership, shuffled.
            rnd.shuffle(members)
        current = check_all(num_shards, members, current)


@pytest.mark.parametrize("seed", range(12))
def test_random_churn(seed: int) -> None:
    churn(seed, steps=150)


class ChurnMachine(RuleBasedStateMachine):
    """Hypothesis drives joins and leaves; every step is checked against the last."""

    def __init__(self) -> None:
        super().__init__()
        self.num_shards = 1
        self.members: list[str] = []
        self.current: dict[str, list[int]] | None = None
        self.next_id = 0

    @initialize(num_shards=st.integers(1, 2048))
    def start(self, num_shards: int) -> None:
        self.num_shards = num_shards

    def step(self) -> None:
        self.current = check_all(self.num_shards, self.members, self.current)

    @precondition(lambda self: len(self.members) < 64)
    @rule(count=st.integers(1, 8))
    def join(self, count: int) -> None:
        for _ in range(min(count, 64 - len(self.members))):
            self.members.append(f"j{self.next_id}")
            self.next_id += 1
        self.step()

    @precondition(lambda self: len(self.members) > 0)
    @rule(data=st.data())
    def leave(self, data: st.DataObject) -> None:
        gone = data.draw(st.lists(st.sampled_from(self.members), min_size=1, unique=True))
        self.members = [m for m in self.members if m not in gone]
        self.step()

    @precondition(lambda self: len(self.members) > 0)
    @rule(data=st.data())
    def replace(self, data: st.DataObject) -> None:
        """A member restarts under a new id: one leave and one join in the same round."""
        gone = data.draw(st.sampled_from(self.members))
        self.members = [m for m in self.members if m != gone] + [f"j{self.next_id}"]
        self.next_id += 1
        self.step()

    @invariant()
    def members_match(self) -> None:
        if self.current is not None:
            assert list(self.current) == sorted(self.members)


TestChurnMachine = ChurnMachine.TestCase
TestChurnMachine.settings = settings(max_examples=40, stateful_step_count=40, deadline=None)
