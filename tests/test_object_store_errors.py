"""An object-store warehouse that cannot be used fails fast, in one line, without a key.

Real ``python -m paimon_group`` processes against three stores that cannot
serve the group: a closed loopback port, a socket that accepts connections
but never answers, and a real S3-compatible server that checks signatures and
refuses the key. Each must exit non-zero within the request timeout
(``paimon-group.s3.timeout-s``, default 10 s; pypaimon's own bounds hung for
a minute or more), print one line naming the endpoint, create nothing, and
show neither the access key nor the secret.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from paimon_group import GroupMember, MemberConfig
from paimon_group.store.object_store import DEFAULT_TIMEOUT_S, TIMEOUT_OPTION
from tests.support.s3_server import (
    ACCESS_KEY,
    REGION,
    SECRET_KEY,
    S3Server,
    S3Warehouse,
    free_port,
)
from tests.support.tables import make_pk_table, register_catalog_options, write_rows

REPO = Path(__file__).resolve().parents[1]
SLACK_S = 20.0  # bounding is the point, not a tight timing (a loaded CI machine)
WRONG_SECRET = "pg-wrong-SECRET-77c1"


def endpoint_options(endpoint: str, *, access_key: str = ACCESS_KEY,
                     secret_key: str = SECRET_KEY) -> dict[str, str]:
    return {"s3.endpoint": endpoint, "s3.access-key": access_key, "s3.secret-key": secret_key,
            "s3.region": REGION, "s3.path-style-access": "true"}


def cli(args: list[str], options: dict[str, str], bound_s: float
        ) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run ``python -m paimon_group ARGS`` with the catalog options in the environment
    (as a deployment gives them); the elapsed seconds."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO),
           "PAIMON_GROUP_CATALOG_OPTION": " ".join(f"{k}={v}" for k, v in options.items())}
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "paimon_group", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=bound_s + SLACK_S)
    return proc, time.monotonic() - started


def assert_one_safe_line(proc: subprocess.CompletedProcess[str], endpoint: str,
                         *secrets: str) -> str:
    out = proc.stdout + proc.stderr
    for secret in secrets:
        assert secret not in out, out
    assert proc.returncode != 0, out
    lines = out.strip().splitlines()
    assert len(lines) == 1, out
    assert lines[0].startswith("error: ") and endpoint in lines[0], out
    return lines[0]


# -- stores that do not answer -----------------------------------------------------


@pytest.fixture
def closed_endpoint() -> str:
    """A loopback port nobody listens on: every connection is refused at once."""
    return f"http://127.0.0.1:{free_port()}"


@pytest.fixture
def silent_endpoint() -> Iterator[str]:
    """A server that accepts every connection and never sends a byte."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(5)
        for conn in held:
            conn.close()
        server.close()


@pytest.fixture(params=["closed", "silent"])
def dead_endpoint(request: pytest.FixtureRequest) -> str:
    name = "closed_endpoint" if request.param == "closed" else "silent_endpoint"
    endpoint: str = request.getfixturevalue(name)
    return endpoint


def run_args(tmp_path: Path, warehouse: str) -> list[str]:
    return ["run", "--group", "g", "--warehouse", warehouse, "--table", "db.t",
            "--handler", "builtins:print", "--coordinator", f"sqlite://{tmp_path}/c.sqlite"]


def test_run_with_a_dead_endpoint_fails_fast_in_one_line(tmp_path: Path,
                                                         dead_endpoint: str) -> None:
    proc, elapsed = cli(run_args(tmp_path, "s3://pg-nowhere/wh"),
                        endpoint_options(dead_endpoint), DEFAULT_TIMEOUT_S)
    line = assert_one_safe_line(proc, dead_endpoint, SECRET_KEY, ACCESS_KEY)
    assert elapsed < DEFAULT_TIMEOUT_S + SLACK_S, elapsed
    assert f"within {DEFAULT_TIMEOUT_S:g} s" in line and TIMEOUT_OPTION in line, line
    assert list(tmp_path.iterdir()) == []  # nothing joined, no coordinator file


def test_the_timeout_option_from_a_config_file_bounds_a_silent_store(
        tmp_path: Path, silent_endpoint: str) -> None:
    config = tmp_path / "member.toml"
    options = endpoint_options(silent_endpoint)
    config.write_text("[catalog-option]\n" + "".join(
        f'"{k}" = "{v}"\n' for k, v in {**options, TIMEOUT_OPTION: "3"}.items()))
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    command, *args = run_args(scratch, "s3://pg-nowhere/wh")
    proc, elapsed = cli([command, "--config", str(config), *args], {}, 3.0)
    line = assert_one_safe_line(proc, silent_endpoint, SECRET_KEY, ACCESS_KEY)
    assert "within 3 s" in line, line
    assert elapsed < 3.0 + SLACK_S, elapsed
    assert list(scratch.iterdir()) == []


def test_a_bad_timeout_option_is_one_line(tmp_path: Path, closed_endpoint: str) -> None:
    options = {**endpoint_options(closed_endpoint), TIMEOUT_OPTION: "soon"}
    proc, _ = cli(run_args(tmp_path, "s3://pg-nowhere/wh"), options, DEFAULT_TIMEOUT_S)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"error: catalog option {TIMEOUT_OPTION}='soon': expected a positive number of "
        f"seconds (default {DEFAULT_TIMEOUT_S:g})"]


# -- describe of a group that exists, with the endpoint wrong --------------------------


@pytest.fixture(scope="module")
def s3_group(s3_server: S3Server, tmp_path_factory: pytest.TempPathFactory
             ) -> tuple[str, str]:
    """(warehouse URI, coordinator URL): group ``g`` on ``db.t`` in a bucket of the
    real server, made by a real member that joined and left."""
    bucket = f"pg-{uuid.uuid4().hex[:12]}"
    s3_server.create_bucket(bucket)
    warehouse = f"s3://{bucket}/wh"
    options = endpoint_options(s3_server.endpoint)
    register_catalog_options(warehouse, options)
    make_pk_table(warehouse, "db.t", buckets=2)
    write_rows(warehouse, "db.t", range(10))
    coordinator = f"sqlite://{tmp_path_factory.mktemp('s3-group')}/c.sqlite"

    async def join_and_leave() -> None:
        member = GroupMember(MemberConfig(group="g", warehouse=warehouse, table="db.t",
                                          coordinator=coordinator, member_id="m1",
                                          session_timeout_s=5, catalog_options=options))
        await member.start()
        for _ in range(200):
            if member.owned_shards:
                break
            await asyncio.sleep(0.05)
        await member.stop()

    asyncio.run(join_and_leave())
    return warehouse, coordinator


def test_describe_with_a_dead_endpoint_fails_fast_in_one_line(
        s3_group: tuple[str, str], s3_server: S3Server, dead_endpoint: str) -> None:
    warehouse, coordinator = s3_group
    args = ["describe", "--group", "g", "--warehouse", warehouse, "--coordinator", coordinator]
    proc, _ = cli([*args, "--json"], endpoint_options(s3_server.endpoint), DEFAULT_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr  # the right endpoint describes the group
    assert json.loads(proc.stdout)["exists"] is True
    assert SECRET_KEY not in proc.stdout + proc.stderr
    proc, elapsed = cli(args, endpoint_options(dead_endpoint), DEFAULT_TIMEOUT_S)
    assert_one_safe_line(proc, dead_endpoint, SECRET_KEY, ACCESS_KEY)
    assert elapsed < DEFAULT_TIMEOUT_S + SLACK_S, elapsed


# -- a real server that refuses the key ----------------------------------------------


@pytest.fixture(scope="module")
def signing_server(tmp_path_factory: pytest.TempPathFactory,
                   s3_server: S3Server) -> Iterator[tuple[S3Server, str, str]]:
    """(server, bucket, access key id): a second server that checks every request's
    signature against a user of its own (moto with authentication after the first
    four calls: the user, its key, its policy, the bucket)."""
    import boto3

    server = S3Server(free_port(), tmp_path_factory.mktemp("s3-auth") / "server.log",
                      env={"INITIAL_NO_AUTH_ACTION_COUNT": "4"})
    server.start()
    try:
        iam = boto3.client("iam", endpoint_url=server.endpoint, region_name=REGION,
                           aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY)
        iam.create_user(UserName="member")
        key = iam.create_access_key(UserName="member")["AccessKey"]
        iam.put_user_policy(UserName="member", PolicyName="all", PolicyDocument=json.dumps(
            {"Version": "2012-10-17",
             "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
        bucket = f"pg-{uuid.uuid4().hex[:12]}"
        boto3.client("s3", endpoint_url=server.endpoint, region_name=REGION,
                     aws_access_key_id=key["AccessKeyId"],
                     aws_secret_access_key=key["SecretAccessKey"]).create_bucket(Bucket=bucket)
        yield server, bucket, str(key["AccessKeyId"])
    finally:
        server.stop()


@pytest.mark.parametrize("command", ["run", "describe"])
def test_a_refused_key_is_one_line_without_the_secret(
        tmp_path: Path, signing_server: tuple[S3Server, str, str], command: str) -> None:
    server, bucket, access_key = signing_server
    options = endpoint_options(server.endpoint, access_key=access_key, secret_key=WRONG_SECRET)
    warehouse = f"s3://{bucket}/wh"
    if command == "run":
        args = run_args(tmp_path, warehouse)
    else:
        coordinator = tmp_path / "c.sqlite"
        asyncio.run(_empty_coordinator(f"sqlite://{coordinator}"))
        args = ["describe", "--group", "g", "--table", "db.t", "--warehouse", warehouse,
                "--coordinator", f"sqlite://{coordinator}"]
    proc, elapsed = cli(args, options, DEFAULT_TIMEOUT_S)
    line = assert_one_safe_line(proc, server.endpoint, WRONG_SECRET, access_key)
    assert "ACCESS_DENIED" in line and "keys" in line, line
    assert elapsed < DEFAULT_TIMEOUT_S + SLACK_S, elapsed
    if command == "run":
        assert list(tmp_path.iterdir()) == []


async def _empty_coordinator(url: str) -> None:
    from coordinators.protocol import ConnectOptions
    from coordinators.registry import open_coordinator

    async with open_coordinator(url, ConnectOptions()):
        pass


# -- every access is bounded, not only the first ------------------------------------


class SwitchableProxy:
    """A TCP proxy to the real server that can go silent: from then on it accepts
    connections and reads requests, old and new, and answers none of them."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.silent = threading.Event()
        self.closed = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.sockets: list[socket.socket] = [self.listener]
        self.endpoint = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                client = self.listener.accept()[0]
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            except OSError:
                return
            self.sockets += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                if not self.silent.is_set():
                    sink.sendall(data)
        except OSError:
            pass

    def close(self) -> None:
        self.closed.set()
        for sock in self.sockets:
            sock.close()


def test_every_file_access_is_bounded_not_only_the_first(s3_warehouse: S3Warehouse) -> None:
    """A store that stops answering after the table is open: a later access (what a
    member does each poll) gives up within the timeout, not after pypaimon's minutes."""
    from paimon_group.reading.table import ShardedTable

    make_pk_table(s3_warehouse.uri, "db.t", buckets=2)
    write_rows(s3_warehouse.uri, "db.t", range(10))
    proxy = SwitchableProxy(s3_warehouse.server.port)
    try:
        options = {**s3_warehouse.options, "s3.endpoint": proxy.endpoint, TIMEOUT_OPTION: "3"}
        table = ShardedTable.open(s3_warehouse.uri, "db.t", options)
        assert table.latest_snapshot_id() == 1
        proxy.silent.set()
        outcome: list[object] = []

        def access() -> None:
            try:
                outcome.append(table.table.file_io.read_file_utf8(
                    f"{table.table_path}/snapshot/snapshot-1"))
            except BaseException as err:  # the outcome is checked below
                outcome.append(err)

        started = time.monotonic()
        worker = threading.Thread(target=access, daemon=True)
        worker.start()
        worker.join(3.0 + SLACK_S)
        elapsed = time.monotonic() - started
        assert outcome, f"a file access still waited after {elapsed:.0f} s"
    finally:
        proxy.close()
    assert isinstance(outcome[0], OSError) and "Timeout" in str(outcome[0]), outcome
    assert SECRET_KEY not in str(outcome[0])


def test_an_endpoint_with_credentials_is_refused_without_echoing_them(tmp_path: Path) -> None:
    options = {**endpoint_options(f"http://{ACCESS_KEY}:{SECRET_KEY}@127.0.0.1:9")}
    proc, _ = cli(run_args(tmp_path, "s3://pg-nowhere/wh"), options, DEFAULT_TIMEOUT_S)
    assert proc.returncode == 2, proc.stderr
    out = proc.stdout + proc.stderr
    assert SECRET_KEY not in out and ACCESS_KEY not in out, out
    assert out.strip().splitlines() == [
        "error: catalog option s3.endpoint=http://***@... carries credentials: give them as "
        "s3.access-key and s3.secret-key (and s3.session-token) in a --config file or "
        "PAIMON_GROUP_CATALOG_OPTION"]


def test_a_store_that_stops_answering_mid_run_ends_the_member_in_one_line(
        s3_warehouse: S3Warehouse, tmp_path: Path) -> None:
    """A running member whose store goes silent ends with one line naming the
    store (the error of the first request that timed out), not pyarrow's error
    under a traceback; no key in its output."""
    from tests.benchmarks.bench_s3 import _delivered as delivered
    make_pk_table(s3_warehouse.uri, "db.t", buckets=2)
    write_rows(s3_warehouse.uri, "db.t", range(10))
    proxy = SwitchableProxy(s3_warehouse.server.port)
    out = tmp_path / "out"
    out.mkdir()
    options = {**s3_warehouse.options, "s3.endpoint": proxy.endpoint, TIMEOUT_OPTION: "2"}
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "PG_BENCH_OUT": str(out),
           "PAIMON_GROUP_CATALOG_OPTION": " ".join(f"{k}={v}" for k, v in options.items())}
    args = ["run", "--group", "g", "--warehouse", s3_warehouse.uri, "--table", "db.t",
            "--handler", "tests.benchmarks.bench_s3:count_rows", "--poll-interval-ms", "100",
            "--coordinator", f"sqlite://{tmp_path}/c.sqlite"]
    proc = subprocess.Popen([sys.executable, "-m", "paimon_group", *args], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # Every row delivered first: a handler reading data files when the
        # store goes silent fails as a handler (its own line, exit 3).
        deadline = time.monotonic() + 60
        while delivered(out)[0] < 10:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        time.sleep(1.0)  # the step's commit, after the handler
        proxy.silent.set()
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
        proxy.close()
    output = stdout + stderr
    assert proc.returncode == 1, output
    assert SECRET_KEY not in output and ACCESS_KEY not in output, output
    assert "Traceback" not in output, output
    errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and proxy.endpoint in errors[0], output


def test_an_oss_warehouse_is_bounded_as_an_s3_one() -> None:
    """OSS through pyarrow's S3 client (pypaimon's default without pyjindosdk):
    its file system is built again with the same bounds as an S3 warehouse's
    (pypaimon's own: 10 attempts of 60 s), on the same endpoint and addressing.
    No OSS server runs here (its virtual-host addressing needs DNS): what is
    checked is the file system the requests would go through."""
    from pypaimon.common.options import Options
    from pypaimon.filesystem.pyarrow_file_io import PyArrowFileIO

    from paimon_group.store.object_store import ATTEMPTS, bound_requests

    options = {"fs.oss.endpoint": "oss-cn-hangzhou.aliyuncs.com", "fs.oss.accessKeyId": "AK",
               "fs.oss.accessKeySecret": "SK", "fs.oss.region": "cn-hangzhou",
               TIMEOUT_OPTION: "6"}
    file_io = PyArrowFileIO("oss://pg-bucket/wh", Options(options))
    assert file_io.filesystem.__reduce__()[1][0]["request_timeout"] == 60  # pypaimon's
    bound_requests(file_io, "oss://pg-bucket/wh", options)
    built = file_io.filesystem.__reduce__()[1][0]
    assert built["request_timeout"] == built["connect_timeout"] == 6 / ATTEMPTS
    assert built["endpoint_override"] == "oss-cn-hangzhou.aliyuncs.com"
    assert built["force_virtual_addressing"] is True
