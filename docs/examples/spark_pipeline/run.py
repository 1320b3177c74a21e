"""Run the example Spark pipeline end to end on this machine, with one command.

    python docs/examples/spark_pipeline/run.py                # 3 workers, local Spark
    python docs/examples/spark_pipeline/run.py --workers 2 --no-kill
    python docs/examples/spark_pipeline/run.py --spark-remote sc://spark-connect:15002
    python docs/examples/spark_pipeline/run.py --local-connect-server

What it does:

1. creates a Paimon warehouse with a primary-key table ``shop.orders``
   (4 buckets) and a small dimension table of customers (a Parquet file);
2. writes a first snapshot of orders, then starts WORKERS processes
   ``paimon-group run --group orders-pipeline --spark-handler pipeline:handle``
   (the Spark job is ``pipeline.py`` next to this file); each starts its own
   local Spark (``--spark-master local[1]``) or uses the Spark Connect server
   given with ``--spark-remote`` / started with ``--local-connect-server``;
3. keeps writing snapshots of new orders while they run, and SIGKILLs one
   worker half way (unless ``--no-kill``): its shards move to the others,
   which deliver its unfinished batch again;
4. waits until every order is in the sink, stops the workers (SIGTERM:
   graceful handoff) and checks that every order is in ``enriched_orders``
   exactly once and that the sum of ``region_totals`` equals the totals
   computed directly from the source table and the dimension table.

Exit code 0 when the check passes. Everything lives under ``--dir`` (default:
a new temporary directory), including each worker's log.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
if (REPO / "paimon_group").is_dir() and str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # running from a checkout without installing
GROUP = "orders-pipeline"
TABLE = "shop.orders"
BUCKETS = 4
REGIONS = ("north", "south", "east", "west")
CUSTOMERS = 40

ORDERS_SCHEMA = pa.schema([
    pa.field("order_id", pa.int64(), nullable=False),
    pa.field("customer_id", pa.int64()),
    pa.field("amount_cents", pa.int64()),
])

SPARK_DEFAULTS = """\
spark.ui.enabled false
spark.ui.showConsoleProgress false
spark.sql.shuffle.partitions 2
spark.default.parallelism 1
spark.driver.memory 512m
"""


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# -- the source: a Paimon table ------------------------------------------


def catalog(warehouse: Path) -> Any:
    from pypaimon import CatalogFactory

    return CatalogFactory.create({"warehouse": str(warehouse)})


def create_orders_table(warehouse: Path) -> None:
    from pypaimon import Schema

    cat = catalog(warehouse)
    cat.create_database("shop", True)
    schema = Schema.from_pyarrow_schema(
        ORDERS_SCHEMA, primary_keys=["order_id"], options={"bucket": str(BUCKETS)}
    )
    cat.create_table(TABLE, schema, False)


def write_orders(warehouse: Path, first_id: int, count: int, rng: random.Random) -> None:
    """One commit (one snapshot) of ``count`` new orders."""
    table = catalog(warehouse).get_table(TABLE)
    data = pa.table({
        "order_id": list(range(first_id, first_id + count)),
        # Customer ids up to CUSTOMERS + 4: a few orders have no customer row
        # (the join is a left join; they land in region "unknown").
        "customer_id": [rng.randrange(CUSTOMERS + 4) for _ in range(count)],
        "amount_cents": [rng.randrange(100, 100_000) for _ in range(count)],
    }, schema=ORDERS_SCHEMA)
    builder = table.new_batch_write_builder()
    write, commit = builder.new_write(), builder.new_commit()
    try:
        write.write_arrow(data)
        commit.commit(write.prepare_commit())
    finally:
        write.close()
        commit.close()


def read_all_orders(warehouse: Path) -> pa.Table:
    table = catalog(warehouse).get_table(TABLE)
    builder = table.new_read_builder()
    return builder.new_read().to_arrow(builder.new_scan().plan().splits())


def write_customers(path: Path) -> dict[int, str]:
    regions = {c: REGIONS[c % len(REGIONS)] for c in range(CUSTOMERS)}
    pq.write_table(pa.table({
        "customer_id": pa.array(list(regions), pa.int64()),
        "region": pa.array(list(regions.values()), pa.string()),
    }), path)
    return regions


# -- processes -----------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_local_connect_server(run_dir: Path, env: dict[str, str]) -> tuple[Any, str]:
    """A Spark Connect server from the installed PySpark, on a free loopback port."""
    import pyspark

    spark_home = Path(pyspark.__file__).parent
    port = free_port()
    log = open(run_dir / "connect-server.log", "wb")
    proc = subprocess.Popen(
        [str(spark_home / "bin" / "spark-submit"),
         "--class", "org.apache.spark.sql.connect.service.SparkConnectServer",
         "--master", "local[2]",
         "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
         "--conf", f"spark.connect.grpc.binding.port={port}",
         "--conf", "spark.ui.enabled=false",
         "--conf", "spark.sql.shuffle.partitions=2",
         "spark-internal"],
        env={**env, "SPARK_HOME": str(spark_home)},
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the Spark Connect server exited; see {run_dir}/connect-server.log")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc, f"sc://127.0.0.1:{port}"
        time.sleep(1)
    raise SystemExit("the Spark Connect server did not start within 300 s")


def start_worker(i: int, args: argparse.Namespace, run_dir: Path, env: dict[str, str],
                 remote: str | None) -> subprocess.Popen[bytes]:
    command = [
        sys.executable, "-m", "paimon_group", "run",
        "--group", GROUP, "--warehouse", str(run_dir / "warehouse"), "--table", TABLE,
        "--member-id", f"worker-{i}",
        "--spark-handler", "pipeline:handle",
        "--session-timeout-s", "5", "--poll-interval-ms", "300",
    ]
    command += ["--spark-remote", remote] if remote else ["--spark-master", args.spark_master]
    log = open(run_dir / f"worker-{i}.log", "wb")
    # cwd = this directory, so that "pipeline" is importable.
    return subprocess.Popen(command, cwd=HERE, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)


def stop(proc: subprocess.Popen[bytes], timeout: float = 120) -> int | None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode


# -- the check -----------------------------------------------------------


def check(run_dir: Path, regions: dict[int, str]) -> bool:
    from paimon_group.spark.sinks import ParquetBatchSink

    source = read_all_orders(run_dir / "warehouse")
    expected_totals: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for customer, amount in zip(source.column("customer_id").to_pylist(),
                                source.column("amount_cents").to_pylist(), strict=True):
        totals = expected_totals[regions.get(customer, "unknown")]
        totals[0] += 1
        totals[1] += amount

    enriched = ParquetBatchSink(run_dir / "out" / "enriched_orders").read_arrow()  # rows
    seen = Counter(enriched.column("order_id").to_pylist())
    duplicates = sorted(k for k, n in seen.items() if n > 1)
    missing = sorted(set(source.column("order_id").to_pylist()) - set(seen))

    totals_sink = ParquetBatchSink(run_dir / "out" / "region_totals")
    got_totals: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    batches = totals_sink.read_arrow()
    for region, orders, amount in zip(batches.column("region").to_pylist(),
                                      batches.column("orders").to_pylist(),
                                      batches.column("amount_cents").to_pylist(), strict=True):
        got_totals[region][0] += orders
        got_totals[region][1] += amount
    enriched_sink = ParquetBatchSink(run_dir / "out" / "enriched_orders")
    replays = {(p["shard"], p["snapshot"])
               for p in enriched_sink.publications() + totals_sink.publications()
               if p["replaced"] or p["superseded"]}

    print()
    print(f"{'region':<10}{'orders':>10}{'amount':>16}   source")
    for region in sorted(set(expected_totals) | set(got_totals)):
        got, want = got_totals[region], expected_totals[region]
        mark = "ok" if got == want else f"MISMATCH (source: {want[0]} orders, {want[1]})"
        print(f"{region:<10}{got[0]:>10}{got[1] / 100:>16,.2f}   {mark}")
    print()
    print(f"source orders: {source.num_rows}; in the sink: {enriched.num_rows} rows, "
          f"{len(seen)} distinct; duplicates: {len(duplicates)}; missing: {len(missing)}")
    print(f"batches written: {len(totals_sink.batch_keys())}; "
          f"replays that replaced or superseded an earlier attempt: {len(replays)}")
    ok = not duplicates and not missing and enriched.num_rows == source.num_rows and (
        dict(got_totals) == dict(expected_totals))
    print("exactly-once check: " + ("PASSED" if ok else "FAILED"))
    return ok


# -- main ----------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--snapshots", type=int, default=12, help="snapshots written while "
                        "the workers run")
    parser.add_argument("--orders-per-snapshot", type=int, default=50)
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between snapshots")
    parser.add_argument("--dir", help="where to put everything (default: a new temp dir)")
    parser.add_argument("--spark-master", default="local[1]")
    parser.add_argument("--spark-remote", help="a Spark Connect server, sc://HOST:PORT")
    parser.add_argument("--local-connect-server", action="store_true",
                        help="start a Spark Connect server from the installed PySpark")
    parser.add_argument("--no-kill", action="store_true", help="do not SIGKILL a worker")
    parser.add_argument("--timeout", type=float, default=900, help="seconds to wait for the "
                        "sink to hold every order")
    args = parser.parse_args(argv)

    run_dir = Path(args.dir or tempfile.mkdtemp(prefix="pg-spark-pipeline-")).absolute()
    run_dir.mkdir(parents=True, exist_ok=True)
    say(f"working in {run_dir}")
    (run_dir / "spark-conf").mkdir(exist_ok=True)
    (run_dir / "spark-conf" / "spark-defaults.conf").write_text(SPARK_DEFAULTS)
    rng = random.Random(7)
    create_orders_table(run_dir / "warehouse")
    regions = write_customers(run_dir / "customers.parquet")
    write_orders(run_dir / "warehouse", 0, 100, rng)
    total = 100
    env = {
        **os.environ,
        "PIPELINE_OUT": str(run_dir / "out"),
        "PIPELINE_CUSTOMERS": str(run_dir / "customers.parquet"),
        "SPARK_CONF_DIR": str(run_dir / "spark-conf"),
        "PYTHONUNBUFFERED": "1",
    }
    if (REPO / "paimon_group").is_dir():  # running from a checkout
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))

    server = None
    remote = args.spark_remote
    workers: list[subprocess.Popen[bytes]] = []
    try:
        if args.local_connect_server:
            say("starting a local Spark Connect server")
            server, remote = start_local_connect_server(run_dir, env)
            say(f"Spark Connect server at {remote}")
        say(f"starting {args.workers} workers (group {GROUP!r}); their logs: "
            f"{run_dir}/worker-*.log")
        workers = [start_worker(i, args, run_dir, env, remote) for i in range(args.workers)]
        from paimon_group.spark.sinks import ParquetBatchSink

        sink = ParquetBatchSink(run_dir / "out" / "enriched_orders")

        totals_sink = ParquetBatchSink(run_dir / "out" / "region_totals")

        def in_sink() -> int:
            """Distinct orders in the sink."""
            if not sink.batch_keys():
                return 0
            return len(set(sink.read_arrow().column("order_id").to_pylist()))

        def counted() -> int:
            """Orders counted in the totals."""
            if not totals_sink.batch_keys():
                return 0
            return sum(totals_sink.read_arrow().column("orders").to_pylist())

        say("waiting for the first batches (each worker starts a Spark session first)")
        deadline = time.monotonic() + args.timeout
        while in_sink() < 100:
            if time.monotonic() > deadline or any(w.poll() is not None for w in workers):
                say("workers did not deliver the first snapshot; see the worker logs")
                return 1
            time.sleep(1)
        for n in range(args.snapshots):
            write_orders(run_dir / "warehouse", total, args.orders_per_snapshot, rng)
            total += args.orders_per_snapshot
            say(f"wrote snapshot {n + 2}: {total} orders so far; {in_sink()} rows in the sink")
            if n == args.snapshots // 2 and not args.no_kill and len(workers) > 1:
                say("SIGKILL worker-0 mid-stream: the others take its shards over once its "
                    "session expires, and deliver its unfinished batch again")
                os.killpg(workers[0].pid, signal.SIGKILL)
            time.sleep(args.interval)
        # Wait for both outputs: a worker stopped between its two writes
        # leaves the batch uncommitted (its next owner writes both again).
        while (rows := in_sink()) < total or counted() < total:
            if time.monotonic() > deadline:
                say(f"timed out: {rows} of {total} orders in the sink")
                break
            time.sleep(1)
        say("stopping the workers (SIGTERM: graceful handoff)")
    finally:
        for w in workers:
            stop(w)
        if server is not None:
            stop(server)
    return 0 if check(run_dir, regions) else 1


if __name__ == "__main__":
    sys.exit(main())
