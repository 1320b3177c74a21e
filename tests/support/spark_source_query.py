"""A streaming query over the ``paimon-group`` source, run as its own driver process.

Used by tests/test_spark_source_e2e.py: reads the group with the source,
writes every micro-batch to the documented replacing sink
(:func:`paimon_group.spark.source.sink.write_replacing`) and leaves one
marker file per batch (member, batch id, the (shard, snapshot) pairs it
held, when); or, with ``--sink-format file``, writes with Spark's file sink.
Stops gracefully when ``--stop-file`` appears.

    python -m tests.support.spark_source_query --warehouse WH --table db.t --group g \\
        --member q0 --checkpoint CKPT --sink SINK --markers DIR --stop-file FILE
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    for name in ("warehouse", "table", "group", "member", "checkpoint", "sink", "markers",
                 "stop-file"):
        parser.add_argument(f"--{name}", required=True)
    parser.add_argument("--session-timeout-s", default="4")
    parser.add_argument("--start", default="latest-full")
    # "replacing": foreachBatch with write_replacing and markers; "file":
    # Spark's file sink (Parquet at --sink, its own _spark_metadata log).
    parser.add_argument("--sink-format", choices=("replacing", "file"), default="replacing")
    args = parser.parse_args(argv)
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from paimon_group.spark.handler import PaimonGroupDataSource, build_spark_session
    from paimon_group.spark.source.sink import write_replacing

    spark = build_spark_session(master="local[1]", app_name=f"pg-source-{args.member}", conf={
        "spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "1",
        "spark.driver.memory": "512m"})
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(PaimonGroupDataSource)
    markers = Path(args.markers)

    def write(df: Any, batch_id: int) -> None:
        write_replacing(df, args.sink)
        pairs = sorted({(r[0], r[1]) for r in
                        df.select("_pg_shard", "_pg_snapshot").distinct().collect()})
        name = f"{args.member}-{time.time_ns()}.json"
        (markers / f".{name}").write_text(json.dumps(
            {"member": args.member, "batch": batch_id, "pairs": pairs, "at": time.time()}))
        os.replace(markers / f".{name}", markers / name)

    df = (spark.readStream.format("paimon-group").option("group", args.group)
          .option("warehouse", args.warehouse).option("table", args.table)
          .option("member_id", args.member).option("session_timeout_s", args.session_timeout_s)
          .option("start", args.start).option("metadata_columns", "true").load())
    writer = (df.writeStream.format("parquet").option("path", args.sink)
              if args.sink_format == "file" else df.writeStream.foreachBatch(write))
    query = (writer.option("checkpointLocation", args.checkpoint)
             .trigger(processingTime="500 milliseconds").start())
    print(f"query of {args.member} started", flush=True)
    while not os.path.exists(args.stop_file):
        if query.exception() is not None:
            print(f"query failed: {query.exception()}", flush=True)
            return 1
        time.sleep(0.2)
    query.stop()
    spark.stop()
    print(f"query of {args.member} stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
