"""The ZooKeeper backend beyond the shared conformance suite.

Unit tests (no server): URL and ACL parsing, option checks, error
translation, log redaction. Integration tests (``zk`` marker) against real
ZooKeeper servers from ``tests/support/zk_server.py``: the ABA fencing case,
a real session expiry of a SIGSTOPped process, a server pause within the
session timeout, a server restart, ACL audits with digest and SASL, refused
credentials, TLS with host name verification, and credentials kept out of
reprs, exceptions and logs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError, NoNodeError
from kazoo.protocol.serialization import Auth
from kazoo.security import make_digest_acl_credential

from coordinators import (
    AuthenticationFailed,
    Check,
    ConfigError,
    ConnectOptions,
    CoordinatorError,
    CoordinatorUnavailable,
    Delete,
    InvalidCoordinatorURL,
    Put,
    Secret,
    SessionLost,
    SessionState,
    open_coordinator,
)
from coordinators.errors import SessionSuspended
from coordinators.zookeeper import (
    EPOCH_PREFIX,
    FLAG_PREFIX,
    RedactCredentials,
    ZooKeeperCoordinator,
    parse_acl,
    parse_url,
    translate,
)
from tests.support.waiting import eventually
from tests.support.zk_server import TlsMaterial, ZkServer

T = TypeVar("T")
REPO_ROOT = Path(__file__).resolve().parents[1]
LIMIT_S = 60.0
PASSWORD = "pw-Zq8!never-print-me"
WRONG_PASSWORD = "wrong-Zq8!never-print-me"


async def state_is(coordinator: ZooKeeperCoordinator, state: SessionState) -> bool:
    return coordinator.session.state is state


def expire_session(server: ZkServer, coordinator: ZooKeeperCoordinator) -> None:
    """End ``coordinator``'s session on the server, as an expiry does.

    A second client joins the session with its id and password and closes
    it: the server deletes its ephemeral znodes and drops its connection;
    the owner learns, when it reconnects, that the session has expired.
    """
    session_id, password = coordinator.client.client_id
    other = KazooClient(hosts=server.hosts, client_id=(session_id, password), timeout=10.0)
    other.start(timeout=30)
    other.stop()
    other.close()


def walk(client: Any, path: str) -> list[str]:
    """``path`` and every znode below it."""
    found = [path]
    for child in client.get_children(path):
        found.extend(walk(client, f"{path.rstrip('/')}/{child}"))
    return found


@contextlib.asynccontextmanager
async def opened(url: str, options: ConnectOptions | None = None) -> AsyncIterator[Any]:
    coordinator = open_coordinator(url, options)
    await coordinator.connect()
    try:
        yield coordinator
    finally:
        await coordinator.close()


# ------------------------------------------------------------------ unit tests


class TestUrls:
    def test_hosts_chroot_and_acl(self) -> None:
        target = parse_url("zk://a:2181,b,[::1]:2182/apps/pg?acl=open")
        assert target.hosts == (("a", 2181), ("b", 2181), ("::1", 2182))
        assert target.chroot == "/apps/pg"
        assert target.acl == "open"
        assert target.hosts_string() == "a:2181,b:2181,[::1]:2182"
        assert target.display() == "zk://a:2181,b:2181,[::1]:2182/apps/pg?acl=open"

    def test_no_chroot(self) -> None:
        assert parse_url("zk://h:1").chroot == ""
        assert parse_url("zk://h:1/").chroot == ""

    @pytest.mark.parametrize(
        "url",
        [
            "etcd://h:1",
            "zk://",
            "zk://h:notaport",
            "zk://h:70000",
            "zk://h:1/a//b",
            "zk://h:1/a/../b",
            "zk://h:1/zookeeper/x",
            "zk://h:1/a?timeout=3",
            "zk://[::1/a",
        ],
    )
    def test_bad_urls_fail_with_one_line(self, url: str) -> None:
        with pytest.raises(InvalidCoordinatorURL) as caught:
            parse_url(url)
        assert "\n" not in str(caught.value)

    def test_credentials_in_the_url_are_refused_without_echoing_them(self) -> None:
        with pytest.raises(InvalidCoordinatorURL) as caught:
            ZooKeeperCoordinator(f"zk://alice:{PASSWORD}@h:2181/x")
        assert PASSWORD not in str(caught.value)
        assert "ConnectOptions" in str(caught.value)

    def test_url_property_masks_the_digest_hashes_of_an_acl_list(self) -> None:
        coordinator = ZooKeeperCoordinator("zk://h:1/x?acl=digest:bob:abc:r,open")
        assert coordinator.url == "zk://h:1/x?acl=digest:bob:***:r,open"


class TestAclAndOptions:
    def test_acl_grammar(self) -> None:
        creator, reader = parse_acl("creator, sasl:auditor:r")
        assert (creator.id.scheme, creator.perms) == ("auth", 31)
        assert (reader.id.scheme, reader.id.id, reader.perms) == ("sasl", "auditor", 1)
        (digest,) = parse_acl("digest:bob:c2FsdA==:rw")
        assert (digest.id.id, digest.perms) == ("bob:c2FsdA==", 3)
        (world,) = parse_acl("open")
        assert (world.id.scheme, world.id.id, world.perms) == ("world", "anyone", 31)

    @pytest.mark.parametrize("spec", ["", "sasl:bob", "sasl:bob:rx", ":x:r", "world::r"])
    def test_bad_acls_fail_with_one_line(self, spec: str) -> None:
        with pytest.raises(ConfigError) as caught:
            parse_acl(spec)
        assert "\n" not in str(caught.value)

    def test_creator_acl_without_any_identity_is_refused(self) -> None:
        with pytest.raises(ConfigError, match="acl=open") as caught:
            ZooKeeperCoordinator("zk://h:1/x")
        assert "\n" not in str(caught.value)
        # Chosen explicitly, open ACLs are accepted (development servers).
        ZooKeeperCoordinator("zk://h:1/x?acl=open")
        ZooKeeperCoordinator("zk://h:1/x", ConnectOptions(acl="open"))
        # A username/password or a TLS client certificate is an identity.
        ZooKeeperCoordinator("zk://h:1/x", ConnectOptions(
            username="u", password=Secret("p"), allow_plaintext_credentials=True))
        ZooKeeperCoordinator("zk://h:1/x", ConnectOptions(tls_cert="c.pem", tls_key="k.pem"))

    @pytest.mark.parametrize(
        "options",
        [
            ConnectOptions(username="u"),
            ConnectOptions(password=Secret(PASSWORD)),
            ConnectOptions(username="u", password=Secret(PASSWORD), auth_scheme="kerberos"),
            ConnectOptions(username="u:x", password=Secret(PASSWORD)),
            ConnectOptions(session_timeout_s=0, acl="open"),
            ConnectOptions(tls_cert="c.pem", acl="open"),
            ConnectOptions(tls_ca="ca.pem", tls_server_name="zk.example", acl="open"),
        ],
    )
    def test_bad_options_fail_with_one_line(self, options: ConnectOptions) -> None:
        with pytest.raises(ConfigError) as caught:
            ZooKeeperCoordinator("zk://h:1/x", options)
        message = str(caught.value)
        assert "\n" not in message and PASSWORD not in message

    def test_reserved_key_names_are_refused(self) -> None:
        coordinator = ZooKeeperCoordinator("zk://h:1?acl=open")
        for key in ("a/.pg-key.x", ".pg-epoch.1", "a/./b", "zookeeper/config"):
            with pytest.raises(ConfigError):
                coordinator._check_key(key)
        coordinator._check_key("a/.hidden/b")


class TestTranslation:
    def test_kazoo_errors_become_ours(self) -> None:
        from kazoo.exceptions import (
            AuthFailedError,
            ConnectionLoss,
            NoChildrenForEphemeralsError,
            SessionExpiredError,
        )

        assert isinstance(translate(ConnectionLoss(), "x"), CoordinatorUnavailable)
        assert translate(ConnectionLoss(), "x").retriable
        assert isinstance(translate(SessionExpiredError(), "x"), SessionLost)
        assert isinstance(translate(AuthFailedError(), "x"), AuthenticationFailed)
        assert isinstance(translate(NoAuthError(), "x"), AuthenticationFailed)
        assert isinstance(translate(NoChildrenForEphemeralsError(), "x"), ConfigError)
        assert isinstance(translate(OSError(111, "refused"), "x"), CoordinatorUnavailable)
        for error in (ConnectionLoss(), NoAuthError(), SessionExpiredError()):
            assert "\n" not in str(translate(error, "get a/b"))


class TestLogRedaction:
    def test_auth_packets_and_secrets_are_redacted(self) -> None:
        redactor = RedactCredentials()
        redactor.add([PASSWORD])
        packet = logging.LogRecord(
            "k", logging.DEBUG, "f", 1, "Sending request(xid=%s): %s",
            (-4, Auth(0, "digest", f"alice:{PASSWORD}")), None,
        )
        assert redactor.filter(packet)
        assert PASSWORD not in packet.getMessage() and "redacted" in packet.getMessage()
        stray = logging.LogRecord("k", logging.INFO, "f", 1, "oops %s", (PASSWORD,), None)
        redactor.filter(stray)
        assert PASSWORD not in stray.getMessage()
        redactor.discard([PASSWORD])
        assert redactor.secrets == ()


# ----------------------------------------------------------- integration tests

zk = pytest.mark.zk


@zk
@pytest.mark.asyncio
async def test_znode_layout_is_a_value_a_flag_and_an_epoch_marker(
    zk_server: ZkServer, zk_url: str
) -> None:
    async with opened(zk_url) as coordinator:
        entry = await coordinator.create("groups/g/owners/3", b"m1", ephemeral=True)
        assert entry is not None
        chroot = parse_url(zk_url).chroot
        raw = zk_server.kazoo_client()
        try:
            directory = f"{chroot}/groups/g/owners"
            children = sorted(raw.get_children(directory))
            flag, value = f"{FLAG_PREFIX}3", "3"
            [marker] = [c for c in children if c.startswith(EPOCH_PREFIX)]
            assert children == sorted([flag, value, marker])
            nonce, flag_stat = raw.get(f"{directory}/{flag}")
            assert marker == EPOCH_PREFIX + nonce.decode()
            assert flag_stat.czxid == entry.create_version
            session_id = coordinator.client.client_id[0]
            for name in children:  # one transaction, one session: they die together
                stat = raw.exists(f"{directory}/{name}")
                assert (stat.czxid, stat.ephemeralOwner) == (entry.create_version, session_id)
            assert raw.get(f"{directory}/{value}")[0] == b"m1"
        finally:
            raw.stop()
        # Hidden from the protocol's view.
        assert [e.key for e in await coordinator.list("groups/g/owners/")] == [
            "groups/g/owners/3"
        ]
        assert await coordinator.list("groups/g/") == []


@zk
@pytest.mark.asyncio
async def test_aba_a_stale_owner_fails_although_the_new_znode_looks_the_same(
    zk_server: ZkServer, zk_url: str
) -> None:
    """Owner A's session expires; B re-creates the key; A's guarded commit fails.

    The re-created value znode has the same data version (0) as A's, so a
    plain ZooKeeper ``check`` on it would let A through: shown at the end.
    """
    options = ConnectOptions(session_timeout_s=10.0, connect_timeout_s=30.0)
    async with opened(zk_url, options) as a, opened(zk_url, options) as b:
        owner = await a.create("owners/0", b"a", ephemeral=True)
        assert owner is not None
        assert await a.commit([Check.created_at("owners/0", owner.create_version)],
                              [Put("positions/0", b"10")])

        expire_session(zk_server, a)
        await eventually(lambda: state_is(a, SessionState.LOST), "A's session LOST")
        assert await b.get("owners/0") is None
        successor = await b.create("owners/0", b"b", ephemeral=True)
        assert successor is not None and successor.create_version > owner.create_version
        assert await b.commit([Check.created_at("owners/0", successor.create_version)],
                              [Put("positions/0", b"20")])

        # A knows it is LOST: it refuses to act at all.
        assert a.session.state is SessionState.LOST
        with pytest.raises(SessionLost):
            await a.commit([Check.created_at("owners/0", owner.create_version)],
                           [Put("positions/0", b"11")])
        with pytest.raises(SessionLost):
            await a.create("members/a", b"", ephemeral=True)
        # A stale owner that has not noticed yet (paused, say) sends its
        # commit with the old epoch from a live session: the server refuses.
        async with opened(zk_url, options) as stale:
            assert not await stale.commit(
                [Check.created_at("owners/0", owner.create_version)],
                [Put("positions/0", b"11")],
            )
        position = await b.get("positions/0")
        assert position is not None and position.value == b"20"
        assert await b.get("members/a") is None

        # Why the epoch marker: the value znode alone cannot tell A from B.
        raw = zk_server.kazoo_client()
        try:
            path = f"{parse_url(zk_url).chroot}/owners/0"
            assert raw.get(path)[1].version == 0
            naive = raw.transaction()
            naive.check(path, 0)  # what A read when it owned the key
            assert naive.commit() == [True]
        finally:
            raw.stop()


@zk
@pytest.mark.asyncio
async def test_aba_on_versions_a_recreated_key_with_equal_data_version_fails(
    zk_url: str,
) -> None:
    async with opened(zk_url) as a, opened(zk_url) as b:
        await a.create("assignment", b"v0")
        await a.commit([], [Put("assignment", b"v1")])
        seen = await a.get("assignment")
        assert seen is not None
        # B deletes and re-creates it, written as often: same data version.
        assert await b.delete("assignment")
        await b.create("assignment", b"x0")
        await b.commit([], [Put("assignment", b"x1")])
        assert not await a.commit([Check.at_version("assignment", seen.version)],
                                  [Put("assignment", b"a2")])
        current = await a.get("assignment")
        assert current is not None and current.value == b"x1"


@zk
@pytest.mark.asyncio
async def test_epoch_cache_never_lets_a_dead_incarnation_pass(zk_url: str) -> None:
    """The owner's cached nonce outlives its key: the check fails, never passes."""
    async with opened(zk_url) as a, opened(zk_url) as b:
        owner = await a.create("owners/1", b"a", ephemeral=True)
        assert owner is not None
        assert (("owners/1", owner.create_version)) in a._epochs
        assert await b.delete("owners/1")
        again = await a.create("owners/1", b"a-again", ephemeral=True)
        assert again is not None
        assert not await a.commit([Check.created_at("owners/1", owner.create_version)],
                                  [Put("positions/1", b"x")])
        assert await a.commit([Check.created_at("owners/1", again.create_version)],
                              [Put("positions/1", b"y")])


@zk
@pytest.mark.asyncio
async def test_keys_below_a_key_and_keys_over_a_directory(zk_url: str) -> None:
    async with opened(zk_url) as coordinator:
        assert await coordinator.create("d/a/x", b"x") is not None
        # "d/a" exists as a directory znode only: creating it makes it a key.
        created = await coordinator.create("d/a", b"a")
        assert created is not None and await coordinator.get("d/a") == created
        other = await coordinator.create("d/other", b"")
        assert other is not None and other.create_version > created.create_version - 1
        # Deleting it keeps the znode for its child.
        assert await coordinator.delete("d/a")
        assert await coordinator.get("d/a") is None
        assert [e.key for e in await coordinator.list("d/a/")] == ["d/a/x"]
        # An ephemeral key cannot sit over keys (ZooKeeper forbids children).
        with pytest.raises(ConfigError):
            await coordinator.create("d/a", b"", ephemeral=True)
        assert await coordinator.commit([Check.is_absent("d/a")], [Put("d/a", b"again")])
        again = await coordinator.get("d/a")
        assert again is not None and again.create_version > created.create_version
        # A key under an ephemeral key: refused with one line.
        await coordinator.create("e/k", b"", ephemeral=True)
        with pytest.raises(ConfigError) as caught:
            await coordinator.create("e/k/child", b"")
        assert "\n" not in str(caught.value)


@zk
@pytest.mark.asyncio
async def test_session_timeout_is_the_one_the_server_grants(zk_url: str) -> None:
    # The test server's maxSessionTimeout is 60 s.
    async with opened(zk_url, ConnectOptions(session_timeout_s=120.0)) as coordinator:
        assert coordinator.session.timeout_s == pytest.approx(60.0, abs=0.01)
        assert coordinator.session.deadline < time.monotonic() + 61
        assert coordinator.session.is_live()


HOLDER = r"""
import asyncio, sys
from coordinators import (Check, ConnectOptions, Put, SessionLost, SessionState,
                          open_coordinator)

async def main(url, key, timeout):
    coord = open_coordinator(url, ConnectOptions(session_timeout_s=timeout))
    await coord.connect()
    lost = asyncio.Event()
    def on_state(state):
        print("STATE", state.value, flush=True)
        if state is SessionState.LOST:
            lost.set()
    coord.session.add_listener(on_state)
    entry = await coord.create(key, b"holder", ephemeral=True)
    print("READY", entry.create_version, flush=True)
    await lost.wait()
    print("LIVE", coord.session.is_live(), flush=True)
    try:
        ok = await coord.commit([Check.created_at(key, entry.create_version)],
                                [Put("positions/0", b"from-the-stale-holder")])
        print("COMMIT", ok, flush=True)
    except SessionLost:
        print("COMMIT SessionLost", flush=True)
    try:
        await coord.create(key + "-again", b"", ephemeral=True)
        print("CREATE ok", flush=True)
    except SessionLost:
        print("CREATE SessionLost", flush=True)
    await coord.close()

asyncio.run(main(sys.argv[1], sys.argv[2], float(sys.argv[3])))
"""


def open_log(path: Path) -> BinaryIO:
    """A local log file for a child's stderr (opening it does not block)."""
    return open(path, "wb")


class Process:
    """A holder process, read line by line."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.lines: list[str] = []

    async def expect(self, prefix: str, limit_s: float = LIMIT_S) -> str:
        assert self.process.stdout is not None
        while True:
            for line in self.lines:
                if line.startswith(prefix):
                    self.lines.remove(line)
                    return line
            raw = await asyncio.wait_for(self.process.stdout.readline(), limit_s)
            if not raw:
                raise AssertionError(f"holder exited before printing {prefix!r}: {self.lines}")
            self.lines.append(raw.decode().strip())


@zk
@pytest.mark.asyncio
@pytest.mark.timeout(300)
async def test_sigstopped_holder_expires_goes_lost_and_its_writes_are_rejected(
    zk_url: str, tmp_path: Path
) -> None:
    async with opened(zk_url) as observer:
        await observer.create("positions/0", b"0")
        with open_log(tmp_path / "holder.log") as stderr:
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-c", HOLDER, zk_url, "owners/0", "2.0",
                cwd=REPO_ROOT, stdout=asyncio.subprocess.PIPE, stderr=stderr,
            )
        holder = Process(process)
        try:
            create_version = int((await holder.expect("READY")).split()[1])
            process.send_signal(signal.SIGSTOP)

            async def gone() -> bool:
                return await observer.get("owners/0") is None

            await eventually(gone, "the stopped holder's key expired")
            successor = await observer.create("owners/0", b"observer", ephemeral=True)
            assert successor is not None and successor.create_version > create_version
            assert await observer.commit([Check.created_at("owners/0", successor.create_version)],
                                         [Put("positions/0", b"1")])
            process.send_signal(signal.SIGCONT)

            await holder.expect("STATE lost")
            assert await holder.expect("LIVE") == "LIVE False"
            assert await holder.expect("COMMIT") == "COMMIT SessionLost"
            assert await holder.expect("CREATE") == "CREATE SessionLost"
            assert await asyncio.wait_for(process.wait(), LIMIT_S) == 0
        finally:
            if process.returncode is None:
                process.send_signal(signal.SIGCONT)
                process.kill()
                await process.wait()
        position = await observer.get("positions/0")
        assert position is not None and position.value == b"1"
        owner = await observer.get("owners/0")
        assert owner is not None and owner.create_version == successor.create_version
        assert await observer.get("owners/0-again") is None


@zk
@pytest.mark.asyncio
@pytest.mark.timeout(300)
async def test_short_server_pause_suspends_then_the_same_session_resumes(
    zk_server_factory: Callable[..., ZkServer],
) -> None:
    server = zk_server_factory()
    url = server.unique_url()
    states: list[SessionState] = []
    # 15 s: the pause below lasts about two thirds of it at worst.
    options = ConnectOptions(session_timeout_s=15.0, connect_timeout_s=30.0)
    async with opened(url, options) as coordinator, opened(url, options) as observer:
        coordinator.session.add_listener(states.append)
        session_id = coordinator.session.id
        owner = await coordinator.create("owners/0", b"me", ephemeral=True)
        assert owner is not None
        server.pause()
        try:
            await eventually(lambda: state_is(coordinator, SessionState.SUSPENDED),
                             "SUSPENDED while the server is paused", limit_s=14.0)
            with pytest.raises(SessionSuspended):
                await coordinator.create("members/me", b"", ephemeral=True)
            assert not coordinator.session.is_live()
        finally:
            server.resume()
        await eventually(lambda: state_is(coordinator, SessionState.CONNECTED),
                         "CONNECTED again after the pause")
        assert coordinator.session.id == session_id
        assert coordinator.session.is_live()
        held = await observer.get("owners/0")
        assert held is not None and held.create_version == owner.create_version
        assert await coordinator.commit([Check.created_at("owners/0", owner.create_version)],
                                        [Put("positions/0", b"1")])
        assert SessionState.LOST not in states
        assert states[0] is SessionState.SUSPENDED and states[-1] is SessionState.CONNECTED


@zk
@pytest.mark.asyncio
@pytest.mark.timeout(300)
async def test_server_restart_keeps_the_session_and_rearms_watches(
    zk_server_factory: Callable[..., ZkServer],
) -> None:
    server = zk_server_factory()
    url = server.unique_url()
    # Long enough for a JVM restart on a loaded machine: past the deadline
    # without contact, the session would (rightly) count as LOST.
    options = ConnectOptions(session_timeout_s=45.0, connect_timeout_s=30.0)
    async with opened(url, options) as coordinator:
        session_id = coordinator.session.id
        owner = await coordinator.create("members/me", b"", ephemeral=True)
        assert owner is not None
        async with coordinator.watch("members/") as watch:
            while await watch.wait(timeout=0.3):
                pass
            server.kill()
            await eventually(lambda: state_is(coordinator, SessionState.SUSPENDED),
                             "SUSPENDED once the server is gone")
            server.start()
            await eventually(lambda: state_is(coordinator, SessionState.CONNECTED),
                             "CONNECTED to the restarted server")
            assert coordinator.session.id == session_id
            # A reconnection is reported as a (possibly spurious) change...
            assert await watch.wait(timeout=LIMIT_S)
            while await watch.wait(timeout=0.3):
                pass
            # ...and the watch is armed again on the restarted server.
            async with opened(url, options) as other:
                await other.create("members/other", b"", ephemeral=True)
                assert await watch.wait(timeout=LIMIT_S)
            held = await coordinator.get("members/me")
            assert held is not None and held.create_version == owner.create_version
            assert await coordinator.commit([Check.created_at("members/me", owner.create_version)],
                                            [Put("positions/0", b"1")])


@zk
@pytest.mark.asyncio
@pytest.mark.timeout(300)
async def test_no_contact_for_a_whole_session_timeout_is_lost_for_good(
    zk_server_factory: Callable[..., ZkServer],
) -> None:
    """A server paused past the timeout: the session is LOST, kazoo is stopped."""
    server = zk_server_factory()
    url = server.unique_url()
    options = ConnectOptions(session_timeout_s=3.0, connect_timeout_s=30.0)
    coordinator = open_coordinator(url, options)
    await coordinator.connect()
    try:
        assert isinstance(coordinator, ZooKeeperCoordinator)
        owner = await coordinator.create("owners/0", b"me", ephemeral=True)
        assert owner is not None
        watch = coordinator.watch("owners/")
        server.pause()
        try:
            await eventually(lambda: state_is(coordinator, SessionState.LOST),
                             "LOST after a whole timeout without contact")
        finally:
            server.resume()
        with pytest.raises(SessionLost):
            await watch.wait(timeout=1.0)
        with pytest.raises(SessionLost):
            await coordinator.get("owners/0")
        with pytest.raises(SessionLost):
            await coordinator.commit([Check.created_at("owners/0", owner.create_version)],
                                     [Put("positions/0", b"x")])

        async def kazoo_stopped() -> bool:
            return not coordinator.client.connected

        # No replacement session lives on behind the LOST one.
        await eventually(kazoo_stopped, "kazoo stopped after LOST")
        async with opened(url, options) as successor:

            async def expired() -> bool:
                return await successor.get("owners/0") is None

            await eventually(expired, "the lost session's key expired on the server")
            assert await successor.get("positions/0") is None
    finally:
        await coordinator.close()


# ---------------------------------------------------------------- security


def digest_options(password: str = PASSWORD, **kwargs: Any) -> ConnectOptions:
    return ConnectOptions(
        username="alice", password=Secret(password), connect_timeout_s=20.0,
        allow_plaintext_credentials=True, **kwargs
    )


def sasl_options(password: str = PASSWORD, **kwargs: Any) -> ConnectOptions:
    return ConnectOptions(
        username="alice", password=Secret(password), auth_scheme="sasl",
        connect_timeout_s=20.0, **kwargs,
    )


async def exercise(coordinator: Any) -> None:
    """Creates every kind of znode the backend makes."""
    owner = await coordinator.create("groups/g/owners/0", b"m", ephemeral=True)
    await coordinator.create("groups/g/members/m", b"", ephemeral=True)
    await coordinator.create("groups/g/meta", b"{}")
    await coordinator.create("deep/a/b/c", b"")
    await coordinator.create("deep/a", b"over a directory")
    assert await coordinator.commit(
        [Check.created_at("groups/g/owners/0", owner.create_version),
         Check.is_absent("groups/g/fence")],
        [Put("groups/g/positions/0", b"1"), Delete("groups/g/never")],
    )


def audit(server: ZkServer, chroot: str, identity: tuple[str, str]) -> list[str]:
    """Every znode under ``chroot`` grants rights to ``identity`` only; returns them."""
    admin = server.super_client()
    try:
        znodes = walk(admin, chroot)
        for path in znodes:
            acls, _ = admin.get_acls(path)
            ids = {(acl.id.scheme, acl.id.id) for acl in acls}
            assert ("world", "anyone") not in ids, f"{path} is open to world:anyone"
            assert ids == {identity}, f"{path} grants {ids}"
        return znodes
    finally:
        admin.stop()


def assert_anonymous_locked_out(server: ZkServer, znodes: list[str]) -> None:
    anonymous = server.kazoo_client()
    try:
        for path in znodes:
            with pytest.raises(NoAuthError):
                anonymous.get(path)
            with pytest.raises((NoAuthError, NoNodeError)):
                anonymous.set(path, b"vandal")
            with pytest.raises(NoAuthError):
                anonymous.create(f"{path}/intruder", b"")
    finally:
        anonymous.stop()


@zk
@pytest.mark.asyncio
async def test_acl_audit_digest_every_znode_is_creator_only(
    zk_server_factory: Callable[..., ZkServer],
) -> None:
    server = zk_server_factory()
    url = server.unique_url(acl=None)
    async with opened(url, digest_options()) as coordinator:
        await exercise(coordinator)
        digest = make_digest_acl_credential("alice", PASSWORD)
        znodes = audit(server, parse_url(url).chroot, ("digest", digest))
        assert any(EPOCH_PREFIX in z for z in znodes) and any(FLAG_PREFIX in z for z in znodes)
        assert_anonymous_locked_out(server, znodes)
        # The same user from another process reads and writes them.
        async with opened(url, digest_options()) as peer:
            entry = await peer.get("groups/g/meta")
            assert entry is not None and entry.value == b"{}"
            assert await peer.commit([], [Put("groups/g/meta", b"{1}")])


@zk
@pytest.mark.asyncio
async def test_acl_audit_sasl_every_znode_is_creator_only(
    zk_server_factory: Callable[..., ZkServer],
) -> None:
    server = zk_server_factory(sasl_users={"alice": PASSWORD}, require_auth="sasl")
    url = server.unique_url(acl=None)
    async with opened(url, sasl_options()) as coordinator:
        await exercise(coordinator)
        znodes = audit(server, parse_url(url).chroot, ("sasl", "alice"))
    # The server refuses anonymous sessions outright here; the ACLs are the
    # second line of defence, audited above.
    assert len(znodes) > 10


@zk
@pytest.mark.asyncio
async def test_explicit_acl_list_is_applied(zk_server_factory: Callable[..., ZkServer]) -> None:
    server = zk_server_factory()
    url = server.unique_url(acl=None)
    async with opened(url, digest_options(acl="creator,world:anyone:r")) as coordinator:
        await coordinator.create("k", b"v")
        admin = server.super_client()
        try:
            acls, _ = admin.get_acls(f"{parse_url(url).chroot}/k")
        finally:
            admin.stop()
        assert {(a.id.scheme, a.perms) for a in acls} == {("digest", 31), ("world", 1)}


@zk
@pytest.mark.asyncio
async def test_wrong_digest_password_is_refused_with_one_line(
    zk_server_factory: Callable[..., ZkServer],
) -> None:
    server = zk_server_factory()
    url = server.unique_url(acl=None)
    async with opened(url, digest_options()) as owner:
        await owner.create("k", b"v")
    intruder = open_coordinator(url, digest_options(WRONG_PASSWORD))
    with pytest.raises(AuthenticationFailed) as caught:
        await intruder.connect()
    message = str(caught.value)
    assert "\n" not in message and WRONG_PASSWORD not in message and PASSWORD not in message
    assert "credentials" in message


@zk
@pytest.mark.asyncio
async def test_wrong_sasl_password_and_missing_credentials_are_refused(
    zk_server_factory: Callable[..., ZkServer],
) -> None:
    server = zk_server_factory(sasl_users={"alice": PASSWORD}, require_auth="sasl")
    url = server.unique_url(acl=None)
    wrong = open_coordinator(url, sasl_options(WRONG_PASSWORD))
    with pytest.raises(AuthenticationFailed) as caught:
        await wrong.connect()
    message = str(caught.value)
    assert "\n" not in message and WRONG_PASSWORD not in message
    anonymous = open_coordinator(
        server.unique_url(acl="open"), ConnectOptions(connect_timeout_s=20.0)
    )
    with pytest.raises(AuthenticationFailed, match="requires authentication") as caught:
        await anonymous.connect()
    assert "\n" not in str(caught.value)


@zk
@pytest.mark.asyncio
async def test_credentials_never_reach_reprs_messages_or_logs(
    zk_server_factory: Callable[..., ZkServer], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(1)  # everything, kazoo's BLATHER and DEBUG packet logs included
    caplog.set_level(1, logger="coordinators.zookeeper.kazoo")
    server = zk_server_factory(sasl_users={"alice": PASSWORD})
    for options in (digest_options(), sasl_options()):
        url = server.unique_url(acl=None)
        coordinator = open_coordinator(url, options)
        assert PASSWORD not in repr(coordinator) + repr(options) + coordinator.url
        await coordinator.connect()
        try:
            await coordinator.create("k", b"v")
            assert PASSWORD not in repr(coordinator) + repr(coordinator.session)
        finally:
            await coordinator.close()
    refused = open_coordinator(server.unique_url(acl=None), sasl_options(WRONG_PASSWORD))
    with pytest.raises(AuthenticationFailed) as caught:
        await refused.connect()
    assert WRONG_PASSWORD not in str(caught.value) + repr(caught.value)
    assert "Auth(<redacted>)" in caplog.text  # the digest packet was logged, redacted
    assert PASSWORD not in caplog.text and WRONG_PASSWORD not in caplog.text


@zk
@pytest.mark.asyncio
async def test_tls_with_certificate_and_host_name_verification(
    zk_server_factory: Callable[..., ZkServer], zk_tls: TlsMaterial
) -> None:
    server = zk_server_factory(tls=zk_tls)
    tls = {
        "tls_ca": str(zk_tls.ca),
        "tls_cert": str(zk_tls.client_cert),
        "tls_key": str(zk_tls.client_key),
    }
    # The certificate names localhost: dialled by that name, it verifies.
    url = server.unique_url(server.tls_url, acl=None)
    async with opened(url, ConnectOptions(connect_timeout_s=20.0, **tls)) as coordinator:
        entry = await coordinator.create("k", b"over TLS")
        assert entry is not None and await coordinator.get("k") == entry
        admin = server.super_client()
        try:
            acls, _ = admin.get_acls(f"{parse_url(url).chroot}/k")
        finally:
            admin.stop()
        # Creator-only through the client certificate's x509 identity.
        assert {(a.id.scheme, a.id.id) for a in acls} == {("x509", "CN=zk-client")}

    # Dialled by IP address, the certificate does not match: refused.
    by_ip = server.unique_url(f"zk://127.0.0.1:{server.secure_port}", acl=None)
    with pytest.raises(AuthenticationFailed) as caught:
        await open_coordinator(by_ip, ConnectOptions(connect_timeout_s=3.0, **tls)).connect()
    assert "\n" not in str(caught.value) and "certificate" in str(caught.value).lower()

    # A CA that did not sign the server's certificate: refused.
    untrusted = {**tls, "tls_ca": str(zk_tls.other_ca)}
    with pytest.raises(AuthenticationFailed) as caught:
        await open_coordinator(url, ConnectOptions(connect_timeout_s=3.0, **untrusted)).connect()
    assert "\n" not in str(caught.value) and "verif" in str(caught.value)


@pytest.mark.asyncio
async def test_unreachable_server_fails_with_one_line() -> None:
    coordinator = open_coordinator(
        "zk://127.0.0.1:1/x?acl=open", ConnectOptions(connect_timeout_s=1.0)
    )
    with pytest.raises(CoordinatorUnavailable) as caught:
        await coordinator.connect()
    assert "\n" not in str(caught.value)
    with pytest.raises(CoordinatorError):
        await coordinator.get("k")


# -- kazoo's handler ----------------------------------------------------------


def test_the_handler_waits_with_poll_and_never_builds_an_epoll(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """kazoo's own select semantics (ready lists, timeout), over poll(2): the
    default selector (an epoll instance per wait) is never made."""
    import selectors
    import socket

    from coordinators.zookeeper.handler import PollingHandler

    def no_epoll(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a DefaultSelector was made")

    monkeypatch.setattr(selectors, "DefaultSelector", no_epoll)
    a, b = socket.socketpair()
    try:
        handler = PollingHandler()
        started = time.monotonic()
        readable, writable, _ = handler.select([a], [b], [], 0.2)
        assert readable == [] and writable == [b]
        readable, _, _ = handler.select([a], [], [], 0.2)
        assert readable == [] and time.monotonic() - started >= 0.15  # waited
        b.send(b"\0")
        readable, _, _ = handler.select([a], [], [], 5)
        assert readable == [a]
    finally:
        a.close()
        b.close()


@pytest.mark.asyncio
async def test_every_kazoo_client_gets_the_polling_handler(zk_url: str) -> None:
    from coordinators.zookeeper.handler import PollingHandler

    async with open_coordinator(f"{zk_url}&client=kazoo") as coord:
        assert isinstance(coord.client.handler, PollingHandler)  # type: ignore[attr-defined]
        assert await coord.create("k", b"v") is not None
