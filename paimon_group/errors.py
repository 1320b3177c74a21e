"""Errors of the group layer; all derive from :class:`PaimonGroupError`.

The hierarchy is shared with :mod:`coordinators.errors` (one hierarchy, one
``retriable`` flag). Messages are one line and say what to do next.
"""

from __future__ import annotations

from coordinators.errors import (
    AuthenticationFailed,
    ConfigError,
    CoordinatorError,
    CoordinatorUnavailable,
    CorruptValue,
    InvalidCoordinatorURL,
    PaimonGroupError,
    SessionLost,
    SessionSuspended,
)

__all__ = [
    "AlreadyWritten",
    "AuthenticationFailed",
    "BatchExpired",
    "ConfigError",
    "CoordinatorError",
    "CoordinatorUnavailable",
    "CorruptValue",
    "DataFileMissing",
    "GroupBusy",
    "HandlerFailed",
    "HandlerImportError",
    "IncompatibleVersion",
    "InvalidCoordinatorURL",
    "MemberIdInUse",
    "MemberRemoved",
    "NotOwner",
    "ObjectStoreUnavailable",
    "PaimonGroupError",
    "PlanInvariantViolated",
    "SessionLost",
    "SessionSuspended",
    "ShardCountMismatch",
    "SnapshotExpired",
    "StaleEpoch",
    "StaleSinkWrite",
    "TableNotFound",
    "TableReplaced",
    "UnsupportedTable",
    "WarehouseMismatch",
]


class TableNotFound(ConfigError):
    """The Paimon table (or its warehouse) does not exist."""


class ObjectStoreUnavailable(PaimonGroupError):
    """The object store of the warehouse did not answer within its timeout, or
    refused a request (a wrong endpoint, wrong keys); see :mod:`paimon_group.store.object_store`."""


class TableReplaced(PaimonGroupError):
    """The group's table was dropped and re-created under the same name.

    Never retried: the group's positions are snapshot ids of the old table,
    which mean nothing in the new one (waiting would stall, then skip the new
    table's first snapshots). An operator deletes the group (``paimon-group
    delete``) and starts it again, or uses another group name.
    """

    retriable = False


class WarehouseMismatch(ConfigError):
    """A group of a shared coordinator was created on another warehouse.

    A group name is one group per coordinator: the same name used for a table
    of another warehouse would read that table from the first one's
    positions. Refused at join, and by ``delete``/``reset``/``describe``.
    """


class UnsupportedTable(ConfigError):
    """The table's bucket mode cannot be sharded by bucket (``bucket % shards``)."""


class SnapshotExpired(PaimonGroupError):
    """A shard's next snapshot was expired before it was read: data would be skipped.

    Never retriable and never skipped silently: the rows of the expired
    snapshots are gone for this shard. An operator must reset the shard's
    position explicitly (the Paimon consumer files the group mirrors exist to
    prevent this: check that they are written and not expired).
    """

    retriable = False


class BatchExpired(SnapshotExpired, FileNotFoundError):
    """A batch's files were deleted by Paimon's expiry before it was read.

    The batch was planned from snapshots ``first .. last``; snapshot ``first``
    expired (``earliest`` is the earliest retained snapshot) while the batch
    was held, before ``to_arrow()`` or ``iter_batches()`` read it, and the
    expiry deleted a file the batch reads (``file``). Its rows are lost to the
    group: a member handles it as ``--on-data-loss`` says (the one line of
    ``fail``, or the skip), never by calling the handler again. It is a
    ``FileNotFoundError`` too, as the read's own error was.
    """

    def __init__(self, message: str, *, shards: tuple[int, ...], first: int, last: int,
                 earliest: int, full_scan: bool, file: str) -> None:
        super().__init__(message)
        self.shards = shards
        self.first = first
        self.last = last
        self.earliest = earliest
        self.full_scan = full_scan
        self.file = file


class DataFileMissing(PaimonGroupError, FileNotFoundError):
    """A file a batch reads is missing although its snapshot is still retained.

    Not an expiry (which only deletes files of snapshots older than the
    earliest retained one): the file was deleted by something else, or the
    storage lost it (or the table is being dropped). Never retried and never
    skipped: one line names the file. A ``FileNotFoundError`` too, as the
    read's own error was.
    """

    retriable = False


class PlanInvariantViolated(PaimonGroupError):
    """A plan would give a shard a split of a bucket it does not hold (invariant 4).

    A bug, never retried: the batch is refused instead of delivered.
    """


class IncompatibleVersion(ConfigError):
    """A record written by a newer version that this one cannot follow: a
    record of a newer format, or a group that uses a feature this version does
    not know (docs/design.md, "Versions and compatibility"). Refused at join,
    before the member registers or holds anything; never retried: this
    member's version must be upgraded."""


class ShardCountMismatch(ConfigError):
    """``--shards`` contradicts the shard count stored with an existing group."""


class AssignorMismatch(ConfigError):
    """``--assignor`` contradicts the assignor stored with an existing group."""


class HandlerImportError(ConfigError):
    """``MODULE:CALLABLE`` cannot be imported or is not callable."""


class HandlerFailed(PaimonGroupError):
    """The handler kept raising after its retries; the batch was not committed."""


class MemberIdInUse(PaimonGroupError):
    """Another live process holds this member id."""


class GroupBusy(PaimonGroupError):
    """An administrative change was refused because the group has live members."""


class StaleEpoch(PaimonGroupError):
    """A commit was rejected: the writer no longer owns the shard at its epoch.

    Another member took the shard over (our session expired or the shard was
    reassigned). The batch's progress was not recorded; the new owner resumes
    from the last committed position, so the batch may be delivered again.
    Nothing to do: the member drops the shard and carries on.
    """


class AlreadyWritten(PaimonGroupError):
    """A sink already holds a batch's output: its shard is written up to
    ``next_snapshot`` (exclusive) in the sink's target.

    Raised by :class:`~paimon_group.sink.PaimonSink` for a replay (a crash
    came between the target's commit and the position's) or a longer replay
    of it. A handler lets it through; the member then commits position
    ``next_snapshot`` for the shard (fenced, as any commit) and reads on from
    there, so nothing the target holds is read or written again.
    """

    def __init__(self, message: str, *, shard: int, next_snapshot: int) -> None:
        super().__init__(message)
        self.shard = shard
        self.next_snapshot = next_snapshot


class StaleSinkWrite(StaleEpoch):
    """A sink refused a write: a newer owner of the shard (higher epoch) has written.

    The batch was not written. A handler may let it through: the member
    neither retries the batch nor counts a handler failure (the member's
    commit of the batch is rejected by the coordinator for the same reason
    and the shard is dropped); :class:`~paimon_group.spark.handler.SparkBatchHandler`
    returns normally on it.
    """


class NotOwner(PaimonGroupError):
    """An operation needs ownership of a shard that this member does not hold."""


class MemberRemoved(PaimonGroupError):
    """An operator removed this member from its group (``members remove``)."""
