"""The coordinator of an object-store warehouse is never an implicit per-host file.

Real ``python -m paimon_group`` processes on a real S3-compatible server
(``tests/support/s3_server.py``):

* without ``--coordinator`` every command on an ``s3://`` warehouse refuses in
  one line naming the choices, and creates nothing (no coordinator file, no
  object in the bucket);
* ``--coordinator local`` on two warehouses of one host keeps them apart: a
  file per warehouse URI; the same group name on both delivers each its own
  rows, and ``delete`` on one leaves the other's group, positions and consumer
  files alone;
* one coordinator shared by two warehouses holds a group name for one of them:
  a member of the other stops with an error naming both warehouses, and
  ``delete``/``reset`` from the other warehouse change nothing.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.support.group_procs import REPO, GroupHarness
from tests.support.s3_server import S3Server, S3Warehouse, catalog_options
from tests.support.tables import make_pk_table, register_catalog_options, write_rows

pytestmark = pytest.mark.slow


def other_warehouse(server: S3Server) -> S3Warehouse:
    """A second bucket of the same server, with a warehouse of the same path."""
    bucket = f"pg-{uuid.uuid4().hex[:12]}"
    server.create_bucket(bucket)
    warehouse = S3Warehouse(server, bucket, f"s3://{bucket}/wh",
                            catalog_options(server.endpoint))
    register_catalog_options(warehouse.uri, warehouse.options)
    return warehouse


def bucket_keys(s3: S3Warehouse) -> set[str]:
    import boto3

    from tests.support.s3_server import ACCESS_KEY, REGION, SECRET_KEY

    client = boto3.client("s3", endpoint_url=s3.server.endpoint, aws_access_key_id=ACCESS_KEY,
                          aws_secret_access_key=SECRET_KEY, region_name=REGION)
    keys: set[str] = set()
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=s3.bucket):
        keys |= {obj["Key"] for obj in page.get("Contents", [])}
    return keys


def consumer_keys(s3: S3Warehouse, group: str = "g") -> set[str]:
    return {k for k in bucket_keys(s3) if f"/consumer/consumer-pg-{group}-shard-" in k}


def cli(s3: S3Warehouse, *args: str, state: Path) -> subprocess.CompletedProcess[str]:
    """``python -m paimon_group ARGS`` with the warehouse's catalog options in
    the environment and ``XDG_STATE_HOME`` at ``state``."""
    import os

    env = {**os.environ, **s3.env(), "XDG_STATE_HOME": str(state)}
    return subprocess.run([sys.executable, "-m", "paimon_group", *args], cwd=REPO,
                          capture_output=True, text=True, env=env, timeout=120)


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), result.stderr
    return lines[0]


def test_remote_warehouse_without_coordinator_is_refused_creating_nothing(
        tmp_path: Path, s3_warehouse: S3Warehouse) -> None:
    make_pk_table(s3_warehouse.uri, "db.t", buckets=4)
    write_rows(s3_warehouse.uri, "db.t", range(20))
    state = tmp_path / "state"
    before = bucket_keys(s3_warehouse)
    common = ["--group", "g", "--warehouse", s3_warehouse.uri]
    commands = {
        "run": ["run", *common, "--table", "db.t", "--handler", "tests.support.handlers:record"],
        "describe": ["describe", *common],
        "list": ["list", "--warehouse", s3_warehouse.uri],
        "reset": ["reset", *common, "--to-latest", "--execute"],
        "delete": ["delete", *common],
        "members": ["members", "remove", *common, "m1"],
    }
    for name, args in commands.items():
        result = cli(s3_warehouse, *args, state=state)
        assert result.returncode == 2, (name, result.stderr)
        line = one_error_line(result)
        assert s3_warehouse.uri in line, line
        assert "--coordinator etcd://HOST:PORT" in line and "--coordinator local" in line, line
        assert not state.exists(), (name, list(state.rglob("*")))
    assert bucket_keys(s3_warehouse) == before
    assert consumer_keys(s3_warehouse) == set()


def _positions(h: GroupHarness) -> dict[int, Any]:
    return {s["shard"]: s["next_snapshot"] for s in h.describe()["shards"]}


def _explain(*harnesses: GroupHarness) -> str:
    return "\n".join(f"--- {m}\n{h.log(m)[-3000:]}" for h in harnesses for m in h.procs)


def test_local_coordinators_of_two_warehouses_stay_apart(
        tmp_path: Path, s3_warehouse: S3Warehouse, monkeypatch: pytest.MonkeyPatch) -> None:
    state = tmp_path / "state"
    monkeypatch.setenv("XDG_STATE_HOME", str(state))
    wa, wb = s3_warehouse, other_warehouse(s3_warehouse.server)
    ha = GroupHarness(tmp_path / "a", "local", buckets=4, warehouse=wa.uri,
                      catalog_options=wa.options, poll_interval_ms=200)
    hb = GroupHarness(tmp_path / "b", "local", buckets=4, warehouse=wb.uri,
                      catalog_options=wb.options, poll_interval_ms=200)
    try:
        ha.write(range(0, 40))
        hb.write(range(1000, 1040))
        ha.start("a1")
        hb.start("b1")
        for i in range(1, 3):
            ha.write(range(i * 40, (i + 1) * 40))
            hb.write(range(1000 + i * 40, 1000 + (i + 1) * 40))
            time.sleep(0.2)
        ha.wait_caught_up({"a1"})
        hb.wait_caught_up({"b1"})
        assert ha.terminate_all() == {"a1": 0}, _explain(ha, hb)
        assert hb.terminate_all() == {"b1": 0}, _explain(ha, hb)
    finally:
        ha.cleanup()
        hb.cleanup()
    files = sorted(state.rglob("coordinator.sqlite"))
    assert len(files) == 2, files
    assert {f.parent.name.split("-")[1] + "-" + f.parent.name.split("-")[2]
            for f in files} == {wa.bucket, wb.bucket}
    for h in (ha, hb):
        counts = h.history().delivered_counts()
        assert set(counts) == h.written, _explain(ha, hb)
        assert set(counts.values()) == {1}
    b_positions = _positions(hb)
    b_files = consumer_keys(wb)
    assert consumer_keys(wa) and b_files

    result = cli(wa, "delete", "--group", "g", "--warehouse", wa.uri, "--coordinator", "local",
                 state=state)
    assert result.returncode == 0, result.stderr
    assert "deleted group g" in result.stdout
    assert consumer_keys(wa) == set()
    assert not ha.describe()["exists"]
    assert hb.describe()["exists"]
    assert _positions(hb) == b_positions
    assert consumer_keys(wb) == b_files


def test_one_coordinator_shared_by_two_warehouses_refuses_the_other(
        tmp_path: Path, s3_warehouse: S3Warehouse) -> None:
    state = tmp_path / "state"
    shared = f"sqlite://{tmp_path}/shared.sqlite"
    wa, wb = s3_warehouse, other_warehouse(s3_warehouse.server)
    ha = GroupHarness(tmp_path / "a", shared, buckets=4, warehouse=wa.uri,
                      catalog_options=wa.options, poll_interval_ms=200)
    hb = GroupHarness(tmp_path / "b", shared, buckets=4, warehouse=wb.uri,
                      catalog_options=wb.options, poll_interval_ms=200)
    try:
        ha.write(range(0, 40))
        hb.write(range(1000, 1040))
        ha.start("a1")
        ha.wait_caught_up({"a1"})
        assert ha.terminate_all() == {"a1": 0}, _explain(ha)
        positions, a_files = _positions(ha), consumer_keys(wa)
        hb.start("b1")
        code = hb.procs["b1"].wait(timeout=60)
    finally:
        ha.cleanup()
        hb.cleanup()
    log = hb.log("b1")
    assert code == 2, log
    errors = [line for line in log.splitlines() if wa.uri in line and wb.uri in line]
    assert errors, log
    assert "re-created" not in log and "session lost" not in log, log
    assert consumer_keys(wb) == set()
    for args in (["delete"], ["reset", "--to-earliest", "--execute"], ["describe"]):
        result = cli(wb, *args, "--group", "g", "--warehouse", wb.uri, "--coordinator", shared,
                     state=state)
        assert result.returncode == 2, (args, result.stderr)
        line = one_error_line(result)
        assert wa.uri in line and wb.uri in line, line
    assert ha.describe()["exists"]
    assert _positions(ha) == positions
    assert consumer_keys(wa) == a_files
