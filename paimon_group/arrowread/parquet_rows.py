"""ROW values read from Parquet as Paimon's engine reads them.

The engine's Parquet reader rebuilds a ROW from its fields' columns and
reads a ROW whose fields are all null as a null ROW, wherever the ROW is: a
top-level ROW column, an element of an ARRAY, a value of a MAP, a field of
another ROW. It decides bottom-up: a ROW whose fields are null ROWs or
null values is null in turn (``ROW<r ROW<a, b>, x>`` holding ``((null,
null), null)`` is read as null). Its ORC and Avro readers keep a ROW of
nulls, and so does pyarrow, for every format: :func:`engine_parquet_rows`
gives a column read from a Parquet file the engine's nulls, vectorized with
pyarrow compute, rebuilding only the struct, list and map arrays on the
way to a struct (their leaf buffers are shared, not copied). A MAP's keys
are left as they are (a key is never null).

:func:`needs_engine_parquet_rows` says whether a type holds a ROW at all;
columns without one are never looked at (no cost on tables without ROWs).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["engine_parquet_rows", "needs_engine_parquet_rows"]


def needs_engine_parquet_rows(data_type: pa.DataType) -> bool:
    """Whether a column of ``data_type`` can hold a ROW (a struct with
    fields) at any depth, outside a MAP's keys."""
    if pa.types.is_struct(data_type):
        return bool(data_type.num_fields > 0)
    if pa.types.is_map(data_type):
        return needs_engine_parquet_rows(data_type.item_type)
    if pa.types.is_list(data_type) or pa.types.is_large_list(data_type):
        return needs_engine_parquet_rows(data_type.value_type)
    return False


def engine_parquet_rows(column: Any) -> Any:
    """``column`` (an Array or a ChunkedArray read from a Parquet file) with
    every ROW whose fields are all null made null, bottom-up (see the module
    docstring); returned as it is when its type holds no ROW."""
    if not needs_engine_parquet_rows(column.type):
        return column
    if isinstance(column, pa.ChunkedArray):
        return pa.chunked_array([_rebuilt(chunk) for chunk in column.chunks], column.type)
    return _rebuilt(column)


def _rebuilt(array: pa.Array) -> pa.Array:
    if not needs_engine_parquet_rows(array.type):
        return array
    if pa.types.is_struct(array.type):
        return _struct(array)
    if array.offset:
        # The list and map constructors refuse a sliced array with nulls.
        array = pa.concat_arrays([array])
    mask = array.is_null() if array.null_count else None
    if pa.types.is_map(array.type):
        return pa.MapArray.from_arrays(array.offsets, array.keys, _rebuilt(array.items),
                                       mask=mask, type=array.type)
    list_class = pa.LargeListArray if pa.types.is_large_list(array.type) else pa.ListArray
    return list_class.from_arrays(array.offsets, _rebuilt(array.values), mask=mask,
                                  type=array.type)


def _struct(array: pa.StructArray) -> pa.StructArray:
    # field(i) is the child under this (possibly sliced) array's rows; a
    # child is itself rebuilt first, so a ROW of null ROWs is null too.
    children = [_rebuilt(array.field(i)) for i in range(array.type.num_fields)]
    all_null = children[0].is_null()
    for child in children[1:]:
        all_null = pc.and_(all_null, child.is_null())
    if array.null_count:
        all_null = pc.or_(all_null, array.is_null())
    return pa.StructArray.from_arrays(children, fields=list(array.type), mask=all_null)
