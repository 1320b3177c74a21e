"""Files written with an older schema of the table, read by field id.

A Paimon data file holds its columns under the names of the schema it was
written with (its ``schema_id``). The engine, and pypaimon after it, map a
file's fields to the table's by field id, not by name:

* a field of the table that the file's schema lacks (ADD COLUMN since) is
  null in that file's rows;
* a renamed field is read under the name the file has;
* a dropped field is not read (the table no longer has it);
* a field whose type was promoted (INT -> BIGINT, FLOAT -> DOUBLE) is read
  with the file's type and cast.

:func:`names_in_file` gives, for one older schema, the file's name of every
table field whose name differs there (None: not in the file), or raises
:class:`~paimon_group.arrowread.files.Unsupported` for what we do not read
the engine's way (then pypaimon's reader reads the split):

* a type change other than a widening of an integer or a float (the engine's
  casts between other types, e.g. to and from strings and decimals, have
  rules of their own);
* a nested type (ROW, ARRAY, MAP) whose fields changed, or any change of a
  nested column's type: its inner fields have ids of their own;
* a table with a ``fields.<name>.default-value`` option: the engine fills the
  default where a field is absent.

Example: schema 0 ``(id BIGINT, payload STRING)``, then ``ADD COLUMN extra
INT``, ``RENAME payload TO body``: for a file of schema 0,
``names_in_file(...) == {"extra": None, "body": "payload"}``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from paimon_group.arrowread.files import Unsupported

__all__ = ["names_in_file"]

# Widening casts, exact in pyarrow as in the engine.
_WIDENING: dict[pa.DataType, frozenset[pa.DataType]] = {
    pa.int8(): frozenset({pa.int16(), pa.int32(), pa.int64()}),
    pa.int16(): frozenset({pa.int32(), pa.int64()}),
    pa.int32(): frozenset({pa.int64()}),
    pa.float32(): frozenset({pa.float64()}),
}


def _arrow_type(field: Any) -> pa.DataType:
    from pypaimon.schema.data_types import PyarrowFieldParser

    arrow_type: pa.DataType = PyarrowFieldParser.from_paimon_schema([field])[0].type
    return arrow_type


def _nested(arrow_type: pa.DataType) -> bool:
    return bool(pa.types.is_nested(arrow_type))


def names_in_file(
    table_fields: Sequence[Any], file_fields: Sequence[Any], options: dict[str, str]
) -> dict[str, str | None]:
    """The file's name of each table field named otherwise in the file (None
    when the file has no such field); see the module docstring. Raises
    :class:`Unsupported` for a change we do not read the engine's way."""
    defaults = sorted(k for k in options if k.startswith("fields.") and
                      k.endswith(".default-value"))
    if defaults:
        raise Unsupported(f"files of an older schema with default values ({defaults[0]})")
    by_id = {int(f.id): f for f in file_fields}
    names: dict[str, str | None] = {}
    for field in table_fields:
        old = by_id.get(int(field.id))
        if old is None:
            names[field.name] = None
            continue
        if old.name != field.name:
            names[field.name] = old.name
        if str(old.type) == str(field.type):
            continue
        new_type, old_type = _arrow_type(field), _arrow_type(old)
        if new_type == old_type and not _nested(new_type):
            continue  # nullability only
        if new_type in _WIDENING.get(old_type, frozenset()):
            continue
        raise Unsupported(
            f"files of an older schema where column {field.name!r} was {old.type}, "
            f"now {field.type}"
        )
    return names
