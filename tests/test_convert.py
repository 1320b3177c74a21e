"""Unit tests of paimon_group/arrowread/convert.py: nested fields matched by
id (reordered, renamed, added, dropped, promoted; in ROW, ARRAY and MAP
values; null containers and sliced or chunked columns) against pypaimon's
own alignment of older files, and the engine's timestamp truncation and
DECIMAL overflow rules on values the engine tests cannot write."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest

from paimon_group.arrowread.convert import converter
from paimon_group.arrowread.files import Unsupported


def _types() -> tuple[Any, Any]:
    from pypaimon.schema.data_types import ArrayType, AtomicType, DataField, MapType, RowType

    old = RowType(True, [DataField(1, "p", AtomicType("INT")),
                         DataField(2, "q", AtomicType("STRING")),
                         DataField(3, "gone", AtomicType("INT"))])
    new = RowType(True, [DataField(2, "q2", AtomicType("STRING")),
                         DataField(1, "p", AtomicType("BIGINT")),
                         DataField(4, "z", AtomicType("INT"))])
    wrap = RowType(True, [
        DataField(10, "r", old), DataField(11, "l", ArrayType(True, old)),
        DataField(12, "m", MapType(True, AtomicType("STRING"), old))])
    wrap_new = RowType(True, [
        DataField(12, "m", MapType(True, AtomicType("STRING"), new)),
        DataField(10, "r", new), DataField(11, "l", ArrayType(True, new))])
    return wrap, wrap_new


def _column(file_type: Any) -> pa.Array:
    from pypaimon.schema.data_types import PyarrowFieldParser

    row = {"p": 1, "q": "a", "gone": 9}
    values = [
        {"r": row, "l": [row, None], "m": [("k", row), ("n", None)]},
        None,
        {"r": None, "l": None, "m": None},
        {"r": {"p": None, "q": None, "gone": None}, "l": [], "m": []},
    ]
    return pa.array(values * 3, PyarrowFieldParser.from_paimon_type(file_type))


@pytest.mark.parametrize("shape", ["whole", "sliced", "chunked"])
def test_nested_fields_by_id_as_pypaimon_aligns_them(shape: str) -> None:
    from pypaimon.read.reader.data_file_batch_reader import DataFileBatchReader

    file_type, table_type = _types()
    column: Any = _column(file_type)
    if shape == "sliced":
        column = column.slice(3, 6)
    elif shape == "chunked":
        column = pa.chunked_array([column.slice(0, 5), column.slice(5)])
    convert = converter(file_type, table_type)
    assert convert is not None
    got = convert(column)
    whole = column.combine_chunks() if shape == "chunked" else column
    aligner = DataFileBatchReader.__new__(DataFileBatchReader)  # its alignment only
    expected = aligner._align_array_by_id(whole, file_type, table_type)
    assert got.to_pylist() == expected.to_pylist()
    assert got.type == expected.type
    first = got.to_pylist()[0] if shape != "sliced" else got.to_pylist()[1]
    if first is not None:
        assert first["r"] == {"q2": "a", "p": 1, "z": None}


def test_a_map_key_change_is_left_to_pypaimon() -> None:
    from pypaimon.schema.data_types import AtomicType, MapType

    with pytest.raises(Unsupported):
        converter(MapType(True, AtomicType("INT"), AtomicType("INT")),
                  MapType(True, AtomicType("BIGINT"), AtomicType("INT")))


def _cast(before: str, after: str, values: list[Any], arrow_type: pa.DataType) -> list[Any]:
    from pypaimon.schema.data_types import AtomicType

    convert = converter(AtomicType(before), AtomicType(after))
    assert convert is not None
    result: list[Any] = convert(pa.array(values, arrow_type)).to_pylist()
    return result


def test_timestamp_truncation_follows_the_engine() -> None:
    # nano-of-second 5000 has 4 digits: kept by a TIMESTAMP(4); before 1970
    # the epoch millisecond is cut towards zero for a precision up to 3.
    got = _cast("TIMESTAMP(9)", "TIMESTAMP(4)", [5_000, 12_345_678, None], pa.timestamp("ns"))
    assert got == [dt.datetime(1970, 1, 1, 0, 0, 0, 5), dt.datetime(1970, 1, 1, 0, 0, 0, 12300),
                   None]
    got = _cast("TIMESTAMP(3)", "TIMESTAMP(0)", [-1_500, 1_500], pa.timestamp("ms"))
    assert got == [dt.datetime(1969, 12, 31, 23, 59, 59), dt.datetime(1970, 1, 1, 0, 0, 1)]


def test_a_decimal_that_overflows_is_null() -> None:
    got = _cast("DECIMAL(6, 3)", "DECIMAL(4, 1)", [Decimal("999.950"), Decimal("999.949"),
                                                   Decimal("-999.95")], pa.decimal128(6, 3))
    assert got == [None, Decimal("999.9"), None]
    assert _cast("BIGINT", "DECIMAL(3, 0)", [999, -1000], pa.int64()) == [Decimal(999), None]


@pytest.mark.parametrize(("before", "after"), [
    ("DOUBLE", "INT"), ("DOUBLE", "STRING"), ("STRING", "INT"), ("INT", "CHAR(3)"),
    ("BOOLEAN", "INT"), ("TIMESTAMP(3)", "TIMESTAMP_LTZ(3)"), ("DOUBLE", "DECIMAL(5, 2)")])
def test_casts_without_a_vectorized_engine_rule_are_left_to_pypaimon(
        before: str, after: str) -> None:
    from pypaimon.schema.data_types import AtomicType

    with pytest.raises(Unsupported):
        convert = converter(AtomicType(before), AtomicType(after))
        assert convert is not None
        from pypaimon.schema.data_types import PyarrowFieldParser

        convert(pa.nulls(1, PyarrowFieldParser.from_paimon_type(AtomicType(before))))
