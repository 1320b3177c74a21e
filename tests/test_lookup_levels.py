"""Lookup tables read as the engine's ``LookupMergeFunction`` merges
(paimon_group/arrowread/levels.py), on a table laid out as a lookup
compaction leaves it, built with pypaimon (tests/engine/ checks the same on
tables the engine itself compacts):

* key versions v=1 fully compacted to the top level (5);
* new versions v=2 of some keys, lookup-compacted: their merged value (the
  engine's aggregation of v=1 and v=2) written to level 1, the level-0 file
  removed, the older v=1 left at level 5.

The engine reads each key once: level 1's value where there is one. A merge
of every level (pypaimon's) would add v=1 again under ``sum``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from paimon_group.arrowread.levels import merges_by_lookup
from paimon_group.reading.planner import ShardPlanner
from paimon_group.reading.table import ShardedTable
from tests.support.tables import (
    compact,
    current_entries,
    make_pk_table,
    open_table,
    rows_table,
    write_rows,
)

AGG = {"merge-engine": "aggregation", "fields.v.aggregate-function": "sum"}


def _lookup_compact(warehouse: str, merged: pa.Table) -> None:
    """Replace the level-0 files by ``merged`` written at level 1 (one
    COMPACT commit), leaving the files above level 0 as they are."""
    from pypaimon.manifest.schema.manifest_entry import ManifestEntry

    table = open_table(warehouse, "db.t")
    level0 = [e for e in current_entries(table) if e.file.level == 0]
    assert level0
    builder = table.new_batch_write_builder()
    write = builder.new_write()
    commit = builder.new_commit()
    try:
        write.write_arrow(merged)
        entries: list[Any] = []
        for message in write.prepare_commit():
            for new_file in message.new_files:
                template = next(e for e in level0 if e.bucket == message.bucket)
                entries.append(ManifestEntry(
                    kind=0, partition=template.partition, bucket=message.bucket,
                    total_buckets=template.total_buckets,
                    file=dataclasses.replace(new_file, level=1, file_source=1)))
        for entry in level0:
            entries.append(ManifestEntry(
                kind=1, partition=entry.partition, bucket=entry.bucket,
                total_buckets=entry.total_buckets, file=entry.file))
        commit.file_store_commit._try_commit(
            commit_kind="COMPACT", commit_identifier=2**63 - 1,
            commit_entries_plan=lambda _snapshot: entries, detect_conflicts=True,
            changelog_entries=[])
    finally:
        write.close()
        commit.close()


@pytest.mark.parametrize("arrow_reader", ["1", "0"])
def test_lookup_aggregation_reads_each_key_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, arrow_reader: str
) -> None:
    monkeypatch.setenv("PAIMON_GROUP_ARROW_READER", arrow_reader)
    warehouse = str(tmp_path / "wh")
    make_pk_table(warehouse, "db.t", buckets=2, changelog_producer="lookup", options=AGG)
    write_rows(warehouse, "db.t", range(0, 10), v=1)
    compact(warehouse, "db.t")  # v=1 at level 5
    write_rows(warehouse, "db.t", range(0, 5), v=2)  # level 0
    table = open_table(warehouse, "db.t")
    assert merges_by_lookup(table)
    merged = rows_table(table, range(0, 5), v=2)
    merged = merged.set_column(1, "v", pa.array([3] * 5, pa.int64()))  # sum: 1 + 2
    _lookup_compact(warehouse, merged)

    sharded = ShardedTable.open(warehouse, "db.t")
    latest = sharded.latest_snapshot_id()
    assert latest is not None
    planner = ShardPlanner(sharded, 2, include_row_kind=False)
    step = planner.plan_full([0, 1], latest)
    assert any(len({f.level for f in s.files}) > 1 for ss in step.splits.values() for s in ss)
    got = pa.concat_tables([planner.read_arrow(s) for s in step.splits.values()]).sort_by("id")
    assert dict(zip(got.column("id").to_pylist(), got.column("v").to_pylist(), strict=True)) == {
        **{k: 3 for k in range(0, 5)}, **{k: 1 for k in range(5, 10)}
    }
    if arrow_reader == "1":  # the Arrow reader merged it itself (fieldmerge.py)
        assert planner.view.read_path is not None and planner.view.read_path.fallback_splits == 0


def test_which_tables_merge_by_lookup(tmp_path: Path) -> None:
    cases = {
        "lookup": ({"changelog-producer": "lookup"}, True),
        "deletion-vectors": ({"deletion-vectors.enabled": "true"}, True),
        "force-lookup": ({"force-lookup": "true"}, True),
        "input": ({"changelog-producer": "input"}, False),
        "first-row": ({"merge-engine": "first-row", "changelog-producer": "lookup"}, False),
    }
    for name, (options, expected) in cases.items():
        warehouse = str(tmp_path / name)
        make_pk_table(warehouse, "db.t", buckets=1, options=options)
        assert merges_by_lookup(open_table(warehouse, "db.t")) is expected, name
