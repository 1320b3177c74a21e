"""The merge's fast path (paimon_group/arrowread/merge.py): one integer key,
no ``sequence.field``, each key's rows in sequence order -- a stable numpy
sort by the key alone -- gives exactly the rows of the general sort by
(key, sequence number); rows out of sequence order take the general sort.
And a real section (files of three commits and an update) takes the fast
path once its files are concatenated oldest first."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paimon_group.arrowread import merge
from paimon_group.arrowread.fieldmerge import merge_fields
from paimon_group.arrowread.files import SEQUENCE_NUMBER, VALUE_KIND
from paimon_group.reading.planner import ShardPlanner
from paimon_group.reading.table import ShardedTable
from tests.support.tables import make_pk_table, write_rows


def _general(table: pa.Table, *, first_row: bool) -> list[int]:
    """The merge by pyarrow's sort by (key, sequence number): the reference."""
    order = pc.sort_indices(table, sort_keys=[("id", "ascending"),
                                              (SEQUENCE_NUMBER, "ascending")]).to_pylist()
    ids = table.column("id").to_pylist()
    adds = [k in (0, 2) for k in table.column(VALUE_KIND).to_pylist()]
    if first_row:
        order = [i for i in order if adds[i]]
        return [i for n, i in enumerate(order) if n == 0 or ids[order[n - 1]] != ids[i]]
    return [i for n, i in enumerate(order)
            if (n == len(order) - 1 or ids[order[n + 1]] != ids[i]) and adds[i]]


@st.composite
def sections(draw: Any) -> pa.Table:
    """Rows of a few runs (each key once per run, key order), sequence
    numbers unique; concatenated oldest first or in a drawn order."""
    runs = draw(st.integers(1, 4))
    tables, sequence = [], 0
    for _ in range(runs):
        ids = sorted(draw(st.sets(st.integers(-50, 50), min_size=1, max_size=30)))
        kinds = draw(st.lists(st.sampled_from([0, 1, 2, 3]), min_size=len(ids),
                              max_size=len(ids)))
        tables.append(pa.table({
            "id": pa.array(ids, pa.int32()),
            SEQUENCE_NUMBER: pa.array(range(sequence, sequence + len(ids)), pa.int64()),
            VALUE_KIND: pa.array(kinds, pa.int8()),
        }))
        sequence += len(ids)
    return pa.concat_tables(draw(st.permutations(tables)))


@settings(max_examples=300, deadline=None)
@given(sections(), st.booleans())
def test_the_fast_path_keeps_what_the_general_sort_keeps(table: pa.Table,
                                                         first_row: bool) -> None:
    got = merge.merge_indices(table, ["id"], [], ascending=True, first_row=first_row,
                              ignore_delete=True)
    assert got.to_pylist() == _general(table, first_row=first_row)


def _forbid_general_sort(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the merge took the general sort")

    monkeypatch.setattr(merge.pc, "sort_indices", refuse)


def test_rows_in_sequence_order_skip_the_general_sort(monkeypatch: pytest.MonkeyPatch) -> None:
    table = pa.table({
        "id": pa.array([3, 5, 9, 1, 5], pa.int64()),
        SEQUENCE_NUMBER: pa.array([0, 1, 2, 3, 4], pa.int64()),
        VALUE_KIND: pa.array([0, 0, 0, 0, 2], pa.int8()),
    })
    _forbid_general_sort(monkeypatch)
    kept = merge.merge_indices(table, ["id"], [], ascending=True, first_row=False,
                               ignore_delete=False)
    assert kept.to_pylist() == [3, 0, 4, 2]  # ids 1, 3, 5 (its update), 9


def test_rows_out_of_sequence_order_take_the_general_sort() -> None:
    table = pa.table({
        "id": pa.array([5, 5], pa.int64()),
        SEQUENCE_NUMBER: pa.array([7, 2], pa.int64()),  # the later row first
        VALUE_KIND: pa.array([0, 0], pa.int8()),
    })
    kept = merge.merge_indices(table, ["id"], [], ascending=True, first_row=False,
                               ignore_delete=False)
    assert kept.to_pylist() == [0]


def test_a_section_of_several_commits_merges_without_the_general_sort(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    warehouse = str(tmp_path / "wh")
    make_pk_table(warehouse, "db.t", buckets=1)
    for i in range(3):
        write_rows(warehouse, "db.t", range(i * 100, (i + 1) * 100), v=i)
    write_rows(warehouse, "db.t", range(0, 300, 7), v=9)  # overlaps every file
    table = ShardedTable.open(warehouse, "db.t")
    planner = ShardPlanner(table, 1)
    latest = table.latest_snapshot_id()
    assert latest is not None
    splits = planner.plan_full([0], latest).splits[0]
    expected = planner.pypaimon_read_arrow(splits)
    assert planner.view.read_path is not None
    units = planner.view.read_path.reader.units(splits[0])
    assert [len(u.files) for u in units] == [4]  # one section: the update spans all
    _forbid_general_sort(monkeypatch)
    got = planner.read_arrow(splits)
    assert got.equals(expected)
    assert np.array_equal(got.column("id").to_numpy(), np.arange(300))


@st.composite
def partial_runs(draw: Any) -> list[pa.Table]:
    """Runs of a partial-update section, oldest first: each key once per run,
    ``v`` or ``payload`` null at random, sequence numbers unique."""
    tables, sequence = [], 0
    for _ in range(draw(st.integers(2, 4))):
        ids = sorted(draw(st.sets(st.integers(0, 40), min_size=1, max_size=20)))
        n = len(ids)
        values = draw(st.lists(st.none() | st.integers(0, 9), min_size=n, max_size=n))
        texts = draw(st.lists(st.none() | st.sampled_from("abc"), min_size=n, max_size=n))
        tables.append(pa.table({
            "id": pa.array(ids, pa.int64()), "v": pa.array(values, pa.int64()),
            "payload": pa.array(texts, pa.string()),
            SEQUENCE_NUMBER: pa.array(range(sequence, sequence + n), pa.int64()),
            VALUE_KIND: pa.array([0] * n, pa.int8()),
        }))
        sequence += n
    return tables


@settings(max_examples=200, deadline=None)
@given(partial_runs(), st.sampled_from(["partial-update", "sum"]))
def test_partial_update_and_aggregation_merge_the_same_either_way(
        runs: list[pa.Table], engine: str) -> None:
    functions = ({"v": "last_non_null_value", "payload": "last_non_null_value"}
                 if engine == "partial-update" else
                 {"v": "sum", "payload": "last_non_null_value"})
    oldest_first = pa.concat_tables(runs)
    newest_first = pa.concat_tables(runs[::-1])
    assert merge.integer_key_order(oldest_first, ["id"], []) is not None
    got = merge_fields(oldest_first, ["id"], functions)
    assert got.equals(merge_fields(newest_first, ["id"], functions))
    with pytest.MonkeyPatch.context() as patch:
        _forbid_general_sort(patch)
        assert merge_fields(oldest_first, ["id"], functions).equals(got)
