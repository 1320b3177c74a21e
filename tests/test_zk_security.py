"""ZooKeeper security findings of issue 44, on real servers started by the suite.

* A chroot or a directory znode that exists before the coordinator would create
  it is used only if its ACL is ours (``coordinators/zookeeper/guard.py``):
  otherwise one line naming the znode and its ACL, at ``connect()`` for the
  chroot and before the first request in any other directory, through the
  library (:class:`ForeignAcl`, a ``ConfigError`` and a ``CoordinatorError``)
  and through ``paimon-group run`` (one line, non-zero exit, nothing joined).
  What our own members made is accepted on every auth mode: digest, SASL, a TLS
  client certificate, open.
* A TLS failure is said as such, naming the server, at once (not after the
  connect timeout as an unreachable coordinator).
* A digest ACL entry is printed with its hash masked (errors, reprs, URLs,
  kazoo's debug log); ``acl=open`` and the other ACL words are shown.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from kazoo.security import OPEN_ACL_UNSAFE, make_acl, make_digest_acl_credential

from coordinators import (
    AuthenticationFailed,
    ConfigError,
    ConnectOptions,
    CoordinatorError,
    Secret,
    open_coordinator,
)
from coordinators.registry import redact_url
from coordinators.zookeeper import ZooKeeperCoordinator, parse_url
from coordinators.zookeeper.guard import ForeignAcl
from tests.support.group_procs import REPO
from tests.support.tables import make_pk_table, write_rows
from tests.support.zk_server import TlsMaterial, ZkServer

pytestmark = pytest.mark.zk

PASSWORD = "pw-44!never-print-me"
OTHER_PASSWORD = "other-44!never-print-me"
OUR_DIGEST = make_digest_acl_credential("alice", PASSWORD)  # alice:HASH
OUR_HASH = OUR_DIGEST.split(":", 1)[1]


def digest_options(**kwargs: Any) -> ConnectOptions:
    return ConnectOptions(username="alice", password=Secret(PASSWORD), connect_timeout_s=20.0,
                          allow_plaintext_credentials=True, **kwargs)


@contextlib.asynccontextmanager
async def opened(url: str, options: ConnectOptions) -> AsyncIterator[Any]:
    coordinator = open_coordinator(url, options)
    await coordinator.connect()
    try:
        yield coordinator
    finally:
        await coordinator.close()


def as_super(server: ZkServer, action: Callable[[Any], Any]) -> Any:
    admin = server.super_client()
    try:
        return action(admin)
    finally:
        admin.stop()
        admin.close()


def our_acl() -> list[Any]:
    """What ``creator`` gives a znode made by alice with digest credentials."""
    return [make_acl("digest", OUR_DIGEST, all=True)]


def assert_one_line_refusal(err: BaseException, znode: str, acl: str) -> str:
    message = str(err)
    assert isinstance(err, ForeignAcl) and isinstance(err, ConfigError | CoordinatorError)
    assert "\n" not in message
    assert f"znode {znode} exists with an ACL that is not ours: {acl} " in message, message
    assert PASSWORD not in message and OUR_HASH not in message, message
    return message


# -- existing znodes with an ACL that is not ours ------------------------------------


@pytest.mark.asyncio
async def test_a_chroot_made_open_by_an_admin_is_refused_at_connect(
    zk_server_factory: Callable[..., ZkServer],
) -> None:
    """zkCli's ``create /paimon`` gives world:anyone all rights: refused, with
    nothing created in it; ``?acl=open`` opts in."""
    server = zk_server_factory()
    url = server.unique_url(acl=None)
    chroot = parse_url(url).chroot
    as_super(server, lambda zk: zk.create(chroot, b"", acl=OPEN_ACL_UNSAFE))
    coordinator = open_coordinator(url, digest_options())
    with pytest.raises(ForeignAcl) as caught:
        await coordinator.connect()
    message = assert_one_line_refusal(caught.value, chroot, "world:anyone:crwda")
    assert "digest:alice:***:crwda" in message and "?acl=open" in message
    assert as_super(server, lambda zk: zk.get_children(chroot)) == []
    async with opened(f"{url}?acl=open", ConnectOptions(connect_timeout_s=20.0)) as open_one:
        assert await open_one.create("k", b"v") is not None


@pytest.mark.asyncio
async def test_an_open_groups_folder_is_refused_before_anything_is_created(
    zk_server_factory: Callable[..., ZkServer],
) -> None:
    """The review's case: ``/chroot/groups`` made world-writable before the first
    member (the chroot's ACL fixed later, or the chroot ours): the group is
    refused before it is read or created, and an anonymous client could not
    have deleted its keys."""
    server = zk_server_factory()
    url = server.unique_url(acl=None)
    chroot = parse_url(url).chroot

    def prepare(zk: Any) -> None:
        zk.create(chroot, b"", acl=our_acl())
        zk.create(f"{chroot}/groups", b"", acl=OPEN_ACL_UNSAFE)

    as_super(server, prepare)
    async with opened(url, digest_options()) as coordinator:  # the chroot is ours
        for attempt in (coordinator.get("groups/g"),
                        coordinator.create("groups/g", b"{}"),
                        coordinator.create("groups/g/members/m1", b"", ephemeral=True),
                        coordinator.list("groups/")):
            with pytest.raises(ForeignAcl) as caught:
                await attempt
            assert_one_line_refusal(caught.value, f"{chroot}/groups", "world:anyone:crwda")
        # A directory deeper down, made open by someone with our rights above it.
        assert await coordinator.create("apps/a", b"") is not None
        as_super(server, lambda zk: zk.create(f"{chroot}/apps/x", b"", acl=OPEN_ACL_UNSAFE))
        with pytest.raises(ForeignAcl) as caught:
            await coordinator.create("apps/x/owners/0", b"", ephemeral=True)
        assert_one_line_refusal(caught.value, f"{chroot}/apps/x", "world:anyone:crwda")
    assert as_super(server, lambda zk: zk.get_children(f"{chroot}/groups")) == []
    assert as_super(server, lambda zk: zk.get_children(f"{chroot}/apps/x")) == []
    # Given our ACL, the folder is used.
    as_super(server, lambda zk: zk.set_acls(f"{chroot}/groups", our_acl()))
    async with opened(url, digest_options()) as coordinator:
        assert await coordinator.create("groups/g/members/m1", b"", ephemeral=True)


@pytest.mark.asyncio
async def test_another_identity_or_a_reader_we_did_not_name_is_refused(
    zk_server_factory: Callable[..., ZkServer],
) -> None:
    """A chroot another digest user may change (we may read it), or ours plus a
    reader not in our acl: refused (hashes shown masked); the reader named in
    our acl: accepted. (A chroot we may not even read is denied access, as
    before.)"""
    server = zk_server_factory()
    other = make_digest_acl_credential("mallory", OTHER_PASSWORD)
    cases = {
        "mallory": ([make_acl("digest", other, all=True),
                     make_acl("digest", OUR_DIGEST, read=True)],
                    "digest:mallory:***:crwda,digest:alice:***:r"),
        "reader": ([*our_acl(), make_acl("world", "anyone", read=True)],
                   "digest:alice:***:crwda,world:anyone:r"),
    }
    for acl, shown in cases.values():
        url = server.unique_url(acl=None)
        chroot = parse_url(url).chroot
        as_super(server, functools.partial(make_chroot, chroot, acl))
        with pytest.raises(ForeignAcl) as caught:
            await open_coordinator(url, digest_options()).connect()
        message = assert_one_line_refusal(caught.value, chroot, shown)
        assert other.split(":")[1] not in message
    # Named in our own acl, the reader is ours to grant.
    url = server.unique_url(acl=None)
    as_super(server, lambda zk: zk.create(parse_url(url).chroot, b"", acl=cases["reader"][0]))
    async with opened(url, digest_options(acl="creator,world:anyone:r")) as coordinator:
        assert await coordinator.create("groups/g", b"{}") is not None


def make_chroot(chroot: str, acl: list[Any], zk: Any) -> None:
    zk.create(chroot, b"", acl=acl)


async def made_then_used_again(url: str, options: ConnectOptions) -> None:
    """One coordinator makes a group's znodes; a second, later, uses them."""
    async with opened(url, options) as first:
        assert await first.create("groups/g", b"{}") is not None
        assert await first.create("groups/g/members/m1", b"", ephemeral=True) is not None
        assert await first.create("groups/g/positions/0", b"1") is not None
    async with opened(url, options) as second:
        assert [e.key for e in await second.list("groups/")] == ["groups/g"]
        assert await second.create("groups/g/members/m2", b"", ephemeral=True) is not None
        assert (await second.get("groups/g/positions/0")) is not None


@pytest.mark.asyncio
async def test_what_our_members_made_is_accepted_on_every_auth_mode(
    zk_server_factory: Callable[..., ZkServer], zk_tls: TlsMaterial,
) -> None:
    server = zk_server_factory(sasl_users={"alice": PASSWORD}, tls=zk_tls)
    sasl = ConnectOptions(username="alice", password=Secret(PASSWORD), auth_scheme="sasl",
                          connect_timeout_s=20.0)
    cert: dict[str, Any] = {"tls_ca": str(zk_tls.ca), "tls_cert": str(zk_tls.client_cert),
            "tls_key": str(zk_tls.client_key), "connect_timeout_s": 20.0}
    await made_then_used_again(server.unique_url(acl=None), digest_options())
    await made_then_used_again(server.unique_url(acl=None), sasl)
    await made_then_used_again(server.unique_url(server.tls_url, acl=None),
                               ConnectOptions(**cert))  # x509:CN=zk-client
    await made_then_used_again(server.unique_url(server.tls_url, acl=None), ConnectOptions(
        username="alice", password=Secret(PASSWORD), **cert))  # digest and x509
    await made_then_used_again(server.unique_url(acl="open"), ConnectOptions(connect_timeout_s=20))
    await made_then_used_again(server.unique_url(acl="creator,sasl:auditor:r"), sasl)
    # An admin who made the chroot for the group with its identity.
    url = server.unique_url(acl=None)
    as_super(server, lambda zk: zk.create(parse_url(url).chroot, b"", acl=our_acl()))
    await made_then_used_again(url, digest_options())


# -- through the command line --------------------------------------------------------


def cli(*args: str, out: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``paimon-group ARGS``; the handler ``record`` writes to ``out``."""
    return subprocess.run([sys.executable, "-m", "paimon_group", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PG_TEST_OUT": str(out)})


def error_line(result: subprocess.CompletedProcess[str]) -> str:
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr
    return errors[0]


@pytest.fixture
def warehouse(tmp_path: Path) -> str:
    wh = str(tmp_path / "wh")
    make_pk_table(wh, "db.t", buckets=2)
    write_rows(wh, "db.t", range(4))
    return wh


def run_args(wh: str, url: str, *extra: str) -> list[str]:
    return ["run", "--group", "g", "--warehouse", wh, "--table", "db.t",
            "--handler", "tests.support.handlers:record", "--session-timeout-s", "2",
            "--coordinator", url, *extra]


@pytest.mark.parametrize("where", ["chroot", "groups"])
def test_run_refuses_a_foreign_acl_in_one_line_before_joining(
    zk_server_factory: Callable[..., ZkServer], warehouse: str, tmp_path: Path, where: str,
) -> None:
    server = zk_server_factory()
    url = server.unique_url(acl=None)
    chroot = parse_url(url).chroot
    znode = chroot if where == "chroot" else f"{chroot}/groups"

    def prepare(zk: Any) -> None:
        zk.create(chroot, b"", acl=OPEN_ACL_UNSAFE if where == "chroot" else our_acl())
        if where == "groups":
            zk.create(znode, b"", acl=OPEN_ACL_UNSAFE)

    as_super(server, prepare)
    secret = tmp_path / "zk-password"
    secret.write_text(PASSWORD)
    result = cli(*run_args(warehouse, url, "--coordinator-username", "alice",
                           "--coordinator-password-file", str(secret),
                           "--allow-plaintext-credentials"), out=tmp_path / "out")
    assert result.returncode != 0, result.stderr
    line = error_line(result)
    assert f"znode {znode} exists with an ACL that is not ours: world:anyone:crwda" in line
    assert PASSWORD not in result.stderr + result.stdout and OUR_HASH not in result.stderr
    assert as_super(server, lambda zk: zk.get_children(znode)) == []  # nothing joined
    assert not (tmp_path / "out").exists()  # nothing read


# -- TLS failures ----------------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_tls_failure_is_said_at_once_naming_the_server(
    zk_server_factory: Callable[..., ZkServer], zk_tls: TlsMaterial,
) -> None:
    server = zk_server_factory(tls=zk_tls)
    tls: dict[str, Any] = {"tls_ca": str(zk_tls.ca), "tls_cert": str(zk_tls.client_cert),
           "tls_key": str(zk_tls.client_key), "connect_timeout_s": 20.0}
    port = server.secure_port
    cases: list[tuple[str, dict[str, Any], str]] = [
        (f"zk://127.0.0.1:{port}/x", tls,
         f"TLS certificate verification failed for ZooKeeper at 127.0.0.1:{port}: "
         "IP address mismatch, certificate is not valid for '127.0.0.1'."),
        (f"zk://localhost:{port}/x", {**tls, "tls_ca": str(zk_tls.other_ca)},
         f"TLS certificate verification failed for ZooKeeper at localhost:{port}: "
         "self-signed certificate in certificate chain"),
    ]
    for url, options, expected in cases:
        started = time.monotonic()
        with pytest.raises(AuthenticationFailed) as caught:
            await open_coordinator(url, ConnectOptions(**options)).connect()
        assert str(caught.value) == expected
        assert time.monotonic() - started < 5.0  # at once, not after the 20 s timeout


def test_run_says_the_tls_error_not_an_unreachable_coordinator(
    zk_server_factory: Callable[..., ZkServer], zk_tls: TlsMaterial, warehouse: str,
    tmp_path: Path,
) -> None:
    server = zk_server_factory(tls=zk_tls)
    url = f"zk://127.0.0.1:{server.secure_port}/x"  # the certificate names localhost only
    result = cli(*run_args(warehouse, url, "--coordinator-ca", str(zk_tls.ca),
                           "--coordinator-cert", str(zk_tls.client_cert),
                           "--coordinator-key", str(zk_tls.client_key)), out=tmp_path / "out")
    assert result.returncode != 0
    assert error_line(result) == (
        f"error: TLS certificate verification failed for ZooKeeper at "
        f"127.0.0.1:{server.secure_port}: IP address mismatch, certificate is not valid for "
        "'127.0.0.1'.")


# -- digest ACL entries are printed with their hash masked -----------------------------


@pytest.mark.asyncio
async def test_a_digest_acl_is_shown_with_its_hash_masked_everywhere(
    zk_server_factory: Callable[..., ZkServer], caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(1)
    caplog.set_level(1, logger="coordinators.zookeeper.kazoo")  # kazoo's request log
    server = zk_server_factory()
    auditor = make_digest_acl_credential("auditor", OTHER_PASSWORD)
    auditor_hash = auditor.split(":")[1]
    spec = f"digest:{auditor}:r,creator"
    shown = "digest:auditor:***:r,creator"
    url = server.unique_url(acl=spec)
    # Without an identity: the error shows the whole acl, its hash masked.
    with pytest.raises(ConfigError) as caught:
        ZooKeeperCoordinator(url)
    assert f"ZooKeeper acl {shown!r} needs an identity" in str(caught.value)
    async with opened(url, digest_options()) as coordinator:
        await coordinator.create("groups/g", b"{}")
        assert coordinator.url.endswith(f"?acl={shown}")
        assert f"?acl={shown}" in repr(coordinator)
        acls = as_super(server, lambda zk: zk.get_acls(f"{parse_url(url).chroot}/groups/g")[0])
        assert {a.id.id for a in acls} == {OUR_DIGEST, auditor}  # applied as given
    assert redact_url(url).endswith(f"?acl={shown}")
    assert f"acl={shown!r}" in repr(digest_options(acl=spec))
    ours = "\n".join(r.getMessage() for r in caplog.records if r.name.startswith("coordinators"))
    assert "Create(" in ours and "GetACL(" in ours  # kazoo's log of our requests and replies
    for secret in (auditor_hash, OUR_HASH, PASSWORD):
        assert secret not in ours
        assert secret not in str(caught.value) + repr(digest_options(acl=spec))
    # acl=open and the other words are no secret.
    assert redact_url("zk://h:1/x?acl=open,sasl:auditor:r") == "zk://h:1/x?acl=open,sasl:auditor:r"
    assert ZooKeeperCoordinator("zk://h:1/x?acl=open").url == "zk://h:1/x?acl=open"


# -- one TLS context per client ------------------------------------------------------


async def _reconnected(client: Any, framer: Any) -> None:
    """Until ``client`` is connected on another connection than ``framer``."""
    for _ in range(400):
        if client.connected and client._framer is not None and client._framer is not framer:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the client did not reconnect")


@pytest.mark.asyncio
async def test_a_client_builds_its_tls_context_once_and_again_after_a_tls_failure(
    zk_server_factory: Callable[..., ZkServer], zk_tls: TlsMaterial,
) -> None:
    """The context (the system's CAs and the given ones, the client
    certificate: about 16 ms of the event loop) is built for the client's
    first connection and used for the next ones; a connection attempt that
    fails in TLS builds it again (a rotated certificate or CA is read then)."""
    import ssl
    import warnings

    from coordinators.zookeeper.aio import AioZkClient
    from coordinators.zookeeper.wire import tls_context

    server = zk_server_factory(tls=zk_tls)
    built: list[ssl.SSLContext] = []

    def build() -> ssl.SSLContext:
        built.append(tls_context(str(zk_tls.ca), str(zk_tls.client_cert),
                                 str(zk_tls.client_key)))
        return built[-1]

    assert server.secure_port is not None
    client = AioZkClient([("localhost", server.secure_port)], timeout_s=10, tls=build,
                         max_delay_s=0.2)
    assert await client.start(30)
    try:
        for _ in range(2):  # two reconnections, on the context of the first
            framer = client._framer
            framer.abort()
            await _reconnected(client, framer)
            assert await client.exists_async("/") is not None
        assert len(built) == 1
        # The next attempt's handshake fails (a context no server agrees with):
        # the one after it builds the context again, and connects.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # TLSv1: refused, as meant
            built[0].maximum_version = ssl.TLSVersion.TLSv1
            built[0].minimum_version = ssl.TLSVersion.TLSv1
        framer = client._framer
        framer.abort()
        await _reconnected(client, framer)
        assert await client.exists_async("/") is not None
        assert len(built) == 2
    finally:
        await client.aclose()
