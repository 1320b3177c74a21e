"""Writes over ZooKeeper's ``jute.maxbuffer`` are refused before they are sent.

A request longer than the server's ``jute.maxbuffer`` (1048575 bytes by
default, the whole request counted) is never answered: the server closes the
connection, every time it is sent. The coordinator measures each ``multi``
first and refuses one that does not fit in one non-retriable line
(:class:`RequestTooLarge`), on both clients, with the session left alone
(coordinators/zookeeper/limits.py, docs/zookeeper.md "Values and groups: the
size limit"). At the bound on a real server: the largest request that fits is
written, one byte more is refused unsent, and sent anyway it is what the
server drops.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from kazoo.protocol.serialization import Transaction
from kazoo.security import ACL, CREATOR_ALL_ACL, Id

from coordinators import (
    Check,
    ConfigError,
    ConnectOptions,
    CoordinatorUnavailable,
    Put,
    RequestTooLarge,
    SessionState,
    open_coordinator,
)
from coordinators.zookeeper.aio_txn import AioTransaction
from coordinators.zookeeper.layout import TxnOp
from coordinators.zookeeper.limits import JUTE_MAXBUFFER, acl_size, max_request_of, multi_size
from coordinators.zookeeper.wire import packet
from paimon_group.protocol.group import GroupClient
from paimon_group.protocol.records import Assignment, GroupMeta

zk = pytest.mark.zk
SENDS = re.compile(r"would send (\d+) bytes")


def test_the_measured_size_is_what_kazoos_codec_writes() -> None:
    acls = [list(CREATOR_ALL_ACL), [ACL(31, Id("world", "anyone")), ACL(1, Id("sasl", "ü-r"))]]
    ops = [
        TxnOp("check", "/a/.pg-epoch.0123", "a", True, version=-1),
        TxnOp("create", "/a/ключ", "a/ключ", False, data=b"x" * 1000, ephemeral=True),
        TxnOp("set", "/a/b", "a/b", False, data=b"\x00" * 77, version=3),
        TxnOp("delete", "/a/c", "a/c", False, version=-1),
    ]
    for acl in acls:
        txn = AioTransaction(lambda request: request)
        for op in ops:
            if op.kind == "create":
                txn.create(op.path, op.data, acl, op.ephemeral)
            elif op.kind == "set":
                txn.set_data(op.path, op.data, op.version)
            elif op.kind == "delete":
                txn.delete(op.path, op.version)
            else:
                txn.check(op.path, op.version)
        sent = packet(Transaction(txn._ops), 7)
        assert multi_size(ops, acl_size(acl)) == len(sent) - 4  # what follows the length


def test_the_limit_is_a_setting_of_the_backend() -> None:
    assert max_request_of({}) == JUTE_MAXBUFFER == 1048575
    assert max_request_of({"jute_maxbuffer": "4194304"}) == 4194304
    for bad in ("1 MiB", "100"):
        with pytest.raises(ConfigError, match="jute_maxbuffer") as caught:
            max_request_of({"jute_maxbuffer": bad})
        assert "\n" not in str(caught.value)


@pytest_asyncio.fixture(params=["asyncio", "kazoo"])
async def coordinator(zk_url: str, request: pytest.FixtureRequest) -> AsyncIterator[object]:
    url = f"{zk_url}&client={request.param}"
    opened = open_coordinator(url, ConnectOptions(session_timeout_s=10.0))
    await opened.connect()
    try:
        yield opened
    finally:
        await opened.close()


@zk
@pytest.mark.asyncio
@pytest.mark.timeout(120)
async def test_at_the_bound_the_largest_write_passes_and_one_byte_more_is_refused_unsent(
    coordinator: object,
) -> None:
    c = coordinator
    states: list[SessionState] = []
    c.session.add_listener(states.append)  # type: ignore[attr-defined]
    session_id = c.session.id  # type: ignore[attr-defined]
    await c.create("big/seed", b"")  # type: ignore[attr-defined]

    # One MiB: refused, with the request's whole size said. That size less the
    # value is the request's overhead, so the value that fits exactly is known.
    with pytest.raises(RequestTooLarge) as caught:
        await c.create("big/key", b"v" * 1048576)  # type: ignore[attr-defined]
    message = str(caught.value)
    assert "\n" not in message and not caught.value.retriable
    assert "'big/key'" in message and "1048576 bytes" in message and "1048575" in message
    match = SENDS.search(message)
    assert match is not None, message
    overhead = int(match.group(1)) - 1048576
    fits = JUTE_MAXBUFFER - overhead

    with pytest.raises(RequestTooLarge, match=f"would send {JUTE_MAXBUFFER + 1} bytes"):
        await c.create("big/key", b"v" * (fits + 1))  # type: ignore[attr-defined]
    entry = await c.create("big/key", b"v" * fits)  # type: ignore[attr-defined]
    assert entry is not None
    got = await c.get("big/key")  # type: ignore[attr-defined]
    assert got is not None and len(got.value) == fits

    # In a transaction: each value fits, together they do not.
    half = b"h" * (JUTE_MAXBUFFER // 2)
    with pytest.raises(RequestTooLarge, match=r"commit would send \d+ bytes") as caught:
        await c.commit(  # type: ignore[attr-defined]
            [Check.created_at("big/key", entry.create_version)],
            [Put("big/a", half), Put("big/b", half + b"more")],
        )
    assert "'big/b'" in str(caught.value)
    assert await c.get("big/a") is None  # type: ignore[attr-defined]

    # Nothing of this reached the server: the same session, never suspended.
    assert states == [] and c.session.state is SessionState.CONNECTED  # type: ignore[attr-defined]
    assert c.session.id == session_id  # type: ignore[attr-defined]
    assert await c.commit([], [Put("big/after", b"ok")])  # type: ignore[attr-defined]

    # A rewrite of the key (a set, not a create) at its own bound: the largest
    # that fits is written; one byte more, sent anyway (the limit raised by
    # one), is dropped by the server: the bound is the server's, to the byte.
    with pytest.raises(RequestTooLarge) as caught:
        await c.commit([], [Put("big/key", b"w" * 1048576)])  # type: ignore[attr-defined]
    match = SENDS.search(str(caught.value))
    assert match is not None
    fits_set = JUTE_MAXBUFFER - (int(match.group(1)) - 1048576)
    assert await c.commit([], [Put("big/key", b"w" * fits_set)])  # type: ignore[attr-defined]
    assert states == []
    c._max_request = JUTE_MAXBUFFER + 1  # type: ignore[attr-defined]
    with pytest.raises(CoordinatorUnavailable):
        await c.commit([], [Put("big/key", b"x" * (fits_set + 1))])  # type: ignore[attr-defined]
    for _ in range(200):  # the listeners hear of it on the loop, maybe after the reply
        if SessionState.SUSPENDED in states:
            break
        await asyncio.sleep(0.05)
    assert SessionState.SUSPENDED in states


@zk
@pytest.mark.asyncio
@pytest.mark.timeout(120)
async def test_a_group_of_more_shards_than_zookeeper_holds_is_refused_in_one_line(
    coordinator: object,
) -> None:
    c = coordinator
    assert c.max_shards == 16384  # type: ignore[attr-defined]
    group = GroupClient(c, "wide")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"16385 shards, more than the 16384") as caught:
        await group.ensure_meta(16385, "db.t")
    assert "\n" not in str(caught.value) and "--shards 16384 or fewer" in str(caught.value)
    assert await group.read_meta() is None  # nothing was created
    assert (await group.ensure_meta(16384, "db.t")).num_shards == 16384

    # A group stored with more (made before the bound) is refused at a join.
    older = GroupClient(c, "older")  # type: ignore[arg-type]
    meta = GroupMeta(num_shards=20000, table="db.t", created_at=0.0)
    assert await c.create(older.keys.meta, meta.encode())  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match=r"20000 shards, more than the 16384"):
        await older.ensure_meta(None, "db.t")

    # The assignment of the bound, as large as it gets, is written.
    ids = [f"{i:0128d}" for i in range(1000)]
    shards: dict[str, list[int]] = {m: [] for m in ids}
    for shard in range(16384):
        shards[ids[shard % len(ids)]].append(shard)
    record = Assignment(
        generation=2**40, leader=ids[0], leader_epoch=2**40, shards=shards,
        published_at=1.7e9, home=dict(shards), away_since=dict.fromkeys(ids, 1.7e9),
        loads=[2**31] * 16384,
    ).encode()
    assert 700_000 < len(record) < JUTE_MAXBUFFER - 4096
    assert await c.create(group.keys.assignment, record)  # type: ignore[attr-defined]
