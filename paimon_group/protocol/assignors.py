"""The group's assignors as objects, chosen once by name.

An assignor has a ``name`` (recorded with the group, ``GroupMeta.assignor``)
and an ``assign`` that maps ``0..num_shards-1`` onto the live members,
sticking to what they hold, as kafka-python's ``AbstractPartitionAssignor``
does for partitions. Both are pure: the leader measures, the assignor
decides.

* :data:`COUNT` balances shard counts (:func:`paimon_group.protocol.assignor.assign`);
* :data:`LOAD` balances the rows each member reads
  (:func:`paimon_group.protocol.load_assignor.assign_by_load`) when every
  shard's load was measured and there is a member to give shards to, and
  assigns as :data:`COUNT` otherwise (an empty table, a measurement that
  failed or saw another shard count). ``needs_loads`` tells the leader
  whether to measure at all.

    >>> assignor_named("LOAD").name, assignor_named(None).name
    ('load', 'count')
    >>> LOAD.assign(4, ["a", "b"], {}, loads=None)  # nothing measured: by count
    {'a': [0, 1], 'b': [2, 3]}
    >>> LOAD.assign(4, ["a", "b"], {}, loads={0: 8, 1: 1, 2: 1, 3: 1})
    {'a': [0], 'b': [1, 2, 3]}
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from paimon_group.protocol.assignor import ASSIGNORS, assign, parse_assignor
from paimon_group.protocol.load_assignor import DEFAULT_MAX_MOVE_SHARE, assign_by_load

__all__ = ["COUNT", "LOAD", "Assignor", "assign_over", "assignor_named"]


class Assignor(Protocol):
    """What a leader assigns shards with."""

    @property
    def name(self) -> str: ...

    @property
    def needs_loads(self) -> bool: ...

    def assign(
        self, num_shards: int, members: Iterable[str],
        previous: Mapping[str, Collection[int]] | None, *,
        loads: Mapping[int, float] | None = None,
        max_move_share: float = DEFAULT_MAX_MOVE_SHARE,
    ) -> dict[str, list[int]]:
        """``{member: sorted shards}``, one entry per member (see the module docstring)."""
        ...


@dataclass(frozen=True)
class CountAssignor:
    """Balances shard counts; loads, if given, are not looked at."""

    name: str = "count"
    needs_loads: bool = False

    def assign(
        self, num_shards: int, members: Iterable[str],
        previous: Mapping[str, Collection[int]] | None, *,
        loads: Mapping[int, float] | None = None,
        max_move_share: float = DEFAULT_MAX_MOVE_SHARE,
    ) -> dict[str, list[int]]:
        return assign(num_shards, members, previous)


@dataclass(frozen=True)
class LoadAssignor:
    """Balances measured loads; by count without a measurement of every shard."""

    name: str = "load"
    needs_loads: bool = True

    def assign(
        self, num_shards: int, members: Iterable[str],
        previous: Mapping[str, Collection[int]] | None, *,
        loads: Mapping[int, float] | None = None,
        max_move_share: float = DEFAULT_MAX_MOVE_SHARE,
    ) -> dict[str, list[int]]:
        members = list(members)
        if not members or loads is None:
            return COUNT.assign(num_shards, members, previous)
        return assign_by_load(num_shards, members, loads, previous,
                              max_move_share=max_move_share)


COUNT: Assignor = CountAssignor()
LOAD: Assignor = LoadAssignor()
_BY_NAME: Mapping[str, Assignor] = {a.name: a for a in (COUNT, LOAD)}
assert tuple(_BY_NAME) == ASSIGNORS


def assign_over(
    assignor: Assignor, shards: Sequence[int], members: Iterable[str],
    previous: Mapping[str, Collection[int]] | None, *,
    loads: Mapping[int, float] | None = None,
    max_move_share: float = DEFAULT_MAX_MOVE_SHARE,
) -> dict[str, list[int]]:
    """``assignor``'s assignment of ``shards`` alone, dealt in their order
    (a group of several tables: the live tables' shards in spread order,
    :meth:`~paimon_group.protocol.table_map.TableMap.spread_order`; a dropped
    table's shards are in no member's share). The assignor sees positions
    ``0..len(shards)-1``: its balance and minimum moves hold over them, and
    the count assignor deals them ascending, so in ``shards``' order."""
    at = {shard: i for i, shard in enumerate(shards)}
    before = None if previous is None else {
        m: [at[s] for s in held if s in at] for m, held in previous.items()}
    by_position = None if loads is None else {
        at[s]: load for s, load in loads.items() if s in at}
    out = assignor.assign(len(shards), members, before, loads=by_position,
                          max_move_share=max_move_share)
    return {m: sorted(shards[i] for i in held) for m, held in out.items()}


def assignor_named(name: str | None) -> Assignor:
    """The assignor of that name (None or "": count, as records stored before
    assignors could be chosen decode); an unknown name is a ConfigError."""
    return _BY_NAME[parse_assignor(name)]
