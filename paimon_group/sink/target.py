"""The sink's target table: its rows' shape, its marks, one commit at a time.

:class:`TargetTable` wraps a pypaimon table for :class:`~paimon_group.sink.paimon.PaimonSink`:

* :meth:`~TargetTable.open` refuses, in one line, a target the sink cannot
  write once: a primary-key target without a fixed bucket count (Paimon
  lets one writer job write dynamic or postponed buckets) or without a
  ``BIGINT`` ``sequence.field``;
* :meth:`~TargetTable.conform` gives the output rows the target's columns
  (following the target's schema as it changes: :meth:`~TargetTable.current`),
  on a primary-key target fills its ``sequence.field`` column with the
  batch's source snapshot where the rows carry none, and writes each row
  with its kind (``_row_kind``: :mod:`paimon_group.sink.kinds`);
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

import contextlib
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from paimon_group.errors import ConfigError, PaimonGroupError
from paimon_group.reading.table import ShardedTable
from paimon_group.sink.deletes import count_deletes
from paimon_group.sink.kinds import ROW_KIND, kind_column, retractions
from paimon_group.sink.marks import NONCE_PROPERTY, GroupMarks, ShardMark, decode_group, group_of
from paimon_group.store.exclusive import create_exclusive, exclusive_create_check

log = logging.getLogger("paimon_group.sink")

# The options of the table the sink commits with: one try per commit (a lost
# race is judged again by the sink), and a commit of batches without output
# rows still makes a snapshot (it carries their marks).
COMMIT_OPTIONS = {"commit.max-retries": "0", "snapshot.ignore-empty-commit": "false"}
# The schema id conformed rows were shaped for, in their Arrow schema's metadata.
_SCHEMA_TAG = b"paimon-group.schema-id"


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
    hint is written as pypaimon writes it (a hint: readers check it). Its
    ``created`` is the id of the snapshot it created (None: none)."""
    from pypaimon.common.json_util import JSON
    from pypaimon.snapshot.renaming_snapshot_commit import RenamingSnapshotCommit

    class ExclusiveSnapshotCommit(RenamingSnapshotCommit):  # type: ignore[misc]
        created: int | None = None

        def commit(self, base_snapshot_uuid: Any, snapshot: Any, statistics: Any) -> bool:
            path = self.snapshot_manager.get_snapshot_path(snapshot.id)
            if not create_exclusive(self.file_io, path, JSON.to_json(snapshot, indent=2)):
                return False
            self.created = snapshot.id
            self._commit_latest_hint(snapshot.id)
            return True

    return ExclusiveSnapshotCommit(snapshot_manager)


def _make_exclusive(store_commit: Any) -> Any:
    """Put the exclusive snapshot commit into pypaimon's ``store_commit`` in
    place of its renaming one; it (None: a catalog's own commit, a REST
    catalog's, which is the server's compare-and-set already, is kept).
    One line, and nothing committed, for a pypaimon whose store commit has
    no ``snapshot_commit`` or one of another type: the sink never commits
    through pypaimon's create (it asks, then renames over another writer's
    snapshot)."""
    from pypaimon.snapshot.catalog_snapshot_commit import CatalogSnapshotCommit
    from pypaimon.snapshot.renaming_snapshot_commit import RenamingSnapshotCommit

    found = store_commit.__dict__.get("snapshot_commit", _MISSING)
    if isinstance(found, CatalogSnapshotCommit):
        return None
    if type(found) is not RenamingSnapshotCommit:
        kind = "has no snapshot_commit" if found is _MISSING else \
            f"is a {type(found).__module__}.{type(found).__qualname__}"
        raise PaimonGroupError(
            "the sink cannot make its commits exclusive with this pypaimon: its store "
            f"commit {kind}, not the RenamingSnapshotCommit the sink replaces")
    exclusive = _exclusive_snapshot_commit(store_commit.snapshot_manager)
    store_commit.snapshot_commit = exclusive
    return exclusive


_MISSING = object()

@dataclass(frozen=True)
class _Shape:
    """What the sink writes into the target at one of its schemas."""

    table: Any  # the pypaimon table at this schema
    committing: Any  # the same, with COMMIT_OPTIONS
    schema_id: int
    fields: dict[str, pa.Field]
    schema: pa.Schema  # the conformed rows' (tagged with schema_id)
    sequence_column: str | None  # a primary-key target's sequence.field
    kind_column: str | None  # its rowkind.field, or an append target's _row_kind
    primary_key: bool


class TargetTable:
    """A Paimon table a sink writes into; see the module docstring."""

    def __init__(self, table: Any, identifier: str, warehouse: str = "") -> None:
        exclusive_create_check(table.file_io, table.table_path)
        self.identifier = identifier
        self.warehouse = warehouse
        self._shape = _shape_of(table, identifier)
        # Every schema written at, by id: a batch's files are written with the
        # table its rows were conformed to, also after the schema changed.
        self._shapes = {self._shape.schema_id: self._shape}
        self._lock = threading.Lock()
        self._seen = 0  # the newest snapshot whose properties were read
        self._marks: dict[str, str] = {}  # each group's marks property, as stored
        self._decoded: dict[str, tuple[str, GroupMarks]] = {}  # group -> (value, marks)

    @classmethod
    def open(cls, warehouse: str, table: str,
             catalog_options: Mapping[str, str] | None = None) -> TargetTable:
        """Open ``table`` (``DB.TABLE``); one line for a missing table or one
        the sink cannot write once (see :func:`_shape_of`)."""
        loaded, location = ShardedTable.load(warehouse, table, catalog_options,
                                             check="check the sink's warehouse and table")
        return cls(loaded, table, location)

    @property
    def table(self) -> Any:
        """The pypaimon table at the newest schema the sink has seen."""
        return self._shape.table

    @property
    def _committing(self) -> Any:
        return self.current().committing

    @property
    def sequence_column(self) -> str | None:
        return self._shape.sequence_column

    @property
    def kind_column(self) -> str | None:
        """The column the target records a row's kind in (a primary-key
        target's ``rowkind.field``, an append target's ``_row_kind``), or None."""
        return self._shape.kind_column

    def current(self) -> _Shape:
        """The target at its newest schema: an ``ALTER TABLE`` while the sink
        runs adds the schema file after the one known, which is looked up
        (one existence check) at each write and commit and, when found, read
        with every later one. One line if the new schema is one the sink
        cannot write (see :func:`_shape_of`)."""
        shape = self._shape
        manager = shape.table.schema_manager
        if manager.get_schema(shape.schema_id + 1) is None:
            return shape
        with self._lock:
            shape = self._shape
            newest = shape.table.table_schema
            while (later := manager.get_schema(newest.id + 1)) is not None:
                newest = later
            if newest.id == shape.schema_id:
                return shape
            from pypaimon.table.file_store_table import FileStoreTable

            old = shape.table
            table = FileStoreTable(old.file_io, old.identifier, old.table_path, newest,
                                   old.catalog_environment)
            self._shape = _shape_of(table, self.identifier)
            self._shapes[newest.id] = self._shape
            log.info("target %s: the sink writes at schema %d (was %d)", self.identifier,
                     newest.id, shape.schema_id)
            return self._shape

    # -- rows ----------------------------------------------------------------

    def conform(self, rows: pa.Table, batch: Any) -> pa.Table:
        """``rows``, the output of ``batch``, in the target's column order and
        types at its newest schema: the sequence column filled with the
        batch's source snapshot where the rows carry none (or a null), the
        kind column from ``_row_kind``. One line, and nothing written, for
        output columns the target does not have, a missing ``NOT NULL``
        column, or row kinds the target cannot hold or the rows dropped."""
        shape = self.current()
        snapshot_id = int(batch.snapshot_id)
        kinds = kind_column(rows, self.identifier)
        self._check_kinds(shape, rows, kinds, batch)
        extra = [name for name in rows.column_names
                 if name not in shape.fields and name != ROW_KIND]
        if extra:
            raise ConfigError(
                f"the output rows for {self.identifier} have the columns {', '.join(extra)}, "
                "which the target does not have: add them to the target (ALTER TABLE ... "
                "ADD ...) or leave them out of the output")
        if kinds is not None and ROW_KIND not in shape.fields:
            rows = rows.drop_columns([ROW_KIND])
        if shape.kind_column is not None and kinds is not None:
            rows = _with_column(rows, shape.kind_column, kinds)
        elif shape.kind_column is not None and shape.kind_column not in rows.column_names:
            rows = rows.append_column(shape.kind_column,
                                      pa.array(["+I"] * rows.num_rows, pa.string()))
        if shape.sequence_column is not None:
            rows = _with_sequence(rows, shape.sequence_column, snapshot_id)
        missing = [name for name in shape.fields if name not in rows.column_names
                   and not shape.fields[name].nullable]
        if missing:
            raise ConfigError(f"the output rows for {self.identifier} lack the columns "
                              f"{', '.join(missing)} (NOT NULL in the target)")
        return pa.Table.from_arrays([
            rows.column(f.name).cast(f.type) if f.name in rows.column_names
            else pa.nulls(rows.num_rows, f.type) for f in shape.fields.values()],
            schema=shape.schema)

    def _check_kinds(self, shape: _Shape, rows: pa.Table, kinds: pa.ChunkedArray | None,
                     batch: Any) -> None:
        """One line unless every row's kind reaches the target (see
        :mod:`paimon_group.sink.kinds`)."""
        read = int(getattr(batch, "retractions", 0) or 0)
        carried = kinds is not None or (shape.primary_key and shape.kind_column is not None
                                        and shape.kind_column in rows.column_names)
        if read and not carried:
            raise ConfigError(
                f"the batch read {read} deletes or update-befores from the source, and its "
                f"output rows for {self.identifier} carry no {ROW_KIND}, so they would be "
                f"written as inserts: run the group with row kinds (--include-row-kind, "
                f"include_row_kind=True) and keep the {ROW_KIND} column in the output")
        retracted = retractions(kinds)
        if retracted and shape.kind_column is None:
            how = ("declare 'rowkind.field' naming a STRING column the sink fills with the "
                   "kind (ALTER TABLE ... ADD pg_row_kind STRING; ALTER TABLE ... SET "
                   "('rowkind.field' = 'pg_row_kind'))" if shape.primary_key else
                   f"add a STRING column {ROW_KIND} that records each row's kind "
                   f"(ALTER TABLE ... ADD {ROW_KIND} STRING)")
            raise ConfigError(
                f"the output rows for {self.identifier} hold {retracted} deletes or "
                f"update-befores ({ROW_KIND} -D or -U), which the target cannot represent: "
                f"{how}, or leave them out of the output")

    def open_writer(self, rows: pa.Table) -> PartsWriter:
        """A writer for a batch written in parts, at the schema ``rows`` (its
        first part) were conformed to; see :class:`PartsWriter`."""
        tag = (rows.schema.metadata or {}).get(_SCHEMA_TAG)
        shape = self._shapes[int(tag)] if tag is not None else self._shape
        return PartsWriter(shape.table.new_batch_write_builder().new_write(), tag,
                           self.identifier, shape)

    def write_files(self, rows: pa.Table, commit_user: str) -> list[Any]:
        """Write ``rows``' data files (with the table at the schema they were
        conformed to); their commit messages (not committed)."""
        tag = (rows.schema.metadata or {}).get(_SCHEMA_TAG)
        shape = self._shapes[int(tag)] if tag is not None else self._shape
        write = shape.table.new_batch_write_builder().new_write()
        try:
            if rows.num_rows:
                write.write_arrow(rows.replace_schema_metadata(None))
            messages: list[Any] = write.prepare_commit()
            count_deletes(shape.table.file_io, messages, _retracted(shape, rows))
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
        (``fresh``) or as last read; one line if they cannot be read.
        ``group`` is a marks key (:func:`~paimon_group.sink.marks.marks_key`):
        a group's name, or a group's and a source table's."""
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
        from pypaimon.write.table_commit import StreamTableCommit

        commit = StreamTableCommit(self._committing, commit_user)
        store_commit = commit.file_store_commit
        store_commit.snapshot_manager = _PinnedLatest(store_commit.snapshot_manager, latest)
        try:
            exclusive = _make_exclusive(store_commit)
        except BaseException:
            with contextlib.suppress(Exception):  # the refusal is the error to tell
                commit.close()
            raise
        try:
            commit.commit(messages, identifier, snapshot_properties=properties)
        except Exception as err:  # a lost race, or an unknown outcome
            taken = self.table.snapshot_manager().get_snapshot_by_id(
                1 if latest is None else latest.id + 1)
            if taken is not None and (taken.properties or {}).get(NONCE_PROPERTY) == nonce:
                return True
            if taken is None:
                raise  # nothing took the id: not a race
            log.debug("the sink's commit lost the race for snapshot %d: %s", taken.id, err)
            return False
        else:
            if exclusive is not None and getattr(exclusive, "created", None) is None:
                raise PaimonGroupError(
                    f"the sink's commit of snapshot {1 if latest is None else latest.id + 1} "
                    "succeeded without its exclusive create of the snapshot file (pypaimon "
                    "committed by another path): another writer may have taken the same "
                    "snapshot id")
            return True
        finally:
            commit.close()


class PartsWriter:
    """One pypaimon writer for every part of one batch, until it is sealed.

    Paimon orders a key's rows of equal sequence value (every row of a batch
    carries its source snapshot) by the writer's own sequence numbers, which
    each writer counts from the bucket's committed maximum: parts written by
    writers of their own tie, and a key's earlier change in an earlier part
    could win over its later change in a later one. One writer numbers the
    batch's rows in the order they were written, as for a batch written
    whole. Not thread-safe: the sink writes one part of a batch at a time."""

    def __init__(self, write: Any, tag: bytes | None, identifier: str,
                 shape: _Shape | None = None) -> None:
        self._write = write
        self._tag = tag
        self._identifier = identifier
        self._shape = shape
        self._retracted = 0  # the parts' -U and -D rows (sink/deletes.py)

    def write(self, rows: pa.Table) -> None:
        """Write one part (conformed at the first part's schema)."""
        if (rows.schema.metadata or {}).get(_SCHEMA_TAG) != self._tag:
            raise PaimonGroupError(
                f"the schema of {self._identifier} changed while a batch was written in "
                "parts: the batch is written again at the new schema")
        if rows.num_rows:
            self._retracted += _retracted(self._shape, rows)
            self._write.write_arrow(rows.replace_schema_metadata(None))

    def prepare(self) -> list[Any]:
        """The commit messages of every part (their files written), and the
        writer closed."""
        try:
            messages: list[Any] = self._write.prepare_commit()
            if self._shape is not None:
                count_deletes(self._shape.table.file_io, messages, self._retracted)
            return messages
        finally:
            self._write.close()

    def close(self) -> None:
        """Closed without a commit: no part of the batch is committed."""
        with contextlib.suppress(Exception):
            self._write.close()


def _retracted(shape: _Shape | None, rows: pa.Table) -> int:
    """The ``-U`` and ``-D`` rows among conformed ``rows`` that a
    primary-key target merges (an append target keeps its kinds as data)."""
    if shape is None or not shape.primary_key or shape.kind_column is None \
            or shape.kind_column not in rows.column_names:
        return 0
    return retractions(rows.column(shape.kind_column))


def _shape_of(table: Any, identifier: str) -> _Shape:
    """What the sink writes into ``table``; one line for a target it cannot
    write once: a primary-key target without a fixed bucket count or without
    a ``BIGINT`` ``sequence.field``, a row kind column that is not a STRING."""
    from pypaimon.schema.data_types import PyarrowFieldParser

    schema: pa.Schema = PyarrowFieldParser.from_paimon_schema(table.table_schema.fields)
    fields = {f.name: f for f in schema}
    primary_key = bool(table.primary_keys)
    if primary_key:
        bucket = int(table.options.bucket())
        if bucket <= 0:
            mode = {-1: "dynamic", -2: "postponed"}.get(bucket, "unsupported")
            raise ConfigError(
                f"the primary-key target {identifier} has {mode} buckets ('bucket' = "
                f"'{bucket}'), which Paimon lets one writer job write, and the sink's "
                "writers are many: give it a fixed number of buckets, e.g. "
                "CREATE TABLE ... WITH ('bucket' = '4', ...)")
    sequence = _sequence_column(table, identifier, fields)
    kind = None
    if primary_key:
        kind = table.options.options.to_map().get("rowkind.field")
    elif ROW_KIND in fields:
        kind = ROW_KIND
    if kind is not None and (kind not in fields or not pa.types.is_string(fields[kind].type)):
        raise ConfigError(f"the target {identifier} records row kinds in {kind!r}, which must "
                          "be a STRING column")
    schema_id = int(table.table_schema.id)
    return _Shape(table, table.copy(dict(COMMIT_OPTIONS)), schema_id, fields,
                  schema.with_metadata({_SCHEMA_TAG: str(schema_id)}), sequence, kind,
                  primary_key)


def _with_column(rows: pa.Table, name: str, values: Any) -> pa.Table:
    """``rows`` with column ``name`` set to ``values`` (None: as they are)."""
    if values is None:
        return rows
    if name in rows.column_names:
        return rows.set_column(rows.column_names.index(name), name, values)
    return rows.append_column(name, values)


def _with_sequence(rows: pa.Table, name: str, snapshot_id: int) -> pa.Table:
    """``rows`` with the sequence column ``name`` filled with ``snapshot_id``
    where it is missing or null; values the rows carry stay."""
    if name not in rows.column_names:
        return rows.append_column(name, pa.array([snapshot_id] * rows.num_rows, pa.int64()))
    column = rows.column(name).cast(pa.int64())
    if column.null_count:
        column = pc.fill_null(column, pa.scalar(snapshot_id, pa.int64()))
    return _with_column(rows, name, column)


def _sequence_column(table: Any, identifier: str, fields: Mapping[str, pa.Field]) -> str | None:
    """The column a primary-key target orders a key's rows by; None for an
    append target. One line when a primary-key target has none, or one that
    is not a BIGINT (a STRING orders "9" after "10")."""
    if not table.primary_keys:
        return None
    names: list[str] = table.options.sequence_field()
    if len(names) != 1:
        raise ConfigError(
            f"the primary-key target {identifier} needs 'sequence.field' set to one BIGINT "
            "column the sink fills with the source snapshot (so a key's later source "
            "version wins whichever member wrote it), e.g. "
            "ALTER TABLE ... SET ('sequence.field' = 'pg_source_snapshot')")
    field = fields.get(names[0])
    if field is None or not pa.types.is_int64(field.type):
        kind = "missing" if field is None else str(field.type)
        raise ConfigError(
            f"the primary-key target {identifier} orders keys by 'sequence.field' "
            f"{names[0]!r} ({kind}), which must be a BIGINT: the sink fills it with the "
            "source snapshot, e.g. ALTER TABLE ... ADD pg_source_snapshot BIGINT; "
            "ALTER TABLE ... SET ('sequence.field' = 'pg_source_snapshot')")
    return names[0]
