"""Start positions: where a shard with no committed position begins reading.

A start position is parsed once from user text (``--start``) by
:func:`parse_start`, when the member's configuration is built
(``MemberConfig.start_position``), and resolved against the table when a shard
first needs it (:mod:`paimon_group.reading.start`).

==========================  ================================================
text                        meaning
==========================  ================================================
``latest-full`` (default)   full scan of the latest snapshot, then follow-ups
``latest``                  only snapshots committed after the start
``earliest``                full scan of the earliest retained snapshot, then
                            follow-ups (see :attr:`StartKind.EARLIEST`)
``snapshot:N``              follow-ups starting with snapshot N (N >= 1)
``timestamp:T``             follow-ups from the first snapshot committed at or
                            after T: ISO-8601 (``2024-05-01T12:00:00Z``; no
                            offset means UTC) or epoch milliseconds
==========================  ================================================

On an empty table (no snapshot yet) every position resolves to "follow-ups
from snapshot 1", so nothing the first writer commits is missed.

Example::

    >>> from paimon_group.config.start import parse_start
    >>> parse_start("snapshot:42")
    StartPosition(kind=<StartKind.SNAPSHOT: 'snapshot'>, snapshot_id=42, timestamp_ms=None)
    >>> str(parse_start("timestamp:2024-05-01T12:00:00Z"))
    'timestamp:2024-05-01T12:00:00.000Z'
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from datetime import UTC, datetime

from coordinators.errors import ConfigError

__all__ = [
    "DEFAULT_START",
    "StartKind",
    "StartPosition",
    "parse_start",
]


class StartKind(enum.Enum):
    """The kinds of start position."""

    LATEST_FULL = "latest-full"
    """Full scan of the latest snapshot, then follow-ups (the default)."""

    LATEST = "latest"
    """Only snapshots committed after the start; nothing already in the table."""

    EARLIEST = "earliest"
    """Full scan of the earliest *retained* snapshot, then follow-ups.

    Why a full scan and not "follow-ups from the earliest snapshot": once
    older snapshots have been expired, the delta of the earliest retained
    snapshot holds only what that one commit added; files written by expired
    commits (and still live in the table) would never be delivered. The full
    scan of the earliest snapshot delivers the complete table as of that
    snapshot, and the follow-ups every change after it, so ``earliest`` reads
    everything the table still knows about. When nothing has been expired and
    the table is append-only this is exactly the history from snapshot 1.
    """

    SNAPSHOT = "snapshot"
    """Follow-ups starting with snapshot N (no full scan)."""

    TIMESTAMP = "timestamp"
    """Follow-ups from the first snapshot committed at or after a time."""


@dataclass(frozen=True)
class StartPosition:
    """A parsed start position; build it with :func:`parse_start`."""

    kind: StartKind
    snapshot_id: int | None = None
    timestamp_ms: int | None = None

    def __str__(self) -> str:
        if self.kind is StartKind.SNAPSHOT:
            return f"snapshot:{self.snapshot_id}"
        if self.kind is StartKind.TIMESTAMP:
            when = datetime.fromtimestamp((self.timestamp_ms or 0) / 1000, tz=UTC)
            return "timestamp:" + when.isoformat(timespec="milliseconds").replace("+00:00", "Z")
        return str(self.kind.value)


_HELP = (
    "expected latest-full, latest, earliest, snapshot:N (N >= 1) "
    "or timestamp:ISO-8601 (or timestamp:EPOCH_MILLIS)"
)
_SNAPSHOT_RE = re.compile(r"snapshot:(\d+)")
_DIGITS_RE = re.compile(r"\d+")


def _parse_timestamp_ms(text: str, original: str) -> int:
    if _DIGITS_RE.fullmatch(text):
        return int(text)
    try:
        when = datetime.fromisoformat(text)
    except ValueError as err:
        raise ConfigError(f"bad start position {original!r}: {text!r} is not ISO-8601") from err
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return int(when.timestamp() * 1000)


def parse_start(text: str) -> StartPosition:
    """Parse ``--start`` text; raise :class:`ConfigError` (one line) if malformed."""
    value = text.strip()
    lowered = value.lower()
    for kind in (StartKind.LATEST_FULL, StartKind.LATEST, StartKind.EARLIEST):
        if lowered == kind.value:
            return StartPosition(kind)
    match = _SNAPSHOT_RE.fullmatch(lowered)
    if match:
        snapshot_id = int(match.group(1))
        if snapshot_id < 1:
            raise ConfigError(f"bad start position {text!r}: snapshot ids start at 1")
        return StartPosition(StartKind.SNAPSHOT, snapshot_id=snapshot_id)
    if lowered.startswith("timestamp:"):
        stamp = value[len("timestamp:") :].strip()
        if not stamp:
            raise ConfigError(f"bad start position {text!r}: {_HELP}")
        return StartPosition(StartKind.TIMESTAMP, timestamp_ms=_parse_timestamp_ms(stamp, text))
    raise ConfigError(f"bad start position {text!r}: {_HELP}")


DEFAULT_START = StartPosition(StartKind.LATEST_FULL)
"""``latest-full``: what a shard with no position does when no ``--start`` is given."""
