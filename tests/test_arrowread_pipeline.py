"""A split read whole (``to_arrow``) decodes its next units while one merges
(paimon_group/arrowread/pipeline.py): its files on the decode pool, at most
``UNITS_AHEAD`` units ahead, and a split that turns out unreadable mid-way
read by pypaimon alone. Real tables written by pypaimon; the decode and the
merge are wrapped only to observe them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from paimon_group.arrowread import pipeline, reader
from paimon_group.arrowread.files import Unsupported
from paimon_group.reading.planner import ShardPlanner
from paimon_group.reading.table import ShardedTable
from tests.support.tables import make_pk_table, write_rows

SECTIONS = 6


def _planner(warehouse: str, buckets: int) -> tuple[ShardPlanner, list[Any]]:
    """A table whose splits hold ``SECTIONS`` sections each: commits of
    disjoint key ranges, then an update of the first range (so the first
    section merges two files); the planner and its full scan's splits."""
    make_pk_table(warehouse, "db.t", buckets=buckets)
    for i in range(SECTIONS):
        write_rows(warehouse, "db.t", range(i * 1000, (i + 1) * 1000), v=i)
    write_rows(warehouse, "db.t", range(0, 1000, 3), v=9)
    table = ShardedTable.open(warehouse, "db.t")
    planner = ShardPlanner(table, buckets, include_row_kind=True)
    latest = table.latest_snapshot_id()
    assert latest is not None
    step = planner.plan_full(range(buckets), latest)
    return planner, [s for shard in range(buckets) for s in step.splits[shard]]


def _observe_decodes(monkeypatch: pytest.MonkeyPatch,
                     on_decode: Callable[[Any], None]) -> list[tuple[str, str]]:
    """Wrap the file decode: ``(thread name, file name)`` of each decode."""
    seen: list[tuple[str, str]] = []
    decode_file = reader.decode_file

    def observed(file_io: Any, file: Any, *args: Any, **kwargs: Any) -> pa.Table:
        seen.append((threading.current_thread().name, file.file_name))
        on_decode(file)
        return decode_file(file_io, file, *args, **kwargs)

    monkeypatch.setattr(reader, "decode_file", observed)
    return seen


def test_a_split_read_whole_decodes_the_next_section_while_one_merges(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    planner, splits = _planner(str(tmp_path / "wh"), buckets=1)
    assert len(splits) == 1
    read_path = planner.view.read_path
    assert read_path is not None
    units = read_path.reader.units(splits[0])
    assert len(units) == SECTIONS and len(units[0].files) == 2
    unit_of = {f.file_name: i for i, u in enumerate(units) for f, _ in u.files}
    later_decoding = threading.Event()
    started: list[set[int]] = []  # at each merge: the units whose files started decoding
    seen = _observe_decodes(monkeypatch, lambda f: unit_of[f.file_name] > 0
                            and later_decoding.set())
    merge_unit = reader.ArrowSplitReader.merge_unit

    def observed_merge(self: Any, unit: Any, tables: list[pa.Table]) -> Any:
        if not started:
            # The first section's merge waits for a later section's decode:
            # it comes only if that decode runs beside this merge.
            later_decoding.wait(10)
        started.append({unit_of[name] for _, name in seen})
        return merge_unit(self, unit, tables)

    monkeypatch.setattr(reader.ArrowSplitReader, "merge_unit", observed_merge)
    got = planner.read_arrow(splits)

    assert later_decoding.is_set() and 1 in started[0]
    assert {name for name, _ in seen} and all(
        name.startswith("paimon-group-decode") for name, _ in seen), seen
    # Bounded: at the merge of unit k, no file of a unit past k + UNITS_AHEAD started.
    for k, units_started in enumerate(started):
        assert max(units_started) <= k + pipeline.UNITS_AHEAD, (k, units_started)
    assert got.equals(planner.pypaimon_read_arrow(splits))
    assert read_path.fallback_splits == 0


def test_a_split_unreadable_mid_way_is_read_by_pypaimon_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    planner, splits = _planner(str(tmp_path / "wh"), buckets=2)
    assert len(splits) == 2
    read_path = planner.view.read_path
    assert read_path is not None
    # The last section of the first split cannot be decoded here.
    refused = read_path.reader.units(splits[0])[-1].files[0][0].file_name

    def refuse(file: Any) -> None:
        if file.file_name == refused:
            raise Unsupported("a file this test refuses")

    _observe_decodes(monkeypatch, refuse)
    got = planner.read_arrow(splits)

    assert got.equals(planner.pypaimon_read_arrow(splits))
    assert read_path.fallback_splits == 1


def held_through_merges(warehouse: str) -> list[tuple[int, int]]:
    """For each way of reading a split whole, the bytes Arrow has allocated
    when the section's merge starts, and the section's own bytes. Run in a
    process of its own: ``pa.total_allocated_bytes`` counts every thread's
    allocations, and threads left by earlier tests in a suite's process
    would count too."""
    make_pk_table(warehouse, "db.t", buckets=1)
    for i in range(3):
        write_rows(warehouse, "db.t", range(i * 20_000, (i + 1) * 20_000), v=i)
    write_rows(warehouse, "db.t", range(0, 60_000, 5), v=9)  # one section of 4 files
    table = ShardedTable.open(warehouse, "db.t")
    planner = ShardPlanner(table, 1)
    latest = table.latest_snapshot_id()
    assert latest is not None
    splits = planner.plan_full([0], latest).splits[0]
    held: list[tuple[int, int]] = []  # (bytes allocated by Arrow, the section's bytes)
    merge_section = reader.ArrowSplitReader._merge_section
    before = 0

    def observed(self: Any, rows: pa.Table, *, single_run: bool) -> Any:
        held.append((pa.total_allocated_bytes() - before, rows.nbytes))
        return merge_section(self, rows, single_run=single_run)

    reader.ArrowSplitReader._merge_section = observed  # type: ignore[method-assign]
    measured = []
    for read in (planner.read_arrow, lambda s: pa.Table.from_batches(
            list(planner.iter_batches(s)))):
        held.clear()
        before = pa.total_allocated_bytes()
        assert read(splits).num_rows == 60_000
        [one] = held
        measured.append(one)
    return measured


def test_a_merged_section_is_not_held_twice_through_its_merge(tmp_path: Path) -> None:
    """The section's files are combined into one table before the merge; the
    decoded files are freed then, so the merge holds one copy of the rows."""
    root = Path(__file__).resolve().parent.parent
    code = ("import json, sys\n"
            "from tests.test_arrowread_pipeline import held_through_merges\n"
            "print(json.dumps(held_through_merges(sys.argv[1])))\n")
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "wh")], cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)}, capture_output=True,
        text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    measured = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(measured) == 2
    for allocated, section in measured:
        assert section < allocated < 1.5 * section, (allocated, section)
