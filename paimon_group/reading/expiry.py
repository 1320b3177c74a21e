"""A snapshot whose files vanish while it is planned: expired, or one clear error.

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

Example::

    with expired_if_gone(table, snapshot_id):
        manifests = manifest_lists.read_all(snapshot)
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from coordinators.errors import PaimonGroupError

if TYPE_CHECKING:
    from paimon_group.reading.planner import PlannedTable

__all__ = ["EXPIRY_CHECKS", "EXPIRY_CHECK_S", "expired_if_gone", "vanished_error"]

EXPIRY_CHECKS = 20
"""Times a retained snapshot with a missing file is asked for again."""

EXPIRY_CHECK_S = 0.25
"""Seconds between two of those (5 s in all: an expiration deletes a
snapshot's file right after its manifests, one request or a few apart)."""


@contextlib.contextmanager
def expired_if_gone(table: PlannedTable, snapshot_id: int) -> Iterator[None]:
    """Plan ``snapshot_id`` (the first snapshot planned) inside this block: a
    file found missing becomes :func:`vanished_error`'s error."""
    try:
        yield
    except FileNotFoundError as err:
        raise vanished_error(table, snapshot_id, err) from err


def vanished_error(table: PlannedTable, snapshot_id: int,
                   err: FileNotFoundError) -> Exception:
    """The error for a file of ``snapshot_id`` found missing while planning it
    (see the module docstring); raises TableNotFound or TableReplaced itself."""
    for check in range(EXPIRY_CHECKS):
        table.raise_if_dropped()
        if not table.snapshot_retained(snapshot_id):
            latest = table.latest_snapshot_id(fresh=True)
            if latest is not None and snapshot_id <= latest:
                return table.expired_error(snapshot_id)
            return err  # no snapshot that far: not an expiry, the error stands
        if check < EXPIRY_CHECKS - 1:
            time.sleep(EXPIRY_CHECK_S)
    return PaimonGroupError(
        f"snapshot {snapshot_id} of table {table.identifier} is retained but a file it needs "
        f"is missing ({err}): the table's files are damaged (deleted by hand, or by a tool "
        "other than Paimon's expiration); nothing of the snapshot was delivered")
