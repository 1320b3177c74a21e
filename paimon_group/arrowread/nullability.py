"""Columns cast to a table type whose nested fields are NOT NULL.

A field inside a ROW (a top-level ROW, a ROW in a ROW, the ROW elements of
an ARRAY, the ROW values of a MAP) can be made NOT NULL after files were
written with it nullable: Paimon's engine refuses that ALTER unless the
table sets ``alter-column-null-to-not-null.disabled = false`` (its
version bundled for ``tests/engine`` has no such guard), and then reads
the nulls of those files as nulls: its field getters follow the file's
type, never the table's. pypaimon's reader reads them the same way, and
gives them in an Arrow field marked not null. So do we.

pyarrow refuses to cast a struct whose field is nullable to one whose
field is not (``cannot cast nullable field to non-nullable field``), and
an ORC file never marks a field not null, so such a column would not read
at all. :func:`cast_column` casts to the table's type with every nested
field nullable, then rebuilds the struct, list and map arrays with the
table's fields (their leaf buffers are shared, not copied; nothing checks
the nulls of a field marked not null, in pyarrow or after it).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

__all__ = ["cast_column", "relaxed"]


def relaxed(data_type: pa.DataType) -> pa.DataType:
    """``data_type`` with every field inside it nullable (a MAP's key field
    aside, which Arrow keeps not null)."""
    if pa.types.is_struct(data_type):
        return pa.struct([pa.field(f.name, relaxed(f.type), metadata=f.metadata)
                          for f in data_type])
    if pa.types.is_map(data_type):
        return pa.map_(pa.field(data_type.key_field.name, relaxed(data_type.key_type), False),
                       pa.field(data_type.item_field.name, relaxed(data_type.item_type)))
    if pa.types.is_list(data_type) or pa.types.is_large_list(data_type):
        make = pa.large_list if pa.types.is_large_list(data_type) else pa.list_
        return make(pa.field(data_type.value_field.name, relaxed(data_type.value_type)))
    return data_type


def cast_column(column: Any, target: pa.DataType) -> Any:
    """``column`` (an Array or a ChunkedArray) cast to ``target``, the
    nulls of fields that ``target`` marks not null kept (see the module
    docstring)."""
    if column.type == target:
        return column
    loose = relaxed(target)
    if loose == target:
        return column.cast(target)
    column = column if column.type == loose else column.cast(loose)
    if isinstance(column, pa.ChunkedArray):
        return pa.chunked_array([_retyped(chunk, target) for chunk in column.chunks], target)
    return _retyped(column, target)


def _retyped(array: pa.Array, target: pa.DataType) -> pa.Array:
    """``array``, of type ``relaxed(target)``, as an array of ``target``."""
    if array.type == target:
        return array
    if pa.types.is_struct(target):
        # field(i) is the child under this (possibly sliced) array's rows.
        children = [_retyped(array.field(i), f.type) for i, f in enumerate(target)]
        return pa.StructArray.from_arrays(children, fields=list(target),
                                          mask=array.is_null() if array.null_count else None)
    if array.offset:
        # The list and map constructors refuse a sliced array with nulls.
        array = pa.concat_arrays([array])
    mask = array.is_null() if array.null_count else None
    if pa.types.is_map(target):
        return pa.MapArray.from_arrays(array.offsets, _retyped(array.keys, target.key_type),
                                       _retyped(array.items, target.item_type), type=target,
                                       mask=mask)
    list_class = pa.LargeListArray if pa.types.is_large_list(target) else pa.ListArray
    return list_class.from_arrays(array.offsets, _retyped(array.values, target.value_type),
                                  type=target, mask=mask)
