"""The tables the Arrow reader leaves to pypaimon's reader (docs/design.md,
"What pypaimon's reader still reads"): every path still reads exactly what
pypaimon reads, the splits are counted as fallen back, and the reason is said
in one log line per table, not once per split."""

from __future__ import annotations

import logging
from pathlib import Path

import pyarrow as pa
import pytest

from paimon_group.reading.planner import ShardPlanner
from paimon_group.reading.table import ShardedTable
from tests.support.tables import make_pk_table, open_table, rows_table, write_rows, write_table
from tests.test_arrowread import compare_every_path

FALLBACK_TABLES = {
    "aggregation with listagg distinct": (
        {"merge-engine": "aggregation", "fields.payload.aggregate-function": "listagg",
         "fields.payload.distinct": "true"},
        "merge-engine aggregation with aggregate function listagg with distinct",
    ),
}

# Read by the Arrow reader (fieldmerge.py), checked against pypaimon the same way.
FIELD_MERGE_TABLES = {
    "partial-update": {"merge-engine": "partial-update"},
    "aggregation sum, last_non_null_value": {
        "merge-engine": "aggregation", "fields.v.aggregate-function": "sum"},
    "aggregation max, first_value": {
        "merge-engine": "aggregation", "fields.v.aggregate-function": "max",
        "fields.payload.aggregate-function": "first_value"},
    "aggregation min, first_non_null_value": {
        "merge-engine": "aggregation", "fields.v.aggregate-function": "min",
        "fields.payload.aggregate-function": "first_non_null_value"},
    "partial-update with sequence.field": {
        "merge-engine": "partial-update", "sequence.field": "v"},
    "aggregation with sequence.field": {
        "merge-engine": "aggregation", "sequence.field": "v",
        "fields.payload.aggregate-function": "last_value"},
    "aggregation product": {
        "merge-engine": "aggregation", "fields.v.aggregate-function": "product"},
    "aggregation listagg": {
        "merge-engine": "aggregation", "fields.payload.aggregate-function": "listagg"},
    "aggregation last_value by default": {
        "merge-engine": "aggregation", "fields.default-aggregate-function": "last_value"},
}


def _write_with_nulls(warehouse: str, ids: range, v: int) -> None:
    """Rows whose payload is null for odd keys: partial-update keeps the older
    non-null value there, which a plain deduplicate would not."""
    table = open_table(warehouse, "db.t")
    data = rows_table(table, ids, v=v)
    payload = [None if i % 2 else f"p{i}-{v}" for i in ids]
    data = data.set_column(
        data.schema.get_field_index("payload"), "payload", pa.array(payload, pa.string())
    )
    write_table(table, data)


def _read_every_path(
    warehouse: str, options: dict[str, str], kind: str
) -> ShardPlanner:
    """Write the table, then read every full scan and step with both readers
    and compare; the planner, for its fallback count."""
    make_pk_table(warehouse, "db.t", buckets=2, options=options)
    write_rows(warehouse, "db.t", range(0, 20), v=1)
    _write_with_nulls(warehouse, range(0, 20), v=2)
    write_rows(warehouse, "db.t", range(10, 30), v=3)

    table = ShardedTable.open(warehouse, "db.t")
    latest = table.latest_snapshot_id()
    assert latest == 3
    planner = ShardPlanner(table, 2, include_row_kind=True, batch_rows=5)
    _, compared = compare_every_path(planner, latest, kind)
    assert compared > 0
    assert planner.view.read_path is not None
    return planner


@pytest.mark.parametrize("kind", sorted(FIELD_MERGE_TABLES))
def test_partial_update_and_aggregation_read_as_pypaimon_on_the_arrow_path(
    kind: str, tmp_path: Path
) -> None:
    planner = _read_every_path(str(tmp_path / "wh"), FIELD_MERGE_TABLES[kind], kind)
    assert planner.view.read_path is not None and planner.view.read_path.fallback_splits == 0


@pytest.mark.parametrize("kind", sorted(FALLBACK_TABLES))
def test_fallback_table_reads_what_pypaimon_reads_and_says_why_once(
    kind: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    options, reason = FALLBACK_TABLES[kind]
    caplog.set_level(logging.INFO, logger="paimon_group.arrowread")
    planner = _read_every_path(str(tmp_path / "wh"), options, kind)
    assert planner.view.read_path is not None
    assert planner.view.read_path.fallback_splits > 0
    lines = [r.getMessage() for r in caplog.records if r.name == "paimon_group.arrowread"]
    assert [line for line in lines if reason in line] == [
        f"table db.t: pypaimon's reader reads splits with {reason} (the Arrow reader does not)"
    ], lines
