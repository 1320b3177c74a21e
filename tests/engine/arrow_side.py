"""Our side of an engine comparison: a table's latest snapshot read by the Arrow path.

The engine tests write a one-bucket table ``db.t`` with Paimon's engine and
compare the engine's read with ours. Ours is read twice, as a member reads
it: whole (``read_arrow``) and batch by batch (``iter_batches``), and no
split may fall back to pypaimon's reader: a fallback would compare pypaimon
with the engine, not us.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa

from paimon_group.reading.planner import ShardPlanner
from paimon_group.reading.table import ShardedTable


@dataclass(frozen=True)
class ArrowSide:
    latest: int
    whole: pa.Table
    streamed: pa.Table


def read_latest(warehouse: str, *, batch_rows: int,
                projection: Sequence[str] | None = None) -> ArrowSide:
    """The latest snapshot of ``db.t`` read by the Arrow path, whole and in batches."""
    table = ShardedTable.open(warehouse, "db.t")
    latest = table.latest_snapshot_id()
    assert latest is not None
    planner = ShardPlanner(table, 1, include_row_kind=False, batch_rows=batch_rows,
                           projection=None if projection is None else list(projection))
    splits = planner.plan_full([0], latest).splits[0]
    whole = planner.read_arrow(splits)
    streamed = pa.Table.from_batches(list(planner.iter_batches(splits)), schema=planner.schema)
    assert planner.view.read_path is not None and planner.view.read_path.fallback_splits == 0
    return ArrowSide(latest, whole, streamed)
