"""What a member does when a shard's next snapshot has expired before it was read.

``--on-data-loss fail`` (the default, as Spark's Kafka source with
``failOnDataLoss=true``): the member stops with one line naming the shards,
the lost snapshot range (from the next unread snapshot to the earliest
retained one minus one) and the exact ``paimon-group reset`` command that
resumes them from the earliest retained snapshot; nothing is committed past
the gap. ``--on-data-loss skip``: the shards move on to the earliest
retained snapshot, with a WARNING line naming the lost range, a ``skip``
event in the history and the ``paimon_group_skipped_snapshots_total``
counter (snapshots summed over the shards that skipped them).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from coordinators.urls import redact_url
from paimon_group.config.member import MemberConfig, local_coordinator_url
from paimon_group.errors import SnapshotExpired

ON_DATA_LOSS = ("fail", "skip")


@dataclass(frozen=True)
class LostRange:
    """Snapshots ``first .. last`` expired before the shards read them."""

    shards: tuple[int, ...]
    first: int
    earliest: int
    full_scan: bool = False

    @property
    def last(self) -> int:
        return self.earliest - 1

    @property
    def count(self) -> int:
        return max(0, self.earliest - self.first)

    def shards_text(self) -> str:
        return ("shard " if len(self.shards) == 1 else "shards ") + \
            ", ".join(str(s) for s in self.shards)

    def what(self, table: str) -> str:
        if self.full_scan:
            return (f"snapshot {self.first} of table {table}, whose full scan was still to be "
                    f"delivered, expired (earliest retained: {self.earliest})")
        span = f"snapshot {self.first}" if self.first == self.last else \
            f"snapshots {self.first}..{self.last}"
        return (f"{span} of table {table} expired before they were read "
                f"(earliest retained: {self.earliest})")


def reset_command(config: MemberConfig, shards: Sequence[int], table: str | None = None) -> str:
    """The ``paimon-group reset`` that resumes ``shards`` from the earliest
    snapshot (``table``: the table they are of, in a group of several)."""
    words = ["paimon-group", "reset", "--group", config.group, "--warehouse", config.warehouse,
             "--table", table or config.table]
    url = config.coordinator_url
    if url != local_coordinator_url(config.warehouse):
        words += ["--coordinator", redact_url(url)]
    words.append("--to-earliest")
    for shard in shards:
        words += ["--shard", str(shard)]
    words.append("--execute")
    return " ".join(shlex.quote(w) for w in words)


def data_loss_error(config: MemberConfig, lost: LostRange,
                    table: str | None = None) -> SnapshotExpired:
    """The one line a member stops with (``--on-data-loss fail``); ``table``:
    the table of ``lost`` in a group of several."""
    return SnapshotExpired(
        f"{lost.shards_text()}: {lost.what(table or config.table)}: their rows are lost to group "
        f"{config.group}, so reading stops and nothing is committed past them (members run "
        "with --on-data-loss skip skip such gaps; docs/operations.md, time to data loss, "
        "says how to keep snapshots from expiring); to resume from the earliest retained "
        f"snapshot, stop the group's members and run: "
        f"{reset_command(config, lost.shards, table)}")


def skip_warning(config: MemberConfig, lost: LostRange, table: str | None = None) -> str:
    """The WARNING line of a skip (``--on-data-loss skip``)."""
    name = table or config.table
    if lost.full_scan:
        return (f"{lost.shards_text()}: {lost.what(name)}: scanning snapshot "
                f"{lost.earliest} in full instead (--on-data-loss skip)")
    return (f"{lost.shards_text()}: {lost.what(name)}: skipping to snapshot "
            f"{lost.earliest} (--on-data-loss skip); the rows of {lost.count} snapshots are "
            f"lost to group {config.group}")
