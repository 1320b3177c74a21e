"""A read round that found nothing new is not run again until something it
looked at changed.

An idle member's read loop runs a round every poll interval. While the
group's head is fresh, a round of a member holding shards of many tables only
finds, shard group by shard group, that the head names no snapshot at the
group's position (``HeadView.nothing_new_in``): no request, but work in
proportion to the shards held (80 shards at 200 tables over 20 members),
every second, for nothing. :class:`IdleRounds` remembers what such a round
looked at (its *key*) and lets the next round be skipped while the key is
the same and the head still fresh. The key is taken in constant time, so a
skipped round costs nothing in proportion to the shards held either. The
round's result would be the same:

* its shard groups are the held shards' (table, next snapshot) pairs: any
  change of a held shard (its epoch, position, state, anything) or of the
  held set changes ``OwnedShard.last_change``, in the key;
* each group was skipped on the head's latest of its table (``tables``, or
  ``latest`` for a group of one table), in the key; the head's freshness is
  checked at each skip;
* nothing else a round does applies: a key is only kept when no held
  shard has a commit to read back, a start to resolve or a full scan due
  (checked once, when the round that looked only has run), and when no
  table's start can move (bucket-unaware tables: their re-pin is looked
  for in every round).

A table found gone only takes groups away (still nothing to read); a new
table map is another object (in the key). Skipping a round whose result
would be the same cannot lose or repeat a row: every position still moves
only by a fenced commit, and the next round that runs plans as it would
have.
"""

from __future__ import annotations

from collections.abc import Sequence

from paimon_group.member.head import HeadView
from paimon_group.member.state import OwnedShard
from paimon_group.member.tables import MemberTables

__all__ = ["IdleRounds"]


class IdleRounds:
    """The key of the last round that found nothing new (see the module docstring)."""

    def __init__(self) -> None:
        self._idle: object | None = None

    @staticmethod
    def key(tables: MemberTables | None, head: HeadView) -> object | None:
        """What a round looks at, or None when it may do more than look (see
        the module docstring)."""
        record = head.record
        if tables is None or tables.any_file_rule or record is None:
            return None
        return (tables, record.latest, record.tables, OwnedShard.last_change)

    def skip(self, key: object | None, head: HeadView) -> bool:
        """Whether the round of ``key`` may be skipped: the last round found
        nothing new with the same key, and the head is still fresh. A round
        not skipped is forgotten until :meth:`ran` says how it went."""
        if key is not None and key == self._idle and head.fresh:
            return True
        self._idle = None
        return False

    def ran(self, key: object | None, active: Sequence[OwnedShard], *,
            looked_only: bool) -> None:
        """A round of ``key`` over the held ``active`` shards ran;
        ``looked_only``: every group it had was skipped on the head (nothing
        planned, nothing progressed). Its key is kept only if none of those
        shards has more to do than look."""
        self._idle = key if looked_only and all(map(_looks_only, active)) else None


def _looks_only(o: OwnedShard) -> bool:
    """Whether a round over ``o`` may only look: no commit to read back, its
    start resolved, no full scan due."""
    return o.unsure is None and o.next_snapshot is not None and o.full_scan is None
