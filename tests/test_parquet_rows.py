"""paimon_group/arrowread/parquet_rows.py: a ROW whose fields are all null made null,
bottom-up, wherever it is (the engine's Parquet reader; the engine's own
reads are compared in tests/engine/test_engine_parquet_rows.py)."""

from __future__ import annotations

import pyarrow as pa

from paimon_group.arrowread.parquet_rows import engine_parquet_rows, needs_engine_parquet_rows

INNER = pa.struct([pa.field("a", pa.int32()), pa.field("b", pa.string())])
OUTER = pa.struct([pa.field("r", INNER), pa.field("x", pa.int32())])
NULLS = {"a": None, "b": None}


def test_rows_of_nulls_in_a_list_are_null_and_the_others_kept() -> None:
    array = pa.array([[NULLS, None, {"a": 1, "b": None}], [], None, [{"a": None, "b": "x"}]],
                     pa.list_(INNER))
    got = engine_parquet_rows(array)
    assert got.type == array.type
    assert got.to_pylist() == [[None, None, {"a": 1, "b": None}], [], None,
                               [{"a": None, "b": "x"}]]
    assert engine_parquet_rows(array.slice(1)).to_pylist() == [[], None,
                                                              [{"a": None, "b": "x"}]]


def test_a_row_of_null_rows_is_null_in_lists_rows_and_maps() -> None:
    nested = pa.array([[{"r": NULLS, "x": None}, {"r": None, "x": None},
                        {"r": NULLS, "x": 5}, None]], pa.large_list(OUTER))
    assert engine_parquet_rows(nested).to_pylist() == [[None, None, {"r": None, "x": 5}, None]]
    top = pa.chunked_array([pa.array([{"r": NULLS, "x": None}, {"r": NULLS, "x": 3}], OUTER)])
    got = engine_parquet_rows(top)
    assert isinstance(got, pa.ChunkedArray)
    assert got.to_pylist() == [None, {"r": None, "x": 3}]
    mapped = pa.array([[("n", NULLS), ("z", None), ("h", {"a": 2, "b": None})], None],
                      pa.map_(pa.string(), INNER))
    assert engine_parquet_rows(mapped).to_pylist() == [
        [("n", None), ("z", None), ("h", {"a": 2, "b": None})], None]


def test_columns_without_a_row_are_returned_as_they_are() -> None:
    for array in (pa.array([1, None]), pa.array([[1], None], pa.list_(pa.int32())),
                  pa.array([[(1, 2)]], pa.map_(pa.int32(), pa.int32()))):
        assert not needs_engine_parquet_rows(array.type)
        assert engine_parquet_rows(array) is array
    assert needs_engine_parquet_rows(pa.map_(pa.string(), pa.list_(INNER)))
