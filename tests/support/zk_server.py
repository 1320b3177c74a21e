"""Real ZooKeeper servers for the test suite, on free loopback ports.

Each server is one standalone ``ZooKeeperServerMain`` JVM started directly
(not through ``zkServer.sh``) with a generated ``zoo.cfg``: a free 127.0.0.1
client port, the admin server off, a temporary data dir, and a 200 ms tick, so
sessions may be as short as 0.4 s (``minSessionTimeout = 2 * tickTime``) and as
long as 60 s.

Fixtures (loaded as a pytest plugin from ``tests/conftest.py``):

``zk_server``
    One plaintext ZooKeeper for the whole session, without authentication.
    Never restart or pause it: other tests share it.
``zk_url``
    ``zk://127.0.0.1:PORT/t-<unique>?acl=open``: the shared server with a
    chroot of its own, so every test starts from an empty tree. ``acl=open``
    is the explicit opt-in the backend requires before it creates
    world-accessible znodes on a server without authentication (see
    ``coordinators.zookeeper``).
``zk_server_factory``
    ``factory(**ZkServer kwargs, start=True) -> ZkServer``: a server of the
    test's own, stopped at the end of the test. For tests that kill, restart
    or pause ZooKeeper, and for secured servers: ``sasl_users={"alice": "pw"}``
    (SASL DIGEST-MD5 through a JAAS file), ``require_auth="sasl"`` or
    ``"digest"`` (the server refuses unauthenticated clients), ``tls=True``
    (a Netty ``secureClientPort`` with a certificate for ``localhost`` only,
    client certificates required).
``zk_tls``
    The :class:`TlsMaterial` of the session (made with ``openssl`` and
    ``keytool`` at test time).

Every server has a superuser ``super`` (password :data:`SUPER_PASSWORD`, by
digest, and by SASL on servers with SASL users) for audits: it may read any
znode and its ACL, whatever the ACL says (:meth:`ZkServer.super_client`).

Without Java or the ZooKeeper jars the ZooKeeper tests are skipped, except in
CI (``CI=true``) where they fail with one line: a CI run must never pass by
skipping its integration tests.

Example::

    def test_restart(zk_server_factory):
        server = zk_server_factory()
        server.kill()      # SIGKILL
        server.start()     # same port, same data dir
"""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import ssl
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.server_process import ServerProcess

START_TIMEOUT_S = 90.0
TICK_MS = 200
SUPER_USER = "super"
SUPER_PASSWORD = "super-Pa55word"
TLS_STORE_PASSWORD = "store-Pa55word"

# Where the Debian package puts ZooKeeper; ZOOKEEPER_JAR overrides.
_ZK_JARS = ("/usr/share/java/zookeeper.jar",)
# A logging backend for ZooKeeper's slf4j (without one it logs nothing).
_SLF4J_SIMPLE = "/usr/share/java/slf4j-simple.jar"
# The Debian jar's manifest names only part of what the Netty connection
# factory (needed for TLS) loads.
_NETTY_EXTRA = tuple(
    f"/usr/share/java/netty-{name}.jar"
    for name in ("codec", "resolver", "transport-native-unix-common")
)


def java_binary() -> str | None:
    return os.environ.get("JAVA") or shutil.which("java")


def zookeeper_jar() -> str | None:
    candidates = [os.environ.get("ZOOKEEPER_JAR", ""), *_ZK_JARS]
    return next((c for c in candidates if c and os.path.isfile(c)), None)


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require_zookeeper() -> tuple[str, str]:
    """(java, zookeeper jar), or skip (fail in CI) with one clear line."""
    java, jar = java_binary(), zookeeper_jar()
    if java is None or jar is None:
        missing = "java" if java is None else "the ZooKeeper jar (/usr/share/java/zookeeper.jar)"
        message = (
            f"ZooKeeper tests need {missing}: install the Debian packages zookeeper and "
            "default-jre-headless (tests/run.sh does)"
        )
        if _in_ci():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return java, jar


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def super_digest() -> str:
    """``super:<base64 sha1>``, the form ZooKeeper's superDigest property takes."""
    from kazoo.security import make_digest_acl_credential

    credential: str = make_digest_acl_credential(SUPER_USER, SUPER_PASSWORD)
    return credential


# ------------------------------------------------------------------------ TLS


@dataclass(frozen=True)
class TlsMaterial:
    """Certificates made at test time.

    The server certificate names ``localhost`` only (no IP address), so a
    client that dials ``127.0.0.1`` must fail host name verification.
    """

    dir: Path
    ca: Path  # PEM, the CA clients trust
    client_cert: Path
    client_key: Path
    other_ca: Path  # an unrelated CA: trusting it must fail the handshake
    keystore: Path  # PKCS12: the server's key and certificate
    truststore: Path  # PKCS12: the CA, for client certificates
    password: str = TLS_STORE_PASSWORD


def _run(*args: str | Path) -> None:
    subprocess.run(
        [str(a) for a in args], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )


def make_tls_material(directory: Path) -> TlsMaterial:
    for tool in ("openssl", "keytool"):
        if shutil.which(tool) is None:
            message = f"the {tool} CLI is needed to make test certificates"
            if _in_ci():
                pytest.fail(message, pytrace=False)
            pytest.skip(message)
    directory.mkdir(parents=True, exist_ok=True)
    rsa = ("-newkey", "rsa:2048", "-nodes")

    def make_ca(name: str) -> tuple[Path, Path]:
        crt, key = directory / f"{name}.pem", directory / f"{name}.key"
        _run(
            "openssl", "req", "-x509", *rsa, "-keyout", key, "-out", crt, "-days", "3",
            "-subj", f"/CN={name}",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        )
        return crt, key

    def make_leaf(name: str, ca: Path, ca_key: Path, ext: str) -> tuple[Path, Path]:
        crt, key, csr = (directory / f"{name}.{s}" for s in ("pem", "key", "csr"))
        extfile = directory / f"{name}.ext"
        extfile.write_text(ext)
        _run("openssl", "req", *rsa, "-keyout", key, "-out", csr, "-subj", f"/CN={name}")
        _run(
            "openssl", "x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key,
            "-CAcreateserial", "-out", crt, "-days", "3", "-extfile", extfile,
        )
        return crt, key

    ca, ca_key = make_ca("zk-test-ca")
    other_ca, _ = make_ca("zk-other-ca")
    server_cert, server_key = make_leaf(
        "zk-server", ca, ca_key,
        "basicConstraints=CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth,clientAuth\n"
        "subjectAltName=DNS:localhost\n",
    )
    client_cert, client_key = make_leaf(
        "zk-client", ca, ca_key,
        "basicConstraints=CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=clientAuth\n",
    )
    keystore, truststore = directory / "server.p12", directory / "trust.p12"
    _run(
        "keytool", "-importcert", "-noprompt", "-alias", "ca", "-file", ca,
        "-keystore", truststore, "-storetype", "PKCS12", "-storepass", TLS_STORE_PASSWORD,
    )
    # keytool cannot import a PEM private key: let openssl make the PKCS12 file,
    # with algorithms every Java 11+ reads.
    _run(
        "openssl", "pkcs12", "-export", "-in", server_cert, "-inkey", server_key,
        "-certfile", ca, "-name", "server", "-out", keystore,
        "-passout", f"pass:{TLS_STORE_PASSWORD}",
    )
    return TlsMaterial(directory, ca, client_cert, client_key, other_ca, keystore, truststore)


# --------------------------------------------------------------------- server

# Servers started by this process: stopped at exit if a fixture could not.
_STARTED: set[ZkServer] = set()


@atexit.register
def _stop_leftovers() -> None:
    for server in list(_STARTED):
        server.stop()


class ZkServer(ServerProcess):
    """One standalone ZooKeeper JVM on fixed loopback ports and a data dir.

    ``kill``/``start`` keep the ports and the data dir: clients reconnect to
    the same URL and, when they come back within their session timeout, find
    their sessions (and ephemeral znodes) again, because ZooKeeper logs
    sessions in its transaction log.
    """

    server_name = "ZooKeeper"
    stop_wait_s = 20.0
    tail_lines = 40

    def __init__(
        self,
        java: str,
        jar: str,
        root: Path,
        *,
        sasl_users: dict[str, str] | None = None,
        require_auth: str | None = None,
        tls: TlsMaterial | None = None,
        client_auth: str = "need",
        tick_ms: int = TICK_MS,
    ) -> None:
        if require_auth not in (None, "sasl", "digest"):
            raise ValueError(f"require_auth must be None, 'sasl' or 'digest', not {require_auth!r}")
        if require_auth == "sasl" and not sasl_users:
            raise ValueError("require_auth='sasl' needs sasl_users")
        self.java = java
        self.jar = jar
        self.root = root
        self.data_dir = root / "data"
        self.config_path = root / "zoo.cfg"
        self.jaas_path = root / "jaas.conf"
        self.log_path = root / "zookeeper.log"
        self.sasl_users = dict(sasl_users or {})
        self.require_auth = require_auth
        self.tls = tls
        self.tick_ms = tick_ms
        self.client_auth = client_auth  # of the TLS port: need, want or none
        self.port = free_port()
        self.secure_port = free_port() if tls is not None else None
        self.process: subprocess.Popen[bytes] | None = None

    # -- addresses ---------------------------------------------------------

    @property
    def host(self) -> str:
        return "127.0.0.1"

    @property
    def url(self) -> str:
        """``zk://127.0.0.1:PORT``: the plaintext port (open even on a TLS server)."""
        return f"zk://127.0.0.1:{self.port}"

    @property
    def tls_url(self) -> str:
        """``zk://localhost:SECURE_PORT``: the TLS port, by the certificate's host name."""
        if self.secure_port is None:
            raise RuntimeError("this server has no TLS port (tls=None)")
        return f"zk://localhost:{self.secure_port}"

    @property
    def hosts(self) -> str:
        """``127.0.0.1:PORT``, as kazoo takes it."""
        return f"127.0.0.1:{self.port}"

    def unique_url(self, base: str | None = None, *, acl: str | None = "open") -> str:
        """``base/t-<unique>`` (and ``?acl=...``): a fresh chroot on this server."""
        url = f"{base or self.url}/t-{uuid.uuid4().hex[:12]}"
        return f"{url}?acl={acl}" if acl else url

    # -- configuration -----------------------------------------------------

    def _write_config(self) -> None:
        lines = [
            f"tickTime={self.tick_ms}",
            f"dataDir={self.data_dir}",
            f"clientPort={self.port}",
            "clientPortAddress=127.0.0.1",
            f"minSessionTimeout={2 * self.tick_ms}",
            "maxSessionTimeout=60000",
            "admin.enableServer=false",
            "4lw.commands.whitelist=ruok,srvr,stat,cons",
            # Every client of a test or benchmark comes from 127.0.0.1: room for
            # a group of 1,000 members and the clients that watch it.
            "maxClientCnxns=2000",
            # Empty containers and TTL nodes are not used; keep the reaper idle.
            "autopurge.purgeInterval=0",
        ]
        if self.sasl_users:
            lines.append(
                "authProvider.sasl=org.apache.zookeeper.server.auth.SASLAuthenticationProvider"
            )
        if self.require_auth is not None:
            lines += ["enforce.auth.enabled=true", f"enforce.auth.schemes={self.require_auth}"]
        if self.tls is not None:
            lines += [
                f"secureClientPort={self.secure_port}",
                "secureClientPortAddress=127.0.0.1",
            ]
        self.config_path.write_text("\n".join(lines) + "\n")
        if self.sasl_users:
            accounts = {**self.sasl_users, SUPER_USER: SUPER_PASSWORD}
            users = "\n".join(
                f'    user_{name}="{password}"' for name, password in accounts.items()
            )
            self.jaas_path.write_text(
                "Server {\n"
                "    org.apache.zookeeper.server.auth.DigestLoginModule required\n"
                f"{users};\n"
                "};\n"
            )

    def _command(self) -> list[str]:
        jars = [self.jar, _SLF4J_SIMPLE, *(_NETTY_EXTRA if self.tls is not None else ())]
        classpath = os.pathsep.join(j for j in jars if os.path.isfile(j))
        props = {
            "zookeeper.DigestAuthenticationProvider.superDigest": super_digest(),
            "zookeeper.jmx.log4j.disable": "true",
            "org.slf4j.simpleLogger.showDateTime": "true",
        }
        if self.sasl_users:
            props["java.security.auth.login.config"] = str(self.jaas_path)
            props["zookeeper.superUser"] = SUPER_USER
        if self.tls is not None:
            tls = self.tls
            props.update(
                {
                    "zookeeper.serverCnxnFactory":
                        "org.apache.zookeeper.server.NettyServerCnxnFactory",
                    "zookeeper.ssl.keyStore.location": str(tls.keystore),
                    "zookeeper.ssl.keyStore.password": tls.password,
                    "zookeeper.ssl.keyStore.type": "PKCS12",
                    "zookeeper.ssl.trustStore.location": str(tls.truststore),
                    "zookeeper.ssl.trustStore.password": tls.password,
                    "zookeeper.ssl.trustStore.type": "PKCS12",
                    "zookeeper.ssl.clientAuth": self.client_auth,
                }
            )
        return [
            self.java,
            "-Xmx192m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            *(f"-D{key}={value}" for key, value in props.items()),
            "-cp",
            classpath,
            "org.apache.zookeeper.server.ZooKeeperServerMain",
            str(self.config_path),
        ]

    # -- lifecycle ---------------------------------------------------------

    def start(self) -> None:
        """Start (or restart after ``kill``/``stop``) on the same ports and data."""
        if self.process is not None and self.process.poll() is None:
            raise RuntimeError("ZooKeeper is already running")
        self.root.mkdir(parents=True, exist_ok=True)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._write_config()
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self._command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        _STARTED.add(self)
        try:
            self.wait_serving()
        except BaseException:
            self.stop()
            raise

    def four_letter(self, command: str, timeout_s: float = 2.0) -> str:
        """A four-letter-word command on the plaintext port (``srvr``, ``cons``...)."""
        with socket.create_connection((self.host, self.port), timeout=timeout_s) as sock:
            sock.sendall(command.encode())
            chunks = []
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
        return b"".join(chunks).decode(errors="replace")

    def wait_serving(self, timeout_s: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        last_error = ""
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                raise RuntimeError(
                    f"ZooKeeper exited at start (code {self.process and self.process.returncode});"
                    f" log: {self.log_path}\n{self.log_tail()}"
                )
            try:
                # "Mode: standalone" only once the server serves requests.
                if "Mode:" in self.four_letter("srvr"):
                    if self.tls is None or self._tls_answers():
                        return
            except OSError as err:
                last_error = str(err)
            time.sleep(0.1)
        raise RuntimeError(
            f"ZooKeeper not serving after {timeout_s}s ({last_error}); {self.log_path}"
        )

    def _tls_answers(self) -> bool:
        assert self.tls is not None and self.secure_port is not None
        context = ssl.create_default_context(cafile=str(self.tls.ca))
        context.load_cert_chain(str(self.tls.client_cert), str(self.tls.client_key))
        try:
            with socket.create_connection((self.host, self.secure_port), timeout=2) as raw:
                with context.wrap_socket(raw, server_hostname="localhost"):
                    return True
        except (OSError, ssl.SSLError):
            return False

    def _stopping(self) -> None:
        _STARTED.discard(self)

    # -- clients for tests -------------------------------------------------

    def kazoo_client(self, *, auth: tuple[str, str] | None = None, **kwargs: Any) -> Any:
        """A started raw kazoo client on the plaintext port (the caller stops it).

        ``auth=(scheme, credential)``, e.g. ``("digest", "super:" + SUPER_PASSWORD)``.
        """
        from kazoo.client import KazooClient

        client = KazooClient(
            hosts=self.hosts, timeout=10.0, auth_data=[auth] if auth else None, **kwargs
        )
        client.start(timeout=30)
        return client

    def super_client(self) -> Any:
        """A raw kazoo client authenticated as the superuser (reads everything).

        Digest, or SASL on a server with SASL users (which may refuse digest).
        """
        if self.sasl_users:
            return self.kazoo_client(
                sasl_options={
                    "mechanism": "DIGEST-MD5",
                    "username": SUPER_USER,
                    "password": SUPER_PASSWORD,
                }
            )
        return self.kazoo_client(auth=("digest", f"{SUPER_USER}:{SUPER_PASSWORD}"))


@pytest.fixture(scope="session")
def zk_tls(tmp_path_factory: pytest.TempPathFactory) -> TlsMaterial:
    return make_tls_material(tmp_path_factory.mktemp("zk-tls"))


@pytest.fixture(scope="session")
def zk_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZkServer]:
    """The shared plaintext ZooKeeper of the session (never restart or pause it)."""
    java, jar = require_zookeeper()
    server = ZkServer(java, jar, tmp_path_factory.mktemp("zk-shared"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def zk_url(zk_server: ZkServer) -> str:
    """``zk://127.0.0.1:PORT/t-<unique>?acl=open``: the shared server, a fresh chroot."""
    return zk_server.unique_url()


@pytest.fixture
def zk_server_factory(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[..., ZkServer]]:
    """``factory(**ZkServer kwargs, start=True)``: servers of this test only."""
    java, jar = require_zookeeper()
    servers: list[ZkServer] = []

    def factory(*, start: bool = True, **kwargs: Any) -> ZkServer:
        server = ZkServer(java, jar, tmp_path_factory.mktemp("zk-own"), **kwargs)
        servers.append(server)
        if start:
            server.start()
        return server

    try:
        yield factory
    finally:
        for server in servers:
            server.stop()
