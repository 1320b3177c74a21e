"""Start positions resolved against a table.

The text of a start position (``--start``) is parsed once, with the member's
configuration (:mod:`paimon_group.config.start`, whose names are also
importable from here); :meth:`paimon_group.reading.table.ShardedTable.resolve_start`
resolves it when a shard first needs it, giving a :class:`ResolvedStart`: an
optional full scan of one snapshot, then follow-ups from ``next_snapshot``.
"""

from __future__ import annotations

from dataclasses import dataclass

from paimon_group.config.start import DEFAULT_START, StartKind, StartPosition, parse_start

__all__ = [
    "DEFAULT_START",
    "ResolvedStart",
    "StartKind",
    "StartPosition",
    "parse_start",
]


@dataclass(frozen=True)
class ResolvedStart:
    """A start position resolved against a table.

    ``full_scan_snapshot``: when not None, first read the full content of
    that snapshot (``ShardPlanner.plan_full``); its position after commit is
    ``full_scan_snapshot + 1`` == ``next_snapshot``. Then, or when it is None,
    follow-ups begin with ``next_snapshot`` (``ShardPlanner.plan_next``).
    """

    next_snapshot: int
    full_scan_snapshot: int | None = None
