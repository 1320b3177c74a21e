"""The suite's one Spark session per test process (an xdist worker): a JVM
costs seconds and hundreds of MiB to start, so every Spark test of a worker
shares it. Tests stop their own queries and leave the session as they found it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]

TEST_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "1",
    "spark.driver.memory": "512m",
}


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """A local Spark session (``local[2]``) with the paimon-group source
    registered. Its Python processes (driver side and executors) run this
    interpreter and import paimon_group from this checkout."""
    from paimon_group.spark.handler import PaimonGroupDataSource, build_spark_session

    os.environ["PYSPARK_PYTHON"] = sys.executable
    path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = f"{REPO}{os.pathsep}{path}" if path else str(REPO)
    session = build_spark_session(master="local[2]", app_name="paimon-group-tests",
                                  conf=TEST_CONF)
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(PaimonGroupDataSource)
    yield session
    session.stop()
