"""A streaming query over the ``paimon-group`` source, run as its own driver process.

Used by tests/test_spark_source_e2e.py: reads the group with the source,
writes every micro-batch to the documented replacing sink
(:func:`paimon_group.spark.source.sink.write_replacing`) and leaves one
marker file per batch (member, batch id, the (shard, snapshot) pairs it
held, when); or, with ``--sink-format file``, writes with Spark's file sink;
or, with ``--sink-format paimon``, writes each micro-batch's ``id``, ``v`` and
``_row_kind`` into the Paimon tables ``--sink`` names (comma-separated, in
the source's warehouse) through :class:`~paimon_group.spark.source.PaimonBatchSink`,
killing its own process group (SIGKILL) at the point an armed file
``<markers>/kill-<member>`` names: ``before`` the writes, ``between`` the
two targets' writes, or ``after`` them (before Spark records the batch).
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
    parser.add_argument("--sink-format", choices=("replacing", "file", "paimon"),
                        default="replacing")
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
          .option("start", args.start).option("metadata_columns", "true")
          .option("include_row_kind", str(args.sink_format == "paimon").lower()).load())
    if args.sink_format == "paimon":
        df = df.select("id", "v", "_row_kind", "_pg_shard", "_pg_snapshot", "_pg_epoch")
        write = _paimon_writer(args)
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


def _paimon_writer(args: argparse.Namespace) -> Any:
    """The foreachBatch function writing into every target of ``--sink``."""
    import signal

    from paimon_group.spark.source import PaimonBatchSink
    from paimon_group.spark.source.to_paimon import batch_offset

    sinks = [PaimonBatchSink(args.warehouse, name, args.checkpoint)
             for name in args.sink.split(",")]
    arm = Path(args.markers) / f"kill-{args.member}"

    def die_at(point: str) -> None:
        if arm.exists() and arm.read_text().strip() == point:
            arm.unlink()
            os.killpg(os.getpgid(0), signal.SIGKILL)

    def write(df: Any, batch_id: int) -> None:
        rows = df.toArrow()
        offset = batch_offset(args.checkpoint, batch_id)
        die_at("before")
        for i, sink in enumerate(sinks):
            if i:
                die_at("between")
            sink.write(rows, offset, batch_id)
        die_at("after")
        name = f"{args.member}-{time.time_ns()}.json"
        markers = Path(args.markers)
        (markers / f".{name}").write_text(json.dumps(
            {"member": args.member, "batch": batch_id, "rows": rows.num_rows, "pairs": [],
             "at": time.time()}))
        os.replace(markers / f".{name}", markers / name)

    return write


if __name__ == "__main__":
    sys.exit(main())
