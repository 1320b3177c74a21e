"""Differential test: the Arrow reader gives exactly what pypaimon's reader gives.

Random commits are written with pypaimon (inserts, updates, update-befores and
deletes through ``rowkind.field``, several commits, partitions, several
buckets, nulls, the data types pypaimon writes, Parquet/ORC/Avro, the
deduplicate and first-row engines with and without ``sequence.field``, full
compactions, ``changelog-producer`` none or input). Every path a member reads
is planned with :class:`ShardPlanner` (initial full scan of every snapshot,
one delta/changelog step per snapshot, catch-up steps) and each shard's splits
are read by both readers (``read_arrow`` and ``iter_batches`` against
pypaimon's ``to_arrow``): row for row, in order, row kinds included.

Examples per run: ``PAIMON_GROUP_DIFF_EXAMPLES`` (default 12, about a minute
here); set it higher on demand, e.g. ``PAIMON_GROUP_DIFF_EXAMPLES=300``.
"""

from __future__ import annotations

import datetime
import decimal
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paimon_group.arrowread import merge
from paimon_group.arrowread.files import SEQUENCE_NUMBER, VALUE_KIND, apply_deletion_vector
from paimon_group.reading.planner import ShardPlanner
from paimon_group.reading.table import ShardedTable
from tests.support.tables import catalog, catalog_options_of, compact

EXAMPLES = int(os.environ.get("PAIMON_GROUP_DIFF_EXAMPLES", "12"))

VALUE_FIELDS = [
    pa.field("i8", pa.int8()),
    pa.field("i16", pa.int16()),
    pa.field("i32", pa.int32()),
    pa.field("f32", pa.float32()),
    pa.field("f64", pa.float64()),
    pa.field("flag", pa.bool_()),
    pa.field("s", pa.string()),
    pa.field("bin", pa.binary()),
    pa.field("dec", pa.decimal128(10, 2)),
    pa.field("day", pa.date32()),
    pa.field("at", pa.timestamp("us")),
    pa.field("ts", pa.int64()),  # the sequence.field when one is configured
]
KINDS = ("+I", "+U", "-U", "-D")


@dataclass
class Scenario:
    engine: str = "deduplicate"
    sequence_field: bool = False
    descending: bool = False
    partitioned: bool = False
    buckets: int = 2
    file_format: str = "parquet"
    changelog: bool = False
    commits: list[Any] = field(default_factory=list)  # list of row lists, or "compact"


def schema_of(scenario: Scenario) -> pa.Schema:
    fields = [pa.field("id", pa.int64(), nullable=False)]
    if scenario.partitioned:
        fields.append(pa.field("part", pa.string(), nullable=False))
    fields.extend(VALUE_FIELDS)
    fields.append(pa.field("op", pa.string()))
    return pa.schema(fields)


def create_table(warehouse: str, scenario: Scenario) -> str:
    from pypaimon import Schema

    options = {
        "bucket": str(scenario.buckets),
        "rowkind.field": "op",
        "file.format": scenario.file_format,
        "merge-engine": scenario.engine,
    }
    if scenario.engine == "first-row":
        options["ignore-delete"] = "true"
    if scenario.sequence_field and scenario.engine != "first-row":  # pypaimon refuses both
        options["sequence.field"] = "ts"
        if scenario.descending:
            options["sequence.field.sort-order"] = "descending"
    if scenario.changelog:
        options["changelog-producer"] = "input"
    keys = ["id", "part"] if scenario.partitioned else ["id"]
    cat = catalog(warehouse)
    cat.create_database("db", True)
    cat.create_table(
        "db.t",
        Schema.from_pyarrow_schema(
            schema_of(scenario),
            primary_keys=keys,
            partition_keys=["part"] if scenario.partitioned else None,
            options=options,
        ),
        False,
    )
    return "db.t"


def write_commit(warehouse: str, rows: list[dict[str, Any]], schema: pa.Schema) -> None:
    table = catalog(warehouse).get_table("db.t")
    data = pa.Table.from_pylist(rows, schema=schema)
    builder = table.new_batch_write_builder()
    write = builder.new_write()
    commit = builder.new_commit()
    try:
        write.write_arrow(data)
        commit.commit(write.prepare_commit())
    finally:
        write.close()
        commit.close()


def build(warehouse: str, scenario: Scenario) -> None:
    create_table(warehouse, scenario)
    schema = schema_of(scenario)
    for commit in scenario.commits:
        if commit == "compact":
            try:
                compact(warehouse, "db.t")
            except ValueError:  # nothing to compact yet
                pass
        else:
            write_commit(warehouse, commit, schema)


def assert_same(arrow: pa.Table, reference: pa.Table, what: str) -> None:
    assert arrow.schema == reference.schema, f"{what}: schema\n{arrow.schema}\n{reference.schema}"
    assert arrow.num_rows == reference.num_rows, (
        f"{what}: {arrow.num_rows} rows, pypaimon {reference.num_rows}"
    )
    for name in reference.column_names:
        a = arrow.column(name).to_pylist()
        b = reference.column(name).to_pylist()
        assert a == b, f"{what}: column {name} differs\narrow    {a}\npypaimon {b}"

def compare_every_path(planner: Any, latest: int, what: str) -> tuple[list[Any], int]:
    """Plan every full scan (snapshots 1..``latest``) and every step after
    snapshot 1 on shards 0 and 1, read each shard's splits with both of our
    read calls and compare with pypaimon's reader; the steps and the rows
    compared."""
    shards = [0, 1]
    steps = [planner.plan_full(shards, s) for s in range(1, latest + 1)]
    position = 1
    while (step := planner.plan_next(shards, position)) is not None:
        steps.append(step)
        position = step.next_snapshot
    compared = 0
    for step in steps:
        for shard, splits in step.splits.items():
            reference = planner.pypaimon_read_arrow(splits)
            assert_same(planner.read_arrow(splits), reference, f"{what} shard {shard}")
            streamed = pa.Table.from_batches(
                list(planner.iter_batches(splits)), schema=planner.schema
            )
            assert_same(streamed, reference, f"{what} shard {shard} iter_batches")
            compared += reference.num_rows
    return steps, compared



def compare_all_paths(
    warehouse: str, *, num_shards: int = 2, projection: list[str] | None = None
) -> int:
    """Every path, both readers; returns the number of rows compared."""
    table = ShardedTable.open(warehouse, "db.t", catalog_options_of(warehouse))
    latest = table.latest_snapshot_id()
    if latest is None:
        return 0
    compared = 0
    shards = list(range(num_shards))
    for with_kinds in (True, False):
        planners = [
            ShardPlanner(table, num_shards, include_row_kind=with_kinds, batch_rows=7,
                         projection=projection),
            ShardPlanner(table, num_shards, include_row_kind=with_kinds, catch_up_threshold=2,
                         projection=projection),
        ]
        steps = [("initial", planners[0], planners[0].plan_full(shards, s))
                 for s in range(1, latest + 1)]
        for planner in planners:
            position = 1
            while (step := planner.plan_next(shards, position)) is not None:
                steps.append((step.kind.value, planner, step))
                position = step.next_snapshot
        for label, planner, step in steps:
            for shard, splits in step.splits.items():
                what = f"{label} @{step.snapshot_id} shard {shard} kinds={with_kinds}"
                reference = planner.pypaimon_read_arrow(splits)
                assert_same(planner.read_arrow(splits), reference, what)
                batches = list(planner.iter_batches(splits))
                streamed = pa.Table.from_batches(batches, schema=planner.schema)
                assert_same(streamed, reference, what + " iter_batches")
                assert all(b.num_rows <= planner.batch_rows for b in batches)
                compared += reference.num_rows
        for planner in planners:
            assert planner.view.read_path is not None
            assert planner.view.read_path.fallback_splits == 0, "the Arrow reader fell back"
    return compared


# -- strategies ----------------------------------------------------------------

_ints = {"i8": 2**7, "i16": 2**15, "i32": 2**31}


def _row_values(draw: Any) -> dict[str, Any]:
    def maybe(strategy: st.SearchStrategy[Any]) -> Any:
        return draw(st.one_of(st.none(), strategy))

    values: dict[str, Any] = {
        name: maybe(st.integers(-bound, bound - 1)) for name, bound in _ints.items()
    }
    values["f32"] = maybe(st.floats(-1e6, 1e6, width=32, allow_nan=False))
    values["f64"] = maybe(st.floats(allow_nan=False))
    values["flag"] = maybe(st.booleans())
    values["s"] = maybe(st.text(max_size=6))
    values["bin"] = maybe(st.binary(max_size=6))
    values["dec"] = maybe(
        st.decimals(-(10**7), 10**7, places=2, allow_nan=False, allow_infinity=False)
    )
    values["day"] = maybe(st.dates(datetime.date(1970, 1, 1), datetime.date(2100, 1, 1)))
    values["at"] = maybe(st.datetimes(datetime.datetime(2000, 1, 1), datetime.datetime(2030, 1, 1)))
    values["ts"] = maybe(st.integers(0, 5))
    return values


@st.composite
def scenarios(draw: Any) -> Scenario:
    scenario = Scenario(
        engine=draw(st.sampled_from(["deduplicate", "deduplicate", "first-row"])),
        sequence_field=draw(st.booleans()),
        descending=draw(st.booleans()),
        partitioned=draw(st.booleans()),
        buckets=draw(st.integers(1, 3)),
        file_format=draw(st.sampled_from(["parquet", "parquet", "orc", "avro"])),
        changelog=draw(st.booleans()),
    )
    keys = st.integers(0, 12)
    for _ in range(draw(st.integers(1, 5))):
        # tests.support.tables.compact writes unpartitioned tables only
        if not scenario.partitioned and draw(st.integers(0, 4)) == 0:
            scenario.commits.append("compact")
            continue
        ids = draw(st.lists(keys, min_size=1, max_size=10, unique=True))
        rows = []
        for key in ids:
            row = {"id": key, "op": draw(st.sampled_from(KINDS)), **_row_values(draw)}
            if scenario.partitioned:
                row["part"] = draw(st.sampled_from(["a", "b"]))
            rows.append(row)
        scenario.commits.append(rows)
    return scenario


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    database=None,
)
@given(scenario=scenarios())
def test_arrow_reader_equals_pypaimon_on_every_path(scenario: Scenario) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        warehouse = str(Path(tmp) / "warehouse")
        build(warehouse, scenario)
        compare_all_paths(warehouse)


# -- fixed scenarios (each path and engine at least once per run) --------------


def _rows(ids: list[int], op: str, ts: int | None = None, part: str | None = None) -> list[Any]:
    rows = []
    for i in ids:
        row: dict[str, Any] = {name.name: None for name in VALUE_FIELDS}
        row.update(id=i, op=op, ts=ts, s=f"s{i}{op}", dec=decimal.Decimal("1.25"))
        if part is not None:
            row["part"] = part
        rows.append(row)
    return rows


@pytest.mark.parametrize("engine", ["deduplicate", "first-row"])
@pytest.mark.parametrize("sequence_field", [False, True])
def test_fixed_updates_deletes_and_compaction(
    tmp_path: Path, engine: str, sequence_field: bool
) -> None:
    scenario = Scenario(engine=engine, sequence_field=sequence_field, buckets=3, changelog=True)
    scenario.commits = [
        _rows(list(range(30)), "+I", ts=3),
        _rows(list(range(0, 30, 2)), "+U", ts=1),
        _rows(list(range(0, 30, 3)), "-D", ts=4),
        "compact",
        _rows(list(range(25, 40)), "+U", ts=2),
        _rows(list(range(10, 20)), "-U", ts=9),
    ]
    warehouse = str(tmp_path / "warehouse")
    build(warehouse, scenario)
    assert compare_all_paths(warehouse) > 0


def test_projection_decodes_only_what_is_asked_and_the_merge_needs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from paimon_group.arrowread import reader

    decoded: set[str] = set()
    real = reader.decode_file

    def spy(file_io: Any, file: Any, columns: Any, types: Any, **kwargs: Any) -> pa.Table:
        decoded.update(columns)
        return real(file_io, file, columns, types, **kwargs)

    monkeypatch.setattr(reader, "decode_file", spy)
    scenario = Scenario(sequence_field=True, buckets=2)
    scenario.commits = [_rows(list(range(20)), "+I", ts=1), _rows(list(range(5)), "-D", ts=2)]
    warehouse = str(tmp_path / "warehouse")
    build(warehouse, scenario)
    assert compare_all_paths(warehouse, projection=["s", "dec"]) > 0
    # the key and sequence.field for the merge, the row kind; never i8, bin, ...
    assert decoded == {"s", "dec", "id", "ts", SEQUENCE_NUMBER, VALUE_KIND}


def test_append_table_reads_equal(tmp_path: Path) -> None:
    from pypaimon import Schema

    warehouse = str(tmp_path / "warehouse")
    cat = catalog(warehouse)
    cat.create_database("db", True)
    schema = pa.schema([pa.field("id", pa.int64()), pa.field("s", pa.string())])
    cat.create_table(
        "db.t",
        Schema.from_pyarrow_schema(schema, options={"bucket": "3", "bucket-key": "id"}),
        False,
    )
    for n in range(3):
        write_commit(warehouse, [{"id": i, "s": f"{n}-{i}"} for i in range(20)], schema)
    assert compare_all_paths(warehouse) > 0


# -- units ---------------------------------------------------------------------


def test_merge_keeps_the_last_version_and_drops_deletes() -> None:
    table = pa.table(
        {
            "id": [1, 2, 1, 3, 2, 3],
            SEQUENCE_NUMBER: pa.array([1, 2, 3, 4, 5, 6], pa.int64()),
            VALUE_KIND: pa.array([0, 0, 2, 0, 3, 1], pa.int8()),
        }
    )
    kept = merge.merge_indices(
        table, ["id"], [], ascending=True, first_row=False, ignore_delete=False
    )
    assert kept.to_pylist() == [2]  # id 1 at sequence 3; ids 2 and 3 end deleted
    first = merge.merge_indices(
        table, ["id"], [], ascending=True, first_row=True, ignore_delete=True
    )
    assert first.to_pylist() == [0, 1, 3]


def test_sequence_field_orders_before_the_sequence_number_nulls_first() -> None:
    table = pa.table(
        {
            "id": [1, 1, 1],
            "ts": pa.array([5, None, 2], pa.int64()),
            SEQUENCE_NUMBER: pa.array([1, 2, 3], pa.int64()),
            VALUE_KIND: pa.array([0, 0, 0], pa.int8()),
        }
    )
    up = merge.merge_indices(table, ["id"], ["ts"], ascending=True, first_row=False,
                             ignore_delete=False)
    down = merge.merge_indices(table, ["id"], ["ts"], ascending=False, first_row=False,
                               ignore_delete=False)
    assert up.to_pylist() == [0]  # null < 2 < 5: ts 5 is last
    assert down.to_pylist() == [2]  # null first, then 5, 2: ts 2 is last


def test_deletion_vector_drops_rows_by_position() -> None:
    table = pa.table({"x": list(range(6))})
    assert apply_deletion_vector(table, [0, 4]).column("x").to_pylist() == [1, 2, 3, 5]
    assert apply_deletion_vector(table, []).num_rows == 6
    # a chunk holding file positions 4..9: positions 4 and 9 are its rows 0 and 5
    assert apply_deletion_vector(table, [0, 4, 9], offset=4).column("x").to_pylist() == [
        1, 2, 3, 4
    ]


def test_row_kind_strings() -> None:
    kinds = pa.array([0, 1, 2, 3], pa.int8())
    assert merge.row_kind_strings(kinds).to_pylist() == list(merge.ROW_KINDS)
    assert np.array_equal(merge._is_add(kinds), [True, False, True, False])
