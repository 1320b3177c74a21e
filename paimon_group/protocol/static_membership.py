"""Static membership: a member that comes back with its id gets its own shards back.

Two rules, both applied by the leader before it calls the assignor
(:func:`paimon_group.protocol.assignor.assign`):

* **Homes** (:func:`sticky_basis`): the assignment records each member's
  shards as its *home*. A member that returns (it holds nothing now but has
  a home) is treated as still holding its home shards, taken back from
  whoever held them meanwhile, so the sticky assignor moves exactly those
  shards back and nothing else: a rolling restart never shuffles the
  survivors' shards. Homes of members away for more than
  :data:`HOME_RETENTION_S` are forgotten.
* **Reservations** (:class:`VanishedMembers`): with ``rebalance_delay_s``, a
  member that vanished without a goodbye keeps its shards that long
  (counted from when this leader first saw it gone), so a restart with the
  same id moves nothing at all. A graceful leave moves shards at once.

Example::

    vanished = VanishedMembers()
    reserved, recheck_after = vanished.reserved({"a"}, previous, set(), delay=30.0,
                                                now=time.monotonic())
    basis, home, away = sticky_basis(previous, sorted({"a"} | reserved), num_shards=8)
"""

from __future__ import annotations

import time

from paimon_group.protocol.records import Assignment

HOME_RETENTION_S = 3600.0


class VanishedMembers:
    """When the leader first saw each member of the assignment gone."""

    def __init__(self) -> None:
        self._since: dict[str, float] = {}

    def reserved(
        self, live: set[str], previous: Assignment | None, leaving: set[str], *,
        delay: float, now: float,
    ) -> tuple[set[str], list[float]]:
        """Members that vanished without a goodbye less than ``delay`` seconds
        ago (they keep their shards), and after how many seconds each of
        them is due a re-check (when its delay runs out, even if nothing
        else changes)."""
        if delay <= 0 or previous is None:
            self._since.clear()
            return set(), []
        reserved: set[str] = set()
        recheck_after: list[float] = []
        for member, shards in previous.shards.items():
            if member in live or member in leaving or not shards:
                self._since.pop(member, None)
                continue
            first_seen = self._since.setdefault(member, now)
            if now - first_seen < delay:
                reserved.add(member)
                recheck_after.append(delay - (now - first_seen) + 0.05)
        for member in list(self._since):
            if member in live:
                del self._since[member]
        return reserved, recheck_after


def sticky_basis(
    previous: Assignment | None, members: list[str], num_shards: int, *,
    now: float | None = None,
) -> tuple[dict[str, list[int]], dict[str, list[int]], dict[str, float]]:
    """The "previous" assignment handed to the assignor, with static members'
    homes; and the homes and away times to publish with the new one.
    ``now``: the leader's wall clock (default ``time.time()``)."""
    if previous is None:
        return {}, {}, {}
    now = time.time() if now is None else now
    basis = {m: list(s) for m, s in previous.shards.items()}
    home = {m: list(s) for m, s in previous.home.items()}
    away = dict(previous.away_since)
    live = set(members)
    for m in list(home):
        if m not in live:
            away.setdefault(m, now)
            if now - away[m] > HOME_RETENTION_S:
                home.pop(m, None)
                away.pop(m, None)
    for m in members:
        if basis.get(m) or not home.get(m):
            continue
        mine = {s for s in home[m] if s < num_shards}
        for other in basis:
            basis[other] = [s for s in basis[other] if s not in mine]
        basis[m] = sorted(mine)
    return basis, home, away


def same_assignment(a: dict[str, list[int]], b: dict[str, list[int]]) -> bool:
    """Whether two assignments give every member the same shards."""
    def norm(d: dict[str, list[int]]) -> dict[str, list[int]]:
        return {k: sorted(v) for k, v in d.items() if v or k in d}

    return norm(a) == norm(b)
