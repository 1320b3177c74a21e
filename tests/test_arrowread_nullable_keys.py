"""Nullable primary keys (``primary-key.nullable = true``) on the Arrow path.

The engine's key comparator orders nulls first and takes a null key as
equal to a null and unequal to every value; a null key is one key like any
other, merged across files and levels. Every read path must give what
pypaimon's reader gives there (which agrees with the engine), row for row.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paimon_group.arrowread import merge
from paimon_group.arrowread.files import SEQUENCE_NUMBER, VALUE_KIND
from tests.support.tables import catalog, compact, write_table
from tests.test_arrowread import EXAMPLES, compare_all_paths

SCHEMA = pa.schema(
    [pa.field("a", pa.int64()), pa.field("b", pa.string()), pa.field("v", pa.string())]
)


def _create(warehouse: str, keys: list[str], file_format: str = "parquet") -> None:
    from pypaimon import Schema

    cat = catalog(warehouse)
    cat.create_database("db", True)
    options = {"bucket": "1", "primary-key.nullable": "true", "file.format": file_format}
    cat.create_table(
        "db.t", Schema.from_pyarrow_schema(SCHEMA, primary_keys=keys, options=options), False
    )


def _write(warehouse: str, rows: list[tuple[Any, Any, str]]) -> None:
    data = pa.table(
        {
            "a": pa.array([r[0] for r in rows], pa.int64()),
            "b": pa.array([r[1] for r in rows], pa.string()),
            "v": pa.array([r[2] for r in rows], pa.string()),
        },
        schema=SCHEMA,
    )
    write_table(catalog(warehouse).get_table("db.t"), data)


def _pypaimon_rows(warehouse: str) -> list[tuple[Any, ...]]:
    table = catalog(warehouse).get_table("db.t")
    builder = table.new_read_builder()
    data = builder.new_read().to_arrow(builder.new_scan().plan().splits())
    return [tuple(r.values()) for r in data.to_pylist()]


def test_a_null_key_written_twice_is_one_key(tmp_path: Path) -> None:
    warehouse = str(tmp_path / "wh")
    _create(warehouse, ["a"])
    _write(warehouse, [(None, "x", "old"), (1, "x", "first")])
    _write(warehouse, [(None, "x", "new"), (2, "x", "two")])
    _write(warehouse, [(1, "x", "one")])
    assert _pypaimon_rows(warehouse) == [
        (None, "x", "new"), (1, "x", "one"), (2, "x", "two")
    ]
    assert compare_all_paths(warehouse, num_shards=1) > 0


def test_two_column_nullable_keys_over_files_and_levels(tmp_path: Path) -> None:
    warehouse = str(tmp_path / "wh")
    _create(warehouse, ["a", "b"])
    keys = [(a, b) for a in (None, 1, 2) for b in (None, "p", "q")]
    _write(warehouse, [(a, b, "v1") for a, b in keys])
    _write(warehouse, [(a, b, "v2") for a, b in keys if a is None or b is None])
    compact(warehouse, "db.t")  # one file at the top level
    _write(warehouse, [(a, b, "v3") for a, b in keys if a is None])
    _write(warehouse, [(a, b, "v4") for a, b in keys if b is None])
    expected = {k: "v1" for k in keys}
    expected.update({k: "v2" for k in keys if None in k})
    expected.update({k: "v3" for k in keys if k[0] is None})
    expected.update({k: "v4" for k in keys if k[1] is None})
    rows = _pypaimon_rows(warehouse)
    assert sorted(rows, key=repr) == sorted(
        [(a, b, v) for (a, b), v in expected.items()], key=repr
    )
    assert compare_all_paths(warehouse, num_shards=1) > 0


def test_merge_takes_null_keys_as_equal_and_unequal_to_values() -> None:
    table = pa.table(
        {
            "a": pa.array([None, 1, None, 1, None], pa.int64()),
            "b": pa.array(["x", None, "x", None, None], pa.string()),
            SEQUENCE_NUMBER: pa.array([1, 2, 3, 4, 5], pa.int64()),
            VALUE_KIND: pa.array([0, 0, 0, 0, 0], pa.int8()),
        }
    )
    kept = merge.merge_indices(
        table, ["a", "b"], [], ascending=True, first_row=False, ignore_delete=False
    )
    # keys nulls first: (null, null), (null, 'x') twice, (1, null) twice
    assert kept.to_pylist() == [4, 2, 3]


_key_values = st.one_of(st.none(), st.integers(0, 3))


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    database=None,
)
@given(
    two_columns=st.booleans(),
    file_format=st.sampled_from(["parquet", "orc", "avro"]),
    commits=st.lists(
        st.one_of(
            st.just("compact"),
            st.lists(st.tuples(_key_values, _key_values), min_size=1, max_size=8),
        ),
        min_size=1,
        max_size=5,
    ),
)
def test_nullable_keys_read_as_pypaimon_reads(
    two_columns: bool, file_format: str, commits: list[Any]
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        warehouse = str(Path(tmp) / "wh")
        _create(warehouse, ["a", "b"] if two_columns else ["a"], file_format)
        written = False
        for n, commit in enumerate(commits):
            if commit == "compact":
                if written:
                    compact(warehouse, "db.t")
                continue
            rows = {
                (a, (None if b is None else f"b{b}") if two_columns else "x"): f"v{n}"
                for a, b in commit
            }
            _write(warehouse, [(a, b, v) for (a, b), v in rows.items()])
            written = True
        if written:
            compare_all_paths(warehouse, num_shards=1)
