"""End to end: real ``paimon-group run --spark-handler`` workers, a SIGKILL mid-stream,
and a batch-keyed sink that ends with every source row exactly once.

Two worker processes (each with its own local Spark JVM) share a 4-bucket
table; a writer process commits snapshots while they run. The handler of
this module writes each batch to a :class:`ParquetBatchSink` and then, on
worker ``w0`` only and for non-initial batches, pauses: the test SIGKILLs
``w0`` in that pause, i.e. after its sink publication and before its commit,
the window where at-least-once delivery repeats a batch. ``w1`` takes the
shards over, replays from the committed positions and must replace, not
duplicate, what ``w0`` wrote.

The workers import :func:`handle` from this module (``--spark-handler
tests.test_spark_e2e:handle``, run from the repository root); it is
configured through ``PG_E2E_*`` environment variables.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from paimon_group.spark.sinks import ParquetBatchSink
from tests.support.requirements import require
from tests.support.waiting import wait_for

REPO = Path(__file__).resolve().parents[1]

_sink: ParquetBatchSink | None = None


def handle(df: Any, batch: Any) -> None:
    """The workers' Spark handler (see the module docstring)."""
    global _sink
    if _sink is None:
        _sink = ParquetBatchSink(os.environ["PG_E2E_SINK"])
    publication = _sink.write(df.select("id", "v", "payload"), batch)
    marker = {
        "member": batch.member_id, "shard": batch.shard, "snapshot": batch.first_snapshot,
        "epoch": batch.epoch, "kind": batch.kind.value, "replaced": publication.replaced,
    }
    markers = Path(os.environ["PG_E2E_MARKERS"])
    name = f"{batch.member_id}-{batch.shard}-{batch.first_snapshot}-{batch.epoch}.json"
    (markers / f".{name}").write_text(json.dumps(marker))
    os.replace(markers / f".{name}", markers / name)
    if batch.member_id == os.environ.get("PG_E2E_PAUSE_MEMBER") and batch.kind.value != "initial":
        time.sleep(600)  # killed here: published, not committed


# ---------------------------------------------------------------------------

pytestmark = [pytest.mark.spark, pytest.mark.slow]

if not os.environ.get("CI"):
    require("pyspark", "pip install '.[spark]' (tests/run.sh does)")

SPARK_DEFAULTS = """\
spark.ui.enabled false
spark.ui.showConsoleProgress false
spark.sql.shuffle.partitions 2
spark.default.parallelism 1
spark.driver.memory 512m
"""


@pytest.fixture
def processes() -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    """Processes started by the test; each leads its own process group (its JVM
    included), which is killed at teardown if still there."""
    procs: dict[str, subprocess.Popen[bytes]] = {}
    yield procs
    for proc in procs.values():
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)


def test_sigkill_mid_stream_ends_with_every_row_once_in_the_sink(
    tmp_path: Path, processes: dict[str, subprocess.Popen[bytes]]
) -> None:
    from tests.support.tables import make_pk_table, write_rows

    warehouse, sink_dir, markers = tmp_path / "wh", tmp_path / "sink", tmp_path / "markers"
    markers.mkdir()
    conf_dir = tmp_path / "spark-conf"
    conf_dir.mkdir()
    (conf_dir / "spark-defaults.conf").write_text(SPARK_DEFAULTS)
    make_pk_table(warehouse, "db.t", buckets=4)
    write_rows(warehouse, "db.t", range(100))  # read by the initial scan
    env = {
        **os.environ,
        "PG_E2E_SINK": str(sink_dir),
        "PG_E2E_MARKERS": str(markers),
        "PG_E2E_PAUSE_MEMBER": "w0",
        "SPARK_CONF_DIR": str(conf_dir),
        "PYTHONUNBUFFERED": "1",
    }
    sink = ParquetBatchSink(sink_dir)
    logs: list[Any] = []

    def start_worker(member: str) -> subprocess.Popen[bytes]:
        log = open(tmp_path / f"{member}.log", "wb")
        logs.append(log)
        return subprocess.Popen(
            [sys.executable, "-m", "paimon_group", "run", "--group", "e2e",
             "--warehouse", str(warehouse), "--table", "db.t", "--member-id", member,
             "--spark-handler", "tests.test_spark_e2e:handle", "--spark-master", "local[1]",
             "--session-timeout-s", "4", "--poll-interval-ms", "200",
             "--history", str(tmp_path / f"{member}.history.jsonl")],
            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )

    def sink_ids() -> list[int]:
        if not sink.batch_keys():
            return []
        return sorted(sink.read_arrow().column("id").to_pylist())

    def marker_list() -> list[dict[str, Any]]:
        return [json.loads(p.read_text()) for p in sorted(markers.glob("w*.json"))]

    processes["w0"] = start_worker("w0")
    processes["w1"] = start_worker("w1")
    def owns_shards(member: str) -> bool:
        history = tmp_path / f"{member}.history.jsonl"
        return history.exists() and '"event": "acquire"' in history.read_text()

    # The initial rows are in the sink (published by w0, w1 or both, depending
    # on when w1 joined) and both workers own shards.
    wait_for("the initial rows in the sink and both workers owning shards", lambda:
             sink_ids() == list(range(100)) and owns_shards("w0") and owns_shards("w1"),
             timeout=420, alive=processes)

    processes["writer"] = subprocess.Popen(
        [sys.executable, "-m", "tests.support.tables", "write", "--warehouse", str(warehouse),
         "--table", "db.t", "--start", "100", "--count", "200", "--per-snapshot", "10",
         "--interval-ms", "300"],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, start_new_session=True,
    )
    workers = {"w0": processes["w0"], "w1": processes["w1"]}
    killed = wait_for("w0 to publish a delta batch", lambda: [
        m for m in marker_list() if m["member"] == "w0" and m["kind"] != "initial"],
        timeout=300, alive=workers)[0]
    os.kill(processes["w0"].pid, signal.SIGKILL)  # in its pause: published, not committed
    assert processes["w0"].wait(timeout=60) == -signal.SIGKILL

    assert processes["writer"].wait(timeout=600) == 0
    wait_for("the sink to hold all 300 ids", lambda: len(set(sink_ids())) == 300,
             timeout=420, alive={"w1": processes["w1"]})

    # w1 replayed w0's unfinished batch under a higher epoch, replacing it.
    replays = [p for p in sink.publications()
               if (p["shard"], p["snapshot"]) == (killed["shard"], killed["snapshot"])
               and p["epoch"] > killed["epoch"]]
    assert replays and replays[0]["replaced"], (killed, sink.publications())

    processes["w1"].send_signal(signal.SIGTERM)
    assert processes["w1"].wait(timeout=120) == 0

    table = sink.read_arrow()
    ids = sorted(table.column("id").to_pylist())
    assert ids == list(range(300)), "every source row exactly once"
    assert sorted(zip(table.column("id").to_pylist(), table.column("v").to_pylist(),
                      strict=True)) == [(i, 0) for i in range(300)]
    for log in logs:
        log.close()
