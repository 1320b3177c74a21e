"""Decode one data file of a split into Arrow, the way pypaimon writes them.

A primary-key data file holds ``_KEY_<pk>`` columns, ``_SEQUENCE_NUMBER``
(int64), ``_VALUE_KIND`` (int8: 0 ``+I``, 1 ``-U``, 2 ``+U``, 3 ``-D``) and
then every column of the row under its own name; an append-table file holds
the row's columns only. We read the row's columns by name (never the
``_KEY_`` copies: the value side holds the same keys) plus the two system
columns when they are needed, so columns nobody asked for are never decoded.

Parquet and ORC are decoded by pyarrow (which releases the GIL, so files of a
split decode in parallel on a thread pool); Avro by fastavro, as pypaimon
does. A deletion vector is applied by position right after decoding, before
anything else looks at the rows (DV positions are physical file positions).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

__all__ = [
    "SEQUENCE_NUMBER",
    "SUPPORTED_FORMATS",
    "VALUE_KIND",
    "Unsupported",
    "apply_deletion_vector",
    "decode_file",
    "file_format",
]

SEQUENCE_NUMBER = "_SEQUENCE_NUMBER"
VALUE_KIND = "_VALUE_KIND"
SUPPORTED_FORMATS = frozenset({"parquet", "orc", "avro"})
_SYSTEM_TYPES = {SEQUENCE_NUMBER: pa.int64(), VALUE_KIND: pa.int8()}


class Unsupported(Exception):
    """This split cannot be read here exactly; pypaimon's reader reads it."""


def file_format(path: str) -> str:
    """The format of a data file from its extension (``parquet``, ``orc``, ...)."""
    name = os.path.basename(path)
    return name.rsplit(".", 1)[-1].lower() if "." in name else ""


def decode_file(
    file_io: Any, file: Any, columns: Sequence[str], types: dict[str, pa.DataType]
) -> pa.Table:
    """The ``columns`` of one data file, in that order, cast to ``types``
    (system columns have their own types). Raises :class:`Unsupported` for a
    format or a layout we do not decode (pypaimon then reads the split)."""
    path = file.physical_path()
    fmt = file_format(path)
    fs = getattr(file_io, "filesystem", None)
    to_fs_path = getattr(file_io, "to_filesystem_path", None)
    if fs is None or to_fs_path is None:
        raise Unsupported(f"file system {type(file_io).__name__}")
    fs_path = to_fs_path(path)
    wanted = [pa.field(c, _SYSTEM_TYPES.get(c) or types[c]) for c in columns]
    if fmt == "parquet":
        table = _decode_parquet(fs, fs_path, list(columns))
    elif fmt == "orc":
        table = _decode_orc(fs, fs_path, list(columns))
    elif fmt == "avro":
        return _decode_avro(fs, fs_path, pa.schema(wanted))
    else:
        raise Unsupported(f"file format {fmt!r}")
    missing = [c for c in columns if c not in table.column_names]
    if missing:
        raise Unsupported(f"columns {missing} not in {file.file_name}")
    if table.num_rows != int(file.row_count):
        raise Unsupported(f"{file.file_name}: {table.num_rows} rows, not {file.row_count}")
    arrays = []
    for field in wanted:
        column = table.column(field.name)
        arrays.append(column if column.type == field.type else column.cast(field.type))
    return pa.Table.from_arrays(arrays, schema=pa.schema(wanted))


def _decode_parquet(fs: Any, path: str, columns: list[str]) -> pa.Table:
    import pyarrow.parquet as pq

    with fs.open_input_file(path) as source:
        parquet = pq.ParquetFile(source)
        present = set(parquet.schema_arrow.names)
        table: pa.Table = parquet.read(columns=[c for c in columns if c in present])
    return table


def _decode_orc(fs: Any, path: str, columns: list[str]) -> pa.Table:
    import pyarrow.orc as orc

    with fs.open_input_file(path) as source:
        reader = orc.ORCFile(source)
        present = set(reader.schema.names)
        table: pa.Table = reader.read(columns=[c for c in columns if c in present])
    return table


def _decode_avro(fs: Any, path: str, schema: pa.Schema) -> pa.Table:
    import fastavro

    names = schema.names
    data: dict[str, list[Any]] = {name: [] for name in names}
    with fs.open_input_file(path) as source:
        record: Any
        for record in fastavro.reader(source):
            for name in names:
                data[name].append(record.get(name))
    return pa.Table.from_pydict(data, schema=schema)


def apply_deletion_vector(table: pa.Table, deleted: Sequence[int] | None) -> pa.Table:
    """``table`` without the rows at the ``deleted`` positions."""
    if not deleted:
        return table
    keep = np.ones(table.num_rows, dtype=bool)
    positions = np.fromiter(deleted, dtype=np.int64)
    keep[positions[positions < table.num_rows]] = False
    return table.filter(pa.array(keep))


def read_deletion_vector(file_io: Any, deletion_file: Any) -> list[int]:
    """The deleted positions of one deletion file (pypaimon decodes the bitmap)."""
    from pypaimon.deletionvectors.deletion_vector import DeletionVector

    vector = DeletionVector.read(file_io, deletion_file)
    return list(vector.bit_map())
