"""Worked examples of the per-field merges (paimon_group/arrowread/fieldmerge.py).

The differential tests (tests/test_arrowread_fallback.py against pypaimon,
tests/engine against the engine) check whole tables; these pin the rules."""

from __future__ import annotations

import pyarrow as pa
import pytest

from paimon_group.arrowread.fieldmerge import merge_fields
from paimon_group.arrowread.files import SEQUENCE_NUMBER, VALUE_KIND, Unsupported


def _rows(records: list[tuple[int, int | None, str | None, int, int]]) -> pa.Table:
    """(key, v, s, sequence number, value kind) records, in any order."""
    return pa.table({
        "k": pa.array([r[0] for r in records], pa.int64()),
        "v": pa.array([r[1] for r in records], pa.int64()),
        "s": pa.array([r[2] for r in records], pa.string()),
        SEQUENCE_NUMBER: pa.array([r[3] for r in records], pa.int64()),
        VALUE_KIND: pa.array([r[4] for r in records], pa.int8()),
    })


RECORDS = [
    (2, 5, None, 4, 0),
    (1, 1, "a", 1, 0),
    (1, None, "b", 3, 2),
    (1, 4, None, 2, 0),
    (3, None, None, 5, 0),
]


def _merged(functions: dict[str, str]) -> list[tuple[object, ...]]:
    out = merge_fields(_rows(RECORDS), ["k"], functions)
    assert out.column(VALUE_KIND).to_pylist() == [0] * out.num_rows  # all +I
    return list(zip(out.column("k").to_pylist(), out.column("v").to_pylist(),
                    out.column("s").to_pylist(), strict=True))


def test_partial_update_takes_each_fields_latest_non_null_value() -> None:
    # key 1 in sequence order: (v=1, s=a), (v=4, s=null), (v=null, s=b)
    assert _merged({"v": "last_non_null_value", "s": "last_non_null_value"}) == [
        (1, 4, "b"), (2, 5, None), (3, None, None)]


def test_last_and_first_values_keep_nulls_unless_asked_not_to() -> None:
    assert _merged({"v": "last_value", "s": "first_value"}) == [
        (1, None, "a"), (2, 5, None), (3, None, None)]
    assert _merged({"v": "first_non_null_value", "s": "first_non_null_value"}) == [
        (1, 1, "a"), (2, 5, None), (3, None, None)]


def test_sum_max_min_skip_nulls_and_an_all_null_key_stays_null() -> None:
    assert _merged({"v": "sum", "s": "max"}) == [(1, 5, "b"), (2, 5, None), (3, None, None)]
    assert _merged({"v": "min", "s": "min"}) == [(1, 1, "a"), (2, 5, None), (3, None, None)]


def test_product_and_booleans_skip_nulls() -> None:
    assert _merged({"v": "product", "s": "last_value"}) == [
        (1, 4, "b"), (2, 5, None), (3, None, None)]
    flags = pa.table({
        "k": pa.array([1, 1, 1, 2, 2, 3], pa.int64()),
        "b": pa.array([True, None, False, None, True, None], pa.bool_()),
        SEQUENCE_NUMBER: pa.array(range(6), pa.int64()),
        VALUE_KIND: pa.array([0] * 6, pa.int8()),
    })
    assert merge_fields(flags, ["k"], {"b": "bool_and"}).column("b").to_pylist() == [
        False, True, None]
    assert merge_fields(flags, ["k"], {"b": "bool_or"}).column("b").to_pylist() == [
        True, True, None]


def test_a_retraction_is_left_to_pypaimon() -> None:
    with pytest.raises(Unsupported, match="retraction"):
        merge_fields(_rows([*RECORDS, (2, 1, None, 6, 3)]), ["k"], {"v": "sum"})
