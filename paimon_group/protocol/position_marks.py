"""What a client's own commits of positions may have left, shard by shard.

Positions never move backwards (invariant 2), and only the owner writes a
shard's position (its commits are fenced by its epoch), so the owner knows a
lower bound of what is stored without reading it:

* the **floor**: the highest position (in
  :func:`~paimon_group.protocol.records.position_order`) a commit of ours
  landed with, or that we read back, under the epoch held;
* the **unsure** mark: the highest position of a commit of ours that raised
  (it may or may not have landed).

A position below the floor must not be written; one below the unsure mark
is decided by reading the stored position back (:meth:`PositionMarks.read_back`).
A mark of a newer epoch is never replaced by one of an older epoch.

Example::

    >>> marks = PositionMarks()
    >>> marks.raise_floor(3, (7, (5, 0)))       # shard 3, epoch 7: 5 landed
    >>> marks.lowers(3, 7, (4, 0)), marks.lowers(3, 7, (6, 0))
    (True, False)
    >>> marks.raise_unsure(3, (7, (9, 0)))      # a commit of 9 raised
    >>> marks.lowers(3, 7, (8, 0)) is None      # read the stored one back
    True
    >>> marks.read_back(3, 7, (8, 0), stored=(9, 0))   # it had landed
    True
"""

from __future__ import annotations

Order = tuple[int, ...]
Mark = tuple[int, Order]  # (epoch, position order)


class PositionMarks:
    """See the module docstring."""

    def __init__(self) -> None:
        self._floor: dict[int, Mark] = {}
        self._unsure: dict[int, Mark] = {}

    def raise_floor(self, shard: int, mark: Mark) -> None:
        _raise(self._floor, shard, mark)

    def raise_unsure(self, shard: int, mark: Mark) -> None:
        _raise(self._unsure, shard, mark)

    def lowers(self, shard: int, epoch: int, order: Order) -> bool | None:
        """Whether ``order`` under ``epoch`` is below what is stored: True,
        False, or None when only the stored position can tell."""
        floor = self._floor.get(shard)
        if floor is not None and floor[0] == epoch and order < floor[1]:
            return True
        unsure = self._unsure.get(shard)
        if unsure is None or unsure[0] != epoch or order >= unsure[1]:
            return False
        return None

    def read_back(self, shard: int, epoch: int, order: Order, stored: Order | None) -> bool:
        """Take the ``stored`` position read back (None: none stored); whether
        ``order`` is below it."""
        self._unsure.pop(shard, None)
        if stored is None:
            return False
        _raise(self._floor, shard, (epoch, stored))
        return order < stored


def _raise(marks: dict[int, Mark], shard: int, mark: Mark) -> None:
    old = marks.get(shard)  # a mark of a newer epoch is never replaced by an older one
    if old is None or mark[0] > old[0] or (mark[0] == old[0] and mark[1] > old[1]):
        marks[shard] = mark
