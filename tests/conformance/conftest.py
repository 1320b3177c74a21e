"""Fixtures of the coordinator conformance suite: every backend passes the same tests.

``coordinator_url`` is parametrised over the backends (ZooKeeper twice: on
its default client, the asyncio connection, and on kazoo). The embedded ones get a
fresh database per test (a file in ``tmp_path``; a unique in-memory name). The
server ones take their URL from the fixtures ``etcd_url`` and ``zk_url``
(``tests/support/etcd_server.py``, ``tests/support/zk_server.py``): each returns
a URL string whose key prefix / chroot is unique to the test, so tests may use
fixed key names.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from urllib.parse import quote

import pytest
import pytest_asyncio

from coordinators import ConnectOptions, Coordinator, open_coordinator
from tests.conformance.holder import Holder

OpenCoordinator = Callable[..., Awaitable[Coordinator]]
StartHolder = Callable[..., Awaitable[Holder]]

# Sessions of the coordinators a test opens for itself: long enough that a
# loaded machine never expires them by accident.
DEFAULT_SESSION_TIMEOUT_S = 10.0


@pytest.fixture(
    params=[
        "sqlite",
        "memory",
        pytest.param("etcd", marks=pytest.mark.etcd),
        pytest.param("zk", marks=pytest.mark.zk),
        # The ZooKeeper backend on kazoo, its other client (docs/zookeeper.md).
        pytest.param("zk-kazoo", marks=pytest.mark.zk),
    ]
)
def coordinator_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    backend: str = request.param
    if backend == "sqlite":
        return "sqlite://" + quote(str(tmp_path / "coordinator.db"))
    if backend == "memory":
        return f"memory://conformance-{uuid.uuid4().hex}"
    if backend == "zk-kazoo":
        return f"{request.getfixturevalue('zk_url')}&client=kazoo"
    url = request.getfixturevalue(f"{backend}_url")
    assert isinstance(url, str), f"fixture {backend}_url must return a URL string"
    return url


@pytest.fixture
def multi_process(coordinator_url: str) -> None:
    """Skip tests that need a second process on the same coordinator."""
    if coordinator_url.startswith("memory://"):
        pytest.skip("memory:// databases are private to one process")


@pytest_asyncio.fixture
async def open_coord(coordinator_url: str) -> AsyncIterator[OpenCoordinator]:
    """Opens connected coordinators on the test's backend; closes them all at the end."""
    opened: list[Coordinator] = []

    async def _open(session_timeout_s: float = DEFAULT_SESSION_TIMEOUT_S) -> Coordinator:
        coordinator = open_coordinator(
            coordinator_url,
            ConnectOptions(session_timeout_s=session_timeout_s, connect_timeout_s=30.0),
        )
        await coordinator.connect()
        opened.append(coordinator)
        return coordinator

    yield _open
    for coordinator in reversed(opened):
        await coordinator.close()


@pytest_asyncio.fixture
async def coord(open_coord: OpenCoordinator) -> Coordinator:
    return await open_coord()


@pytest_asyncio.fixture
async def start_holder(
    coordinator_url: str, multi_process: None, tmp_path: Path
) -> AsyncIterator[StartHolder]:
    """Starts session-holder processes; SIGKILLs whichever is left at the end."""
    started: list[Holder] = []

    async def _start(key: str, session_timeout_s: float = 2.0) -> Holder:
        holder = await Holder.start(
            coordinator_url, key, session_timeout_s, tmp_path / f"holder-{len(started)}.log"
        )
        started.append(holder)
        await holder.expect("READY")
        return holder

    yield _start
    for holder in started:
        await holder.kill()
