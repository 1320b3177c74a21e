"""Spark into Paimon: the source's exactly-once sink against a plain ``foreachBatch`` write.

    python tests/benchmarks/bench_spark_to_paimon.py [--rows 400000] [--repeats 3]
    python -m tests.benchmarks.run spark-to-paimon

The same source (a primary-key table of 4 buckets, ``rows`` rows in 8
commits: ``id``, ``v``, 40-byte ``payload``), the same local Spark
(``local[2]``), the same micro-batches (``Trigger.AvailableNow`` from
``earliest``, ``max_snapshots_per_batch=2``: the full scan of the first
snapshot, then the others two at a time), each written into a fresh
target, side by side in one process, alternating, best of the repeats:

* **plain**: ``foreachBatch`` collecting the micro-batch (``toArrow``),
  dropping the metadata columns (on the primary-key target, the
  ``'sequence.field'`` column filled with ``_pg_snapshot``) and writing it
  with one pypaimon batch write and commit: what a user writes without the
  sink, with no exactly-once;
* **sink**: ``foreachBatch(PaimonBatchSink(...))``: the micro-batch's
  offset read from the checkpoint, its rows split by (shard, snapshot),
  judged against the target's marks and committed once.

Timed: the seconds spent in the ``foreachBatch`` function over the query
(the write; the source's read is the same on both sides), and the whole
query. Ratio: plain's seconds over the sink's (>= 0.9: the sink costs at
most about a tenth more than the plain write). Targets: primary-key (4
buckets, ``'sequence.field'``) and append (Paimon's default).
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

import pyarrow as pa

from tests.benchmarks.common import Context, Figure, fill_table

TITLE = "spark-to-paimon"
TABLE = "db.src"
SNAPSHOTS = 8
REPO = Path(__file__).resolve().parents[2]
SPARK_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.driver.memory": "1g",
}
METADATA = ("_pg_shard", "_pg_snapshot", "_pg_epoch")


def _target(wh: str, name: str, pk: bool) -> None:
    from tests.support.tables import _create

    fields = [pa.field("id", pa.int64(), nullable=False), pa.field("v", pa.int64()),
              pa.field("payload", pa.string())]
    if pk:
        _create(wh, name, pa.schema([*fields, pa.field("seq", pa.int64())]),
                primary_keys=["id"], options={"bucket": "4", "sequence.field": "seq"})
    else:
        _create(wh, name, pa.schema(fields), primary_keys=[], options={})


def _plain_write(wh: str, name: str, pk: bool) -> Any:
    from tests.support.tables import open_table

    table = open_table(wh, name)

    def write(df: Any, _batch_id: int) -> None:
        rows = df.toArrow()
        if pk:
            rows = rows.append_column("seq", rows.column("_pg_snapshot"))
        rows = rows.drop_columns(list(METADATA))
        builder = table.new_batch_write_builder()
        writer, commit = builder.new_write(), builder.new_commit()
        try:
            writer.write_arrow(rows)
            commit.commit(writer.prepare_commit())
        finally:
            writer.close()
            commit.close()

    return write


def _query(spark: Any, wh: str, workdir: Path, side: str, pk: bool, run: int
           ) -> tuple[float, float, int]:
    """One query writing every micro-batch into a fresh target: (seconds in
    foreachBatch, seconds of the query, micro-batches)."""
    from paimon_group.spark.source import PaimonBatchSink

    name = f"db.{side}_{'pk' if pk else 'log'}_{run}"
    _target(wh, name, pk)
    checkpoint = str(workdir / f"ckpt-{name}")
    write = (_plain_write(wh, name, pk) if side == "plain"
             else PaimonBatchSink(wh, name, checkpoint))
    spent: list[float] = []

    def timed(df: Any, batch_id: int) -> None:
        began = time.perf_counter()
        write(df, batch_id)
        spent.append(time.perf_counter() - began)

    df = (spark.readStream.format("paimon-group").option("group", name.replace(".", "-"))
          .option("warehouse", wh).option("table", TABLE).option("start", "earliest")
          .option("member_id", "b").option("metadata_columns", "true")
          .option("max_snapshots_per_batch", "2").load())
    began = time.perf_counter()
    query = (df.writeStream.foreachBatch(timed).option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))
    return sum(spent), time.perf_counter() - began, len(spent)


def measure(workdir: Path, rows: int, repeats: int) -> dict[str, Any]:
    from paimon_group.spark.handler import PaimonGroupDataSource, build_spark_session

    os.environ["PYSPARK_PYTHON"] = sys.executable
    path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = f"{REPO}{os.pathsep}{path}" if path else str(REPO)
    wh = str(workdir / "wh")
    fill_table(wh, TABLE, buckets=4, snapshots=SNAPSHOTS, rows_per_snapshot=rows // SNAPSHOTS)
    spark = build_spark_session(master="local[2]", app_name="bench-spark-to-paimon",
                                conf=SPARK_CONF)
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(PaimonGroupDataSource)
    out: dict[str, Any] = {"rows": rows, "snapshots": SNAPSHOTS, "repeats": repeats}
    try:
        for pk in (True, False):
            kind = "pk" if pk else "append"
            _query(spark, wh, workdir, "plain", pk, -1)  # warm-up
            _query(spark, wh, workdir, "sink", pk, -1)
            timings: dict[str, list[tuple[float, float, int]]] = {"plain": [], "sink": []}
            for i in range(repeats):
                for side in (("plain", "sink") if i % 2 == 0 else ("sink", "plain")):
                    timings[side].append(_query(spark, wh, workdir, side, pk, i))
            plain = min(timings["plain"])
            sink = min(timings["sink"])
            out[kind] = {"plain_write_s": plain[0], "sink_write_s": sink[0],
                         "plain_query_s": min(t[1] for t in timings["plain"]),
                         "sink_query_s": min(t[1] for t in timings["sink"]),
                         "micro_batches": sink[2], "write_ratio": plain[0] / sink[0],
                         "query_ratio": min(t[1] for t in timings["plain"])
                         / min(t[1] for t in timings["sink"])}
    finally:
        spark.stop()
    return out


def run(ctx: Context) -> list[Figure]:
    try:
        import pyspark  # noqa: F401
    except ImportError:
        return [Figure(TITLE, "skipped: PySpark not installed", None, "")]
    rows, repeats = (200_000, 2) if ctx.quick else (400_000, 3)
    m = measure(ctx.scratch("spark-to-paimon"), rows, repeats)
    figures = []
    for kind in ("pk", "append"):
        r = m[kind]
        target = "primary-key" if kind == "pk" else "append"
        figures += [
            Figure(TITLE, f"{target} target: write in foreachBatch, plain / sink",
                   round(r["write_ratio"], 2), "x", ">= 0.9", r["write_ratio"] >= 0.9,
                   details=r),
            Figure(TITLE, f"{target} target: whole query, plain / sink",
                   round(r["query_ratio"], 2), "x"),
        ]
    return figures


def main(argv: list[str] | None = None) -> int:
    import tempfile

    parser = argparse.ArgumentParser(description="PaimonBatchSink vs a plain foreachBatch write")
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="pg-bench-spark-to-paimon-") as tmp:
        m = measure(Path(tmp), args.rows, args.repeats)
    print(f"rows: {m['rows']:,} in {m['snapshots']} snapshots; best of {m['repeats']}, "
          "local[2]")
    for kind in ("pk", "append"):
        r = m[kind]
        print(f"{kind:>6} target, {r['micro_batches']} micro-batches: write plain "
              f"{r['plain_write_s']:.2f} s | sink {r['sink_write_s']:.2f} s | plain / sink "
              f"{r['write_ratio']:.2f}x;  whole query plain {r['plain_query_s']:.2f} s | sink "
              f"{r['sink_query_s']:.2f} s | {r['query_ratio']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
