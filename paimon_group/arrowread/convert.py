"""Values of a file written with an older schema, converted to the table's
type of the column, as Paimon's engine converts them when it reads.

Nested types are matched by field id, as the engine's schema evolution does:
a ROW's fields found by id in the file's ROW (read under the file's name,
converted recursively), null where the file's ROW lacks the id (added
since), left out where the table's ROW dropped it, in the table's order
(reordered); inside an ARRAY's elements and a MAP's values the same. A
MAP's key type must not change.

Leaf values follow the engine's ``CastExecutors`` rules (paimon-common
``org.apache.paimon.casting``), vectorized with pyarrow compute:

* integer -> integer, integer -> FLOAT/DOUBLE, FLOAT <-> DOUBLE
  (``NumericPrimitiveCastRule``: Java's primitive conversions; a narrowing
  keeps the low bits, as pyarrow's unchecked cast);
* integer -> DECIMAL(p, s) (``NumericPrimitiveToDecimalCastRule``) and
  DECIMAL -> DECIMAL(p, s) (``DecimalToDecimalCastRule``): rounded HALF_UP
  (ties away from zero) to scale s, null when the value then needs more
  than p digits;
* integer -> STRING / VARCHAR(n) (``NumericToStringCastRule``) and
  CHAR/VARCHAR/STRING -> VARCHAR(n)/STRING (``StringToStringCastRule``):
  the decimal digits; cut to n characters;
* TIMESTAMP(p) -> TIMESTAMP(q) (``TimestampToTimestampCastRule``): the
  engine's ``DateTimeUtils.truncate``, quirks included (:func:`_truncated`),
  then the value in the table's unit (towards the past);
  DATE -> TIMESTAMP(q) (``DateToTimestampCastRule``): midnight.

Everything else (to CHAR(n), which pads; to and from BOOLEAN, BINARY, TIME;
floating point to integer, DECIMAL or string, whose Java rules pyarrow does
not share; anything to or from a time zone; strings parsed to numbers and
dates) raises :class:`~paimon_group.arrowread.files.Unsupported`, and the
split is read by pypaimon's reader.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from paimon_group.arrowread.files import Unsupported
from paimon_group.arrowread.nullability import cast_column

__all__ = ["Converter", "converter", "same_type"]

Converter = Callable[[Any], Any]
"""Converts one column (an Array or a ChunkedArray) of the file's type."""

_INTEGERS = ("TINYINT", "SMALLINT", "INT", "INTEGER", "BIGINT")
_FLOATS = ("FLOAT", "DOUBLE")
_STRINGS = ("STRING", "VARCHAR", "CHAR")


def _arrow(paimon_type: Any) -> pa.DataType:
    from pypaimon.schema.data_types import PyarrowFieldParser

    arrow_type: pa.DataType = PyarrowFieldParser.from_paimon_type(paimon_type)
    return arrow_type


def _kind(paimon_type: Any) -> str:
    from pypaimon.schema.data_types import ArrayType, MapType, RowType

    for kind, cls in (("ROW", RowType), ("ARRAY", ArrayType), ("MAP", MapType)):
        if isinstance(paimon_type, cls):
            return kind
    name = str(getattr(paimon_type, "type", paimon_type)).upper()
    return re.split(r"[(<\s]", name, maxsplit=1)[0]


def _args(paimon_type: Any) -> list[int]:
    found = re.search(r"\(([\d,\s]+)\)", str(getattr(paimon_type, "type", "")))
    return [int(a) for a in found.group(1).split(",")] if found else []


def same_type(a: Any, b: Any) -> bool:
    """Equal types, nullability aside, nested field ids and names included."""
    kind = _kind(a)
    if kind != _kind(b):
        return False
    if kind == "ROW":
        return len(a.fields) == len(b.fields) and all(
            int(x.id) == int(y.id) and x.name == y.name and same_type(x.type, y.type)
            for x, y in zip(a.fields, b.fields, strict=True))
    if kind == "ARRAY":
        return same_type(a.element, b.element)
    if kind == "MAP":
        return same_type(a.key, b.key) and same_type(a.value, b.value)
    return _strip_null(a) == _strip_null(b)


def _strip_null(paimon_type: Any) -> str:
    return str(paimon_type).upper().replace(" NOT NULL", "")


def converter(file_type: Any, table_type: Any) -> Converter | None:
    """How to convert a column of ``file_type`` to ``table_type`` (None:
    nothing to do); raises :class:`Unsupported` (see the module docstring)."""
    if same_type(file_type, table_type):
        return None
    kinds = (_kind(file_type), _kind(table_type))
    nested = {"ROW": _row, "ARRAY": _array, "MAP": _map}
    if kinds[0] == kinds[1] and kinds[0] in nested:
        return _per_chunk(nested[kinds[0]](file_type, table_type))
    if kinds[0] in nested or kinds[1] in nested:
        raise Unsupported(f"a cast from {file_type} to {table_type}")
    return _per_chunk(_leaf(file_type, table_type))


def _per_chunk(convert: Converter) -> Converter:
    def each(column: Any) -> Any:
        if isinstance(column, pa.ChunkedArray):
            return pa.chunked_array([convert(c) for c in column.chunks] or
                                    [convert(column.combine_chunks())])
        return convert(column)
    return each


def _unsliced(array: pa.Array) -> pa.Array:
    """A list or map array whose offsets start at its first value (pyarrow's
    from_arrays refuses a sliced array with nulls)."""
    return pa.concat_arrays([array]) if array.offset else array


def _row(file_type: Any, table_type: Any) -> Converter:
    in_file = {int(f.id): (i, f) for i, f in enumerate(file_type.fields)}
    plan: list[tuple[int | None, Converter | None, pa.Field]] = []
    for field in table_type.fields:
        found = in_file.get(int(field.id))
        inner = None if found is None else converter(found[1].type, field.type)
        target = pa.field(field.name, _arrow(field.type), nullable=field.type.nullable)
        plan.append((None if found is None else found[0], inner, target))

    def convert(array: pa.Array) -> pa.Array:
        children = []
        for position, inner, target in plan:
            if position is None:  # added to the ROW since the file was written
                children.append(pa.nulls(len(array), target.type))
                continue
            child = array.field(position)
            children.append(inner(child) if inner else cast_column(child, target.type))
        fields = [target for _, _, target in plan]
        return pa.StructArray.from_arrays(children, fields=fields, mask=pc.is_null(array))
    return convert


def _array(file_type: Any, table_type: Any) -> Converter:
    inner = converter(file_type.element, table_type.element)
    assert inner is not None  # the element differs, or the types are the same

    def convert(array: pa.Array) -> pa.Array:
        array = _unsliced(array)
        return pa.ListArray.from_arrays(array.offsets, inner(array.values),
                                        mask=pc.is_null(array))
    return convert


def _map(file_type: Any, table_type: Any) -> Converter:
    if not same_type(file_type.key, table_type.key):
        raise Unsupported(f"a MAP key changed from {file_type.key} to {table_type.key}")
    inner = converter(file_type.value, table_type.value)
    assert inner is not None

    def convert(array: pa.Array) -> pa.Array:
        array = _unsliced(array)
        return pa.MapArray.from_arrays(array.offsets, array.keys, inner(array.items),
                                       mask=pc.is_null(array))
    return convert


def _leaf(file_type: Any, table_type: Any) -> Converter:
    source, target = _kind(file_type), _kind(table_type)
    arrow_target = _arrow(table_type)
    if (source in _INTEGERS and (target in _INTEGERS or target in _FLOATS)) or (
            source in _FLOATS and target in _FLOATS):
        return lambda array: array.cast(arrow_target, safe=False)
    if target == "DECIMAL" and (source in _INTEGERS or source == "DECIMAL"):
        return _to_decimal(arrow_target)
    if target in ("STRING", "VARCHAR") and (source in _INTEGERS or source in _STRINGS):
        return _to_string(_args(table_type) if target == "VARCHAR" else [])
    if target == "TIMESTAMP" and source in ("TIMESTAMP", "DATE"):
        return _to_timestamp(_precision(table_type), arrow_target)
    raise Unsupported(f"a cast from {file_type} to {table_type}")


def _precision(paimon_type: Any) -> int:
    args = _args(paimon_type)
    return args[0] if args else 6


def _to_decimal(target: pa.Decimal128Type) -> Converter:
    limit = pa.scalar(10 ** (target.precision - target.scale), pa.decimal128(38, 0))

    def convert(array: pa.Array) -> pa.Array:
        if pa.types.is_integer(array.type):
            if target.scale > 18:
                raise Unsupported(f"an integer cast to {target}")
            array = array.cast(pa.decimal128(38, 0))
        # Widened first, so that rounding up (9.99 -> 10.0) cannot overflow.
        array = array.cast(pa.decimal128(38, array.type.scale))
        if array.type.scale > target.scale:
            # HALF_UP in Java's BigDecimal: ties away from zero.
            array = pc.round(array, target.scale, round_mode="half_towards_infinity")
        # |v| < 10^(p - s) exactly when the integral part (towards zero) is.
        integral = array.cast(pa.decimal128(38, 0), safe=False)
        fits = pc.less(pc.abs(integral), limit)
        kept = pc.if_else(fits, array, pa.nulls(len(array), array.type))
        return kept.cast(target, safe=False)
    return convert


def _to_string(length: list[int]) -> Converter:
    def convert(array: pa.Array) -> pa.Array:
        strings = array.cast(pa.string())
        if length:
            strings = pc.utf8_slice_codeunits(strings, 0, length[0])
        return strings
    return convert


_NANOS = {"s": 10**9, "ms": 10**6, "us": 10**3, "ns": 1}


def _to_timestamp(precision: int, target: pa.TimestampType) -> Converter:
    def convert(array: pa.Array) -> pa.Array:
        if pa.types.is_date(array.type):
            return array.cast(target)
        if array.type.tz is not None or target.tz is not None:
            raise Unsupported("a timestamp with a time zone cast")
        nanos = array.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False).astype(
            np.int64) * _NANOS[array.type.unit]
        ticks = np.floor_divide(_truncated(nanos, precision), _NANOS[target.unit])
        mask = array.is_null().to_numpy(zero_copy_only=False)
        return pa.array(ticks, pa.int64(), mask=mask).cast(target)
    return convert


def _truncated(nanos: np.ndarray[Any, Any], precision: int) -> np.ndarray[Any, Any]:
    """The engine's ``DateTimeUtils.truncate`` (TimestampToTimestampCastRule):
    a value whose nano-of-second has at most ``precision`` decimal digits is
    kept as it is (5 µs stays 5 µs in a TIMESTAMP(4): the engine counts the
    digits of the number, not of the fraction); others lose their last digits,
    of the epoch millisecond towards zero for a precision up to 3, of the
    nano-of-millisecond (never negative) above."""
    if precision >= 9:
        return nanos
    millis = np.floor_divide(nanos, 10**6)
    of_milli = nanos - millis * 10**6
    keep = np.mod(nanos, 10**9) < 10**precision
    if precision <= 3:
        step = 10 ** (3 - precision)
        cut = np.sign(millis) * (np.abs(millis) // step) * step * 10**6
    else:
        step = 10 ** (9 - precision)
        cut = millis * 10**6 + of_milli // step * step
    return np.where(keep, nanos, cut)
