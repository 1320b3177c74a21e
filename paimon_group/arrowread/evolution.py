"""Files written with an older schema of the table, read by field id.

A Paimon data file holds its columns under the names of the schema it was
written with (its ``schema_id``). The engine, and pypaimon after it, map a
file's fields to the table's by field id, not by name:

* a field of the table that the file's schema lacks (ADD COLUMN since) is
  null in that file's rows;
* a renamed field is read under the name the file has;
* a dropped field is not read (the table no longer has it);
* a field whose type changed is read with the file's type and converted as
  the engine converts it (:mod:`paimon_group.arrowread.convert`: nested
  ROW fields by id, inside ARRAY and MAP too; leaf casts by the engine's
  ``CastExecutors`` rules).

:func:`file_columns` gives, for one older schema, the file's name of every
table field whose name differs there (None: not in the file) and the
converters of the fields whose type differs, or raises
:class:`~paimon_group.arrowread.files.Unsupported` for what we do not read
the engine's way (then pypaimon's reader reads the split): a cast the
engine makes by rules pyarrow does not share (convert.py lists them). A
field absent from a file is null here; a ``fields.<name>.default-value``
fills it afterwards, as every null of the field (defaults.py).

Example: schema 0 ``(id BIGINT, payload STRING)``, then ``ADD COLUMN extra
INT``, ``RENAME payload TO body``: for a file of schema 0,
``file_columns(...).names == {"extra": None, "body": "payload"}``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from paimon_group.arrowread.convert import Converter, converter
from paimon_group.arrowread.files import Unsupported

__all__ = ["FileColumns", "file_columns"]


@dataclass
class FileColumns:
    """How the columns of files of one older schema are read."""

    names: dict[str, str | None] = field(default_factory=dict)
    """The file's name of each table field named otherwise there (None: absent)."""
    convert: dict[str, tuple[pa.DataType, Converter]] = field(default_factory=dict)
    """Per table field whose type changed: its Arrow type in the file, and
    the conversion to the table's type."""


def _arrow_type(paimon_type: Any) -> pa.DataType:
    from pypaimon.schema.data_types import PyarrowFieldParser

    arrow_type: pa.DataType = PyarrowFieldParser.from_paimon_type(paimon_type)
    return arrow_type


def file_columns(
    table_fields: Sequence[Any], file_fields: Sequence[Any]
) -> FileColumns:
    """How files of the schema with ``file_fields`` are read (see the module
    docstring). Raises :class:`Unsupported` for a change we do not read the
    engine's way."""
    by_id = {int(f.id): f for f in file_fields}
    columns = FileColumns()
    for table_field in table_fields:
        old = by_id.get(int(table_field.id))
        if old is None:
            columns.names[table_field.name] = None
            continue
        if old.name != table_field.name:
            columns.names[table_field.name] = old.name
        try:
            convert = converter(old.type, table_field.type)
        except Unsupported as err:
            raise Unsupported(f"files of an older schema where column {table_field.name!r} "
                              f"was {old.type}, now {table_field.type} ({err})") from None
        if convert is not None:
            columns.convert[table_field.name] = (_arrow_type(old.type), convert)
    return columns
