"""The sink's target table: its rows' shape, its marks, one commit at a time.

:class:`TargetTable` wraps a pypaimon table for :class:`~paimon_group.sink.paimon.PaimonSink`:

* :meth:`~TargetTable.conform` gives the output rows the target's columns
  and, on a primary-key target, fills its ``sequence.field`` column with the
  batch's source snapshot;
* :meth:`~TargetTable.write_files` writes a batch's data files with a writer
  of its own and returns their commit messages (nothing is visible yet);
* :meth:`~TargetTable.marks_at_latest` reads the marks of every group as of
  the newest snapshot (scanning only the snapshots it has not seen), as
  stored: a group's are decoded only when one of its batches is judged
  (:meth:`~TargetTable.group_marks`), so marks the sink cannot read (corrupt,
  or of a newer format) fail their own group's batches only, and are carried
  as they are;
* :meth:`~TargetTable.commit_once` commits on top of exactly that snapshot,
  once: pypaimon's commit is a compare-and-set of the next snapshot id, and
  its retry (which would read a newer snapshot and commit on it with marks
  judged against the older one) is not used. The snapshot file is created
  only if its name is free (:mod:`paimon_group.store.exclusive`): pypaimon's
  own create asks, then renames over whatever another process created
  meanwhile, and two sink processes both "won" the same snapshot id (one
  batch of 300 lost, without an error).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from paimon_group.errors import ConfigError
from paimon_group.reading.table import ShardedTable
from paimon_group.sink.marks import NONCE_PROPERTY, GroupMarks, ShardMark, decode_group, group_of
from paimon_group.store.exclusive import create_exclusive, exclusive_create_check

log = logging.getLogger("paimon_group.sink")

# The options of the table the sink commits with: one try per commit (a lost
# race is judged again by the sink), and a commit of batches without output
# rows still makes a snapshot (it carries their marks).
COMMIT_OPTIONS = {"commit.max-retries": "0", "snapshot.ignore-empty-commit": "false"}


class _PinnedLatest:
    """A snapshot manager whose latest snapshot is the one the marks were
    judged on: pypaimon's commit then writes exactly the id after it, or
    fails if another writer took that id."""

    def __init__(self, manager: Any, latest: Any) -> None:
        self._manager = manager
        self._latest = latest

    def get_latest_snapshot(self) -> Any:
        return self._latest

    def __getattr__(self, name: str) -> Any:
        return getattr(self._manager, name)


def _exclusive_snapshot_commit(snapshot_manager: Any) -> Any:
    """pypaimon's renaming snapshot commit, but the snapshot file is created
    only if no other writer created it (:func:`create_exclusive`); the LATEST
    hint is written as pypaimon writes it (a hint: readers check it)."""
    from pypaimon.common.json_util import JSON
    from pypaimon.snapshot.renaming_snapshot_commit import RenamingSnapshotCommit

    class ExclusiveSnapshotCommit(RenamingSnapshotCommit):  # type: ignore[misc]
        def commit(self, base_snapshot_uuid: Any, snapshot: Any, statistics: Any) -> bool:
            path = self.snapshot_manager.get_snapshot_path(snapshot.id)
            if not create_exclusive(self.file_io, path, JSON.to_json(snapshot, indent=2)):
                return False
            self._commit_latest_hint(snapshot.id)
            return True

    return ExclusiveSnapshotCommit(snapshot_manager)


class TargetTable:
    """A Paimon table a sink writes into; see the module docstring."""

    def __init__(self, table: Any, identifier: str, warehouse: str = "") -> None:
        exclusive_create_check(table.file_io, table.table_path)
        self.table = table
        self.identifier = identifier
        self.warehouse = warehouse
        self._committing = table.copy(dict(COMMIT_OPTIONS))
        self.sequence_column = _sequence_column(table, identifier)
        self._fields = {f.name: f for f in _arrow_schema(table)}
        self._lock = threading.Lock()
        self._seen = 0  # the newest snapshot whose properties were read
        self._marks: dict[str, str] = {}  # each group's marks property, as stored
        self._decoded: dict[str, tuple[str, GroupMarks]] = {}  # group -> (value, marks)

    @classmethod
    def open(cls, warehouse: str, table: str,
             catalog_options: Mapping[str, str] | None = None) -> TargetTable:
        """Open ``table`` (``DB.TABLE``); one line for a missing table or a
        primary-key table without ``sequence.field``."""
        opened = ShardedTable.open(warehouse, table, catalog_options,
                                   check="check the sink's warehouse and table")
        return cls(opened.table, table, opened.warehouse)

    # -- rows ----------------------------------------------------------------

    def conform(self, rows: pa.Table, snapshot_id: int) -> pa.Table:
        """``rows`` in the target's column order and types; the sequence
        column filled with ``snapshot_id`` unless the rows carry it."""
        if self.sequence_column is not None and self.sequence_column not in rows.column_names:
            rows = rows.append_column(self.sequence_column, pa.array(
                [snapshot_id] * rows.num_rows, pa.int64()))
        missing = [name for name in self._fields if name not in rows.column_names
                   and not self._fields[name].nullable]
        if missing:
            raise ConfigError(f"the output rows for {self.identifier} lack the columns "
                              f"{', '.join(missing)} (NOT NULL in the target)")
        return pa.Table.from_arrays([
            rows.column(f.name).cast(f.type) if f.name in rows.column_names
            else pa.nulls(rows.num_rows, f.type) for f in self._fields.values()],
            schema=pa.schema(list(self._fields.values())))

    def write_files(self, rows: pa.Table, commit_user: str) -> list[Any]:
        """Write ``rows``' data files; their commit messages (not committed)."""
        write = self.table.new_batch_write_builder().new_write()
        try:
            if rows.num_rows:
                write.write_arrow(rows)
            messages: list[Any] = write.prepare_commit()
            return messages
        finally:
            write.close()

    # -- marks -----------------------------------------------------------------

    def marks(self, group: str, *, fresh: bool = True) -> dict[int, ShardMark]:
        """``group``'s marks as of the newest snapshot (``fresh``) or as last
        read, whatever their source."""
        return dict(self.group_marks(group, fresh=fresh).shards)

    def group_marks(self, group: str, *, fresh: bool = True) -> GroupMarks:
        """``group``'s marks (with their source) as of the newest snapshot
        (``fresh``) or as last read; one line if they cannot be read."""
        if fresh:
            value = self.marks_at_latest()[1].get(group)
        else:
            with self._lock:
                value = self._marks.get(group)
        return GroupMarks() if value is None else self.decoded(group, value)

    def decoded(self, group: str, value: str) -> GroupMarks:
        """``group``'s marks property ``value`` decoded (once per value)."""
        with self._lock:
            known = self._decoded.get(group)
        if known is not None and known[0] == value:
            return known[1]
        marks = decode_group(value)
        with self._lock:
            self._decoded[group] = (value, marks)
        return marks

    def marks_at_latest(self) -> tuple[Any, dict[str, str]]:
        """The newest snapshot (None: the table has none) and every group's
        marks property as of it, as stored (:meth:`decoded` reads one): the
        newest snapshot that carries a group's property holds all of its
        marks (each commit carries them all)."""
        manager = self.table.snapshot_manager()
        latest = manager.get_latest_snapshot()
        with self._lock:
            if latest is None:
                return None, {}
            found: dict[str, str] = {}
            for snapshot_id in range(latest.id, self._seen, -1):
                snapshot = latest if snapshot_id == latest.id else \
                    manager.get_snapshot_by_id(snapshot_id)
                if snapshot is None:
                    break  # expired: older ones are too
                for key, value in (snapshot.properties or {}).items():
                    group = group_of(key, value)
                    if group is not None and group not in found:
                        found[group] = value
            self._marks.update(found)
            self._seen = latest.id
            return latest, dict(self._marks)

    # -- committing ------------------------------------------------------------

    def commit_once(self, messages: list[Any], latest: Any, properties: dict[str, str],
                    commit_user: str, identifier: int, nonce: str) -> bool:
        """Commit ``messages`` with ``properties`` as the snapshot after
        ``latest``; False if another writer's commit took that id first.
        A commit whose outcome is unknown (an error after the snapshot may
        have been written) is looked up by its ``nonce``."""
        from pypaimon.snapshot.renaming_snapshot_commit import RenamingSnapshotCommit
        from pypaimon.write.table_commit import StreamTableCommit

        commit = StreamTableCommit(self._committing, commit_user)
        store_commit = commit.file_store_commit
        store_commit.snapshot_manager = _PinnedLatest(store_commit.snapshot_manager, latest)
        if isinstance(store_commit.snapshot_commit, RenamingSnapshotCommit):
            # (A catalog's own commit, a REST catalog's, is the server's
            # compare-and-set already.)
            store_commit.snapshot_commit = _exclusive_snapshot_commit(
                store_commit.snapshot_manager)
        try:
            commit.commit(messages, identifier, snapshot_properties=properties)
            return True
        except Exception as err:  # a lost race, or an unknown outcome
            taken = self.table.snapshot_manager().get_snapshot_by_id(
                1 if latest is None else latest.id + 1)
            if taken is not None and (taken.properties or {}).get(NONCE_PROPERTY) == nonce:
                return True
            if taken is None:
                raise  # nothing took the id: not a race
            log.debug("the sink's commit lost the race for snapshot %d: %s", taken.id, err)
            return False
        finally:
            commit.close()


def _arrow_schema(table: Any) -> pa.Schema:
    from pypaimon.schema.data_types import PyarrowFieldParser

    schema: pa.Schema = PyarrowFieldParser.from_paimon_schema(table.table_schema.fields)
    return schema


def _sequence_column(table: Any, identifier: str) -> str | None:
    """The column a primary-key target orders a key's rows by; None for an
    append target. One line when a primary-key target has none."""
    if not table.primary_keys:
        return None
    fields: list[str] = table.options.sequence_field()
    if len(fields) != 1:
        raise ConfigError(
            f"the primary-key target {identifier} needs 'sequence.field' set to one BIGINT "
            "column the sink fills with the source snapshot (so a key's later source "
            "version wins whichever member wrote it), e.g. "
            "ALTER TABLE ... SET ('sequence.field' = 'pg_source_snapshot')")
    return fields[0]
