"""The etcd backend against real etcd processes: crashes, pauses, TLS, auth,
token expiry, endpoint failover, compaction, and credential hygiene.

The protocol itself is covered by the conformance suite (``tests/conformance``)
through the ``etcd_url`` fixture; these tests cover what only etcd has.
Servers that are killed, paused or secured are the test's own
(``etcd_server_factory``), never the shared one.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import grpc  # type: ignore[import-untyped]
import pytest
from aetcd import rpc

from coordinators import (
    AuthenticationFailed,
    Check,
    ConfigError,
    ConnectOptions,
    CoordinatorUnavailable,
    Delete,
    InvalidCoordinatorURL,
    Put,
    Secret,
    SessionLost,
    SessionState,
    open_coordinator,
)
from coordinators.etcd import (
    EtcdCoordinator,
    EtcdTarget,
    EtcdWatch,
    Failure,
    classify,
    parse_etcd_url,
    translate_error,
)
from tests.support import etcd_server as etcd_support
from tests.support.etcd_server import ROOT_PASSWORD, EtcdCluster, EtcdServer, Pki, free_port
from tests.support.waiting import eventually

Factory = Callable[..., EtcdServer]
ClusterFactory = Callable[..., EtcdCluster]


def secure_options(pki: Pki, **overrides: Any) -> ConnectOptions:
    values: dict[str, Any] = dict(
        username="root",
        password=Secret(ROOT_PASSWORD),
        tls_ca=str(pki.ca),
        tls_cert=str(pki.client_cert),
        tls_key=str(pki.client_key),
        connect_timeout_s=5.0,
    )
    values.update(overrides)
    return ConnectOptions(**values)


def assert_one_line_without_secrets(err: BaseException) -> None:
    message = str(err)
    assert "\n" not in message
    assert ROOT_PASSWORD not in message
    assert "wrong-Pa55" not in message
    assert "token" not in message.lower() or "invalid auth token" in message.lower()


# -- URL parsing (no server) ---------------------------------------------------


def test_parse_url_endpoints_prefix_and_tls() -> None:
    assert parse_etcd_url("etcd://h1:1,h2/app/env") == EtcdTarget(
        ("h1:1", "h2:2379"), "app/env/", False
    )
    assert parse_etcd_url("etcds://[::1]:2379") == EtcdTarget(("[::1]:2379",), "", True)
    assert parse_etcd_url("etcd://127.0.0.1:2379/").prefix == ""


@pytest.mark.parametrize(
    "url",
    [
        "etcd://",
        "etcd://user:hunter2@h:1/p",
        "etcd://h:1/p?password=hunter2",
        "etcd://h:99999",
        "etcd://h:1/a//b",
        "etcd://h:1/a b",
        "zk://h:1",
    ],
)
def test_bad_urls_fail_with_one_line(url: str) -> None:
    with pytest.raises(InvalidCoordinatorURL) as info:
        EtcdCoordinator(url)
    assert "\n" not in str(info.value)
    assert "hunter2" not in str(info.value)


def test_half_credentials_and_half_client_cert_are_config_errors(tmp_path: Any) -> None:
    with pytest.raises(ConfigError, match="username and a password"):
        EtcdCoordinator("etcd://h:1", ConnectOptions(username="root"))
    cert = tmp_path / "c.pem"
    cert.write_text("x")
    with pytest.raises(ConfigError, match="tls_cert and tls_key"):
        EtcdCoordinator("etcds://h:1", ConnectOptions(tls_cert=str(cert)))
    with pytest.raises(ConfigError, match="cannot read TLS CA"):
        EtcdCoordinator("etcds://h:1", ConnectOptions(tls_ca=str(tmp_path / "missing.pem")))


def test_repr_and_str_never_show_credentials() -> None:
    options = ConnectOptions(username="root", password=Secret(ROOT_PASSWORD),
                             allow_plaintext_credentials=True)
    coord = open_coordinator("etcd://127.0.0.1:1,127.0.0.1:2/app", options)
    for text in (repr(coord), str(coord), repr(options), str(options), coord.url):
        assert ROOT_PASSWORD not in text
    assert repr(coord) == "EtcdCoordinator('etcd://127.0.0.1:1,127.0.0.1:2/app')"


class _FakeRpcError(grpc.RpcError):  # type: ignore[misc]
    """A unit-test stand-in for a gRPC error (code + details)."""

    def __init__(self, code: Any, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> Any:
        return self._code

    def details(self) -> str:
        return self._details


@pytest.mark.parametrize(
    ("code", "details", "kind"),
    [
        (grpc.StatusCode.UNAUTHENTICATED, "etcdserver: invalid auth token", Failure.TOKEN),
        (grpc.StatusCode.INVALID_ARGUMENT,
         "etcdserver: authentication failed, invalid user ID or password", Failure.AUTH),
        (grpc.StatusCode.UNAVAILABLE,
         "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: "
         "Tls handshake failed (TSI_PROTOCOL_FAILURE): CERTIFICATE_VERIFY_FAILED", Failure.TLS),
        (grpc.StatusCode.UNAVAILABLE,
         "failed to connect to all addresses; last error: Connection refused",
         Failure.NOT_APPLIED),
        (grpc.StatusCode.UNAVAILABLE, "Socket closed", Failure.AMBIGUOUS),
        (grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded", Failure.AMBIGUOUS),
        (grpc.StatusCode.NOT_FOUND, "etcdserver: requested lease not found", Failure.LEASE_GONE),
        (grpc.StatusCode.OUT_OF_RANGE, "mvcc: required revision has been compacted",
         Failure.COMPACTED),
        (grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: duplicate key given in txn request",
         Failure.FATAL),
    ],
)
def test_classify_and_translate(code: Any, details: str, kind: Failure) -> None:
    err = _FakeRpcError(code, details + "\n second line")
    assert classify(err) is kind
    translated = translate_error(err, "get 'k'", ["127.0.0.1:1"], username="root")
    assert "\n" not in str(translated)
    expected = {
        Failure.TOKEN: CoordinatorUnavailable,
        Failure.AUTH: AuthenticationFailed,
        Failure.TLS: AuthenticationFailed,
        Failure.NOT_APPLIED: CoordinatorUnavailable,
        Failure.AMBIGUOUS: CoordinatorUnavailable,
        Failure.LEASE_GONE: SessionLost,
    }.get(kind)
    if expected is not None:
        assert isinstance(translated, expected)
    assert translated.retriable == (kind in (Failure.TOKEN, Failure.NOT_APPLIED,
                                             Failure.AMBIGUOUS))


def test_missing_etcd_fails_in_ci_and_skips_elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(etcd_support, "etcd_binary", lambda: None)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="etcd binary not found"):
        etcd_support.require_etcd()
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception):
        etcd_support.require_etcd()


# -- against the shared server ---------------------------------------------------


@pytest.mark.etcd
@pytest.mark.asyncio
async def test_keys_live_under_the_url_prefix(etcd_server: EtcdServer, etcd_url: str) -> None:
    prefix = etcd_url.rsplit("/", 1)[1]
    async with open_coordinator(etcd_url) as coord:
        created = await coord.create("groups/g/meta", b"m")
        assert created is not None
        assert (await coord.get("groups/g/meta")) == created
    channel = etcd_server.grpc_channel(grpc)
    try:
        response = rpc.KVStub(channel).Range(
            rpc.RangeRequest(key=f"{prefix}/groups/g/meta".encode()), timeout=10
        )
    finally:
        channel.close()
    assert [kv.value for kv in response.kvs] == [b"m"]
    async with open_coordinator(etcd_server.url_with_prefix()) as other:
        assert await other.get("groups/g/meta") is None


@pytest.mark.etcd
@pytest.mark.asyncio
async def test_create_and_commit_map_to_revisions(etcd_url: str) -> None:
    async with open_coordinator(etcd_url) as coord:
        owner = await coord.create("owners/0", b"m1", ephemeral=True)
        assert owner is not None and owner.ephemeral
        assert owner.version == owner.create_version
        assert await coord.create("owners/0", b"m2", ephemeral=True) is None
        assert await coord.commit(
            [Check.created_at("owners/0", owner.create_version), Check.is_absent("x")],
            [Put("positions/0", b"5")],
        )
        position = await coord.get("positions/0")
        assert position is not None and position.create_version > owner.create_version
        assert not await coord.commit(
            [Check.created_at("owners/0", owner.create_version + 1000)],
            [Put("positions/0", b"6")],
        )
        assert await coord.commit(
            [Check.at_version("positions/0", position.version)],
            [Put("positions/0", b"7"), Delete("owners/0")],
        )
        assert await coord.get("owners/0") is None

        # etcd writes a key once per transaction: a commit keeps the last
        # operation per key, and refuses delete-then-recreate (a new epoch).
        assert await coord.commit([], [Put("a", b"1"), Put("a", b"2"), Put("b", b"")])
        assert (a := await coord.get("a")) is not None and a.value == b"2"
        assert await coord.commit([], [Put("b", b"x"), Delete("b")])
        assert await coord.get("b") is None
        with pytest.raises(ConfigError, match="deletes then re-creates 'a'"):
            await coord.commit([], [Delete("a"), Put("a", b"3")])
        assert (await coord.get("a")) == a


@pytest.mark.etcd
@pytest.mark.asyncio
async def test_watch_reports_direct_children_only(etcd_url: str) -> None:
    async with open_coordinator(etcd_url) as coord:
        await coord.create("d/seed", b"")
        async with coord.watch("d/") as watch:
            await coord.create("d/child/deeper", b"")
            await coord.create("dx", b"")  # a sibling of the directory, not in it
            assert not await watch.wait(timeout=1.0)
            await coord.create("d/child", b"")
            assert await watch.wait(timeout=30)
            assert not await watch.wait(timeout=0.2)
            await coord.delete("d/seed")
            assert await watch.wait(timeout=30)


@pytest.mark.etcd
@pytest.mark.asyncio
async def test_watch_is_quiet_until_a_direct_child_changes(
    etcd_server_factory: Factory,
) -> None:
    # A server of our own that sends a progress notification every 100 ms,
    # and a 2 s session renewed every 0.67 s holding a key in the watched
    # directory: neither may wake the watch. (A 1 s session could expire on a
    # loaded machine, and its key's deletion is a real change.)
    server = etcd_server_factory(
        extra_args=("--experimental-watch-progress-notify-interval=100ms",)
    )
    url = server.url_with_prefix()
    holder = open_coordinator(url, ConnectOptions(session_timeout_s=2))
    await holder.connect()
    try:
        async with open_coordinator(url) as coord, open_coordinator(url) as writer:
            assert await holder.create("g/owners/0", b"m1", ephemeral=True) is not None
            await coord.get("g/owners/0")  # the revision the watch starts after
            async with coord.watch("g/owners/") as watch:
                assert isinstance(watch, EtcdWatch)
                stop = asyncio.Event()
                last_revision = 0

                async def elsewhere() -> None:
                    # Deeper keys, sibling directories sharing the name's
                    # prefix, the parent: everything changes but the children.
                    nonlocal last_revision
                    i = 0
                    while not stop.is_set():
                        for key in ("g/owners/sub/x", "g/owners-old/0", "g/ownersx",
                                    "g/leader", "h/owners/0"):
                            await writer.commit([], [Put(key, str(i).encode())])
                        entry = await writer.get("g/owners/sub/x")
                        assert entry is not None
                        last_revision = entry.version
                        i += 1
                        await asyncio.sleep(0.05)

                task = asyncio.create_task(elsewhere())
                try:
                    assert not await watch.wait(timeout=3.0)
                finally:
                    stop.set()
                    await task
                # The stream was alive all along: it went past the deeper writes.
                await eventually(lambda: watch.next_revision > last_revision, what="stream")
                assert not await watch.wait(timeout=0.5)
                assert watch.rearms == 0

                # Every real change of a direct child wakes it, each one
                # preceded by a change elsewhere.
                changes: list[Callable[[], Awaitable[object]]] = [
                    lambda: writer.create("g/owners/1", b"m2"),
                    lambda: writer.commit([], [Put("g/owners/1", b"m3")]),
                    lambda: writer.delete("g/owners/1"),
                    holder.close,  # revokes the lease: g/owners/0 goes
                ]
                for change in changes:
                    await writer.commit([], [Put("g/owners/sub/x", b"-")])
                    await change()
                    assert await watch.wait(timeout=30)
                    assert not await watch.wait(timeout=0.3)
                assert await writer.get("g/owners/0") is None
    finally:
        await holder.close()


@pytest.mark.etcd
@pytest.mark.asyncio
async def test_watch_on_a_compacted_revision_rearms_from_a_fresh_read(
    etcd_server: EtcdServer, etcd_url: str
) -> None:
    async with open_coordinator(etcd_url) as coord, open_coordinator(etcd_url) as writer:
        await coord.get("w/x")  # the revision the watch will start after
        for i in range(5):
            await writer.create(f"w/{i}", b"")
        revision = (await writer.list("w/"))[-1].version
        channel = etcd_server.grpc_channel(grpc)
        try:
            rpc.KVStub(channel).Compact(
                rpc.CompactionRequest(revision=revision, physical=True), timeout=10
            )
        finally:
            channel.close()
        watch = coord.watch("w/")
        try:
            # The start revision is compacted: the watch re-reads and reports.
            assert await watch.wait(timeout=30)
            assert watch.rearms == 1
            await writer.create("w/after", b"")
            assert await watch.wait(timeout=30)
        finally:
            await watch.close()


@pytest.mark.etcd
@pytest.mark.asyncio
async def test_keepalive_survives_a_blocked_event_loop(etcd_url: str) -> None:
    options = ConnectOptions(session_timeout_s=2)
    async with open_coordinator(etcd_url, options) as coord, open_coordinator(etcd_url) as peer:
        assert await coord.create("members/m1", b"", ephemeral=True) is not None
        first_deadline = coord.session.deadline
        # Deliberately block the loop (not the keep-alive thread).
        time.sleep(3 * coord.session.timeout_s)  # noqa: ASYNC251
        await eventually(lambda: coord.session.deadline > first_deadline + 2, what="keep-alive")
        assert coord.session.state is SessionState.CONNECTED
        assert await peer.get("members/m1") is not None


@pytest.mark.etcd
@pytest.mark.asyncio
async def test_close_revokes_the_lease_at_once(etcd_url: str) -> None:
    async with open_coordinator(etcd_url) as peer:
        coord = open_coordinator(etcd_url, ConnectOptions(session_timeout_s=60))
        await coord.connect()
        states: list[SessionState] = []
        coord.session.add_listener(states.append)
        await coord.create("members/m1", b"", ephemeral=True)
        await coord.close()
        assert states == [SessionState.LOST]
        assert await peer.get("members/m1") is None
        with pytest.raises(SessionLost):
            await coord.create("members/m1", b"", ephemeral=True)


# -- crashes and pauses (servers of the test's own) -------------------------------


@pytest.mark.etcd
@pytest.mark.chaos
@pytest.mark.slow
@pytest.mark.asyncio
async def test_sigkill_and_restart_while_a_session_is_held(
    etcd_server_factory: Factory,
) -> None:
    server = etcd_server_factory()
    url = server.url_with_prefix("app")
    coord = open_coordinator(url, ConnectOptions(session_timeout_s=6, connect_timeout_s=5))
    await coord.connect()
    try:
        states: list[SessionState] = []
        coord.session.add_listener(states.append)
        member = await coord.create("members/m1", b"me", ephemeral=True)
        assert member is not None
        assert await coord.commit([], [Put("positions/0", b"41")])
        watch = coord.watch("positions/")

        await asyncio.to_thread(server.kill)
        await eventually(lambda: coord.session.state is not SessionState.CONNECTED,
                         what="SUSPENDED after SIGKILL")
        assert coord.session.state is SessionState.SUSPENDED
        with pytest.raises(CoordinatorUnavailable):
            await coord.get("positions/0")

        await asyncio.to_thread(server.start)
        await eventually(lambda: coord.session.state is not SessionState.SUSPENDED,
                         what="the session to recover or be lost")
        position = await coord.get("positions/0")
        assert position is not None and position.value == b"41"  # persisted
        owner = await coord.get("members/m1")
        if coord.session.state is SessionState.CONNECTED:
            # etcd restores leases on restart: same lease, same ephemeral key.
            assert owner == member
            assert states == [SessionState.SUSPENDED, SessionState.CONNECTED]
        else:
            assert coord.session.state is SessionState.LOST
            assert owner is None
        # The watch re-armed (and said so) and still sees new changes.
        assert await watch.wait(timeout=30)
        assert await coord.commit(
            [Check.at_version("positions/0", position.version)], [Put("positions/0", b"42")]
        )
        assert await watch.wait(timeout=30)
        await watch.close()
    finally:
        await coord.close()


@pytest.mark.etcd
@pytest.mark.chaos
@pytest.mark.slow
@pytest.mark.asyncio
async def test_sigstop_past_the_lease_ttl_expires_every_session(
    etcd_server_factory: Factory,
) -> None:
    server = etcd_server_factory()
    url = server.url_with_prefix("app")
    options = ConnectOptions(session_timeout_s=1, connect_timeout_s=3)
    members = [open_coordinator(url, options) for _ in range(3)]
    for i, member in enumerate(members):
        await member.connect()
        assert await member.create(f"members/m{i}", b"", ephemeral=True) is not None
    try:
        await member.commit([], [Put("positions/0", b"9")])
        ttl = max(m.session.timeout_s for m in members)
        await asyncio.to_thread(server.pause)
        try:
            await eventually(lambda: all(not m.session.is_live() for m in members),
                             what="deadlines to pass")
            assert all(m.session.state is SessionState.SUSPENDED for m in members)
            await asyncio.sleep(ttl + 1)  # well past the TTL, on etcd's clock too
        finally:
            await asyncio.to_thread(server.resume)
        await eventually(lambda: all(m.session.state is SessionState.LOST for m in members),
                         what="every session LOST")
        for member in members:
            with pytest.raises(SessionLost):
                await member.create("members/again", b"", ephemeral=True)
        async with open_coordinator(url, options) as fresh:
            assert await fresh.list("members/") == []
            assert (await fresh.get("positions/0")) is not None  # persistent data stays
            assert await fresh.create("members/m0", b"", ephemeral=True) is not None
            assert fresh.session.state is SessionState.CONNECTED
    finally:
        for member in members:
            await member.close()


# -- failover -------------------------------------------------------------------


@pytest.mark.etcd
@pytest.mark.asyncio
async def test_first_endpoint_dead_second_alive(etcd_server: EtcdServer) -> None:
    dead = f"127.0.0.1:{free_port()}"
    url = f"etcd://{dead},{etcd_server.endpoint}/t-{uuid.uuid4().hex[:12]}"
    async with open_coordinator(url, ConnectOptions(session_timeout_s=2)) as coord:
        assert await coord.create("members/m1", b"", ephemeral=True) is not None
        deadline = coord.session.deadline
        await eventually(lambda: coord.session.deadline > deadline, what="a keep-alive")
        assert coord.session.state is SessionState.CONNECTED
        assert [e.key for e in await coord.list("members/")] == ["members/m1"]


@pytest.mark.etcd
@pytest.mark.chaos
@pytest.mark.slow
@pytest.mark.asyncio
async def test_failover_when_the_connected_cluster_member_dies(
    etcd_cluster_factory: ClusterFactory,
) -> None:
    cluster = etcd_cluster_factory(3)
    url = f"{cluster.url}/app"
    options = ConnectOptions(session_timeout_s=4, connect_timeout_s=10)
    # `coord` talks to the first member; `peer` lists the last one first.
    peer_url = "etcd://" + ",".join(reversed(cluster.endpoints)) + "/app"
    async with open_coordinator(url, options) as coord, open_coordinator(peer_url) as peer:
        member = await coord.create("members/m1", b"", ephemeral=True)
        assert member is not None
        watch = coord.watch("positions/")
        await asyncio.to_thread(cluster.members[0].kill)
        killed_at = time.monotonic()
        # Reads and writes carry on through the other members.
        assert await coord.get("members/m1") == member
        assert await coord.commit([Check.created_at("members/m1", member.create_version)],
                                  [Put("positions/0", b"1")])
        # The keep-alive thread fails over too: the same lease stays alive.
        # (deadline = send time of the last acknowledged keep-alive + TTL)
        await eventually(lambda: coord.session.deadline > killed_at + coord.session.timeout_s,
                         what="a keep-alive sent after the kill, through another member")
        assert coord.session.state is SessionState.CONNECTED
        assert await peer.get("members/m1") == member
        # The watch re-armed on another member and sees changes made elsewhere.
        await peer.commit([], [Put("positions/1", b"1")])
        await eventually(lambda: watch.wait(timeout=1.0), what="the watch to wake")
        await watch.close()


@pytest.mark.asyncio
async def test_retries_sleep_through_the_injected_sleep() -> None:
    slept: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        slept.append(seconds)
        await asyncio.sleep(0)

    url = f"etcd://127.0.0.1:{free_port()},127.0.0.1:{free_port()}/x"
    coord = EtcdCoordinator(url, ConnectOptions(connect_timeout_s=1), sleep=fake_sleep)
    with pytest.raises(CoordinatorUnavailable):
        await coord.connect()
    await coord.close()
    assert slept and all(0 <= s <= 1.0 for s in slept)


@pytest.mark.etcd
@pytest.mark.asyncio
async def test_no_endpoint_alive_is_unavailable_in_one_line() -> None:
    url = f"etcd://127.0.0.1:{free_port()},127.0.0.1:{free_port()}/x"
    coord = open_coordinator(url, ConnectOptions(connect_timeout_s=1))
    with pytest.raises(CoordinatorUnavailable) as info:
        await coord.connect()
    assert "\n" not in str(info.value) and "unavailable" in str(info.value)
    await coord.close()


# -- TLS and authentication -------------------------------------------------------


@pytest.fixture
def secured_etcd(etcd_server_factory: Factory, etcd_pki: Pki) -> EtcdServer:
    return etcd_server_factory(pki=etcd_pki, client_cert_auth=True, auth=True)


@pytest.mark.etcd
@pytest.mark.asyncio
async def test_tls_client_cert_and_password(secured_etcd: EtcdServer, etcd_pki: Pki) -> None:
    url = secured_etcd.url_with_prefix("app")
    assert url.startswith("etcds://")
    options = secure_options(etcd_pki, tls_server_name="etcd.test")
    async with open_coordinator(url, options) as coord:
        assert await coord.create("members/m1", b"", ephemeral=True) is not None
        deadline = coord.session.deadline
        await eventually(lambda: coord.session.deadline > deadline, what="a keep-alive")
        async with coord.watch("members/") as watch:
            await coord.create("members/m2", b"")
            assert await watch.wait(timeout=30)


@pytest.mark.etcd
@pytest.mark.asyncio
@pytest.mark.parametrize(
    "case", ["no client certificate", "wrong CA", "wrong server name", "wrong password"]
)
async def test_secured_etcd_refuses_in_one_line(
    secured_etcd: EtcdServer, etcd_pki: Pki, case: str, caplog: pytest.LogCaptureFixture
) -> None:
    overrides: dict[str, Any] = {
        "no client certificate": {"tls_cert": None, "tls_key": None},
        "wrong CA": {"tls_ca": str(etcd_pki.other_ca)},
        "wrong server name": {"tls_server_name": "not-etcd.test"},
        "wrong password": {"password": Secret("wrong-Pa55")},
    }[case]
    caplog.set_level(logging.DEBUG)
    coord = open_coordinator(secured_etcd.url, secure_options(etcd_pki, **overrides))
    with pytest.raises(AuthenticationFailed) as info:
        await coord.connect()
    await coord.close()
    assert_one_line_without_secrets(info.value)
    expected = "refused" if case == "wrong password" else "TLS handshake"
    assert expected in str(info.value)
    assert ROOT_PASSWORD not in caplog.text and "wrong-Pa55" not in caplog.text


@pytest.mark.etcd
@pytest.mark.slow
@pytest.mark.asyncio
async def test_an_expired_token_is_refreshed_mid_run(
    etcd_server_factory: Factory, etcd_pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    ttl = 1
    server = etcd_server_factory(auth=True, auth_token_ttl=ttl)
    url = server.url_with_prefix("app")
    options = ConnectOptions(username="root", password=Secret(ROOT_PASSWORD),
                             allow_plaintext_credentials=True)
    caplog.set_level(logging.DEBUG)
    async with open_coordinator(url, options) as coord, open_coordinator(url, options) as peer:
        assert isinstance(coord, EtcdCoordinator)
        assert await coord.create("members/m1", b"", ephemeral=True) is not None
        watch = coord.watch("members/")
        assert coord._conn.authentications == 1
        await asyncio.sleep(3 * ttl + 1)  # idle: simple tokens expire when unused
        # The server refuses the old token; the coordinator re-authenticates.
        assert [e.key for e in await coord.list("members/")] == ["members/m1"]
        assert coord._conn.authentications == 2
        assert coord.session.state is SessionState.CONNECTED
        await peer.create("members/m2", b"")
        assert await watch.wait(timeout=30)
        await watch.close()
    assert ROOT_PASSWORD not in caplog.text


@pytest.mark.etcd
@pytest.mark.asyncio
async def test_credentials_never_in_messages_or_logs(
    etcd_server_factory: Factory, caplog: pytest.LogCaptureFixture
) -> None:
    server = etcd_server_factory(auth=True)
    caplog.set_level(logging.DEBUG)
    options = ConnectOptions(username="root", password=Secret("wrong-Pa55"),
                             allow_plaintext_credentials=True)
    coord = open_coordinator(server.url_with_prefix("app"), options)
    with pytest.raises(AuthenticationFailed) as info:
        await coord.connect()
    assert_one_line_without_secrets(info.value)
    assert "wrong-Pa55" not in repr(coord) + str(coord) + caplog.text
    # Without credentials, an auth-enabled etcd refuses the first keyed request.
    async with open_coordinator(server.url_with_prefix("app")) as anonymous:
        with pytest.raises(AuthenticationFailed) as anonymous_info:
            await anonymous.get("k")
    assert_one_line_without_secrets(anonymous_info.value)
