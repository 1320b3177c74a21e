"""The documented idempotent sink of the source: Parquet, one partition per (shard, snapshot).

A source row belongs to exactly one (shard, snapshot) pair (``_pg_shard``,
``_pg_snapshot``: the metadata columns), and one micro-batch holds all rows
of each pair it holds (snapshots are never cut). So writing a micro-batch
by *replacing* the partitions of the pairs it holds
(``partitionOverwriteMode=dynamic``) makes any replay harmless: a batch that
Spark re-runs after a crash, or rows another query re-reads after taking a
shard over from a position behind what was written, replace themselves
instead of adding a copy. Rows of the same pair are identical on every read
(the planner is deterministic per snapshot), so whichever write lands last
holds the same rows.

Example (``foreachBatch``)::

    query = df.writeStream.foreachBatch(
        lambda batch, _: write_replacing(batch, "/data/out/orders")).start()
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

__all__ = ["PARTITION_COLUMNS", "read_sink", "write_replacing"]

PARTITION_COLUMNS = ("_pg_shard", "_pg_snapshot")


def write_replacing(df: Any, path: str) -> None:
    """Write ``df`` (with the metadata columns) replacing its (shard, snapshot) partitions."""
    missing = [c for c in PARTITION_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"write_replacing needs the metadata columns {missing}: read with "
                         '.option("metadata_columns", "true")')
    (df.write.mode("overwrite").option("partitionOverwriteMode", "dynamic")
     .partitionBy(*PARTITION_COLUMNS).parquet(path))


def read_sink(spark: Any, path: str, columns: Sequence[str]) -> list[Any]:
    """The values of ``columns`` in the sink (one column: a flat list); [] if empty."""
    if not os.path.isdir(path) or not any(n.startswith("_pg_shard=") for n in os.listdir(path)):
        return []
    rows = spark.read.parquet(path).select(*columns).collect()
    if len(columns) == 1:
        return [r[0] for r in rows]
    return [tuple(r) for r in rows]
