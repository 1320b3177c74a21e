"""Writes a demo Paimon table for trying paimon-group out: ``demo.events``.

Creates the table if it is missing (a primary-key table with 8 fixed buckets,
so a group of up to 8 shards has work on every shard) and then commits one
snapshot of ``--rows`` new rows every ``--interval-s`` seconds, forever, or
``--snapshots`` times. Every row has a fresh ``id``, so a consumer can count
duplicates and gaps.

Example (the quickstart overlay runs exactly this in a Deployment)::

    python demo_writer.py --warehouse /warehouse --interval-s 5 --rows 100

Only pypaimon and pyarrow are needed; both ship in the worker image.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from types import FrameType

import pyarrow as pa
from pypaimon import CatalogFactory, Schema

DATABASE = "demo"
TABLE = "events"
BUCKETS = 8

SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("payload", pa.string()),
        pa.field("written_at_ms", pa.int64()),
    ]
)

_stopping = False


def _stop(_signum: int, _frame: FrameType | None) -> None:
    global _stopping
    _stopping = True


def ensure_table(warehouse: str) -> object:
    catalog = CatalogFactory.create({"warehouse": warehouse})
    catalog.create_database(DATABASE, True)
    schema = Schema.from_pyarrow_schema(
        SCHEMA, primary_keys=["id"], options={"bucket": str(BUCKETS)}
    )
    catalog.create_table(f"{DATABASE}.{TABLE}", schema, True)
    return catalog.get_table(f"{DATABASE}.{TABLE}")


def write_snapshot(table: object, first_id: int, rows: int) -> None:
    now_ms = int(time.time() * 1000)
    data = pa.Table.from_pydict(
        {
            "id": list(range(first_id, first_id + rows)),
            "payload": [f"event-{i}" for i in range(first_id, first_id + rows)],
            "written_at_ms": [now_ms] * rows,
        },
        schema=SCHEMA,
    )
    builder = table.new_batch_write_builder()  # type: ignore[attr-defined]
    write = builder.new_write()
    commit = builder.new_commit()
    try:
        write.write_arrow(data)
        commit.commit(write.prepare_commit())
    finally:
        write.close()
        commit.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--warehouse", required=True)
    parser.add_argument("--interval-s", type=float, default=5.0)
    parser.add_argument("--rows", type=int, default=100)
    parser.add_argument("--snapshots", type=int, default=0, help="stop after N (0: run forever)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _stop)

    table = ensure_table(args.warehouse)
    # Ids start at the wall clock in milliseconds times 1000: a restarted writer
    # never reuses an id (the demo table is append-only in spirit).
    next_id = int(time.time() * 1000) * 1000
    written = 0
    while not _stopping and (args.snapshots == 0 or written < args.snapshots):
        write_snapshot(table, next_id, args.rows)
        next_id += args.rows
        written += 1
        print(f"committed snapshot {written}: {args.rows} rows", flush=True)
        deadline = time.monotonic() + args.interval_s
        while (
            not _stopping
            and time.monotonic() < deadline
            and (args.snapshots == 0 or written < args.snapshots)
        ):
            time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
