"""Columns whose type the engine changed other than by widening (issue 22,
item 3), read from older files by the Arrow reader as the engine reads them
(paimon_group/arrowread/convert.py: the engine's CastExecutors rules,
vectorized), with no split falling back.

Values at the edges of each rule: ties of a rounding, values that overflow
the new precision (null), narrowed integers, strings longer than the new
length (multi-byte characters included), timestamps before 1970 (whole
milliseconds: the engine's Arrow bridge cannot write others), nanoseconds
the engine's truncation keeps. A value that overflows a new DECIMAL is not
among them: the engine's read fails on it (its cast gives a null the row
says is not null); ours gives null, as pypaimon's.
"""

from __future__ import annotations

import datetime as dt
import tempfile
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest

from paimon_group.reading.planner import ShardPlanner
from paimon_group.reading.table import ShardedTable
from tests.engine.engine import Engine

pytestmark = pytest.mark.engine

# column: (type before, type after, values before)
CASES: dict[str, tuple[str, str, list[object]]] = {
    "int_to_string": ("INT", "STRING", [0, -7, 2147483647, None]),
    "int_to_varchar": ("INT", "VARCHAR(3)", [12345, -12, 7, None]),
    "bigint_to_int": ("BIGINT", "INT", [2**40 + 5, -(2**33) - 1, 42, None]),
    "int_to_bigint": ("INT", "BIGINT", [1, -1, 2147483647, None]),
    "int_to_decimal": ("INT", "DECIMAL(4, 1)", [999, 5, -999, None]),
    "decimal_scale": ("DECIMAL(6, 3)", "DECIMAL(5, 1)",
                      [Decimal("1.250"), Decimal("-1.250"), Decimal("999.960"), None]),
    "decimal_wider": ("DECIMAL(6, 3)", "DECIMAL(10, 4)",
                      [Decimal("1.250"), Decimal("-999.999"), Decimal("0.001"), None]),
    "varchar_shorter": ("VARCHAR(10)", "VARCHAR(3)", ["abcdef", "héllo", "ab", None]),
    "varchar_to_string": ("VARCHAR(10)", "STRING", ["abcdef", "", "ab", None]),
    "timestamp_9_to_3": ("TIMESTAMP(9)", "TIMESTAMP(3)", [
        1_700_000_000_123_456_789, -1_001_000_000, 999, 1_234_567, 5_000_000, None]),
    "timestamp_6_to_4": ("TIMESTAMP(6)", "TIMESTAMP(4)", [
        1_700_000_000_123_456, -1_000_001, 5, 12_345, None]),
    "timestamp_3_to_9": ("TIMESTAMP(3)", "TIMESTAMP(9)", [1_700_000_000_123, -1, 0, None]),
    "date_to_timestamp": ("DATE", "TIMESTAMP(3)", [19000, -3, 0, None]),
}


def _arrow_type(sql: str) -> pa.DataType:
    from pypaimon.schema.data_types import AtomicType, PyarrowFieldParser

    arrow_type: pa.DataType = PyarrowFieldParser.from_paimon_type(AtomicType(sql))
    return arrow_type


def _column(sql: str, values: list[object], v: int) -> pa.Array:
    arrow_type = _arrow_type(sql)
    if pa.types.is_timestamp(arrow_type):
        return pa.array([None if x is None else int(x) + v for x in values],  # type: ignore[call-overload]
                        pa.int64()).cast(arrow_type)
    if pa.types.is_date(arrow_type):
        return pa.array([None if x is None else dt.date(1970, 1, 1) + dt.timedelta(days=int(x) + v)  # type: ignore[call-overload]
                         for x in values], arrow_type)
    return pa.array(values, arrow_type)


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_changed_type_reads_as_the_engine_reads(engine: Engine, case: str) -> None:
    before, after, values = CASES[case]
    schema = pa.schema([pa.field("k", pa.int64(), nullable=False),
                        pa.field("c", _arrow_type(before))])
    with tempfile.TemporaryDirectory() as tmp:
        warehouse = str(Path(tmp) / "wh")
        engine.create_table(warehouse, schema, primary_keys=["k"],
                            options={"bucket": "1"}, types={"c": before})
        keys = list(range(len(values)))
        engine.write(warehouse, pa.table({"k": keys, "c": _column(before, values, 0)},
                                         schema=schema))
        engine.alter(warehouse, ("type", "c", after))
        later = pa.schema([schema.field("k"), pa.field("c", _arrow_type(after))])
        engine.write(warehouse, pa.table({"k": [100], "c": pa.nulls(1, _arrow_type(after))},
                                         schema=later))
        expected = engine.read(warehouse).sort_by("k")

        table = ShardedTable.open(warehouse, "db.t")
        latest = table.latest_snapshot_id()
        assert latest is not None
        planner = ShardPlanner(table, 1, include_row_kind=False, batch_rows=3)
        splits = planner.plan_full([0], latest).splits[0]
        got = planner.read_arrow(splits).sort_by("k")
        streamed = pa.Table.from_batches(list(planner.iter_batches(splits)),
                                         schema=planner.schema).sort_by("k")
        assert planner._read_path is not None and planner._read_path.fallback_splits == 0
        want = expected.cast(got.schema).to_pylist()
        assert got.to_pylist() == want, case
        assert streamed.to_pylist() == want, case
