"""collect / collect distinct / merge_map folds (arrowread/collect.py) on
small hand-made sections: the engine's rules that the random engine tests
may not meet (a lone record kept whole, an empty array, all nulls)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from paimon_group.arrowread.collect import COLLECTIONS, collection_reason

STARTS = np.array([0, 1, 4, 6])  # keys of 1, 3, 2 and 1 records


def test_collect_concatenates_in_record_order_and_skips_null_arrays() -> None:
    values = pa.array([[1, 1], [2, None], None, [1], None, None, []], pa.list_(pa.int32()))
    got = COLLECTIONS["collect"](values, STARTS).to_pylist()
    assert got == [[1, 1], [2, None, 1], None, []]


def test_collect_distinct_keeps_first_occurrences_but_leaves_a_lone_record_whole() -> None:
    values = pa.array([["a", "a"], ["b", None, "b"], None, [None, "a", "b"], ["c", "c"], None,
                       []], pa.list_(pa.string()))
    got = COLLECTIONS["collect distinct"](values, STARTS).to_pylist()
    assert got == [["a", "a"], ["b", None, "a"], ["c"], []]


def test_merge_map_takes_the_latest_value_of_each_key() -> None:
    values = pa.array([[("a", 1)], [("a", 1), ("b", 2)], [("b", None), ("c", 3)], [("a", 9)],
                       None, None, []], pa.map_(pa.string(), pa.int32()))
    got = COLLECTIONS["merge_map"](values, STARTS).to_pylist()
    assert got == [[("a", 1)], [("a", 9), ("b", None), ("c", 3)], None, []]


def test_types_compared_otherwise_by_the_engine_are_left_to_pypaimon() -> None:
    assert collection_reason("collect distinct", "ARRAY<DOUBLE>") is not None
    assert collection_reason("collect distinct", "ARRAY<BYTES>") is not None
    assert collection_reason("collect distinct", "ARRAY<ARRAY<INT>>") is not None
    assert collection_reason("merge_map", "MAP<FLOAT, INT>") is not None
    assert collection_reason("collect", "INT") is not None
    assert collection_reason("collect", "ARRAY<DOUBLE>") is None
    assert collection_reason("collect distinct", "ARRAY<VARCHAR(10)>") is None
    assert collection_reason("merge_map", "MAP<STRING, ARRAY<INT>>") is None
    assert collection_reason("merge_map", "MAP<DECIMAL(10, 2), INT>") is None
    assert collection_reason("merge_map", "MAP<DOUBLE NOT NULL, INT>") is not None


def test_nested_keys_compared_otherwise_by_the_engine_are_left_to_pypaimon() -> None:
    from paimon_group.arrowread.collect import nested_key_reason

    fields = {"id": "INT", "d": "DOUBLE", "s": "STRING"}
    assert nested_key_reason(fields, ["id", "s"]) is None
    assert nested_key_reason(fields, []) is None
    assert nested_key_reason(fields, ["d"]) is not None
    assert nested_key_reason(fields, ["missing"]) is not None
    assert collection_reason("nested_update", "ARRAY<INT>") is not None
