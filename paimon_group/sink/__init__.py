"""Sinks that commit a group's output once per source row.

:class:`PaimonSink` writes each source batch's output into a Paimon table
exactly once, across crashes, handoffs and replays (see
:mod:`paimon_group.sink.paimon`); the marks it keeps in the target's
snapshots are :mod:`paimon_group.sink.marks`. :class:`PaimonSinks` writes
each source table of a group of several tables into its own target
(:mod:`paimon_group.sink.routed`).
"""

from __future__ import annotations

from paimon_group.errors import AlreadyWritten
from paimon_group.sink.marks import ShardMark
from paimon_group.sink.paimon import COMMIT_INTERVAL_S, COMMIT_ROWS, PaimonSink
from paimon_group.sink.routed import PaimonSinks

__all__ = ["COMMIT_INTERVAL_S", "COMMIT_ROWS", "AlreadyWritten", "PaimonSink", "PaimonSinks",
           "ShardMark"]
