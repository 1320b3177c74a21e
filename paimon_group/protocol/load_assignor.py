"""The load-aware shard assignment: a pure, deterministic, sticky function.

The count assignor (:func:`paimon_group.protocol.assignor.assign`) gives every member
the same number of shards. On a skewed table (one partition with most of the
rows, a dynamic-bucket table whose buckets grew unevenly, a bucket-unaware
table whose files differ in size by orders of magnitude) that leaves one
member with most of the rows. :func:`assign_by_load` balances the *load* of
each member instead: the sum of its shards' loads, where the leader measures
a shard's load from the table's manifests (rows; see
:mod:`paimon_group.reading.shard_load`) and passes it in. The function does no I/O
and keeps no state: every leader computes the same answer from the same
inputs, whatever order they come in.

**How.** Every live member first keeps all the shards it held in
``previous`` (repaired as the count assignor repairs it: departed members,
shards out of range and duplicates dropped). Then:

1. *Placement.* Shards nobody keeps (a departed member's, a new group's)
   are placed one by one, heaviest first (ties by shard id), each on the
   member with the least load (ties: fewer shards, then member id). These
   placements are always made: a shard is never left without an owner.
2. *Balancing.* Then, at most ``max_move_share`` of the shards
   (``floor(share * S)``, at least 1 when the share is above 0), plus the
   ``S // M`` shards each member that holds nothing would get from the count
   assignor (so a member that joins gets its share of the load at once and
   the others still rebalance among themselves; :func:`move_cap`) are moved, one
   at a time, from the most loaded member to the least loaded one: each time
   the shard that lowers the larger of the two members' loads the most
   (ties by shard id), and only when it lowers it by more than
   ``threshold`` times the mean member load. A move that gains less is not
   worth its handover (the old owner stops and commits, the new one starts
   from the committed position), so small differences never cause moves.
   When no single move gains that much, the exchange of a shard of the most
   loaded member for a lighter one of the least loaded member may (it counts
   as two moves).

Each balancing move lowers the sum of the squared member loads, so the loop
ends; the cap bounds the moves of one call (a rebalance), and the next call
(the next rebalance) carries on from the result. With all loads zero or
unknown (a new, empty table) the count assignor decides instead.

For example, 6 shards whose loads are 50, 10, 10, 10, 10, 10 (rows) over
members ``a`` and ``b`` of a fresh group: the heaviest shard 0 goes to ``a``,
then every 10 goes to the member with the least load, which is ``b`` until it
reaches 50 (total 100, mean 50)::

    a: [0]  (50)    b: [1, 2, 3, 4, 5]  (50)

Then ``c`` joins (mean 33.3, threshold 0.05: a move must lower the larger of
the two members' loads by more than 1.67 rows). Nothing is orphaned; with
``max_move_share=0.5`` the cap is 3 moves, plus 6 // 3 = 2 for ``c``, which
holds nothing. ``a`` and ``b`` tie as most
loaded; ``a``'s only shard would just move its 50 to ``c`` (no gain), so the
giver is ``b``, the next most loaded: it gives 10s to ``c`` until ``c`` has
20 and ``b`` 30 (a third move would leave ``c`` at 30 over ``b``'s 20: no
gain). ``a`` and its 50 cannot be split; that is the best there is::

    a: [0]  (50)    b: [3, 4, 5]  (30)    c: [1, 2]  (20)

The same steps, runnable::

    >>> loads = {0: 50, 1: 10, 2: 10, 3: 10, 4: 10, 5: 10}
    >>> step1 = assign_by_load(6, ["b", "a"], loads)
    >>> step1
    {'a': [0], 'b': [1, 2, 3, 4, 5]}
    >>> step2 = assign_by_load(6, ["a", "b", "c"], loads, step1, max_move_share=0.5)
    >>> step2
    {'a': [0], 'b': [3, 4, 5], 'c': [1, 2]}
    >>> member_loads(step2, loads)
    {'a': 50, 'b': 30, 'c': 20}

Then ``a`` leaves: its shard 0 is orphaned and always placed, on the least
loaded member ``c`` (20 + 50 = 70); then one balancing move (the cap is now 1
with the default share 0.25 of 6 shards) gives ``c``'s heaviest useful shard
to ``b``::

    >>> step3 = assign_by_load(6, ["b", "c"], loads, step2)
    >>> step3
    {'b': [1, 3, 4, 5], 'c': [0, 2]}
    >>> member_loads(step3, loads)
    {'b': 40, 'c': 60}
    >>> assign_by_load(6, ["b", "c"], loads, step3)
    {'b': [1, 2, 3, 4, 5], 'c': [0]}

Unknown loads fall back to the count assignor::

    >>> assign_by_load(4, ["a", "b"], {})
    {'a': [0, 1], 'b': [2, 3]}
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Collection, Iterable, Mapping

from coordinators.errors import ConfigError
from paimon_group.protocol.assignor import assign, repaired_previous

__all__ = [
    "DEFAULT_MAX_MOVE_SHARE",
    "DEFAULT_THRESHOLD",
    "assign_by_load",
    "member_loads",
    "move_cap",
]

#: A balancing move must lower the larger of the two members' loads by more
#: than this share of the mean member load.
DEFAULT_THRESHOLD = 0.05
#: At most this share of the shards moves for balance in one rebalance.
DEFAULT_MAX_MOVE_SHARE = 0.25


def assign_by_load(
    num_shards: int,
    members: Iterable[str],
    loads: Mapping[int, float],
    previous: Mapping[str, Collection[int]] | None = None,
    *,
    threshold: float = DEFAULT_THRESHOLD,
    max_move_share: float = DEFAULT_MAX_MOVE_SHARE,
) -> dict[str, list[int]]:
    """Assign shards ``0..num_shards-1`` to ``members`` by load, sticking to ``previous``.

    Returns ``{member_id: sorted shards}`` with one entry per distinct member,
    keys in member id order; each shard goes to exactly one member (``{}``
    with no members). ``loads`` maps a shard to its load (a number >= 0; a
    shard not in it has load 0). The shards that change owner are those
    nobody kept, plus at most :func:`move_cap` balancing moves.

        >>> assign_by_load(4, ["a", "b"], {0: 8, 1: 1, 2: 1, 3: 1})
        {'a': [0], 'b': [1, 2, 3]}
        >>> assign_by_load(4, ["a", "b"], {0: 8, 1: 1, 2: 1, 3: 1}, {"a": [0, 1], "b": [2, 3]})
        {'a': [0], 'b': [1, 2, 3]}
        >>> assign_by_load(3, ["a", "b", "c"], {0: 5})
        {'a': [0], 'b': [1], 'c': [2]}
    """
    _check_options(loads, threshold, max_move_share)
    kept = repaired_previous(num_shards, members, previous)
    weight = {s: float(loads.get(s, 0)) for s in range(num_shards)}
    if not kept:
        return {}
    if not any(weight.values()):
        return assign(num_shards, members, previous)
    held = {s for shards in kept.values() for s in shards}
    owned = {m: set(shards) for m, shards in kept.items()}
    load = {m: sum(weight[s] for s in shards) for m, shards in owned.items()}

    orphans = sorted((s for s in range(num_shards) if s not in held),
                     key=lambda s: (-weight[s], s))
    for shard in orphans:
        target = min(owned, key=lambda m: (load[m], len(owned[m]), m))
        owned[target].add(shard)
        load[target] += weight[shard]

    gain_needed = threshold * sum(weight.values()) / len(owned)
    newcomers = sum(1 for shards in kept.values() if not shards)
    budget = move_cap(num_shards, max_move_share, newcomers=newcomers, members=len(kept))
    while budget > 0:
        step = _best_move(owned, load, weight, gain_needed)
        if step is None and budget >= 2:
            step = _best_swap(owned, load, weight, gain_needed)
        if step is None:
            break
        for shard, source, target in step:
            owned[source].discard(shard)
            owned[target].add(shard)
            load[source] -= weight[shard]
            load[target] += weight[shard]
        budget -= len(step)
    return {m: sorted(owned[m]) for m in sorted(owned)}


def move_cap(num_shards: int, max_move_share: float, *, newcomers: int = 0,
             members: int = 1) -> int:
    """How many balancing moves one call may make: ``floor(share * S)``, at
    least 1 when the share is above 0, plus ``S // M`` for each of the
    ``newcomers`` (members holding nothing) among ``M`` ``members``; 0 with a
    share of 0.

        >>> move_cap(16, 0.25), move_cap(3, 0.25), move_cap(16, 0.0)
        (4, 1, 0)
        >>> move_cap(16, 0.25, newcomers=1, members=2)  # 1 member joined 1: 4 + 8
        12
    """
    if max_move_share <= 0 or num_shards <= 0:
        return 0
    share = max(1, math.floor(max_move_share * num_shards))
    return share + newcomers * (num_shards // max(1, members))


def member_loads(
    assignment: Mapping[str, Collection[int]], loads: Mapping[int, float]
) -> dict[str, float]:
    """Each member's load: the sum of its shards' loads, by member id."""
    return {m: sum(loads.get(s, 0) for s in assignment[m]) for m in sorted(assignment)}


def _best_move(
    owned: Mapping[str, set[int]],
    load: Mapping[str, float],
    weight: Mapping[int, float],
    gain_needed: float,
) -> list[tuple[int, str, str]] | None:
    """The next balancing move ``(shard, from, to)``, or None.

    The receiver is the least loaded member (ties: fewer shards, then id):
    for any shard, giving it there leaves the lowest larger-of-the-two. The
    giver is the most loaded member (ties by id) that has a shard whose move
    lowers the larger of the two loads by more than ``gain_needed``;
    members are tried from the most loaded down, since when several tie at
    the top, the first of them may hold one indivisible shard only.
    """
    target = min(owned, key=lambda m: (load[m], len(owned[m]), m))
    for source in sorted(owned, key=lambda m: (-load[m], m)):
        if load[source] <= load[target] + gain_needed:
            return None
        best: tuple[float, int] | None = None
        for shard in sorted(owned[source]):
            after = max(load[source] - weight[shard], load[target] + weight[shard])
            if load[source] - after > gain_needed and (best is None or after < best[0]):
                best = (after, shard)
        if best is not None:
            return [(best[1], source, target)]
    return None


def _best_swap(
    owned: Mapping[str, set[int]],
    load: Mapping[str, float],
    weight: Mapping[int, float],
    gain_needed: float,
) -> list[tuple[int, str, str]] | None:
    """When no single move gains: the exchange of a shard of the most loaded
    member (ties by id) for a lighter one of the least loaded member that
    lowers the larger of their loads most (by more than ``gain_needed``;
    two moves). The ideal partner of a shard weighs half the difference of
    the two loads less, found by bisection; ties by shard id."""
    target = min(owned, key=lambda m: (load[m], len(owned[m]), m))
    source = min(owned, key=lambda m: (-load[m], m))
    gap = load[source] - load[target]
    if source == target or gap <= gain_needed:
        return None
    partners = sorted(owned[target], key=lambda s: (weight[s], s))
    weights = [weight[s] for s in partners]
    best: tuple[float, int, int] | None = None
    for shard in sorted(owned[source]):
        at = bisect.bisect_left(weights, weight[shard] - gap / 2)
        for i in {at - 1, at} & set(range(len(partners))):
            diff = weight[shard] - weights[i]
            after = max(load[source] - diff, load[target] + diff)
            if diff > 0 and load[source] - after > gain_needed and (
                    best is None or (after, shard, partners[i]) < best):
                best = (after, shard, partners[i])
    if best is None:
        return None
    return [(best[1], source, target), (best[2], target, source)]


def _check_options(loads: Mapping[int, float], threshold: float, max_move_share: float) -> None:
    if not isinstance(threshold, int | float) or isinstance(threshold, bool) or not (
            0 <= threshold < math.inf):
        raise ConfigError(f"invalid load threshold {threshold!r}: use a number >= 0")
    if not isinstance(max_move_share, int | float) or isinstance(max_move_share, bool) or not (
            0 <= max_move_share <= 1):
        raise ConfigError(f"invalid move share {max_move_share!r}: use a number in [0, 1]")
    for shard, value in loads.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or not (
                0 <= value < math.inf):
            raise ConfigError(f"invalid load {value!r} of shard {shard}: use a number >= 0")
