"""The etcd v3 coordinator: ``etcd://HOST:PORT[,HOST:PORT...][/PREFIX]`` (``etcds://`` = TLS).

How the coordinator protocol maps onto etcd (see ``docs/etcd.md``):

* **session** = one etcd *lease* granted at :meth:`EtcdCoordinator.connect`,
  with TTL = ``ceil(session_timeout_s)`` seconds (at least 1; etcd may raise it
  to its own minimum, and the session then reports the granted TTL as its
  timeout). A dedicated **thread** with a blocking gRPC channel of its own
  sends a keep-alive every TTL/3, so that neither a busy event loop nor slow
  processing can starve it. Each acknowledged keep-alive calls
  :meth:`Session.confirmed` with the *send* time. Failing keep-alives make the
  session SUSPENDED; a keep-alive answered with TTL 0 (the lease is gone)
  makes it LOST. A lost lease is never replaced: open a new coordinator.
* **ephemeral keys** are attached to the lease; etcd deletes them when the
  lease expires or is revoked (:meth:`close` revokes it).
* **create** is one Txn guarded on ``create_revision == 0`` (absent);
  **commit** is one Txn whose compares are ``create_revision == 0`` (absent),
  ``create_revision == N`` (same incarnation: the fencing epoch) and
  ``mod_revision == N`` (unchanged), evaluated atomically with its writes.
  ``Entry.version`` is the mod revision, ``Entry.create_version`` the create
  revision: both are cluster-wide revisions, so create versions strictly
  increase across all keys, ever.
* **watch** is a prefix watch on the directory that keeps the revision it has
  seen; a broken stream resumes from the next revision (and reports a
  change), a compacted revision re-arms from a fresh read (and reports a
  change). Deeper keys than direct children are filtered out; progress
  notifications and keep-alives never wake it.
* **endpoints**: the first endpoint is used until it fails, then the next one
  (round robin). **prefix**: the URL path, prepended to every key.

The gRPC layer is the v3 API stubs shipped with ``aetcd`` (``aetcd.rpc``):
``aetcd.Client`` itself only opens plaintext channels to one host and
authenticates once, so channels, TLS, token refresh, failover and watch
streams are managed here.

Example (needs a running etcd)::

    import asyncio
    from coordinators import ConnectOptions, Put, open_coordinator

    async def main() -> None:
        coord = open_coordinator(
            "etcd://127.0.0.1:2379/paimon", ConnectOptions(session_timeout_s=10)
        )
        async with coord:
            me = await coord.create("groups/g/members/m1", b"{}", ephemeral=True)
            assert me is not None and me.ephemeral
            await coord.commit([], [Put("groups/g/positions/0", b"7")])

    asyncio.run(main())
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import Any, TypeVar

import grpc  # type: ignore[import-untyped]
import grpc.aio  # type: ignore[import-untyped]
import tenacity
from aetcd import rpc

from coordinators.credentials import refuse_plaintext_credentials
from coordinators.errors import (
    CREDENTIALS_HOW,
    ConfigError,
    CoordinatorError,
    ErrorTranslation,
    SessionLost,
)
from coordinators.etcd.channel import AioConnection, ChannelFactory, Metadata, Stubs
from coordinators.etcd.errors import (
    RETRY_IDEMPOTENT,
    RETRY_POLICY,
    RETRY_WRITE,
    Failure,
    classify,
    translate_error,
)
from coordinators.etcd.session import EtcdSession, KeepAlive
from coordinators.etcd.url import parse_etcd_url
from coordinators.etcd.watch import EtcdWatch, prefix_end
from coordinators.protocol import (
    Check,
    ConnectOptions,
    Coordinator,
    Delete,
    Entry,
    Op,
    Put,
    SessionState,
    validate_dir,
    validate_key,
)
from coordinators.urls import redact_url

log = logging.getLogger("coordinators.etcd")  # the backend's one logger

T = TypeVar("T")
Sleep = Callable[[float], Awaitable[None]]
_MAX_TXN_OPS = 128  # etcd's default --max-txn-ops


class EtcdCoordinator(Coordinator):
    """A coordinator on etcd v3; see the module docstring for the mapping.

    ``url`` is ``etcd://HOST:PORT[,HOST:PORT...][/PREFIX]`` or ``etcds://``
    (TLS required; system CAs unless ``options.tls_ca``). Credentials and
    TLS files come from :class:`ConnectOptions`, never from the URL.
    ``sleep`` replaces :func:`asyncio.sleep` between retries (tests).

    Example::

        coord = EtcdCoordinator("etcd://127.0.0.1:2379/app", ConnectOptions())
        await coord.connect()
        entry = await coord.create("owners/0", b"m1", ephemeral=True)
        await coord.close()          # revokes the lease: "owners/0" is gone
    """

    scheme = "etcd"

    def __init__(
        self, url: str, options: ConnectOptions | None = None, *, sleep: Sleep | None = None
    ) -> None:
        self._options = options or ConnectOptions()
        self._target = parse_etcd_url(url)
        self._url = redact_url(url)
        if (self._options.username is None) != (self._options.password is None):
            raise ConfigError("etcd authentication needs both a username and a password: "
                              + CREDENTIALS_HOW)
        if self._options.session_timeout_s <= 0 or self._options.connect_timeout_s <= 0:
            raise ConfigError("session and connect timeouts must be positive")
        self._prefix = self._target.prefix.encode()
        self._factory = ChannelFactory(self._target, self._options)
        if (
            self._options.password is not None
            and not self._factory.tls
            and not self._options.allow_plaintext_credentials
        ):
            # etcd's Authenticate sends the password as it is.
            raise refuse_plaintext_credentials(
                "etcd", "a username and password",
                "use etcds:// or give a CA (tls_ca, --coordinator-ca)",
            )
        self._budget = self._options.connect_timeout_s
        self._rpc_timeout = max(0.5, self._budget / 2)
        self._conn = AioConnection(
            self._factory, self._target.endpoints, self._options, self._rpc_timeout
        )
        self._sleep: Sleep = sleep or asyncio.sleep
        # The one translation of gRPC and etcd failures (see translate_error),
        # for idempotent calls and for writes.
        self._errors = {
            idempotent: ErrorTranslation(
                (Exception,), functools.partial(self._translate, idempotent=idempotent)
            )
            for idempotent in (True, False)
        }
        self._session: EtcdSession | None = None
        self._keepalive: KeepAlive | None = None
        self._watches: set[EtcdWatch] = set()
        self._max_revision = 0
        self._closed = False

    # -- protocol: identity and lifecycle -----------------------------------

    @property
    def url(self) -> str:
        return self._url

    @property
    def endpoints(self) -> tuple[str, ...]:
        return self._target.endpoints

    @property
    def prefix(self) -> str:
        return self._target.prefix

    @property
    def session(self) -> EtcdSession:
        if self._session is None:
            raise CoordinatorError(f"etcd coordinator {self._url} is not connected")
        return self._session

    async def connect(self) -> None:
        """Authenticate (if configured), grant the lease, start keep-alives."""
        if self._closed:
            raise CoordinatorError(f"etcd coordinator {self._url} is closed; open a new one")
        if self._session is not None:
            return
        requested = max(1, math.ceil(self._options.session_timeout_s))
        sent_at = time.monotonic()
        response = await self._call(
            "lease grant",
            lambda s, md: s.lease.LeaseGrant(
                rpc.LeaseGrantRequest(TTL=requested), timeout=self._rpc_timeout, metadata=md
            ),
            idempotent=True,  # a duplicate lease is orphaned and expires
        )
        if response.error:
            raise CoordinatorError(f"etcd refused a lease of {requested}s: {response.error}")
        # The server starts the lease's TTL when it grants it, no earlier than
        # ``sent_at`` (read before the request, and before any retry of it):
        # the first deadline counts from there, not from the reply, which may
        # come a round trip later (invariant 3).
        session = EtcdSession(
            int(response.ID), float(response.TTL), asyncio.get_running_loop(), sent_at=sent_at
        )
        self._session = session
        self._keepalive = KeepAlive(
            session, self._factory, self._target.endpoints, self._conn.index, self._options
        )
        self._keepalive.start()
        log.info(
            "etcd session lease %s (TTL %ss) on %s", session.id, response.TTL, self._url
        )

    async def close(self) -> None:
        """Revoke the lease (its ephemeral keys go at once) and close channels."""
        if self._closed:
            return
        self._closed = True
        for watch in list(self._watches):
            await watch.close()
        if self._keepalive is not None:
            self._keepalive.stop()
            await asyncio.to_thread(self._keepalive.join, 30)
        session = self._session
        if session is not None and session.state is not SessionState.LOST:
            try:
                stubs = self._conn.stubs()
                metadata = await self._conn.metadata(stubs)
                await stubs.lease.LeaseRevoke(
                    rpc.LeaseRevokeRequest(ID=session.lease_id),
                    timeout=self._rpc_timeout,
                    metadata=metadata,
                )
            except Exception as err:
                if classify(err) is not Failure.LEASE_GONE:
                    log.warning(
                        "etcd: could not revoke lease %s (it expires by itself): %s",
                        session.id, translate_error(err, "lease revoke", self.endpoints),
                    )
        if session is not None:
            session.report(SessionState.LOST)
        await self._conn.close()

    # -- protocol: reads -----------------------------------------------------

    async def get(self, key: str) -> Entry | None:
        full = self._full(validate_key(key))
        response = await self._call(
            f"get {key!r}",
            lambda s, md: s.kv.Range(
                rpc.RangeRequest(key=full), timeout=self._rpc_timeout, metadata=md
            ),
            idempotent=True,
        )
        self._seen(response.header.revision)
        return self._entry(response.kvs[0]) if response.kvs else None

    async def get_many(self, keys: Sequence[str]) -> dict[str, Entry | None]:
        wanted = list(dict.fromkeys(keys))
        out: dict[str, Entry | None] = {}
        # etcd refuses a transaction of more than --max-txn-ops (128 by default).
        for start in range(0, len(wanted), _MAX_TXN_OPS):
            chunk = wanted[start : start + _MAX_TXN_OPS]
            request = rpc.TxnRequest(success=[
                rpc.RequestOp(request_range=rpc.RangeRequest(key=self._full(validate_key(k))))
                for k in chunk
            ])
            response = await self._txn(f"get {len(chunk)} keys", request, idempotent=True)
            for key, reply in zip(chunk, response.responses, strict=True):
                kvs = reply.response_range.kvs
                out[key] = self._entry(kvs[0]) if kvs else None
        return out

    async def list(self, prefix: str) -> list[Entry]:
        full = self._full(validate_dir(prefix))
        response = await self._call(
            f"list {prefix!r}",
            lambda s, md: s.kv.Range(
                rpc.RangeRequest(key=full, range_end=prefix_end(full)),
                timeout=self._rpc_timeout,
                metadata=md,
            ),
            idempotent=True,
        )
        self._seen(response.header.revision)
        depth = len(full)
        entries = [self._entry(kv) for kv in response.kvs if b"/" not in kv.key[depth:]]
        return sorted(entries, key=lambda e: e.key)

    async def _current_revision(self) -> int:
        response = await self._call(
            "read revision",
            lambda s, md: s.kv.Range(
                rpc.RangeRequest(key=self._prefix or b"\0", count_only=True),
                timeout=self._rpc_timeout,
                metadata=md,
            ),
            idempotent=True,
        )
        revision = int(response.header.revision)
        self._seen(revision)
        return revision

    # -- protocol: writes ----------------------------------------------------

    async def create(self, key: str, value: bytes, *, ephemeral: bool = False) -> Entry | None:
        full = self._full(validate_key(key))
        lease = 0
        if ephemeral:
            session = self.session
            if session.state is SessionState.LOST:
                raise SessionLost(
                    f"etcd session lease {session.id} is lost; cannot create {key!r}"
                )
            lease = session.lease_id
        request = rpc.TxnRequest(
            compare=[_compare_create(full, 0)],
            success=[rpc.RequestOp(request_put=rpc.PutRequest(key=full, value=value, lease=lease))],
        )
        response = await self._txn(f"create {key!r}", request, idempotent=False)
        if not response.succeeded:
            return None
        revision = int(response.header.revision)
        return Entry(key, bytes(value), revision, revision, ephemeral)

    async def commit(self, checks: Sequence[Check], ops: Sequence[Op]) -> bool:
        compares = []
        for check in checks:
            full = self._full(validate_key(check.key))
            if check.absent:
                compares.append(_compare_create(full, 0))
            elif check.create_version is not None:
                compares.append(_compare_create(full, check.create_version))
            else:
                assert check.version is not None
                compares.append(
                    rpc.Compare(
                        key=full,
                        target=rpc.Compare.MOD,
                        result=rpc.Compare.EQUAL,
                        mod_revision=check.version,
                    )
                )
        requests = []
        final = _net_effect(ops)
        for key, op in final.items():
            full = self._full(validate_key(key))
            if isinstance(op, Put):
                requests.append(rpc.RequestOp(request_put=rpc.PutRequest(key=full, value=op.value)))
            else:
                requests.append(
                    rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=full))
                )
        keys = sorted(final)
        named = ", ".join(repr(k) for k in keys[:3]) + (f" and {len(keys) - 3} more"
                                                        if len(keys) > 3 else "")
        what = f"commit of {len(requests)} op(s) on {named or 'no keys'}"
        response = await self._txn(
            what, rpc.TxnRequest(compare=compares, success=requests), idempotent=False
        )
        return bool(response.succeeded)

    async def delete(self, key: str) -> bool:
        full = self._full(validate_key(key))
        response = await self._call(
            f"delete {key!r}",
            lambda s, md: s.kv.DeleteRange(
                rpc.DeleteRangeRequest(key=full), timeout=self._rpc_timeout, metadata=md
            ),
            # Deleting twice has the effect of deleting once; only the
            # returned flag of a retried call may be False.
            idempotent=True,
        )
        self._seen(response.header.revision)
        return bool(response.deleted)

    def watch(self, prefix: str, *, values: bool = True,
              children: Collection[str] | None = None) -> EtcdWatch:
        # One watch stream reports every change either way: ``values`` saves
        # nothing on etcd; ``children`` narrows the range it streams.
        validate_dir(prefix)
        self._check_open()
        # Every change after this instant has a revision above the highest one
        # this coordinator has observed (revisions are linearizable).
        watch = EtcdWatch(self, prefix, self._max_revision + 1, children=children)
        self._watches.add(watch)
        return watch

    # -- internals -----------------------------------------------------------

    def _full(self, key: str) -> bytes:
        return self._prefix + key.encode()

    def _entry(self, kv: Any) -> Entry:
        return Entry(
            key=bytes(kv.key[len(self._prefix):]).decode(),
            value=bytes(kv.value),
            version=int(kv.mod_revision),
            create_version=int(kv.create_revision),
            ephemeral=bool(kv.lease),
        )

    def _seen(self, revision: int) -> None:
        if revision > self._max_revision:
            self._max_revision = int(revision)

    def _check_open(self) -> None:
        if self._closed:
            raise CoordinatorError(f"etcd coordinator {self._url} is closed; open a new one")

    async def _txn(self, what: str, request: Any, *, idempotent: bool) -> Any:
        response = await self._call(
            what,
            lambda s, md: s.kv.Txn(request, timeout=self._rpc_timeout, metadata=md),
            idempotent=idempotent,
        )
        self._seen(response.header.revision)
        return response

    async def _call(
        self,
        what: str,
        call: Callable[[Stubs, Metadata], Awaitable[T]],
        *,
        idempotent: bool,
    ) -> T:
        """One RPC with retries: failover on transport errors, token refresh
        on an expired token; writes are retried only when certainly not
        applied. Every failure leaves through :func:`translate_error`
        (``self._errors``)."""
        self._check_open()
        policy = RETRY_POLICY.copy(
            sleep=self._sleep,
            stop=tenacity.stop_after_delay(self._budget),
            retry=RETRY_IDEMPOTENT if idempotent else RETRY_WRITE,
        )
        try:
            with self._errors[idempotent].translating(what):
                async for attempt in policy:
                    with attempt:
                        stubs = self._conn.stubs()
                        metadata: Metadata = None
                        try:
                            metadata = await self._conn.metadata(stubs)
                            return await call(stubs, metadata)
                        except grpc.RpcError as err:
                            self._conn.recover(stubs, metadata, err)
                            raise
        except SessionLost:
            # etcd no longer knows the lease: the session is LOST for good.
            if self._session is not None:
                self._session.report(SessionState.LOST)
                if self._keepalive is not None:
                    self._keepalive.stop()
            raise
        raise AssertionError("unreachable: tenacity either returns or raises")

    def _translate(self, err: BaseException, what: str, *, idempotent: bool) -> CoordinatorError:
        return translate_error(
            err, what, self.endpoints, username=self._options.username, idempotent=idempotent
        )

    def __repr__(self) -> str:
        return f"EtcdCoordinator({self._url!r})"


def _net_effect(ops: Sequence[Op]) -> dict[str, Op]:
    """The last operation on each key, in first-seen key order.

    etcd refuses a Txn that writes one key twice, so a commit keeps only the
    final operation per key: ``Put, Put`` is the last ``Put``; ``Put, Delete``
    is the ``Delete`` (nothing at all when the key was absent). ``Delete``
    then ``Put`` would have to re-create the key with a new create revision
    (a new epoch), which one etcd revision cannot express: refused.
    """
    final: dict[str, Op] = {}
    for op in ops:
        if not isinstance(op, Put | Delete):  # pragma: no cover - Op is a closed union
            raise ConfigError(f"unknown commit operation {op!r}")
        previous = final.get(op.key)
        if isinstance(previous, Delete) and isinstance(op, Put):
            raise ConfigError(
                f"commit deletes then re-creates {op.key!r}: etcd cannot do both in one "
                f"transaction; commit the delete and the put separately"
            )
        if isinstance(previous, Delete):
            continue  # Delete after Delete
        final[op.key] = op
    return final


def _compare_create(key: bytes, revision: int) -> Any:
    return rpc.Compare(
        key=key, target=rpc.Compare.CREATE, result=rpc.Compare.EQUAL, create_revision=revision
    )
