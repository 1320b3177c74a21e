"""Session keep-alives that no event-loop stall and no slow reply can starve or
stretch (issue findings 8 and 10, invariant 3).

* SQLite and memory: the keep-alive runs on a thread of its own, so a
  synchronous ``async for`` body longer than the session timeout neither
  expires the member's session nor makes it deliver a snapshot twice.
* etcd: the first local deadline counts from the *send* time of the lease
  grant, not from its reply.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from paimon_group import GroupMember, MemberConfig
from tests.support.tables import make_pk_table, write_rows

TIMEOUT_S = 1.5


def _config(wh: Path, coord: str) -> MemberConfig:
    return MemberConfig(group="stall", warehouse=str(wh), table="db.t", coordinator=coord,
                        member_id="a", session_timeout_s=TIMEOUT_S, poll_interval_ms=50)


@pytest.mark.asyncio
async def test_blocking_iterator_body_keeps_the_sqlite_session(tmp_path: Path) -> None:
    """The body of ``async for`` blocks the event loop (``time.sleep``) for three
    session timeouts: the session survives and nothing is delivered twice."""
    wh = tmp_path / "wh"
    make_pk_table(str(wh), "db.t", buckets=2)
    write_rows(str(wh), "db.t", range(0, 20))
    coord = f"sqlite://{tmp_path}/coord.sqlite"
    deliveries: list[tuple[int, int, int]] = []  # (shard, snapshot, epoch)
    ids: list[int] = []
    lost: list[list[int]] = []

    class Listener:
        def on_assigned(self, shards: list[int]) -> None: ...

        def on_revoked(self, shards: list[int]) -> None: ...

        def on_lost(self, shards: list[int]) -> None:
            lost.append(shards)

    async with GroupMember(_config(wh, coord), listener=Listener()) as member:
        assert member.core.coordinator is not None
        session = member.core.coordinator.session
        batches = member.batches()
        stalled = False
        wrote_second = False
        while len(ids) < 40:
            batch = await asyncio.wait_for(batches.__anext__(), timeout=60)
            deliveries.append((batch.shard, batch.snapshot_id, batch.epoch))
            ids.extend(batch.to_arrow().column("id").to_pylist())
            if not stalled:
                stalled = True
                # The fault: a synchronous body that holds the loop for
                # longer than the session timeout.
                time.sleep(3 * TIMEOUT_S)  # noqa: ASYNC251
            if len(ids) >= 20 and not wrote_second:
                wrote_second = True
                write_rows(str(wh), "db.t", range(20, 40))
        await batches.aclose()
        assert member.core.coordinator is not None
        same_session = member.core.coordinator.session is session
        state = session.state.value
    keys = [(shard, snapshot) for shard, snapshot, _ in deliveries]
    assert len(keys) == len(set(keys)), f"delivered twice: {deliveries}"
    assert sorted(ids) == list(range(40)), "a row was delivered twice or not at all"
    assert same_session and state == "connected" and lost == []


@pytest.mark.asyncio
@pytest.mark.parametrize("backend", ["sqlite", "memory"])
async def test_embedded_session_outlives_a_blocked_loop(tmp_path: Path, backend: str) -> None:
    """The loop is held for three timeouts: the session row is renewed anyway,
    so an ephemeral key survives and a peer cannot take it over."""
    from coordinators import ConnectOptions, SessionState, open_coordinator

    url = (f"sqlite://{tmp_path}/c.sqlite" if backend == "sqlite"
           else f"memory://keepalive-{tmp_path.name}")
    options = ConnectOptions(session_timeout_s=1.0)
    async with open_coordinator(url, options) as coord, open_coordinator(url) as peer:
        assert await coord.create("owners/0", b"me", ephemeral=True) is not None
        session = coord.session
        time.sleep(3.0)  # noqa: ASYNC251 - the fault: the loop is held
        # The peer's write reaps every expired session first: ours is not.
        assert await peer.create("owners/0", b"peer", ephemeral=True) is None
        assert session.state is SessionState.CONNECTED and session.is_live()
        assert await coord.get("owners/0") is not None


@pytest.mark.asyncio
async def test_lost_found_by_the_heartbeat_thread_reaches_listeners_on_the_loop(
    tmp_path: Path,
) -> None:
    """The heartbeat thread finds the row gone: LOST is visible at once and the
    listener runs on the event loop's thread, not on the heartbeat's."""
    import threading

    from coordinators import ConnectOptions, SessionState, open_coordinator
    from coordinators.sqlite import SqliteCoordinator

    coord = open_coordinator(f"sqlite://{tmp_path}/c.sqlite", ConnectOptions(session_timeout_s=1.0))
    assert isinstance(coord, SqliteCoordinator)
    async with coord:
        seen: list[tuple[SessionState, int]] = []
        lost = asyncio.Event()

        def listener(state: SessionState) -> None:
            seen.append((state, threading.get_ident()))
            if state is SessionState.LOST:
                lost.set()

        coord.session.add_listener(listener)
        sid = coord.session.id
        # The fault: the row is deleted, as a peer's reaping would.
        await coord._run(lambda conn: conn.execute("DELETE FROM sessions WHERE id = ?", (sid,)))
        await asyncio.wait_for(lost.wait(), timeout=30)
        assert not coord.session.is_live()
        assert seen == [(SessionState.LOST, threading.get_ident())]


class _Clock:
    """A monotonic clock that only moves when the test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


class _NoKeepAlive:
    def __init__(self, *args: object) -> None: ...

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def join(self, timeout: float | None = None) -> None: ...


@pytest.mark.asyncio
async def test_etcd_first_deadline_counts_from_the_grant_send_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The lease grant's reply comes one (injected, 5 s) round trip after its
    request: the first local deadline is ``send time + TTL``, not later."""
    import types

    import coordinators.etcd.coordinator
    import coordinators.protocol
    from coordinators import ConnectOptions, SessionState
    from coordinators.etcd import EtcdCoordinator

    clock = _Clock()
    fake_time = types.SimpleNamespace(monotonic=clock.monotonic)
    monkeypatch.setattr(coordinators.protocol, "time", fake_time)
    monkeypatch.setattr(coordinators.etcd.coordinator, "time", fake_time)
    monkeypatch.setattr(coordinators.etcd.coordinator, "KeepAlive", _NoKeepAlive)
    coord = EtcdCoordinator("etcd://127.0.0.1:1/app", ConnectOptions(session_timeout_s=10))
    sent: list[float] = []

    async def slow_grant(what: str, call: object, *, idempotent: bool) -> object:
        assert what == "lease grant"
        sent.append(clock.now)
        clock.now += 5.0  # the round trip: the reply comes 5 s after the request
        return types.SimpleNamespace(ID=0x1234, TTL=10, error="")

    monkeypatch.setattr(coord, "_call", slow_grant)
    await coord.connect()
    try:
        assert sent == [1000.0]
        assert coord.session.deadline <= sent[0] + 10.0
        assert coord.session.deadline == 1010.0
    finally:
        coord.session.report(SessionState.LOST)  # nothing to revoke: no server
        await coord.close()


@pytest.mark.etcd
@pytest.mark.asyncio
async def test_etcd_first_deadline_through_a_slow_network(etcd_server: object) -> None:
    """A real etcd behind a proxy that delays every chunk by 0.5 s each way:
    the grant's reply comes at least one delay after the grant was sent, so
    a deadline from the send time is at least that much before
    ``reply + TTL``."""
    from coordinators import ConnectOptions, open_coordinator
    from tests.support.etcd_server import EtcdServer
    from tests.support.proxy import TcpProxy

    assert isinstance(etcd_server, EtcdServer)
    delay = 0.5
    proxy = TcpProxy("127.0.0.1", etcd_server.client_port, delay_s=delay)
    proxy.start()
    try:
        proxy.set_mode("delay")
        coord = open_coordinator(
            f"etcd://127.0.0.1:{proxy.port}/slow-grant",
            ConnectOptions(session_timeout_s=10, connect_timeout_s=30),
        )
        await coord.connect()
        replied = time.monotonic()
        try:
            # No keep-alive has been answered yet (the first is sent TTL/3 in).
            assert coord.session.deadline <= replied - delay + coord.session.timeout_s
        finally:
            await coord.close()
    finally:
        proxy.stop()
