"""A file found missing, planning a snapshot or reading a batch: expired, or one clear error.

Two readers meet it: the planner (:func:`expired_if_gone`, below) and a
batch whose files are read after it was planned (:func:`missing_file_error`).
Both ask the store the same question, again for a few seconds while the
answer is "retained" (:func:`expired_within_checks`): Paimon's expiration
deletes a snapshot's data files and manifests just before its snapshot file.

**Planning.**

A plan starts from a snapshot that may not be in the store any more: a member
keeps the texts of the snapshots the group's head handed over
(:meth:`~paimon_group.reading.table.ShardedTable.remember_snapshot`) and plans
them without reading their files, and any snapshot read from the store can
expire between that read and the reads of its manifest lists. Paimon's
expiration deletes, snapshot by snapshot, the manifest lists and manifests no
retained snapshot uses, then the snapshot's file. So a plan that finds one of
them missing asks the store (never the memory) whether the snapshot is still
retained (:func:`expired_if_gone`):

* **gone**: the table is checked first (dropped or re-created:
  :class:`~paimon_group.errors.TableNotFound`, ``TableReplaced``); else, the
  snapshot being at or below the latest, it expired, and
  :class:`~paimon_group.errors.SnapshotExpired` is raised, which the member
  handles as it handles any expired position (``--on-data-loss``: the one
  line, or the skip with its WARNING);
* **still retained**: the expiration may be between the snapshot's manifests
  and its file, so the file is asked for again, :data:`EXPIRY_CHECKS` times
  :data:`EXPIRY_CHECK_S` apart; a snapshot still retained then, with a file
  of it missing, is a damaged table: one line naming the file (not retried).

A remembered snapshot is thus never trusted past its expiry (design invariant
7), and planning from memory costs nothing more until a file is missing.

**A batch read later.** A handler may hold a batch for minutes before it
calls ``to_arrow()``. Paimon's expiry deletes a data file (or a changelog
file) only once every snapshot that still referenced it has expired, so a
file a batch of snapshots ``first .. last`` reads can only vanish by expiry
once snapshot ``first`` has expired too: the earliest retained snapshot is
then after ``first``. That is data loss
(:class:`~paimon_group.errors.BatchExpired`, handled as ``--on-data-loss``
says). A file missing while snapshot ``first`` is retained all that time was
not deleted by the expiry: it stays an error, in one line naming the file
(:class:`~paimon_group.errors.DataFileMissing`).

Example::

    with expired_if_gone(table, snapshot_id):
        manifests = manifest_lists.read_all(snapshot)

    try:
        rows = view.read_arrow(splits)
    except FileNotFoundError as err:
        raise missing_file_error(table, err, shards=(2,), first=5, last=7,
                                 full_scan=False) from err
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

from coordinators.errors import PaimonGroupError
from paimon_group.errors import BatchExpired, DataFileMissing

__all__ = ["EXPIRY_CHECKS", "EXPIRY_CHECK_S", "expired_if_gone", "expired_within_checks",
           "missing_file_error", "missing_file_name", "vanished_error"]

EXPIRY_CHECKS = 20
"""Times a retained snapshot with a missing file is asked for again."""

EXPIRY_CHECK_S = 0.25
"""Seconds between two of those (5 s in all: an expiration deletes a
snapshot's file right after its manifests, one request or a few apart)."""


class _PlannedTable(Protocol):
    """What planning asks of its table (a :class:`~paimon_group.reading.table.ShardedTable`)."""

    @property
    def identifier(self) -> str: ...

    def raise_if_dropped(self) -> None: ...

    def snapshot_retained(self, snapshot_id: int) -> bool: ...

    def latest_snapshot_id(self, *, fresh: bool = False) -> int | None: ...

    def expired_error(self, snapshot_id: int) -> Exception: ...


def expired_within_checks(expired: Callable[[], bool]) -> bool:
    """Whether ``expired()`` says so within :data:`EXPIRY_CHECKS` asks,
    :data:`EXPIRY_CHECK_S` apart (asked again only while it says no)."""
    for check in range(EXPIRY_CHECKS):
        if expired():
            return True
        if check < EXPIRY_CHECKS - 1:
            time.sleep(EXPIRY_CHECK_S)
    return False


@contextlib.contextmanager
def expired_if_gone(table: _PlannedTable, snapshot_id: int) -> Iterator[None]:
    """Plan ``snapshot_id`` (the first snapshot planned) inside this block: a
    file found missing becomes :func:`vanished_error`'s error."""
    try:
        yield
    except FileNotFoundError as err:
        raise vanished_error(table, snapshot_id, err) from err


def vanished_error(table: _PlannedTable, snapshot_id: int,
                   err: FileNotFoundError) -> Exception:
    """The error for a file of ``snapshot_id`` found missing while planning it
    (see the module docstring); raises TableNotFound or TableReplaced itself."""
    def gone() -> bool:
        table.raise_if_dropped()
        return not table.snapshot_retained(snapshot_id)

    if expired_within_checks(gone):
        latest = table.latest_snapshot_id(fresh=True)
        if latest is not None and snapshot_id <= latest:
            return table.expired_error(snapshot_id)
        return err  # no snapshot that far: not an expiry, the error stands
    return PaimonGroupError(
        f"snapshot {snapshot_id} of table {table.identifier} is retained but a file it needs "
        f"is missing ({err}): the table's files are damaged (deleted by hand, or by a tool "
        "other than Paimon's expiration); nothing of the snapshot was delivered")


_QUOTED = re.compile(r"""['"]([^'"]+)['"]""")


class _Table(Protocol):
    @property
    def identifier(self) -> str: ...

    def earliest_snapshot_id(self) -> int | None: ...

    def raise_if_dropped(self) -> None: ...


def missing_file_name(err: OSError) -> str:
    """The path ``err`` names (pyarrow quotes it in its message), else its message."""
    if err.filename:
        return str(err.filename)
    text = str(err).splitlines()[0] if str(err) else type(err).__name__
    quoted = _QUOTED.search(text)
    return quoted.group(1) if quoted else text


def missing_file_error(table: _Table, err: OSError, *, shards: Sequence[int], first: int,
                       last: int, full_scan: bool) -> BatchExpired | DataFileMissing:
    """What a file missing under a read of snapshots ``first .. last`` means,
    after one look at the table's earliest retained snapshot."""
    earliest = _earliest_after(table, first)
    file = missing_file_name(err)
    who = ("shard " if len(shards) == 1 else "shards ") + ", ".join(str(s) for s in shards)
    span = f"snapshot {first}" if first == last else f"snapshots {first}..{last}"
    if earliest is not None and earliest > first:
        return BatchExpired(
            f"{who}: file {file} of {span} of table {table.identifier} is gone: snapshot "
            f"{first} expired before the batch was read (earliest retained: {earliest}), so "
            "its rows are lost", shards=tuple(shards), first=first, last=last,
            earliest=earliest, full_scan=full_scan, file=file)
    retained = "no snapshot is retained" if earliest is None else \
        f"snapshot {first} is still retained (earliest retained: {earliest})"
    return DataFileMissing(
        f"{who}: file {file} of {span} of table {table.identifier} is missing although "
        f"{retained}: it was not deleted by Paimon's expiry (something else deleted it, or "
        "the storage lost it); nothing is committed past it")


def _earliest_after(table: _Table, first: int) -> int | None:
    """The earliest retained snapshot, asked for until it is after ``first``
    (:func:`expired_within_checks`); None: no snapshot at all. Not asked
    again for a table dropped or re-created (whose reader says so)."""
    earliest: int | None = None

    def expired() -> bool:
        nonlocal earliest
        try:
            earliest = table.earliest_snapshot_id()
        except FileNotFoundError:  # the snapshot directory is gone with the table
            earliest = None
        if earliest is None or earliest > first:
            return True
        try:
            table.raise_if_dropped()
        except PaimonGroupError:
            return True  # asked no more: the reader names the dropped table
        return False

    expired_within_checks(expired)
    return earliest
