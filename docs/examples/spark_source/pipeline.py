"""Exactly-once from a Paimon table into Parquet with the ``paimon-group`` streaming source.

Run one copy per driver (on any hosts sharing the coordinator); each copy is
one member of the group and reads its share of the shards::

    python docs/examples/spark_source/pipeline.py --warehouse /data/wh --table shop.orders \\
        --group totals --member q1 --checkpoint /ckpt/q1 --out /data/out/orders \\
        [--coordinator etcd://etcd-0:2379/pg]

Every row is written to ``--out`` exactly once across crashes, restarts and
shard handoffs: the sink replaces the (shard, snapshot) partitions a
micro-batch holds (see docs/spark.md, "The streaming source").
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

from paimon_group.spark import PaimonGroupDataSource, build_spark_session
from paimon_group.spark.source.errors import error_line
from paimon_group.spark.source.sink import write_replacing


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("warehouse", "table", "group", "member", "checkpoint", "out"):
        parser.add_argument(f"--{name}", required=True)
    parser.add_argument("--coordinator", default=None)
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args()
    # The source's Python workers must run an interpreter that has paimon-group.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = build_spark_session(master=args.master, app_name=f"orders-{args.member}")
    spark.dataSource.register(PaimonGroupDataSource)
    reader = (spark.readStream.format("paimon-group")
              .option("group", args.group).option("warehouse", args.warehouse)
              .option("table", args.table).option("member_id", args.member)
              .option("metadata_columns", "true")        # _pg_shard, _pg_snapshot, _pg_epoch
              .option("max_rows_per_batch", "1000000"))
    if args.coordinator:
        reader = reader.option("coordinator", args.coordinator)

    def write(batch, batch_id):  # type: ignore[no-untyped-def]
        write_replacing(batch, args.out)   # replaces (shard, snapshot) partitions: idempotent

    try:
        query = (reader.load().writeStream.foreachBatch(write)
                 .option("checkpointLocation", args.checkpoint).start())
    except Exception as err:  # a bad option: our one line, not Spark's forty
        line = error_line(err)
        if line is None:
            raise
        print(f"error: {line}", file=sys.stderr)
        spark.stop()
        return 2
    # Ctrl-C (SIGINT) or SIGTERM: stop the query, so that its member leaves
    # the group and hands its shards off, and exit as a shell expects (130
    # after Ctrl-C). The handler only sets a flag: an exception raised in the
    # middle of a call into Spark's JVM would break that connection.
    stop: list[int] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, frame: stop.append(signum))
    while not stop and query.isActive:
        query.awaitTermination(1)
    if stop:
        print("stopping: the query's member leaves the group", file=sys.stderr)
        query.stop()
        spark.stop()
        return 128 + stop[0]
    query.awaitTermination()  # ended by itself: raises its error, if any
    return 0


if __name__ == "__main__":
    sys.exit(main())
