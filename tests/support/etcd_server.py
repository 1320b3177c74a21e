"""Real etcd servers for the test suite, on free loopback ports.

Fixtures (loaded as a pytest plugin from ``tests/conftest.py``):

``etcd_server``
    One plaintext etcd for the whole session. Never restart or pause it: other
    tests share it.
``etcd_url``
    ``etcd://127.0.0.1:PORT/t-<unique>``: the shared server with a key prefix
    of its own, so that every test starts from an empty keyspace.
``etcd_server_factory``
    ``factory(**kwargs) -> EtcdServer``: a server of the test's own, stopped
    at the end of the test. For tests that kill, restart or pause etcd, and
    for secured servers (``tls=True``, ``client_cert_auth=True``,
    ``auth=True``, ``auth_token_ttl=2``).
``etcd_cluster_factory``
    ``factory(size=3) -> EtcdCluster``: a real multi-member cluster of the
    test's own, for failover between endpoints of one cluster.
``etcd_pki``
    A :class:`Pki` made at test time with the ``openssl`` CLI: a CA, a server
    certificate for 127.0.0.1 / localhost / ``etcd.test``, a client
    certificate, and a second, unrelated CA.

Without an ``etcd`` binary the etcd tests are skipped, except in CI
(``CI=true``) where they fail with one line: a CI run must never pass by
skipping its integration tests.

Example::

    def test_put(etcd_server_factory):
        server = etcd_server_factory()
        server.kill()      # SIGKILL
        server.start()     # same ports, same data dir
"""

from __future__ import annotations

import os
import shutil
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.server_process import ServerProcess

ROOT_PASSWORD = "root-Pa55word"
START_TIMEOUT_S = 60.0


def etcd_binary() -> str | None:
    return os.environ.get("ETCD_BIN") or shutil.which("etcd")


def _missing(message: str) -> None:
    """Fail in CI (a CI run must not pass by skipping), skip elsewhere."""
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def require_etcd() -> str:
    """The etcd binary; when there is none, fails the test in CI, else skips it."""
    binary = etcd_binary()
    if binary is None:
        _missing("etcd binary not found: install the Debian package etcd-server (tests/run.sh)")
        raise AssertionError("unreachable")
    return binary


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass(frozen=True)
class Pki:
    """Certificates made at test time (PEM files)."""

    dir: Path
    ca: Path
    ca_key: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path  # an unrelated CA: trusting it must fail the handshake


def _openssl(*args: str | Path) -> None:
    subprocess.run(
        ["openssl", *map(str, args)], check=True, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def make_pki(directory: Path) -> Pki:
    """A CA, a server and a client certificate signed by it, and another CA."""
    if shutil.which("openssl") is None:
        _missing("openssl not found: install the Debian package openssl (tests/run.sh)")
    directory.mkdir(parents=True, exist_ok=True)
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")

    def make_ca(name: str) -> tuple[Path, Path]:
        crt, key = directory / f"{name}.crt", directory / f"{name}.key"
        _openssl(
            "req", "-x509", *ec, "-keyout", key, "-out", crt, "-days", "3",
            "-subj", f"/CN={name}",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        )
        return crt, key

    def make_leaf(name: str, ca: Path, ca_key: Path, ext: str) -> tuple[Path, Path]:
        crt, key, csr = (directory / f"{name}.{s}" for s in ("crt", "key", "csr"))
        extfile = directory / f"{name}.ext"
        extfile.write_text(ext)
        _openssl("req", *ec, "-keyout", key, "-out", csr, "-subj", f"/CN={name}")
        _openssl(
            "x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial",
            "-out", crt, "-days", "3", "-extfile", extfile,
        )
        return crt, key

    ca, ca_key = make_ca("test-ca")
    other_ca, _ = make_ca("other-ca")
    server_cert, server_key = make_leaf(
        "etcd-server", ca, ca_key,
        "basicConstraints=CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth,clientAuth\n"
        "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:etcd.test\n",
    )
    client_cert, client_key = make_leaf(
        "paimon-client", ca, ca_key,
        "basicConstraints=CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=clientAuth\n",
    )
    return Pki(directory, ca, ca_key, server_cert, server_key, client_cert, client_key, other_ca)


class EtcdServer(ServerProcess):
    """One single-node etcd process on fixed loopback ports and a data dir.

    ``kill``/``start`` keep the ports and the data dir, so clients reconnect
    to the same URL and find their data (and their leases) again.
    """

    server_name = "etcd"

    def __init__(
        self,
        binary: str,
        data_root: Path,
        *,
        pki: Pki | None = None,
        tls: bool = False,
        client_cert_auth: bool = False,
        auth: bool = False,
        auth_token_ttl: int | None = None,
        users: dict[str, str] | None = None,
        extra_args: tuple[str, ...] = (),
        name: str = "n0",
        peer_port: int | None = None,
        initial_cluster: str | None = None,
    ) -> None:
        if (tls or client_cert_auth) and pki is None:
            raise ValueError("a TLS etcd needs a Pki")
        self.binary = binary
        self.data_root = data_root
        self.data_dir = data_root / "data"
        self.log_path = data_root / "etcd.log"
        self.pki = pki
        self.tls = tls or client_cert_auth
        self.client_cert_auth = client_cert_auth
        self.auth = auth
        self.users = dict(users or {})  # more users with role root, made with auth
        self.auth_token_ttl = auth_token_ttl
        self.extra_args = extra_args
        self.client_port = free_port()
        self.peer_port = peer_port or free_port()
        self.name = name
        self.initial_cluster = initial_cluster
        self.process: subprocess.Popen[bytes] | None = None
        self._auth_enabled = False

    # -- addresses ---------------------------------------------------------

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    @property
    def url(self) -> str:
        return f"{'etcds' if self.tls else 'etcd'}://{self.endpoint}"

    def url_with_prefix(self, prefix: str | None = None) -> str:
        return f"{self.url}/{prefix or 't-' + uuid.uuid4().hex[:12]}"

    # -- lifecycle ---------------------------------------------------------

    def _command(self) -> list[str]:
        scheme = "https" if self.tls else "http"
        client = f"{scheme}://{self.endpoint}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        cmd = [
            self.binary,
            "--name", self.name,
            "--data-dir", str(self.data_dir),
            "--listen-client-urls", client,
            "--advertise-client-urls", client,
            "--listen-peer-urls", peer,
            "--initial-advertise-peer-urls", peer,
            "--initial-cluster", self.initial_cluster or f"{self.name}={peer}",
            "--initial-cluster-state", "new",
            # Short raft timings: the minimum lease TTL is 1.5 election
            # timeouts, so 500 ms lets tests use 1 s sessions.
            "--heartbeat-interval", "50",
            "--election-timeout", "500",
            "--logger", "zap",
            "--log-outputs", "stderr",
        ]
        if self.tls:
            assert self.pki is not None
            cmd += ["--cert-file", str(self.pki.server_cert),
                    "--key-file", str(self.pki.server_key)]
        if self.client_cert_auth:
            assert self.pki is not None
            cmd += ["--client-cert-auth", "--trusted-ca-file", str(self.pki.ca)]
        if self.auth_token_ttl is not None:
            cmd += ["--auth-token-ttl", str(self.auth_token_ttl)]
        return cmd + list(self.extra_args)

    def start(self, *, wait: bool = True) -> None:
        """Start (or restart after ``kill``/``stop``) on the same ports and data."""
        if self.process is not None and self.process.poll() is None:
            raise RuntimeError("etcd is already running")
        self.data_root.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self._command(), stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        if not wait:
            return  # a cluster member: healthy only once a quorum runs
        self.wait_healthy()
        if self.auth and not self._auth_enabled:
            self._enable_auth()
            self._auth_enabled = True

    def wait_healthy(self, timeout_s: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        last_error = ""
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                raise RuntimeError(
                    f"etcd exited at start (code {self.process and self.process.returncode}); "
                    f"log: {self.log_path}\n{self.log_tail()}"
                )
            try:
                if self._health():
                    return
            except (OSError, urllib.error.URLError, ValueError) as err:
                last_error = str(err)
            time.sleep(0.1)
        raise RuntimeError(f"etcd not healthy after {timeout_s}s ({last_error}); {self.log_path}")

    def _ssl_context(self) -> ssl.SSLContext | None:
        if not self.tls:
            return None
        assert self.pki is not None
        context = ssl.create_default_context(cafile=str(self.pki.ca))
        context.load_cert_chain(str(self.pki.client_cert), str(self.pki.client_key))
        return context

    def _health(self) -> bool:
        scheme = "https" if self.tls else "http"
        try:
            with urllib.request.urlopen(
                f"{scheme}://{self.endpoint}/health", timeout=2, context=self._ssl_context()
            ) as response:
                body = response.read()
        except urllib.error.HTTPError as err:  # 503 while starting
            body = err.read()
        return b'"health":"true"' in body

    # -- auth --------------------------------------------------------------

    def _enable_auth(self) -> None:
        """Create user ``root`` (role root) and enable authentication.

        Uses the v3 gRPC API (the stubs aetcd ships), so no etcdctl is needed.
        """
        import grpc  # type: ignore[import-untyped]
        from aetcd import rpc

        channel = self.grpc_channel(grpc)
        try:
            auth = rpc.AuthStub(channel)
            auth.RoleAdd(rpc.AuthRoleAddRequest(name="root"), timeout=10)
            auth.UserAdd(
                rpc.AuthUserAddRequest(name="root", password=ROOT_PASSWORD), timeout=10
            )
            for user, password in [("root", ROOT_PASSWORD), *self.users.items()]:
                if user != "root":
                    auth.UserAdd(rpc.AuthUserAddRequest(name=user, password=password),
                                 timeout=10)
                auth.UserGrantRole(rpc.AuthUserGrantRoleRequest(user=user, role="root"),
                                   timeout=10)
            auth.AuthEnable(rpc.AuthEnableRequest(), timeout=10)
        finally:
            channel.close()

    def grpc_channel(self, grpc: Any) -> Any:
        """A synchronous gRPC channel to this server (client certificate if TLS)."""
        if not self.tls:
            return grpc.insecure_channel(self.endpoint)
        assert self.pki is not None
        credentials = grpc.ssl_channel_credentials(
            root_certificates=self.pki.ca.read_bytes(),
            private_key=self.pki.client_key.read_bytes(),
            certificate_chain=self.pki.client_cert.read_bytes(),
        )
        return grpc.secure_channel(self.endpoint, credentials)


class EtcdCluster:
    """``size`` plaintext etcd members forming one cluster (for failover tests)."""

    def __init__(self, binary: str, data_root: Path, size: int = 3) -> None:
        names = [f"n{i}" for i in range(size)]
        peers = {name: free_port() for name in names}
        initial = ",".join(f"{n}=http://127.0.0.1:{p}" for n, p in peers.items())
        self.members = [
            EtcdServer(binary, data_root / name, name=name, peer_port=peers[name],
                       initial_cluster=initial)
            for name in names
        ]

    @property
    def endpoints(self) -> list[str]:
        return [m.endpoint for m in self.members]

    @property
    def url(self) -> str:
        return "etcd://" + ",".join(self.endpoints)

    def start(self) -> None:
        for member in self.members:
            member.start(wait=False)
        for member in self.members:
            member.wait_healthy()

    def stop(self) -> None:
        for member in self.members:
            member.stop()


@pytest.fixture(scope="session")
def etcd_pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("etcd-pki"))


@pytest.fixture(scope="session")
def etcd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    """The shared plaintext etcd of the session (never restart or pause it)."""
    server = EtcdServer(require_etcd(), tmp_path_factory.mktemp("etcd-shared"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def etcd_url(etcd_server: EtcdServer) -> str:
    """``etcd://127.0.0.1:PORT/t-<unique>``: the shared server, a fresh key prefix."""
    return etcd_server.url_with_prefix()


@pytest.fixture
def etcd_server_factory(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[..., EtcdServer]]:
    """``factory(**EtcdServer kwargs, start=True)``: servers of this test only."""
    binary = require_etcd()
    servers: list[EtcdServer] = []

    def factory(*, start: bool = True, **kwargs: Any) -> EtcdServer:
        server = EtcdServer(binary, tmp_path_factory.mktemp("etcd-own"), **kwargs)
        servers.append(server)
        if start:
            server.start()
        return server

    try:
        yield factory
    finally:
        for server in servers:
            server.stop()


@pytest.fixture
def etcd_cluster_factory(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[..., EtcdCluster]]:
    """``factory(size=3) -> EtcdCluster``: a started cluster of this test only."""
    binary = require_etcd()
    clusters: list[EtcdCluster] = []

    def factory(size: int = 3) -> EtcdCluster:
        cluster = EtcdCluster(binary, tmp_path_factory.mktemp("etcd-cluster"), size)
        clusters.append(cluster)
        cluster.start()
        return cluster

    try:
        yield factory
    finally:
        for cluster in clusters:
            cluster.stop()
