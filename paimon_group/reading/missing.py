"""A file of a planned read found missing: expired, or lost otherwise.

A batch is planned from snapshots that existed then, and its files are read
later: a handler may hold the batch for minutes before it calls
``to_arrow()``. Paimon's expiry deletes a data file (or a changelog file)
only once every snapshot that still referenced it has expired, so a file a
batch of snapshots ``first .. last`` reads can only vanish by expiry once
snapshot ``first`` has expired too: the earliest retained snapshot is then
after ``first``. That is data loss (:class:`~paimon_group.errors.BatchExpired`,
handled as ``--on-data-loss`` says). Paimon's expiration deletes the data
files of the snapshots it expires before their snapshot files, so a file may
be gone while ``first`` still looks retained for a moment: the earliest
retained snapshot is asked for again, :data:`EXPIRY_CHECKS` times
:data:`EXPIRY_CHECK_S` apart. A file missing while snapshot ``first`` is
retained all that time was not deleted by the expiry: it stays an error, in
one line naming the file (:class:`~paimon_group.errors.DataFileMissing`).

Example::

    try:
        rows = view.read_arrow(splits)
    except FileNotFoundError as err:
        raise missing_file_error(table, err, shards=(2,), first=5, last=7,
                                 full_scan=False) from err
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from typing import Protocol

from coordinators.errors import PaimonGroupError
from paimon_group.errors import BatchExpired, DataFileMissing

__all__ = ["EXPIRY_CHECKS", "EXPIRY_CHECK_S", "missing_file_error", "missing_file_name"]

EXPIRY_CHECKS = 20
"""Times the earliest retained snapshot is asked for before a missing file
of a retained snapshot is an error."""

EXPIRY_CHECK_S = 0.25
"""Seconds between two of those (5 s in all: an expiration deletes the
snapshot files right after the data files, a few requests apart)."""

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
    (at most :data:`EXPIRY_CHECKS` times); None: no snapshot at all. Not
    asked again for a table dropped or re-created (whose reader says so)."""
    earliest: int | None = None
    for check in range(EXPIRY_CHECKS):
        try:
            earliest = table.earliest_snapshot_id()
        except FileNotFoundError:  # the snapshot directory is gone with the table
            earliest = None
        if earliest is None or earliest > first:
            return earliest
        try:
            table.raise_if_dropped()
        except PaimonGroupError:
            return earliest
        if check < EXPIRY_CHECKS - 1:
            time.sleep(EXPIRY_CHECK_S)
    return earliest
