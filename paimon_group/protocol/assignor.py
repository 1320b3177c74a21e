"""The shard assignment of a consumer group: a pure, deterministic, sticky, balanced function.

The leader calls :func:`assign` with the shard count, the ids of the live
members and the assignment it published last, and publishes the result. The
function does no I/O and keeps no state, so every leader (a new one after a
failover included) computes the same answer from the same inputs, whatever
order the coordinator listed them in.

**Balanced.** With ``S`` shards and ``M`` members every member gets
``S // M`` or ``S // M + 1`` shards (with more members than shards some get
none). Every member passed in appears in the result, possibly with ``[]``.

**Sticky.** On a join or a leave only the minimum number of shards change
owner: a member keeps every shard it held before, up to its quota; only the
shards of departed members, shards nobody held and a member's excess over its
quota move. Each move costs a handover (the old owner stops and commits, the
new owner takes the shard with a higher epoch), so fewer moves means less
time with a shard unread. The ``S % M`` members that get the extra shard are
the ones already holding the most (ties broken by member id), which is what
keeps the number of moves minimal; :func:`minimum_moves` computes that
minimum and :func:`moves` lists what actually moved.

For example, 8 shards over members ``a``, ``b`` and ``c`` of a fresh group:
``S // M = 2`` with 2 left over, all members hold nothing, so the two extra
shards go to ``a`` and ``b`` (member id order)::

    a: [0, 1, 2]    b: [3, 4, 5]    c: [6, 7]

Then ``d`` joins: every quota is now 2. ``a`` and ``b`` each give up their
highest shard and ``d`` gets both; ``c`` is untouched (2 moves, the minimum)::

    a: [0, 1]    b: [3, 4]    c: [6, 7]    d: [2, 5]

Then ``b`` leaves: quotas are 3, 3, 2; ``a``, ``c`` and ``d`` hold 2 each,
so the two extra shards go to ``a`` and ``c`` (member id order) and only
``b``'s two shards move::

    a: [0, 1, 3]    c: [4, 6, 7]    d: [2, 5]

The same steps, runnable::

    >>> step1 = assign(8, ["c", "a", "b"])
    >>> step1
    {'a': [0, 1, 2], 'b': [3, 4, 5], 'c': [6, 7]}
    >>> step2 = assign(8, ["a", "b", "c", "d"], step1)
    >>> step2
    {'a': [0, 1], 'b': [3, 4], 'c': [6, 7], 'd': [2, 5]}
    >>> moves(step1, step2)
    {2: ('a', 'd'), 5: ('b', 'd')}
    >>> minimum_moves(8, ["a", "b", "c", "d"], step1)
    2
    >>> step3 = assign(8, ["a", "c", "d"], step2)
    >>> step3
    {'a': [0, 1, 3], 'c': [4, 6, 7], 'd': [2, 5]}
    >>> moves(step2, step3)
    {3: ('b', 'a'), 4: ('b', 'c')}

**A damaged previous assignment** is repaired, never trusted: entries of
members not in ``members`` (departed) are ignored, shards outside
``0..S-1`` are dropped, and a shard listed under several live members is kept
only by the first of them in member id order. The result is always valid.

**Static membership.** To ride out a short restart without moving a
member's shards, the leader may pass a member that is absent (its session
gone) but still within the group's rebalance delay as if it were present:
its shards then stay reserved for it, unread, until it comes back or the
delay ends and the leader assigns again without it. Nothing in this module is
special for that case; the caller decides who counts as a member.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence

from coordinators.errors import ConfigError

__all__ = ["ASSIGNORS", "assign", "minimum_moves", "moves", "parse_assignor",
           "repaired_previous"]

#: The assignors a group can be created with: ``count`` (this module) balances
#: shard counts, ``load`` (:mod:`paimon_group.protocol.load_assignor`) the rows each
#: member reads. A group records its assignor (``GroupMeta.assignor``).
ASSIGNORS = ("count", "load")


def parse_assignor(value: str | None) -> str:
    """The assignor named ``value`` (None or "" means ``count``, as records
    stored before assignors could be chosen decode).

        >>> parse_assignor("LOAD"), parse_assignor(None)
        ('load', 'count')
    """
    name = (value or "count").strip().lower()
    if name not in ASSIGNORS:
        raise ConfigError(f"unknown assignor {value!r}: use one of {', '.join(ASSIGNORS)}")
    return name


def assign(
    num_shards: int,
    members: Iterable[str],
    previous: Mapping[str, Collection[int]] | None = None,
    *,
    order: Sequence[int] | None = None,
) -> dict[str, list[int]]:
    """Assign shards ``0..num_shards-1`` to ``members``, sticking to ``previous``.

    Returns ``{member_id: sorted shards}`` with one entry per distinct member,
    keys in member id order. Each shard goes to exactly one member, shard
    counts differ by at most one, and the number of shards that change owner
    equals :func:`minimum_moves`. With no members the result is ``{}``.
    Duplicate member ids count once; the order of ``members``, of
    ``previous`` and of its shard lists does not matter.

        >>> assign(5, ["b", "a"])
        {'a': [0, 1, 2], 'b': [3, 4]}
        >>> assign(5, ["a", "b", "c"], {"a": [0, 1, 2], "b": [3, 4]})
        {'a': [0, 1], 'b': [3, 4], 'c': [2]}
        >>> assign(2, ["a", "b", "c"])
        {'a': [0], 'b': [1], 'c': []}

    ``order`` is the order shards are dealt in (None: ascending): the free
    shards go to members in that order, and a member over its quota keeps
    the ones earliest in it. It lists distinct shards of ``0..num_shards-1``;
    shards it leaves out come after it, ascending. A group of several tables
    passes :meth:`~paimon_group.protocol.table_map.TableMap.spread_order`, so
    that every member gets a share of every table. The number of moves is
    :func:`minimum_moves` whatever the order.

        >>> assign(4, ["a", "b"], order=[0, 2, 1, 3])
        {'a': [0, 2], 'b': [1, 3]}
        >>> assign(4, ["a", "b"], {"a": [0, 1, 2, 3]}, order=[0, 2, 1, 3])
        {'a': [0, 2], 'b': [1, 3]}
    """
    plan = _Plan(num_shards, members, previous, order)
    result: dict[str, list[int]] = {}
    if not plan.members:
        return result
    free = plan.free_shards()
    taken = 0
    for member in plan.members:
        kept = plan.kept(member)
        need = plan.quota[member] - len(kept)
        # Members fill their deficit in member id order from the free shards in
        # dealing order; the total deficit equals the number of free shards.
        result[member] = sorted(kept + free[taken : taken + need])
        taken += need
    return result


def minimum_moves(
    num_shards: int,
    members: Iterable[str],
    previous: Mapping[str, Collection[int]] | None = None,
) -> int:
    """The fewest shards that must change owner for a balanced assignment.

    Counts the shards of ``0..num_shards-1`` that no balanced assignment can
    leave with a member that held them in ``previous`` (shards of departed
    members, shards nobody held, excess over a quota), plus the distinct
    shards of ``previous`` outside that range (they lose their owner). For a
    ``previous`` without duplicated shards this equals
    ``len(moves(previous, assign(num_shards, members, previous)))``; for one
    with duplicates it counts against the repaired ``previous`` (see the
    module docstring) and is an upper bound of that length.

        >>> minimum_moves(4, ["a", "b"], {"a": [0, 1, 2, 3]})
        2
        >>> minimum_moves(4, ["a", "b"], {"a": [0, 1], "gone": [2, 3]})
        2
        >>> minimum_moves(4, ["a"])
        4
    """
    plan = _Plan(num_shards, members, previous)
    held = {s for shards in (previous or {}).values() for s in shards}
    if not plan.members:
        # Nobody to hand anything to: every previously held shard loses its owner.
        return len(held)
    out_of_range = {s for s in held if not 0 <= s < plan.num_shards}
    kept = sum(len(plan.kept(m)) for m in plan.members)
    return plan.num_shards - kept + len(out_of_range)


def moves(
    previous: Mapping[str, Collection[int]] | None,
    current: Mapping[str, Collection[int]],
) -> dict[int, tuple[str | None, str | None]]:
    """Which shards changed owner: ``{shard: (from_member, to_member)}``, by shard.

    A shard moved when its owner in ``current`` did not hold it in
    ``previous``, or when ``current`` gives it to nobody but ``previous`` did.
    ``from_member`` is ``None`` for a shard nobody held (a fresh group, a new
    shard), ``to_member`` is ``None`` for a shard nobody holds now. If a
    mapping lists a shard under several members, its owner is the first of
    them in member id order (as :func:`assign` repairs it).

        >>> moves({"a": [0, 1], "b": [2]}, {"a": [0], "b": [1, 2]})
        {1: ('a', 'b')}
        >>> moves(None, {"a": [0, 1]})
        {0: (None, 'a'), 1: (None, 'a')}
    """
    holders: dict[int, set[str]] = {}
    first_holder: dict[int, str] = {}
    for member in sorted(previous or {}):
        for shard in (previous or {})[member]:
            holders.setdefault(shard, set()).add(member)
            first_holder.setdefault(shard, member)
    owner: dict[int, str] = {}
    for member in sorted(current):
        for shard in current[member]:
            owner.setdefault(shard, member)

    moved: dict[int, tuple[str | None, str | None]] = {}
    for shard in sorted(holders.keys() | owner.keys()):
        new = owner.get(shard)
        if new is not None and new in holders.get(shard, ()):
            continue
        if new is None and shard not in holders:
            continue
        moved[shard] = (first_holder.get(shard), new)
    return moved


def repaired_previous(
    num_shards: int,
    members: Iterable[str],
    previous: Mapping[str, Collection[int]] | None = None,
) -> dict[str, list[int]]:
    """The live members (in id order) and the shards each may keep from
    ``previous``, repaired as the module docstring says (departed members
    dropped, shards out of range dropped, a duplicated shard kept by the
    first member by id). Raises :class:`ConfigError` on a bad shard count.

        >>> repaired_previous(3, ["b", "a"], {"a": [0, 7], "b": [0, 2], "gone": [1]})
        {'a': [0], 'b': [2]}
    """
    plan = _Plan(num_shards, members, previous)
    return {m: list(plan.candidates[m]) for m in plan.members}


class _Plan:
    """The inputs of one assignment, validated and repaired, and each member's quota.

    ``candidates[m]`` are the shards ``m`` may keep (sorted): its previous
    shards in range, minus those an earlier member (by id) also listed.
    ``quota[m]`` is ``S // M + 1`` for the ``S % M`` members holding the most
    candidates (ties by member id) and ``S // M`` for the rest: giving the
    extra shard to a member that can fill it from what it holds saves a move,
    and no other choice of quotas keeps more shards in place.
    """

    def __init__(
        self,
        num_shards: int,
        members: Iterable[str],
        previous: Mapping[str, Collection[int]] | None,
        order: Sequence[int] | None = None,
    ) -> None:
        if isinstance(num_shards, bool) or not isinstance(num_shards, int) or num_shards < 0:
            raise ConfigError(f"invalid shard count {num_shards!r}: use an integer >= 0")
        if isinstance(members, str):
            raise ConfigError("members must be a collection of member ids, not one string")
        self.num_shards = num_shards
        self.members: list[str] = sorted(set(members))

        previous = previous or {}
        claimed: set[int] = set()
        self.candidates: dict[str, list[int]] = {}
        for member in self.members:
            own = {s for s in previous.get(member, ()) if 0 <= s < num_shards} - claimed
            claimed |= own
            self.candidates[member] = sorted(own)
        # Each shard's place in the dealing order; None: ascending (the
        # candidates and free shards are already in that order).
        self.rank = _ranks(num_shards, order)
        if self.rank is not None:
            ranks = self.rank
            for member in self.members:
                self.candidates[member].sort(key=ranks.__getitem__)

        self.quota: dict[str, int] = {}
        if self.members:
            base, extra = divmod(num_shards, len(self.members))
            by_holding = sorted(self.members, key=lambda m: (-len(self.candidates[m]), m))
            for rank, member in enumerate(by_holding):
                self.quota[member] = base + 1 if rank < extra else base

    def kept(self, member: str) -> list[int]:
        """The shards ``member`` keeps: its candidates earliest in the dealing
        order (the lowest, by default), up to its quota."""
        return self.candidates[member][: self.quota[member]]

    def free_shards(self) -> list[int]:
        """Shards no member keeps, in dealing order: they are the ones that move."""
        kept = {s for m in self.members for s in self.kept(m)}
        free = [s for s in range(self.num_shards) if s not in kept]
        if self.rank is not None:
            free.sort(key=self.rank.__getitem__)
        return free


def _ranks(num_shards: int, order: Sequence[int] | None) -> dict[int, int] | None:
    """Each shard's place in ``order``, the shards it leaves out after it in
    shard order; None for no order. Raises :class:`ConfigError` on a shard
    out of range or listed twice."""
    if order is None:
        return None
    rank: dict[int, int] = {}
    for shard in order:
        if isinstance(shard, bool) or not isinstance(shard, int) or not 0 <= shard < num_shards:
            raise ConfigError(f"invalid shard order: {shard!r} is not a shard of "
                              f"0..{num_shards - 1}")
        if shard in rank:
            raise ConfigError(f"invalid shard order: shard {shard} is listed twice")
        rank[shard] = len(rank)
    for shard in range(num_shards):
        rank.setdefault(shard, len(rank))
    return rank
