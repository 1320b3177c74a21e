"""The leader's coalescing of member-list bursts (:mod:`paimon_group.member.publish_delay`)."""

from __future__ import annotations

import doctest
import itertools

from paimon_group.member import publish_delay
from paimon_group.member.publish_delay import PublishDelay


def test_worked_examples() -> None:
    failures, tried = doctest.testmod(publish_delay, raise_on_error=False)
    assert tried >= 5 and failures == 0


def test_a_lone_change_is_published_at_once() -> None:
    s = PublishDelay(quiet_s=0.2, max_wait_s=2.0)
    assert s.delay({"a"}, now=0.0) == 0.0
    for i, now in enumerate((1.0, 2.0, 2.5, 10.0)):  # each change well apart
        assert s.delay({"a", *(f"m{j}" for j in range(i + 1))}, now=now) == 0.0
    everyone = {"a", "m0", "m1", "m2", "m3"}
    assert s.delay(everyone | {"m9"}, now=10.05) > 0  # a join right after a join: a burst


def test_a_burst_that_never_pauses_is_published_after_max_wait() -> None:
    s = PublishDelay(quiet_s=0.2, max_wait_s=2.0)
    members: set[str] = set()
    published_at = []
    now = 0.0
    while now < 5.0:  # a member arrives every 0.1 s for 5 s
        members.add(f"m{len(members)}")
        if s.delay(members, now=now) == 0.0:
            published_at.append(round(now, 2))
        now = round(now + 0.1, 2)
    # The first arrival at once; then one publication per 2 s at most while
    # arrivals never pause (never starved, never one per arrival).
    assert published_at[0] == 0.0
    assert 2 <= len(published_at) <= 4, published_at
    gaps = [b - a for a, b in itertools.pairwise(published_at)]
    assert all(g >= 1.9 for g in gaps), published_at


def test_the_same_list_again_is_no_change() -> None:
    s = PublishDelay(quiet_s=0.2, max_wait_s=2.0)
    assert s.delay(["a", "b"], now=0.0) == 0.0
    assert s.delay(["b", "a"], now=0.05) == 0.0  # same members, another order


def test_a_departure_is_published_at_once_even_in_a_burst() -> None:
    """A member that left has stopped reading: its shards wait for the
    publication. A member leaving 0.15 s after another joined (the handoff
    benchmark's cycle) is not delayed."""
    s = PublishDelay(quiet_s=0.2, max_wait_s=2.0)
    assert s.delay({"a", "b"}, now=0.0) == 0.0
    assert s.delay({"a", "b", "c"}, now=5.0) == 0.0  # a lone join
    assert s.delay({"a", "b"}, now=5.15) == 0.0  # c leaves right after
    assert s.delay({"a", "b", "d"}, now=5.2) > 0  # an arrival right after: coalesced
    assert s.delay({"a", "d"}, now=5.25) == 0.0  # and a departure ends the burst
