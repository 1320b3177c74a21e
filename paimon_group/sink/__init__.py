"""Sinks that commit a group's output once per source row.

:class:`PaimonSink` writes each source batch's output into a Paimon table
exactly once, across crashes, handoffs and replays (see
:mod:`paimon_group.sink.paimon`); the marks it keeps in the target's
snapshots are :mod:`paimon_group.sink.marks`.
"""

from __future__ import annotations

from paimon_group.errors import AlreadyWritten
from paimon_group.sink.marks import ShardMark
from paimon_group.sink.paimon import COMMIT_INTERVAL_S, COMMIT_ROWS, PaimonSink

__all__ = ["COMMIT_INTERVAL_S", "COMMIT_ROWS", "AlreadyWritten", "PaimonSink", "ShardMark"]
