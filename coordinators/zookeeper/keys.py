"""Reading and writing keys: get, list, create, delete and commit."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

from kazoo.exceptions import (
    BadVersionError,
    ConnectionLoss,
    KazooException,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    RolledBackError,
    RuntimeInconsistency,
    UnimplementedError,
)

from coordinators.errors import (
    ConfigError,
    CoordinatorError,
    CoordinatorUnavailable,
    CorruptValue,
    SessionLost,
)
from coordinators.protocol import (
    Check,
    Delete,
    Entry,
    Op,
    Put,
)
from coordinators.zookeeper.errors import Conflict
from coordinators.zookeeper.guard import AclGuard
from coordinators.zookeeper.heartbeat import Heartbeat
from coordinators.zookeeper.layout import FLAG_PREFIX, NONCE, Failure, KeyState, Txn, TxnOp
from coordinators.zookeeper.limits import refuse_if_too_large
from coordinators.zookeeper.planning import Planner

log = logging.getLogger("coordinators.zookeeper")  # the backend's one logger

# Keys per multiRead message (two GetData each). A reply carries ~300 bytes a
# key of this program's small values (flag, value, two stats), so 256 keys
# keep it near 80 KB, far below ZooKeeper's 1 MB jute.maxbuffer, and a read
# of 2,048 keys is 8 messages sent at once.
MULTI_READ_KEYS = 256


def _head(key: str) -> str:
    """The directory of ``key`` (``""``: the chroot)."""
    return key.rpartition("/")[0]


class Keys(Planner, AclGuard, Heartbeat):
    """The key operations of the protocol over the znode layout."""

    async def _read_states(self, keys: Iterable[str]) -> dict[str, KeyState]:
        """The current state of each key: its flag and value znodes read, the
        flag first; in one ``multiRead`` per :data:`MULTI_READ_KEYS` keys on the
        asyncio client (ZooKeeper 3.6+), else two pipelined reads per key."""
        wanted = list(dict.fromkeys(keys))
        if not wanted:
            return {}
        client = self._live_client()
        # Flag first: if the value znode read then shows a later incarnation,
        # checks built on the flag fail safely.
        paths = [path for key in wanted for path in (self._flag(key), self._znode(key))]

        async def read() -> dict[str, KeyState]:
            if getattr(client, "multi_read", False):
                replies = await self._read_multi(client, paths)
            else:
                sent = [self._send(client.get_async, path) for path in paths]
                replies = await self._recv_all(sent, "a read")
            return {
                key: self._state_of(key, replies[2 * i], replies[2 * i + 1])
                for i, key in enumerate(wanted)
            }

        return await self._reading(read)

    async def _read_multi(self, client: Any, paths: list[str]) -> list[Any]:
        """Each path's ``GetData`` reply (or error), by ``multiRead`` messages sent at once."""
        step = 2 * MULTI_READ_KEYS
        sent = [self._send(client.get_many_async, paths[i : i + step])
                for i in range(0, len(paths), step)]
        replies: list[Any] = []
        for chunk in await self._recv_all(sent, "a read"):
            if isinstance(chunk, UnimplementedError):
                # A server before 3.6 (it closes the connection too): read the
                # other way from now on, on the next connection.
                client.multi_read = False
                log.info("the ZooKeeper server has no multiRead (3.6+): reads are pipelined")
                raise ConnectionLoss("the server has no multiRead")
            if isinstance(chunk, BaseException):
                raise chunk
            replies.extend(chunk)
        return replies

    def _state_of(self, key: str, flag: Any, value: Any) -> KeyState:
        for reply in (flag, value):
            if isinstance(reply, BaseException) and not isinstance(reply, NoNodeError):
                raise reply
        if isinstance(value, NoNodeError):
            return KeyState("absent")
        data, stat = value
        if isinstance(flag, NoNodeError):
            return KeyState("dir", data_version=stat.version, children=stat.numChildren)
        flag_data, flag_stat = flag
        nonce = bytes(flag_data).decode("ascii", "replace")
        if not NONCE.fullmatch(nonce):
            raise CorruptValue(
                f"ZooKeeper znode {self._flag(key)} is not a key flag of this program"
            )
        self._remember_epoch(key, flag_stat.czxid, nonce)
        return KeyState(
            "key",
            nonce=nonce,
            create_version=flag_stat.czxid,
            ephemeral=flag_stat.ephemeralOwner != 0,
            data_version=stat.version,
            mzxid=stat.mzxid,
            children=stat.numChildren,
            value=bytes(data),
        )

    @staticmethod
    def _entry(key: str, state: KeyState) -> Entry | None:
        if state.kind != "key":
            return None
        return Entry(key, state.value, state.mzxid, state.create_version, state.ephemeral)

    async def get(self, key: str) -> Entry | None:
        self._check_key(key)
        with self._translating(f"get {key}"):
            await self._guard([_head(key)])
            states = await self._read_states([key])
        return self._entry(key, states[key])

    async def get_many(self, keys: Sequence[str]) -> dict[str, Entry | None]:
        wanted = list(dict.fromkeys(keys))
        for key in wanted:
            self._check_key(key)
        with self._translating(f"get {len(wanted)} keys"):
            await self._guard({_head(key) for key in wanted})
            states = await self._read_states(wanted)
        return {key: self._entry(key, states[key]) for key in wanted}

    async def list(self, prefix: str) -> list[Entry]:
        self._check_dir(prefix)
        client = self._live_client()
        directory = self._dir_znode(prefix[:-1])
        with self._translating(f"list {prefix}"):
            await self._guard([prefix[:-1]])

            async def children() -> list[str]:
                try:
                    names: list[str] = await self._request(
                        f"list {prefix}", client.get_children_async, directory
                    )
                except NoNodeError:
                    return []
                return names

            names = await self._reading(children)
            keys = sorted(
                prefix + n[len(FLAG_PREFIX) :] for n in names if n.startswith(FLAG_PREFIX)
            )
            states = await self._read_states(keys)
        entries = (self._entry(key, states[key]) for key in keys)
        return [e for e in entries if e is not None]

    async def _multi(self, txn: Txn, what: str) -> Failure | None:
        """Run ``txn`` as one ``multi``: None if applied, else the failing op.

        Measured first: one over the servers' ``jute.maxbuffer`` would make
        the server close the connection (each time it is sent), so it is
        refused here, unsent (coordinators/zookeeper/limits.py)."""
        refuse_if_too_large(txn.ops, self._acl_bytes, self._max_request, what)
        client = self._live_client()
        request = client.transaction()
        for op in txn.ops:
            if op.kind == "create":
                request.create(op.path, op.data, acl=list(self._acl), ephemeral=op.ephemeral)
            elif op.kind == "delete":
                request.delete(op.path, op.version)
            elif op.kind == "set":
                request.set_data(op.path, op.data, op.version)
            else:
                request.check(op.path, op.version)
        results = await self._request(what, request.commit_async)
        for op, result in zip(txn.ops, results, strict=False):
            if isinstance(result, BaseException) and not isinstance(
                result, RolledBackError | RuntimeInconsistency
            ):
                return Failure(op, result)
        if any(isinstance(r, BaseException) for r in results):
            return Failure(txn.ops[0], RuntimeInconsistency())
        return None

    async def _ensure_parent(self, key: str) -> None:
        client = self._live_client()
        await self._request(
            f"create the parents of {key}",
            client.ensure_path_async,
            self._parent_znode(key),
            list(self._acl),
        )

    async def _after_failure(self, failure: Failure) -> None:
        """Prepare the next attempt after an implicit guard failed; raises Conflict."""
        error, op = failure.error, failure.op
        if isinstance(error, NoNodeError) and op.kind == "create":
            await self._ensure_parent(op.key)
        elif not isinstance(error, NodeExistsError | NoNodeError | BadVersionError | NotEmptyError):
            raise error
        raise Conflict(
            "ZooKeeper writes kept conflicting with concurrent changes of the same keys; retry"
        )

    async def create(self, key: str, value: bytes, *, ephemeral: bool = False) -> Entry | None:
        self._check_key(key)
        value = bytes(value)
        if ephemeral:
            self._require_session()
        state: KeyState | None = None

        async def attempt() -> Entry | None:
            nonlocal state
            current = state or KeyState("absent")
            if current.kind == "key":
                return None
            if current.kind == "dir" and ephemeral and current.children:
                raise ConfigError(
                    f"cannot create ephemeral key {key!r}: keys exist below it, and ephemeral "
                    "keys cannot have children"
                )
            if ephemeral:
                self._require_session()
            nonce = uuid.uuid4().hex
            txn = Txn()
            self._create_ops(txn, key, current, value, nonce, ephemeral)
            try:
                failure = await self._multi(txn, f"create {key}")
            except (ConnectionLoss, CoordinatorUnavailable):
                # Applied or not (or not yet: a request that timed out is still
                # queued)? Requests run in order, so a read sent now sees the
                # outcome, and our nonce tells whether the key is ours.
                state = (await self._read_states([key]))[key]
                if state.kind == "key" and state.nonce == nonce:
                    return await self._created(key, nonce, value, ephemeral)
                raise Conflict(f"lost the connection while creating {key}; retry") from None
            if failure is None:
                return await self._created(key, nonce, value, ephemeral)
            if failure.op.path == self._flag(key) and isinstance(failure.error, NodeExistsError):
                return None  # the key exists
            state = None
            if not (isinstance(failure.error, NoNodeError) and failure.op.kind == "create"):
                state = (await self._read_states([key]))[key]
            await self._after_failure(failure)
            raise AssertionError("unreachable")

        with self._translating(f"create {key}"):
            await self._guard([_head(key)], create=True)
            return await self._writing(attempt)

    async def _created(self, key: str, nonce: str, value: bytes, ephemeral: bool) -> Entry:
        """The entry of the key we just created, from its epoch marker's stat."""
        client = self._live_client()

        async def read_marker() -> Any:
            return await self._request(f"read {key}", client.exists_async, self._epoch(key, nonce))

        stat = await self._reading(read_marker)
        if stat is None:
            # Deleted by someone else already: our incarnation is gone.
            raise Conflict(f"{key} was deleted right after we created it; retry")
        if ephemeral:
            session = self.session
            if stat.ephemeralOwner != session.raw_id:
                await self._delete_ghost(key, nonce)
                self._lose("an ephemeral create landed in a new session")
                raise SessionLost(f"ZooKeeper session {session.id} is lost: open a new coordinator")
        self._remember_epoch(key, stat.czxid, nonce)
        # The value znode was written in the same transaction: mzxid == czxid.
        return Entry(key, value, stat.czxid, stat.czxid, ephemeral)

    async def _delete_ghost(self, key: str, nonce: str) -> None:
        """Delete an ephemeral key a replacement session created for us by mistake."""
        txn = Txn()
        txn.add(TxnOp("delete", self._epoch(key, nonce), key, False))
        txn.add(TxnOp("delete", self._flag(key), key, False))
        txn.add(TxnOp("delete", self._znode(key), key, False))
        try:
            await self._multi(txn, f"delete {key}")
        except (KazooException, CoordinatorError) as err:
            log.warning("could not delete %s created by a replacement session: %r", key, err)

    async def delete(self, key: str) -> bool:
        self._check_key(key)

        async def attempt() -> bool:
            state = (await self._read_states([key]))[key]
            if state.kind != "key":
                return False  # linearised at the read
            txn = Txn()
            self._delete_ops(txn, key, state)
            failure = await self._multi(txn, f"delete {key}")
            if failure is None:
                return True
            await self._after_failure(failure)
            raise AssertionError("unreachable")

        with self._translating(f"delete {key}"):
            await self._guard([_head(key)])
            return await self._writing(attempt)

    async def commit(self, checks: Sequence[Check], ops: Sequence[Op]) -> bool:
        for check in checks:
            self._check_key(check.key)
        for op in ops:
            if not isinstance(op, Put | Delete):
                raise TypeError(f"commit takes Put and Delete operations, not {op!r}")
            self._check_key(op.key)
        if not checks and not ops:
            return True
        checks, ops = tuple(checks), tuple(ops)
        optimistic = True

        async def attempt() -> bool:
            nonlocal optimistic
            needed = self._plan_reads(checks, ops, optimistic)
            states = await self._read_states(needed)
            planned = self._plan(checks, ops, states, optimistic)
            if planned is None:
                return False  # a check already fails, for good
            try:
                failure = await self._multi(planned, "commit")
            except (ConnectionLoss, CoordinatorUnavailable) as err:
                raise CoordinatorUnavailable(
                    "lost the connection to ZooKeeper during a commit: it may or may not have "
                    "been applied; re-read before retrying"
                ) from err
            if failure is None:
                return True
            if failure.op.explicit and not (
                isinstance(failure.error, NoNodeError) and failure.op.kind == "create"
            ):
                return False
            optimistic = False
            await self._after_failure(failure)
            raise AssertionError("unreachable")

        with self._translating("commit"):
            heads = {_head(c.key) for c in checks} | {_head(op.key) for op in ops}
            await self._guard(heads, create=any(isinstance(op, Put) for op in ops))
            return await self._writing(attempt)
