"""The Spark source example as a user runs it: a bad option is one line and
exit 2; Ctrl-C stops the query, its member leaves the group, exit 130.

Both run ``docs/examples/spark_source/pipeline.py`` itself, in its own
process with a real Spark (local master)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.requirements import require
from tests.support.tables import make_pk_table, write_rows

pytestmark = [pytest.mark.spark, pytest.mark.slow]

if not os.environ.get("CI"):
    require("pyspark", "pip install '.[spark]' (tests/run.sh does)")

REPO = Path(__file__).resolve().parents[1]
PIPELINE = REPO / "docs" / "examples" / "spark_source" / "pipeline.py"


def pipeline_args(tmp_path: Path, *, group: str, coordinator: str) -> list[str]:
    return [sys.executable, str(PIPELINE), "--warehouse", str(tmp_path / "wh"), "--table",
            "db.t", "--group", group, "--member", "q1", "--checkpoint",
            str(tmp_path / "ckpt"), "--out", str(tmp_path / "out"), "--master", "local[1]",
            "--coordinator", coordinator]


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}


def test_error_line_finds_our_line_in_a_spark_exception() -> None:
    from paimon_group.spark.source.errors import error_line

    wrapped = Exception(
        "[PYTHON_DATA_SOURCE_ERROR] Failed to create Python data source instance: Traceback "
        "(most recent call last):\n  File \"x.py\", line 1, in f\n    raise ConfigError(\n"
        "coordinators.errors.ConfigError: option include_row_kind='maybe' must be true or "
        "false\n SQLSTATE: 38000")
    assert error_line(wrapped) == "option include_row_kind='maybe' must be true or false"
    assert error_line(Exception("java.lang.OutOfMemoryError")) is None


def test_a_bad_option_is_one_line_and_exit_2(tmp_path: Path) -> None:
    make_pk_table(tmp_path / "wh", "db.t", buckets=2)
    coordinator = f"sqlite://{tmp_path}/c.sqlite"
    done = subprocess.run(pipeline_args(tmp_path, group="bad/name", coordinator=coordinator),
                          cwd=tmp_path, env=env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-3000:]
    ours = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert ours == ["error: invalid group name 'bad/name': use 1 to 128 characters from "
                    "A-Z a-z 0-9 . _ -"], done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "AnalysisException" not in done.stderr
    assert not (tmp_path / "c.sqlite").exists()


def test_ctrl_c_stops_the_query_and_its_member_leaves(tmp_path: Path) -> None:
    make_pk_table(tmp_path / "wh", "db.t", buckets=2)
    write_rows(tmp_path / "wh", "db.t", range(20))
    coordinator = f"sqlite://{tmp_path}/c.sqlite"
    log = open(tmp_path / "q1.log", "w+")
    proc = subprocess.Popen(pipeline_args(tmp_path, group="g", coordinator=coordinator),
                            cwd=tmp_path, env=env(), stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        # Batch 0 committed (in the query's checkpoint): the rows are out.
        while not (tmp_path / "ckpt" / "commits" / "0").exists():
            assert proc.poll() is None, (tmp_path / "q1.log").read_text()[-3000:]
            assert time.monotonic() < deadline, (tmp_path / "q1.log").read_text()[-3000:]
            time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the whole foreground process group
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    output = (tmp_path / "q1.log").read_text()
    assert code == 130, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    members = members_of(coordinator, "g")
    assert members == {}, members


def members_of(coordinator: str, group: str) -> dict[str, object]:
    import asyncio

    from coordinators.registry import open_coordinator
    from paimon_group.protocol.group import GroupClient

    async def read() -> dict[str, object]:
        async with open_coordinator(coordinator) as coord:
            return dict(await GroupClient(coord, group).members())

    return asyncio.run(read())
