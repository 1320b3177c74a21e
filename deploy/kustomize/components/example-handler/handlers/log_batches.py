"""Example handler: one JSON line on stdout per delivered batch.

``paimon-group run --handler log_batches:handle`` calls ``handle`` with each
``ShardBatch``; the batch's position is committed after it returns
(at-least-once). Replace the body with your own processing.

Example (a stand-in batch, as a unit test would use)::

    >>> import pyarrow as pa
    >>> class Batch:
    ...     group, member_id, shard, epoch, snapshot_id, kind = "g", "g-0", 1, 7, 4, "new"
    ...     def to_arrow(self):
    ...         return pa.table({"id": [1, 2, 3]})
    >>> handle(Batch())
    {"group": "g", "member": "g-0", "shard": 1, "epoch": 7, "snapshot": 4, "kind": "new", "rows": 3}
"""

from __future__ import annotations

import json
from typing import Any


def handle(batch: Any) -> None:
    rows = batch.to_arrow().num_rows
    print(
        json.dumps(
            {
                "group": batch.group,
                "member": batch.member_id,
                "shard": batch.shard,
                "epoch": batch.epoch,
                "snapshot": batch.snapshot_id,
                "kind": str(getattr(batch.kind, "value", batch.kind)),
                "rows": rows,
            }
        ),
        flush=True,
    )
