"""A connection that fails during SASL re-authentication is a connection failure.

After a connection cut the client reconnects and authenticates again. If that
server connection drops, or goes silent, between the connect response and the
end of SASL, the client must go on to the next attempt with the same session:
only a refusal by the server (an error reply) ends it. Against a real
ZooKeeper with SASL DIGEST-MD5, through :class:`ZkHandshakeFaultProxy`, on
both clients (docs/zookeeper.md, "Client: kazoo or the asyncio connection").
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator

import pytest

from coordinators import ConnectOptions, Secret, SessionState, open_coordinator
from tests.support.zk_fault_proxy import Fault, ZkHandshakeFaultProxy
from tests.support.zk_server import ZkServer

zk = pytest.mark.zk
PASSWORD = "pw-Handshake-fault"
SESSION_TIMEOUT_S = 6.0


@pytest.fixture
def proxy(zk_server_factory: Callable[..., ZkServer]) -> Iterator[ZkHandshakeFaultProxy]:
    server = zk_server_factory(sasl_users={"alice": PASSWORD}, require_auth="sasl")
    fault_proxy = ZkHandshakeFaultProxy(server.host, server.port)
    fault_proxy.start()
    try:
        yield fault_proxy
    finally:
        fault_proxy.stop()


@zk
@pytest.mark.asyncio
@pytest.mark.timeout(120)
@pytest.mark.parametrize("client", ["asyncio", "kazoo"])
@pytest.mark.parametrize("fault", ["drop", "stall"])
async def test_a_fault_during_sasl_after_a_cut_keeps_the_session(
    proxy: ZkHandshakeFaultProxy, fault: Fault, client: str
) -> None:
    url = f"zk://127.0.0.1:{proxy.port}/t-sasl-{fault}-{client}?client={client}"
    options = ConnectOptions(
        username="alice", password=Secret(PASSWORD), auth_scheme="sasl",
        session_timeout_s=SESSION_TIMEOUT_S, connect_timeout_s=20.0,
    )
    coordinator = open_coordinator(url, options)
    await coordinator.connect()
    try:
        session = coordinator.session
        states: list[SessionState] = []
        session.add_listener(states.append)
        assert await coordinator.create("k", b"before")
        first_id = session.id
        accepted = proxy.connections_accepted

        proxy.fault_next(fault)
        proxy.cut()
        # The faulted connection, then one that passes: the same session goes on.
        # (kazoo reports CONNECTED before SASL too: wait for the connection after.)
        deadline = time.monotonic() + 2 * SESSION_TIMEOUT_S
        while not (proxy.connections_accepted >= accepted + 2
                   and session.state is SessionState.CONNECTED):
            assert time.monotonic() < deadline, f"not CONNECTED again: {states}"
            await asyncio.sleep(0.05)
        assert proxy.faulted == [fault]
        assert SessionState.SUSPENDED in states
        entry = await coordinator.get("k")
        assert entry is not None and entry.value == b"before"
        assert await coordinator.create("after", b"x")
        assert SessionState.LOST not in states and session.id == first_id
    finally:
        await coordinator.close()
