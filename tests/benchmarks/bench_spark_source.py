"""Spark: rows/s of the ``paimon-group`` streaming source against the ``--spark-handler`` path.

    python tests/benchmarks/bench_spark_source.py [--rows 400000] [--repeats 3]
    python -m tests.benchmarks.run spark-source

The same table (4 buckets, ``rows`` rows in ``snapshots`` commits of a
primary-key table: ``id``, ``v``, 40-byte ``payload``), the same local Spark
(``local[2]``) and the same work on every row (``count()``), side by side in
one process, alternating, best of the repeats:

* **source**: a query ``readStream.format("paimon-group")`` with
  ``Trigger.AvailableNow`` from ``earliest`` (a new group and checkpoint each
  time), ``foreachBatch`` counting; from ``start()`` to the end of the
  query, so it includes joining the group, Spark's micro-batch bookkeeping
  (offset and commit logs), planning, and the executors' reads;
* **handler**: what a ``--spark-handler`` worker does for the same rows:
  plan the steps of all 4 shards, and for each shard batch
  ``SparkBatchHandler.to_dataframe(batch).count()`` (the batch read in the
  worker, shipped to the JVM as Arrow), one after another.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.benchmarks.common import Context, Figure, fill_table

TITLE = "spark-source"
TABLE = "db.src"
REPO = Path(__file__).resolve().parents[2]

SPARK_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.driver.memory": "1g",
}


def _source_once(spark: Any, wh: str, workdir: Path, run: int) -> int:
    counted: list[int] = []
    df = (spark.readStream.format("paimon-group").option("group", f"bench{run}")
          .option("warehouse", wh).option("table", TABLE).option("start", "earliest")
          .option("member_id", f"b{run}").load())
    query = (df.writeStream.foreachBatch(lambda b, _: counted.append(b.count()))
             .option("checkpointLocation", str(workdir / f"ckpt{run}"))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))
    return sum(counted)


def _handler_once(spark: Any, wh: str) -> int:
    from paimon_group.reading.batch import ShardBatch
    from paimon_group.reading.table import ShardedTable
    from paimon_group.spark.handler import SparkBatchHandler

    table = ShardedTable.open(wh, TABLE)
    planner = table.planner(4)
    handler = SparkBatchHandler(lambda df, b: df, spark)
    earliest = table.earliest_snapshot_id()
    latest = table.latest_snapshot_id()
    assert earliest is not None and latest is not None
    steps = [planner.plan_full(range(4), earliest)]
    n = earliest + 1
    while n <= latest:
        step = planner.plan_next(range(4), n)
        assert step is not None
        steps.append(step)
        n = step.next_snapshot
    total = 0
    for step in steps:
        for shard in range(4):
            if step.splits.get(shard):
                batch = ShardBatch(group="bench", member_id="m0", shard=shard, num_shards=4,
                                   epoch=1, plan=step, planner=planner)
                total += handler.to_dataframe(batch).count()
    return total


def measure(workdir: Path, rows: int, repeats: int, snapshots: int = 4) -> dict[str, Any]:
    from paimon_group.spark.handler import PaimonGroupDataSource, build_spark_session

    os.environ["PYSPARK_PYTHON"] = sys.executable
    path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = f"{REPO}{os.pathsep}{path}" if path else str(REPO)
    wh = str(workdir / "wh")
    fill_table(wh, TABLE, buckets=4, snapshots=snapshots, rows_per_snapshot=rows // snapshots)
    spark = build_spark_session(master="local[2]", app_name="bench-spark-source",
                                conf=SPARK_CONF)
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(PaimonGroupDataSource)
    timings: dict[str, list[float]] = {"source": [], "handler": []}
    try:
        # Warm up both paths (JVM, Python workers, first-use imports).
        assert _source_once(spark, wh, workdir, 0) == rows
        assert _handler_once(spark, wh) == rows
        for i in range(repeats):
            order = ["source", "handler"] if i % 2 == 0 else ["handler", "source"]
            for name in order:
                began = time.perf_counter()
                got = (_source_once(spark, wh, workdir, i + 1) if name == "source"
                       else _handler_once(spark, wh))
                timings[name].append(time.perf_counter() - began)
                assert got == rows, (name, got, rows)
    finally:
        spark.stop()
    s, h = min(timings["source"]), min(timings["handler"])
    return {"rows": rows, "snapshots": snapshots, "repeats": repeats,
            "source_rows_s": rows / s, "handler_rows_s": rows / h, "ratio": h / s,
            "seconds": timings}


def run(ctx: Context) -> list[Figure]:
    try:
        import pyspark  # noqa: F401
    except ImportError:
        return [Figure(TITLE, "skipped: PySpark not installed", None, "")]
    rows, repeats = (200_000, 2) if ctx.quick else (400_000, 3)
    m = measure(ctx.scratch("spark-source"), rows, repeats)
    details = {k: v for k, v in m.items() if k != "seconds"}
    return [
        Figure(TITLE, "source (readStream, availableNow, count)", round(m["source_rows_s"]),
               "rows/s", details=details),
        Figure(TITLE, "--spark-handler path (to_dataframe, count)", round(m["handler_rows_s"]),
               "rows/s"),
        Figure(TITLE, "source / handler", m["ratio"], "x"),
    ]


def main(argv: list[str] | None = None) -> int:
    import tempfile

    parser = argparse.ArgumentParser(description="Spark source vs --spark-handler throughput")
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="pg-bench-spark-source-") as tmp:
        m = measure(Path(tmp), args.rows, args.repeats)
    print(f"rows: {m['rows']:,} in {m['snapshots']} snapshots; best of {m['repeats']}, local[2]")
    print(f"source (readStream, availableNow):  {m['source_rows_s']:>14,.0f} rows/s")
    print(f"--spark-handler path:               {m['handler_rows_s']:>14,.0f} rows/s")
    print(f"ratio source / handler:             {m['ratio']:>14.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
