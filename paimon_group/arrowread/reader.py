"""The Arrow-native reader of a shard's splits.

:class:`ArrowSplitReader` reads one split into :class:`Piece` objects
(decoded columns plus, for merged sections, the row indices that survive the
merge), and cuts pieces into output tables of :attr:`schema` -- the schema
pypaimon's reader gives (``_row_kind`` first when row kinds are requested).
Whether a split can be read here is decided before anything is decoded, so
a split that is :class:`Unsupported` is handed whole to pypaimon's reader
and never delivered half from each.

Memory: a split is read in :class:`Unit` s, one file (not merged) or one
section (files whose key ranges overlap, merged) at a time (a whole read
decodes up to two units ahead of the one merging, pipeline.py); a merged
section's output is taken from its decoded columns ``batch_rows`` rows at a
time by :meth:`ArrowSplitReader.output`, so the merged copy is never whole
in memory when streaming.
"""

from __future__ import annotations

import itertools
import logging
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import pyarrow as pa

from paimon_group.arrowread.classify import (
    SplitMode,
    char_columns,
    split_fallback_reason,
    split_mode,
    table_fallback_reason,
    trimmed_keys,
)
from paimon_group.arrowread.evolution import FileColumns, file_columns
from paimon_group.arrowread.fetch import Prefetcher, SplitFetches, fetch_ahead
from paimon_group.arrowread.fieldmerge import (
    FIELD_MERGE_ENGINES,
    field_functions,
    list_delimiters,
    merge_fields,
    nested_keys,
    sequence_groups,
)
from paimon_group.arrowread.files import (
    SEQUENCE_NUMBER,
    VALUE_KIND,
    Unsupported,
    apply_deletion_vector,
    decode_file,
    iter_file,
    read_deletion_vector,
)
from paimon_group.arrowread.levels import lookup_level_drops, merges_by_lookup
from paimon_group.arrowread.merge import adds_only, merge_indices, row_kind_strings
from paimon_group.arrowread.nullability import cast_column

__all__ = ["ArrowSplitReader", "Piece", "Unit", "decode_pool"]

log = logging.getLogger(__name__)

ROW_KIND_COLUMN = "_row_kind"
_INSERT = pa.scalar("+I", pa.string())
T = TypeVar("T")
R = TypeVar("R")

_POOL: ThreadPoolExecutor | None = None


def decode_pool() -> ThreadPoolExecutor:
    """The process-wide pool that decodes files and merges splits.

    One pool for every planner of the process, so that parallel shards share
    ``min(4, CPUs)`` decoding threads instead of multiplying them. pyarrow
    releases the GIL while it decodes, sorts and takes. Work submitted to it
    never submits more work to it (no nesting, so no deadlock).
    """
    global _POOL
    if _POOL is None:
        workers = max(1, min(4, os.cpu_count() or 1))
        _POOL = ThreadPoolExecutor(workers, thread_name_prefix="paimon-group-decode")
    return _POOL


def pool_map(fn: Callable[[T], R], items: Sequence[T], parallel: bool) -> list[R]:
    """``[fn(x) for x in items]``, on the decode pool when ``parallel``."""
    if not parallel or len(items) < 2:
        return [fn(item) for item in items]
    return list(decode_pool().map(fn, items))


@dataclass(frozen=True)
class Piece:
    """Rows of a split ready for output: ``source`` columns, in order, or the
    rows of ``source`` at ``indices`` (a merged section). ``kinds`` is how
    row kinds are given: from ``_VALUE_KIND`` or all ``+I``."""

    source: pa.Table
    indices: pa.Array | None
    kinds_from_file: bool

    @property
    def num_rows(self) -> int:
        return len(self.indices) if self.indices is not None else self.source.num_rows

    def rows(self, offset: int, length: int) -> pa.Table:
        if self.indices is None:
            return self.source.slice(offset, length)
        return self.source.take(self.indices.slice(offset, length))


def _oldest_first(unit: Unit, tables: list[pa.Table]) -> list[pa.Table]:
    """``tables`` (of ``unit.files``) by their files' sequence numbers, oldest
    first, when the files' sequence number ranges do not overlap (then each
    key's rows come in sequence order, which the merge's fast path uses,
    merge.py); else as they are. Either way the merge's result is the same:
    it sorts by key and sequence number, and a key is in a file once, so no
    two rows of one key tie across files whose ranges are apart."""
    ranges = [(int(f.min_sequence_number), int(f.max_sequence_number)) for f, _ in unit.files]
    order = sorted(range(len(tables)), key=lambda i: ranges[i])
    if any(ranges[a][1] >= ranges[b][0] for a, b in itertools.pairwise(order)):
        return tables
    return [tables[i] for i in order]


@dataclass(frozen=True)
class Unit:
    """What is decoded at once: ``files`` (with their deletion files) and
    ``columns``; ``single_run`` None for files output as they are, else a
    merged section (True: one sorted run, each key once)."""

    files: tuple[tuple[Any, Any], ...]
    columns: list[str]
    kinds_from_file: bool
    single_run: bool | None


class ArrowSplitReader:
    """Reads the splits of one table (see the module docstring).

    ``schema`` is the output schema (pypaimon's); ``fallback_reason`` is set
    when no split of this table can be read here (pypaimon reads them all).
    """

    def __init__(self, table: Any, schema: pa.Schema, *, include_row_kind: bool) -> None:
        self.table = table
        self.schema = schema
        self.include_row_kind = include_row_kind
        names = list(schema.names)
        if include_row_kind and names and names[0] == ROW_KIND_COLUMN:
            names = names[1:]
        self.columns = names
        self.fallback_reason = table_fallback_reason(table, names)
        self._types: dict[str, pa.DataType] = {}
        self._chars = char_columns(table)
        self._keys: list[str] = []
        self._sequence: list[str] = []
        if self.fallback_reason is None:
            from pypaimon.schema.data_types import PyarrowFieldParser

            arrow_schema = PyarrowFieldParser.from_paimon_schema(table.fields)
            self._types = {f.name: f.type for f in arrow_schema}
            if table.is_primary_key_table:
                self._keys = trimmed_keys(table)
                self._sequence = list(table.options.sequence_field())
        options = table.options
        self._first_row = self.fallback_reason is None and getattr(
            options.merge_engine(), "value", ""
        ) == "first-row"
        self._ignore_delete = bool(options.ignore_delete()) if table.is_primary_key_table else False
        self._ascending = bool(
            table.is_primary_key_table and options.sequence_field_sort_order_is_ascending()
        )
        # partial-update / aggregation: each value column's merge function.
        self._field_merge: dict[str, str] | None = None
        self._lookup = False
        self._delimiters: dict[str, str] = {}
        self._groups: dict[str, list[str]] = {}
        self._nested: dict[str, list[str]] = {}
        if self.fallback_reason is None and table.is_primary_key_table and getattr(
                options.merge_engine(), "value", "") in FIELD_MERGE_ENGINES:
            by_key = set(table.primary_keys) | set(table.partition_keys or ())
            self._field_merge = field_functions(
                table, [c for c in self.columns if c not in by_key])
            # Lookup compactions leave older merged values above: the engine
            # merges only a key's lowest level above 0 (levels.py).
            self._lookup = merges_by_lookup(table)
            self._delimiters = list_delimiters(table)
            self._groups = sequence_groups(table)
            self._nested = nested_keys(table)
        self._schema_id = int(table.table_schema.id)
        # Per older schema id: how its files' columns are read (evolution.py),
        # or why such files are left to pypaimon.
        self._evolved: dict[int, FileColumns | Unsupported] = {}

    def unsupported(self, split: Any) -> str | None:
        """Why ``split`` must be read by pypaimon's reader, or None."""
        reason = self.fallback_reason or split_fallback_reason(self.table, split)
        if reason is not None:
            return reason
        for file in split.files:
            try:
                self._file_columns(file)
            except Unsupported as err:
                return str(err)
        return None

    def _file_columns(self, file: Any) -> FileColumns | None:
        """How the columns of ``file`` are read when it was written with an
        older schema (None: the table's schema); raises :class:`Unsupported`."""
        schema_id = int(file.schema_id)
        if schema_id == self._schema_id:
            return None
        known = self._evolved.get(schema_id)
        if known is None:
            old = self.table.schema_manager.get_schema(schema_id)
            if old is None:
                # Not a split to hand to pypaimon (its reader dies of the same
                # missing schema with an AttributeError): a file of the table
                # is gone, as when it is being dropped; the member checks the
                # table and says so. Not remembered.
                raise FileNotFoundError(
                    f"schema {schema_id} of data file {file.file_name} not found")
            try:
                known = file_columns(self.table.fields, old.fields)
            except Unsupported as err:
                known = err
            self._evolved[schema_id] = known
        if isinstance(known, Unsupported):
            raise known
        return known

    # -- reading a split -----------------------------------------------------

    def units(self, split: Any) -> list[Unit]:
        """The units ``split`` is read in, in output order: one per file (not
        merged) or per section (merged). Raises :class:`Unsupported` for a
        split pypaimon's reader must read, before anything is decoded."""
        reason = self.unsupported(split)
        if reason is not None:
            raise Unsupported(reason)
        mode = split_mode(self.table, split)
        files = list(split.files)
        deletions = list(split.data_deletion_files or [None] * len(files))
        if mode is SplitMode.RAW:
            return [Unit(((f, d),), self.columns, False, None) for f, d in zip(files, deletions,
                                                                              strict=True)]
        if mode is SplitMode.STREAM:
            kinds = self.include_row_kind
            columns = self.columns + ([VALUE_KIND] if kinds else [])
            return [Unit(((f, d),), columns, kinds, None) for f, d in zip(files, deletions,
                                                                         strict=True)]
        from pypaimon.read.interval_partition import IntervalPartition

        deletion_of = {f.file_name: d for f, d in zip(files, deletions, strict=True)}
        columns = self._merge_columns()
        return [
            Unit(
                tuple((f, deletion_of[f.file_name]) for run in section for f in run.files),
                columns,
                True,
                len(section) == 1,
            )
            for section in IntervalPartition(files).partition()
        ]

    def read_unit(self, unit: Unit, *, parallel: bool) -> list[Piece]:
        """Decode (and merge) one unit; its files in parallel when ``parallel``.
        (A read of whole splits goes through pipeline.py instead.)"""
        decoders = self.unit_decoders(unit)
        return self.merge_unit(unit, pool_map(lambda decode: decode(), decoders, parallel))

    def unit_decoders(self, unit: Unit, ahead: SplitFetches | None = None
                      ) -> list[Callable[[], pa.Table]]:
        """One callable per file of ``unit`` that decodes it (without the rows
        its deletion vector deletes and the lookup merge leaves out), to run
        on any thread; :meth:`merge_unit` then makes the unit's pieces. The
        lookup merge's levels are read here, on the calling thread; files
        not fetched ahead by ``ahead`` start fetching now (object stores)."""
        drops: dict[str, list[int]] = {}
        deleted: dict[str, list[int]] = {}
        if self._lookup and unit.single_run is False:
            file_io = self.table.file_io
            deleted = {f.file_name: read_deletion_vector(file_io, d)
                       for f, d in unit.files if d is not None}
            drops = lookup_level_drops(self.table, [f for f, _ in unit.files], deleted)
        return self._decoders(unit.files, unit.columns, drops, deleted, ahead)

    def merge_unit(self, unit: Unit, tables: list[pa.Table]) -> list[Piece]:
        """The pieces of ``unit`` from its files' decoded ``tables`` (in file
        order). A merged section's ``tables`` are emptied once combined, so
        that their chunks are freed before the merge (no second copy of the
        section held through it, when the caller keeps no other reference)."""
        if unit.single_run is None:
            return [Piece(t, None, unit.kinds_from_file) for t in tables if t.num_rows]
        if len(tables) > 1:
            # One contiguous table: pyarrow's take over several chunks costs
            # several times a take over one (it resolves each index's chunk),
            # and the merge takes from these rows three times or more.
            rows = pa.concat_tables(_oldest_first(unit, tables)).combine_chunks()
            tables.clear()
        else:
            rows = tables[0]
        piece = self._merge_section(rows, single_run=unit.single_run)
        return [piece] if piece.num_rows else []

    def stream_unit(self, unit: Unit, batch_rows: int) -> Iterator[Piece]:
        """The pieces of one unit, decoded ``batch_rows`` rows at a time where
        no merge needs the unit whole (files output as they are, and sections
        of one sorted run); a merged section is decoded whole, its files in
        parallel. May raise :class:`Unsupported` after pieces were given."""
        if unit.single_run is False:
            yield from self.read_unit(unit, parallel=True)
            return
        file_io = self.table.file_io
        ahead = Prefetcher(file_io, [file for file, _ in unit.files])
        try:
            yield from self._stream_files(unit, batch_rows, ahead)
        finally:
            ahead.close()

    def _stream_files(self, unit: Unit, batch_rows: int, ahead: Prefetcher) -> Iterator[Piece]:
        file_io = self.table.file_io
        for file, deletion in unit.files:
            deleted = read_deletion_vector(file_io, deletion) if deletion is not None else None
            offset = 0
            for chunk in iter_file(file_io, file, unit.columns, self._types,
                                   batch_rows=batch_rows, trim=self._chars,
                                   evolved=self._file_columns(file), fetched=ahead.take()):
                rows = chunk.num_rows
                if deleted:
                    chunk = apply_deletion_vector(chunk, deleted, offset)
                offset += rows
                if unit.single_run:
                    piece = self._merge_section(chunk, single_run=True)
                else:
                    piece = Piece(chunk, None, unit.kinds_from_file)
                if piece.num_rows:
                    yield piece

    def _merge_columns(self) -> list[str]:
        columns = list(self.columns)
        # A sequence group's own sequence field decides its other fields.
        for name in (*self._keys, *self._sequence, *self._groups):
            if name not in columns:
                columns.append(name)
        return [*columns, SEQUENCE_NUMBER, VALUE_KIND]

    def _merge_section(self, rows: pa.Table, *, single_run: bool) -> Piece:
        """One section: a single sorted run holds each key once (decode only)."""
        if self._field_merge is not None:
            if not single_run:
                return Piece(merge_fields(rows, self._keys, self._field_merge,
                                          sequence_fields=self._sequence,
                                          ascending=self._ascending,
                                          delimiters=self._delimiters,
                                          groups=self._groups, nested=self._nested),
                             None, True)
            kept = adds_only(rows)
            if kept.num_rows != rows.num_rows:
                raise Unsupported("a retraction in a partial-update or aggregation merge")
            return Piece(kept, None, True)
        if single_run:
            kept = adds_only(rows)
            if self._first_row and not self._ignore_delete and kept.num_rows != rows.num_rows:
                raise Unsupported("first-row merge met a delete without ignore-delete")
            return Piece(kept, None, True)
        indices = merge_indices(
            rows,
            self._keys,
            self._sequence,
            ascending=self._ascending,
            first_row=self._first_row,
            ignore_delete=self._ignore_delete,
        )
        return Piece(rows, indices, True)

    def _decoders(
        self, files: Sequence[tuple[Any, Any]], columns: list[str],
        drops: dict[str, list[int]], read_already: dict[str, list[int]],
        ahead: SplitFetches | None,
    ) -> list[Callable[[], pa.Table]]:
        """See :meth:`unit_decoders`; ``read_already``: deletion vectors read
        before, by file name."""
        file_io = self.table.file_io
        # On an object store every file of the unit is fetched at once on the
        # I/O pool (requests wait on the network, not the CPU); each decoder
        # waits for its file's bytes.
        fetches = fetch_ahead(file_io, [file for file, _ in files], ahead)

        def decoder(file: Any, deletion: Any) -> Callable[[], pa.Table]:
            def decode() -> pa.Table:
                fetched = fetches.get(id(file))
                table = decode_file(file_io, file, columns, self._types, trim=self._chars,
                                    evolved=self._file_columns(file),
                                    fetched=None if fetched is None else fetched.result())
                known = read_already.get(file.file_name)
                deleted = known if known is not None else (
                    read_deletion_vector(file_io, deletion) if deletion is not None else [])
                extra = drops.get(file.file_name)
                if extra:
                    deleted = sorted(set(deleted) | set(extra))
                if deleted:
                    table = apply_deletion_vector(table, deleted)
                return table
            return decode

        return [decoder(file, deletion) for file, deletion in files]

    # -- output --------------------------------------------------------------

    def output(self, piece: Piece, offset: int = 0, length: int | None = None) -> pa.Table:
        """Rows ``offset .. offset + length`` of ``piece`` as a table of :attr:`schema`."""
        rows = piece.rows(offset, piece.num_rows - offset if length is None else length)
        arrays: list[Any] = []
        fields = list(self.schema)
        if self.include_row_kind:
            if piece.kinds_from_file:
                arrays.append(row_kind_strings(rows.column(VALUE_KIND)))
            else:
                arrays.append(pa.repeat(_INSERT, rows.num_rows))
            fields = fields[1:]
        for field in fields:
            column = rows.column(field.name)
            arrays.append(cast_column(column, field.type))
        return pa.Table.from_arrays(arrays, schema=self.schema)

    def tables(self, pieces: Iterable[Piece]) -> list[pa.Table]:
        return [self.output(p) for p in pieces]

    def batches(self, pieces: Iterable[Piece], batch_rows: int) -> Iterator[pa.RecordBatch]:
        """The rows of ``pieces`` in batches of at most ``batch_rows`` rows."""
        for piece in pieces:
            for offset in range(0, piece.num_rows, batch_rows):
                table = self.output(piece, offset, batch_rows)
                for batch in table.to_batches():
                    if batch.num_rows:
                        yield batch
