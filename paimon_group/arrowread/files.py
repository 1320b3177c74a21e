"""Decode one data file of a split into Arrow, the way pypaimon writes them.

A primary-key data file holds ``_KEY_<pk>`` columns, ``_SEQUENCE_NUMBER``
(int64), ``_VALUE_KIND`` (int8: 0 ``+I``, 1 ``-U``, 2 ``+U``, 3 ``-D``) and
then every column of the row under its own name; an append-table file holds
the row's columns only. We read the row's columns by name (never the
``_KEY_`` copies: the value side holds the same keys) plus the two system
columns when they are needed, so columns nobody asked for are never decoded.

ORC stores a CHAR(n) value padded with spaces to n characters; the engine's
ORC reader (ORC's own) trims trailing spaces from CHAR columns, and so do we
(the ``trim`` columns); Parquet and Avro hold the value as written.

The engine's Parquet reader reads a ROW whose fields are all null as a null
ROW (a top-level ROW, in an ARRAY, a MAP value or another ROW); its ORC and
Avro readers keep the ROW of nulls. Parquet columns holding a ROW are given
the engine's nulls as they are decoded, before anything else looks at them
(:mod:`paimon_group.arrowread.parquet_rows`).

A file written with an older schema of the table (ADD, RENAME or DROP
COLUMN, a changed type) holds its columns under the names of that schema:
``evolved.names`` maps each column asked for to its name in the file, or to
None when the file's schema did not have it (then it is null), as Paimon
maps a file's fields to the table's by field id; ``evolved.convert`` gives
the file's type of a column whose type changed and its conversion to the
table's type (evolution.py, convert.py).

Parquet and ORC are decoded by pyarrow (which releases the GIL, so files of a
split decode in parallel on a thread pool); Avro by fastavro, as pypaimon
does. A deletion vector is applied by position right after decoding, before
anything else looks at the rows (DV positions are physical file positions).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from paimon_group.arrowread.fetch import open_source
from paimon_group.arrowread.nullability import cast_column
from paimon_group.arrowread.parquet_rows import engine_parquet_rows

__all__ = [
    "SEQUENCE_NUMBER",
    "SUPPORTED_FORMATS",
    "VALUE_KIND",
    "Unsupported",
    "apply_deletion_vector",
    "decode_file",
    "file_format",
    "iter_file",
]

SEQUENCE_NUMBER = "_SEQUENCE_NUMBER"
VALUE_KIND = "_VALUE_KIND"
SUPPORTED_FORMATS = frozenset({"parquet", "orc", "avro"})
_SYSTEM_TYPES = {SEQUENCE_NUMBER: pa.int64(), VALUE_KIND: pa.int8()}


class Unsupported(Exception):
    """This split cannot be read here exactly; pypaimon's reader reads it."""


class Evolved(Protocol):
    """How a file of an older schema is read (evolution.FileColumns)."""

    @property
    def names(self) -> Mapping[str, str | None]: ...

    @property
    def convert(self) -> Mapping[str, tuple[pa.DataType, Callable[[Any], Any]]]: ...


def file_format(path: str) -> str:
    """The format of a data file from its extension (``parquet``, ``orc``, ...)."""
    name = os.path.basename(path)
    return name.rsplit(".", 1)[-1].lower() if "." in name else ""


def decode_file(
    file_io: Any, file: Any, columns: Sequence[str], types: dict[str, pa.DataType],
    *, trim: Collection[str] = (), evolved: Evolved | None = None,
    fetched: pa.Buffer | None = None,
) -> pa.Table:
    """The ``columns`` of one data file, in that order, cast to ``types``
    (system columns have their own types); ``trim``: the CHAR columns;
    ``evolved``: how a file of an older schema is read (see the module
    docstring). Raises :class:`Unsupported` for a
    format or a layout we do not decode (pypaimon then reads the split)."""
    chunks = list(iter_file(file_io, file, columns, types, batch_rows=None, trim=trim,
                            evolved=evolved, fetched=fetched))
    schema = pa.schema([pa.field(c, _SYSTEM_TYPES.get(c) or types[c]) for c in columns])
    if len(chunks) == 1:
        return chunks[0]
    return pa.concat_tables(chunks) if chunks else schema.empty_table()


def iter_file(
    file_io: Any,
    file: Any,
    columns: Sequence[str],
    types: dict[str, pa.DataType],
    *,
    batch_rows: int | None,
    trim: Collection[str] = (),
    evolved: Evolved | None = None,
    fetched: pa.Buffer | None = None,
) -> Iterator[pa.Table]:
    """:func:`decode_file` in chunks of about ``batch_rows`` rows (None: the
    whole file, decoded with pyarrow's threads). Chunked decoding is single
    threaded: buffers are allocated and freed by the reading thread, whose
    allocator then returns them (Arrow's mimalloc keeps per-thread heaps).
    Everything that can make the file :class:`Unsupported` is checked before
    the first chunk. ``fetched``: the file's bytes, fetched ahead from an object
    store (:mod:`paimon_group.arrowread.fetch`)."""
    path = file.physical_path()
    fmt = file_format(path)
    fs = getattr(file_io, "filesystem", None)
    to_fs_path = getattr(file_io, "to_filesystem_path", None)
    if fs is None or to_fs_path is None:
        raise Unsupported(f"file system {type(file_io).__name__}")
    if fmt not in SUPPORTED_FORMATS:
        raise Unsupported(f"file format {fmt!r}")
    schema = pa.schema([pa.field(c, _SYSTEM_TYPES.get(c) or types[c]) for c in columns])
    in_file = {c: (evolved.names if evolved else {}).get(c, c) for c in columns}
    convert = dict(evolved.convert) if evolved else {}
    stored = [n for n in in_file.values() if n is not None]
    with open_source(file_io, file, fetched) as (source, pre_buffer):
        if fmt == "avro":
            yield _decode_avro(source, schema, in_file, convert)
            return
        chunks = _parquet_chunks if fmt == "parquet" else _orc_chunks
        for chunk in chunks(source, file, stored, batch_rows, pre_buffer):
            arrays = []
            for field in schema:
                name = in_file[field.name]
                if name is None:  # added after the file was written
                    arrays.append(pa.nulls(chunk.num_rows, field.type))
                    continue
                column = chunk.column(name)
                if fmt == "parquet":  # the file's ROWs as the engine reads them
                    column = engine_parquet_rows(column)
                if field.name in convert:  # its type changed since (convert.py)
                    column = convert[field.name][1](column)
                column = cast_column(column, field.type)
                if fmt == "orc" and field.name in trim:
                    column = pc.utf8_rtrim(column, characters=" ")
                arrays.append(column)
            yield pa.Table.from_arrays(arrays, schema=schema)


def _check(present: Sequence[str], rows: int, file: Any, columns: Sequence[str]) -> list[str]:
    missing = [c for c in columns if c not in present]
    if missing:
        raise Unsupported(f"columns {missing} not in {file.file_name}")
    if rows != int(file.row_count):
        raise Unsupported(f"{file.file_name}: {rows} rows, not {file.row_count}")
    return list(columns)


def _parquet_chunks(
    source: Any, file: Any, columns: list[str], batch_rows: int | None, pre_buffer: bool
) -> Iterator[pa.Table]:
    import pyarrow.parquet as pq

    # pre_buffer (object stores): the projected columns' chunks are fetched in
    # coalesced ranged reads, not one request per column chunk.
    parquet = pq.ParquetFile(source, pre_buffer=pre_buffer)
    wanted = _check(parquet.schema_arrow.names, parquet.metadata.num_rows, file, columns)
    if batch_rows is None:
        yield parquet.read(columns=wanted)
        return
    for batch in parquet.iter_batches(batch_size=batch_rows, columns=wanted, use_threads=False):
        yield pa.Table.from_batches([batch])


def _orc_chunks(
    source: Any, file: Any, columns: list[str], batch_rows: int | None, pre_buffer: bool
) -> Iterator[pa.Table]:
    import pyarrow.orc as orc

    reader = orc.ORCFile(source)
    wanted = _check(reader.schema.names, reader.nrows, file, columns)
    if batch_rows is None:
        yield reader.read(columns=wanted)
        return
    for stripe in range(reader.nstripes):
        yield pa.Table.from_batches([reader.read_stripe(stripe, columns=wanted)])


def _decode_avro(
    source: Any, schema: pa.Schema, in_file: Mapping[str, str | None],
    convert: Mapping[str, tuple[pa.DataType, Callable[[Any], Any]]],
) -> pa.Table:
    import fastavro

    names = schema.names
    data: dict[str, list[Any]] = {name: [] for name in names}
    record: Any
    for record in fastavro.reader(source):
        for name in names:
            stored = in_file[name]
            data[name].append(None if stored is None else record.get(stored))
    # Python values: an integer or float widened converts as it is built;
    # other changed types are built with the file's type, then converted.
    arrays = []
    for field in schema:
        if field.name in convert:
            file_type, conversion = convert[field.name]
            arrays.append(cast_column(conversion(pa.array(data[field.name], type=file_type)),
                                      field.type))
        else:
            arrays.append(pa.array(data[field.name], type=field.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def apply_deletion_vector(
    table: pa.Table, deleted: Sequence[int] | None, offset: int = 0
) -> pa.Table:
    """``table`` (the file's rows from position ``offset`` on) without the
    rows at the ``deleted`` file positions."""
    if not deleted:
        return table
    keep = np.ones(table.num_rows, dtype=bool)
    positions = np.fromiter(deleted, dtype=np.int64) - offset
    keep[positions[(positions >= 0) & (positions < table.num_rows)]] = False
    return table.filter(pa.array(keep))


def read_deletion_vector(file_io: Any, deletion_file: Any) -> list[int]:
    """The deleted positions of one deletion file (pypaimon decodes the bitmap)."""
    from pypaimon.deletionvectors.deletion_vector import DeletionVector

    vector = DeletionVector.read(file_io, deletion_file)
    return list(vector.bit_map())
