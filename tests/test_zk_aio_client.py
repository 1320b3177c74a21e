"""The ZooKeeper coordinator's steady messages: a read of many keys is one
``multiRead`` on the asyncio client; no heartbeat while requests are answered.

On a real server of the test's own, whose ``srvr`` count of received messages
tells how many messages a read took; the values are compared with what kazoo's
pipelined reads (``?client=kazoo``) return for the same znodes.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import Any

import pytest

from coordinators import ConnectOptions, Put
from coordinators.zookeeper.aio import AioZkClient
from coordinators.zookeeper.aio_txn import MultiRead
from coordinators.zookeeper.keys import MULTI_READ_KEYS
from tests.support.zk_server import ZkServer
from tests.test_zk_backend import opened

zk = pytest.mark.zk
OPTIONS = ConnectOptions(session_timeout_s=30)  # pings every 10 s: none during a read


def received(server: ZkServer) -> int:
    """Messages the server received so far, this ``srvr`` command included."""
    match = re.search(r"Received: (\d+)", server.four_letter("srvr"))
    assert match is not None
    return int(match.group(1))


async def messages_of(server: ZkServer, read: Callable[[], Any]) -> tuple[int, Any]:
    """The fewest messages the server received over three runs of ``read`` (a ping
    can only add one), and what the last run returned."""
    counts, result = [], None
    for _ in range(3):
        before = received(server)
        result = await read()
        counts.append(received(server) - before - 1)  # less the second srvr
    return min(counts), result


async def populate(url: str) -> list[str]:
    """Persistent and ephemeral keys, a directory that is no key, missing keys."""
    async with opened(url, OPTIONS) as writer:
        assert await writer.commit([], [Put(f"g/k{i:03}", f"v{i}".encode()) for i in range(200)])
        assert await writer.commit([], [Put("g/d/x", b"below")])  # g/d: a plain directory
        assert await writer.create("g/empty", b"") is not None
        for i in range(5):
            assert await writer.create(f"g/e{i}", b"eph", ephemeral=True) is not None
        keys = [f"g/k{i:03}" for i in range(200)] + [f"g/e{i}" for i in range(5)]
        keys += ["g/d", "g/d/x", "g/empty"] + [f"g/missing{i}" for i in range(40)]
        # The ephemeral keys live as long as this session: compare while it does.
        return await compare(url, keys)


async def compare(url: str, keys: list[str]) -> list[str]:
    base = url.split("&client=")[0]
    async with opened(f"{base}&client=kazoo", OPTIONS) as kazoo:
        expected = await kazoo.get_many(keys)
        listed = await kazoo.list("g/")
        single = await kazoo.get("g/e0")
    async with opened(f"{base}&client=asyncio", OPTIONS) as ours:
        assert isinstance(ours.client, AioZkClient)
        assert await ours.get_many(keys) == expected
        assert await ours.list("g/") == listed
        assert await ours.get("g/e0") == single
    assert expected["g/d"] is None and expected["g/missing0"] is None
    assert expected["g/e0"] is not None and expected["g/e0"].ephemeral
    assert expected["g/empty"] is not None and expected["g/empty"].value == b""
    assert len(listed) == 200 + 5 + 1  # g/d is no key; g/d/x is below
    return keys


@zk
@pytest.mark.asyncio
async def test_a_read_of_many_keys_is_one_message_and_reads_what_pipelined_reads_do(
    zk_server_factory: Callable[..., ZkServer],
) -> None:
    server = zk_server_factory()
    url = server.unique_url()
    keys = await populate(url)
    assert len(keys) == 248 <= MULTI_READ_KEYS
    async with opened(url, OPTIONS) as ours:
        await ours.get("g/k000")  # the ACL guard's first look at g/ is done
        count, entries = await messages_of(server, lambda: ours.get_many(keys))
        assert count == 1
        assert entries["g/k007"].value == b"v7" and entries["g/missing1"] is None
        count, listed = await messages_of(server, lambda: ours.list("g/"))
        assert count == 2  # the listing, then one multiRead of the values
        assert len(listed) == 201
        many = [f"g/k{i % 200:03}x{i}" for i in range(2 * MULTI_READ_KEYS + 1)]
        count, entries = await messages_of(server, lambda: ours.get_many(many))
        assert count == 3 and set(entries.values()) == {None}


@zk
@pytest.mark.asyncio
async def test_a_server_without_multi_read_is_read_the_pipelined_way(
    zk_server_factory: Callable[..., ZkServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server before 3.6 answers a multiRead UnimplementedError and closes the
    connection (shown with an opcode no server knows): the read is retried with
    pipelined reads, on the same session."""
    server = zk_server_factory()
    url = server.unique_url()
    async with opened(url, OPTIONS) as ours:
        assert await ours.commit([], [Put("g/a", b"1"), Put("g/b", b"2")])
        client = ours.client
        session = client.client_id
        monkeypatch.setattr(MultiRead, "type", 99)
        entries = await ours.get_many(["g/a", "g/b", "g/c"])
        assert client.multi_read is False
        assert [e and e.value for e in entries.values()] == [b"1", b"2", None]
        assert client.client_id == session


@zk
@pytest.mark.asyncio
@pytest.mark.parametrize("client", ["asyncio", "kazoo"])
async def test_no_heartbeat_while_requests_are_answered(zk_url: str, client: str) -> None:
    """The heartbeat (an ``exists`` of the chroot) is due a third of the
    timeout after the last confirmation, by any answered request: a busy
    session sends none, an idle one still does."""
    options = ConnectOptions(session_timeout_s=3)  # a heartbeat every second when idle
    async with opened(f"{zk_url}&client={client}", options) as coordinator:
        sent: list[str] = []
        real = coordinator.client.exists_async

        def exists(path: str, *args: Any) -> Any:
            if path == coordinator._root:
                sent.append(path)
            return real(path, *args)

        coordinator.client.exists_async = exists
        for _ in range(12):  # 3 s of reads, one every 0.25 s
            assert await coordinator.get("k") is None
            await asyncio.sleep(0.25)
        assert sent == []
        assert coordinator.session.is_live(margin_s=1.5)
        await asyncio.sleep(2.5)  # idle
        assert len(sent) >= 2
        assert coordinator.session.is_live(margin_s=1.5)


@zk
@pytest.mark.asyncio
@pytest.mark.parametrize("client", ["asyncio", "kazoo"])
async def test_a_value_change_re_arms_that_value_only(zk_url: str, client: str) -> None:
    """A watch whose directory's child watch has not fired re-arms the data
    watch of the value that changed, without listing the directory again
    (the table head, rewritten every few seconds, wakes every member)."""
    async with opened(f"{zk_url}&client={client}", OPTIONS) as coordinator:
        assert await coordinator.commit([], [Put("h/head", b"0")])
        listings: list[str] = []
        real = coordinator.client.get_children_async

        def get_children(path: str, *args: Any, **kwargs: Any) -> Any:
            listings.append(path)
            return real(path, *args, **kwargs)

        coordinator.client.get_children_async = get_children
        async with coordinator.watch("h/") as watch:
            await asyncio.sleep(0.3)  # armed: the directory listed once
            first = len(listings)
            assert first >= 1
            for i in range(1, 4):
                assert await coordinator.commit([], [Put("h/head", str(i).encode())])
                assert await watch.wait(timeout=10)
            await asyncio.sleep(0.3)
            assert len(listings) == first
            # A key created: the child watch fires, the directory is listed,
            # and the new key's value is watched from then on.
            assert await coordinator.commit([], [Put("h/other", b"a")])
            assert await watch.wait(timeout=10)
            await asyncio.sleep(0.3)
            assert len(listings) == first + 1
            assert await coordinator.commit([], [Put("h/other", b"b")])
            assert await watch.wait(timeout=10)
            assert not await watch.wait(timeout=0.5)
