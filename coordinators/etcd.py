"""The etcd v3 backend: ``etcd://HOST:PORT[,HOST:PORT...][/PREFIX]`` (``etcds://`` = TLS).

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
import contextlib
import enum
import logging
import math
import re
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import grpc  # type: ignore[import-untyped]
import grpc.aio  # type: ignore[import-untyped]
import tenacity
from aetcd import rpc

from coordinators import retry
from coordinators.credentials import refuse_plaintext_credentials
from coordinators.errors import (
    AuthenticationFailed,
    ConfigError,
    CoordinatorError,
    CoordinatorUnavailable,
    InvalidCoordinatorURL,
    SessionLost,
)
from coordinators.protocol import (
    Check,
    ConnectOptions,
    Coordinator,
    Delete,
    Entry,
    Op,
    Put,
    SessionState,
    Watch,
    validate_dir,
    validate_key,
)
from coordinators.session import KeepAliveThread, Renewal, ThreadedSession
from coordinators.urls import host_string, parse_hosts, redact_url, split_scheme

log = logging.getLogger(__name__)

T = TypeVar("T")
Metadata = tuple[tuple[str, str], ...] | None
Sleep = Callable[[float], Awaitable[None]]

DEFAULT_PORT: Final = 2379
# Keep-alives per TTL: at TTL/3 two consecutive keep-alives may fail before
# the lease is in danger.
KEEPALIVES_PER_TTL: Final = 3

# gRPC channel options. Reconnect backoff is kept short so that a restarted
# etcd is found again well within a session timeout (the gRPC default grows
# to 120 s); HTTP/2 pings detect a silent (paused, partitioned) server. etcd
# refuses pings more frequent than --grpc-keepalive-min-time (5 s).
_CHANNEL_OPTIONS: Final[tuple[tuple[str, int], ...]] = (
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2000),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
)


# -- URL ---------------------------------------------------------------------


@dataclass(frozen=True)
class EtcdTarget:
    """A parsed etcd URL: endpoints ``host:port``, key prefix, TLS or not."""

    endpoints: tuple[str, ...]
    prefix: str  # "" or "a/b/"
    tls: bool


def parse_etcd_url(url: str) -> EtcdTarget:
    """``etcd[s]://HOST[:PORT][,HOST[:PORT]...][/PREFIX]``; one-line error if bad."""
    shown = redact_url(url)
    scheme, rest = split_scheme(
        url, ("etcd", "etcds"), "an etcd URL",
        "etcd://HOST:PORT[,HOST:PORT...][/PREFIX] or etcds://...",
    )
    if "?" in rest or "#" in rest:
        raise InvalidCoordinatorURL(
            f"invalid etcd URL {shown!r}: query strings are not supported; pass options instead"
        )
    netloc, _, path = rest.partition("/")
    hosts = parse_hosts(netloc, DEFAULT_PORT, "etcd", shown)
    path = path.strip("/")
    prefix = ""
    if path:
        if not all(_SEGMENT.match(s) for s in path.split("/")):
            raise InvalidCoordinatorURL(
                f"invalid etcd URL {shown!r}: the key prefix may only use A-Z a-z 0-9 . _ - "
                "separated by '/'"
            )
        prefix = path + "/"
    return EtcdTarget(tuple(host_string(h) for h in hosts), prefix, scheme == "etcds")


_SEGMENT = re.compile(r"^[A-Za-z0-9._-]+$")


# -- errors ------------------------------------------------------------------


class Failure(enum.Enum):
    """What a failed call means for retrying it (see :func:`classify`)."""

    NOT_APPLIED = "not applied"  # certainly not executed: retry anything
    AMBIGUOUS = "ambiguous"  # may have been executed: retry idempotent calls only
    TOKEN = "token"  # auth token expired or stale: refresh, then retry anything
    TLS = "tls"  # TLS handshake refused either way
    AUTH = "auth"  # credentials refused or missing, or permission denied
    LEASE_GONE = "lease gone"  # the session's lease no longer exists
    COMPACTED = "compacted"  # the requested revision was compacted
    FATAL = "fatal"  # a request the server will never accept


_TLS_HINTS = ("tsi_", "handshake", "ssl", "certificate", "tls", "verification")
_AUTH_HINTS = ("authentication", "user name", "permission denied", "not authorized")
_NOT_SENT_HINTS = (
    "failed to connect",
    "connection refused",
    "etcdserver: no leader",
    "etcdserver: too many requests",
    "not primary",
    "dns resolution failed",
)


def _rpc_code_and_details(err: BaseException) -> tuple[Any, str] | None:
    if isinstance(err, grpc.RpcError) and callable(getattr(err, "code", None)):
        return err.code(), str(err.details() or "")
    return None


def classify(err: BaseException) -> Failure:
    """How to react to ``err`` raised by a gRPC call to etcd."""
    rpc_error = _rpc_code_and_details(err)
    if rpc_error is None:
        if isinstance(err, TimeoutError | OSError):
            return Failure.AMBIGUOUS
        return Failure.FATAL
    code, details = rpc_error
    text = details.lower()
    status = grpc.StatusCode
    if "invalid auth token" in text or "auth store is old" in text:
        return Failure.TOKEN
    if code is status.UNAVAILABLE and any(h in text for h in _TLS_HINTS):
        return Failure.TLS
    if code in (status.UNAUTHENTICATED, status.PERMISSION_DENIED) or (
        code in (status.INVALID_ARGUMENT, status.FAILED_PRECONDITION)
        and any(h in text for h in _AUTH_HINTS)
    ):
        return Failure.AUTH
    if code is status.NOT_FOUND and "lease" in text:
        return Failure.LEASE_GONE
    if code is status.OUT_OF_RANGE and "compacted" in text:
        return Failure.COMPACTED
    if code in (status.UNAVAILABLE, status.RESOURCE_EXHAUSTED) and any(
        h in text for h in _NOT_SENT_HINTS
    ):
        return Failure.NOT_APPLIED
    if code in (status.UNAVAILABLE, status.DEADLINE_EXCEEDED, status.CANCELLED, status.UNKNOWN):
        return Failure.AMBIGUOUS
    return Failure.FATAL


def _describe(err: BaseException) -> str:
    """``CODE: details`` of a gRPC error (or the exception), on one line."""
    rpc_error = _rpc_code_and_details(err)
    if rpc_error is None:
        return _one_line(f"{type(err).__name__}: {err}")
    code, details = rpc_error
    return _one_line(f"{getattr(code, 'name', code)}: {details}")


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def translate_error(
    err: BaseException,
    what: str,
    endpoints: Sequence[str],
    *,
    username: str | None = None,
    idempotent: bool = True,
) -> CoordinatorError:
    """The one place where gRPC / etcd failures become our errors.

    The message is one line: what we did, where, and what to check. It never
    contains a credential (the password and the token are never in scope).
    """
    if isinstance(err, CoordinatorError):
        return err
    where = ",".join(endpoints)
    rpc_error = _rpc_code_and_details(err)
    detail = _one_line(rpc_error[1] if rpc_error else f"{type(err).__name__}: {err}")
    kind = classify(err)
    if kind is Failure.TLS:
        return AuthenticationFailed(
            f"TLS handshake with etcd at {where} failed during {what}: check the CA, the "
            f"client certificate and key, and the server name ({detail})"
        )
    if kind is Failure.AUTH:
        who = f"user {username!r}" if username else "no credentials"
        return AuthenticationFailed(
            f"etcd at {where} refused {what} with {who}: check the username, password and "
            f"role permissions ({detail})"
        )
    if kind is Failure.LEASE_GONE:
        return SessionLost(
            f"etcd session lease expired or was revoked ({what}); open a new coordinator "
            f"and re-register"
        )
    if kind in (Failure.NOT_APPLIED, Failure.AMBIGUOUS, Failure.TOKEN):
        outcome = (
            "" if idempotent or kind is not Failure.AMBIGUOUS
            else "; the write may or may not have been applied, re-read before retrying"
        )
        return CoordinatorUnavailable(
            f"etcd at {where} unavailable during {what}{outcome} ({detail})"
        )
    if kind is Failure.COMPACTED:
        return CoordinatorError(f"etcd revision compacted during {what} ({detail})")
    return CoordinatorError(f"etcd at {where} rejected {what} ({detail})")


# -- retries -----------------------------------------------------------------

# Built once; every call takes a copy with its own stop, retry predicate and sleep.
_RETRY_POLICY: Final = retry.RPCS


def _retry_predicate(idempotent: bool) -> tenacity.retry_base:
    def should_retry(err: BaseException) -> bool:
        kind = classify(err)
        return kind in (Failure.NOT_APPLIED, Failure.TOKEN) or (
            idempotent and kind is Failure.AMBIGUOUS
        )

    return tenacity.retry_if_exception(should_retry)


_RETRY_IDEMPOTENT: Final = _retry_predicate(True)
_RETRY_WRITE: Final = _retry_predicate(False)


# -- channels ----------------------------------------------------------------


class _ChannelFactory:
    """Plaintext or TLS channels (asyncio or blocking) to one endpoint."""

    def __init__(self, target: EtcdTarget, options: ConnectOptions) -> None:
        self.tls = target.tls or options.tls
        self._credentials: Any = None
        chan_options: list[tuple[str, Any]] = list(_CHANNEL_OPTIONS)
        if self.tls:
            if (options.tls_cert is None) != (options.tls_key is None):
                raise ConfigError("TLS client authentication needs both tls_cert and tls_key")
            self._credentials = grpc.ssl_channel_credentials(
                root_certificates=_read_pem(options.tls_ca, "CA"),
                private_key=_read_pem(options.tls_key, "client key"),
                certificate_chain=_read_pem(options.tls_cert, "client certificate"),
            )
            if options.tls_server_name:
                chan_options.append(("grpc.ssl_target_name_override", options.tls_server_name))
        elif options.tls_server_name:
            raise ConfigError("tls_server_name needs TLS: use etcds:// or give tls_ca")
        self._options = tuple(chan_options)

    def aio(self, endpoint: str) -> Any:
        if self.tls:
            return grpc.aio.secure_channel(endpoint, self._credentials, options=self._options)
        return grpc.aio.insecure_channel(endpoint, options=self._options)

    def blocking(self, endpoint: str) -> Any:
        if self.tls:
            return grpc.secure_channel(endpoint, self._credentials, options=self._options)
        return grpc.insecure_channel(endpoint, options=self._options)


def _read_pem(path: str | None, what: str) -> bytes | None:
    if path is None:
        return None
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError as err:
        raise ConfigError(f"cannot read TLS {what} file {path!r}: {err.strerror}") from err


@dataclass(frozen=True)
class _Stubs:
    """The stubs of one channel incarnation (``generation`` detects failovers)."""

    generation: int
    endpoint: str
    kv: Any
    lease: Any
    watch: Any
    auth: Any


class _AioConnection:
    """The asyncio channel of a coordinator: endpoint failover and auth token.

    One endpoint at a time; on a transport failure the next endpoint is used
    (only if the failure happened on the current channel, so that many
    concurrent failures rotate once). The token is fetched lazily and
    refreshed when etcd says it is invalid (expired simple token, stale auth
    revision), under a lock so that one expiry causes one authentication.
    """

    def __init__(
        self,
        factory: _ChannelFactory,
        endpoints: Sequence[str],
        options: ConnectOptions,
        rpc_timeout: float,
    ) -> None:
        self._factory = factory
        self._endpoints = tuple(endpoints)
        self._username = options.username
        self._password = options.password
        self._rpc_timeout = rpc_timeout
        self._index = 0
        self._generation = 0
        self._channel: Any = None
        self._stubs: _Stubs | None = None
        self._token: str | None = None
        self._auth_lock = asyncio.Lock()
        self._old_channels: set[asyncio.Task[None]] = set()
        self.authentications = 0  # observable by tests

    @property
    def index(self) -> int:
        return self._index

    def stubs(self) -> _Stubs:
        if self._stubs is None:
            endpoint = self._endpoints[self._index]
            self._channel = self._factory.aio(endpoint)
            self._generation += 1
            self._stubs = _Stubs(
                self._generation,
                endpoint,
                rpc.KVStub(self._channel),
                rpc.LeaseStub(self._channel),
                rpc.WatchStub(self._channel),
                rpc.AuthStub(self._channel),
            )
        return self._stubs

    async def metadata(self, stubs: _Stubs) -> Metadata:
        if self._username is None or self._password is None:
            return None
        token = self._token
        if token is None:
            async with self._auth_lock:
                if self._token is None:
                    response = await stubs.auth.Authenticate(
                        rpc.AuthenticateRequest(
                            name=self._username, password=self._password.reveal()
                        ),
                        timeout=self._rpc_timeout,
                    )
                    self.authentications += 1
                    self._token = str(response.token)
                token = self._token
        return (("token", token),)

    def recover(self, stubs: _Stubs, metadata: Metadata, err: BaseException) -> None:
        """React to ``err`` from a call made with ``stubs``/``metadata``."""
        kind = classify(err)
        if kind is Failure.TOKEN:
            # Drop the token the call used (not a fresher one another call got).
            if metadata is not None and metadata[0][1] == self._token:
                self._token = None
        elif kind in (Failure.NOT_APPLIED, Failure.AMBIGUOUS) and len(self._endpoints) > 1:
            self._failover(stubs.generation)

    def _failover(self, generation: int) -> None:
        if generation != self._generation or self._stubs is None:
            return
        old = self._channel
        self._index = (self._index + 1) % len(self._endpoints)
        self._stubs = None
        self._channel = None
        # The token stays: etcd replicates tokens through raft, and a member
        # that does not know it answers "invalid auth token" (then refreshed).
        log.info("etcd: switching to endpoint %s", self._endpoints[self._index])
        # Calls still running on the old channel get a grace period.
        task = asyncio.get_running_loop().create_task(old.close(grace=self._rpc_timeout))
        self._old_channels.add(task)
        task.add_done_callback(self._old_channels.discard)

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
        self._channel = None
        self._stubs = None
        for task in list(self._old_channels):
            with contextlib.suppress(Exception):
                await task


# -- session -----------------------------------------------------------------


class EtcdSession(ThreadedSession):
    """A session backed by one etcd lease. State changes from the keep-alive
    thread are handed to the event loop, so listeners run on the loop."""

    def __init__(
        self,
        lease_id: int,
        timeout_s: float,
        loop: asyncio.AbstractEventLoop,
        *,
        sent_at: float | None = None,
    ) -> None:
        super().__init__(timeout_s, loop, sent_at=sent_at)
        self.lease_id = lease_id

    @property
    def id(self) -> str:
        return format(self.lease_id, "x")

    def __repr__(self) -> str:
        return f"EtcdSession(lease={self.id}, state={self.state.value})"


class _LeaseRenewal(Renewal):
    """One lease keep-alive on a blocking channel of the keeper thread's own.

    The channel fails over to the next endpoint after a transport failure.
    etcd 3.4 renews leases without a token; one is fetched only once etcd has
    asked for it (another version or configuration may).
    """

    def __init__(
        self,
        session: EtcdSession,
        factory: _ChannelFactory,
        endpoints: Sequence[str],
        start_index: int,
        options: ConnectOptions,
    ) -> None:
        self._session = session
        self._factory = factory
        self._endpoints = tuple(endpoints)
        self._index = start_index
        self._username = options.username
        self._password = options.password
        self._timeout = max(0.5, session.timeout_s / KEEPALIVES_PER_TTL)
        self._channel: Any = None
        self._lock = threading.Lock()
        self._call: Any = None
        self._interrupted = False
        self._use_token = False
        self._token: str | None = None

    def renew(self) -> bool:
        if self._channel is None:
            self._channel = self._factory.blocking(self._endpoints[self._index])
        endpoint = self._endpoints[self._index]
        try:
            return self._keepalive(self._channel) > 0
        except Exception as err:
            kind = classify(err)
            if kind is Failure.LEASE_GONE:
                return False
            if kind in (Failure.TOKEN, Failure.AUTH):
                self._use_token, self._token = True, None
            if len(self._endpoints) > 1 and kind is not Failure.TOKEN:
                self._channel.close()
                self._index = (self._index + 1) % len(self._endpoints)
                self._channel = None
            raise CoordinatorUnavailable(
                f"keep-alive failed at {endpoint}: {_describe(err)}"
            ) from err

    def retry_delay(self, failures: int, interval_s: float) -> float:
        return min(interval_s, 0.05 * float(2 ** min(failures, 6)))

    def interrupt(self) -> None:
        with self._lock:
            self._interrupted = True
            call = self._call
        if call is not None:
            with contextlib.suppress(Exception):
                call.cancel()

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()

    def _keepalive(self, channel: Any) -> int:
        metadata = self._metadata(channel)
        call = rpc.LeaseStub(channel).LeaseKeepAlive(
            iter([rpc.LeaseKeepAliveRequest(ID=self._session.lease_id)]),
            timeout=self._timeout,
            metadata=metadata,
        )
        with self._lock:
            self._call = call
            interrupted = self._interrupted
        try:
            if interrupted:  # stopped before the call was registered
                call.cancel()
            for response in call:
                return int(response.TTL)
            raise CoordinatorUnavailable("etcd closed the keep-alive stream without an answer")
        finally:
            with self._lock:
                self._call = None
            call.cancel()

    def _metadata(self, channel: Any) -> Metadata:
        if not self._use_token or self._username is None or self._password is None:
            return None
        if self._token is None:
            response = rpc.AuthStub(channel).Authenticate(
                rpc.AuthenticateRequest(name=self._username, password=self._password.reveal()),
                timeout=self._timeout,
            )
            self._token = str(response.token)
        return (("token", self._token),)


class _KeepAlive(KeepAliveThread):
    """Renews the lease every TTL/3 from a thread of its own.

    A thread rather than an asyncio task: a blocked or busy event loop must
    not delay keep-alives (invariant 3 is still enforced by the deadline; this
    only keeps a healthy member from losing its lease). A keep-alive answered
    with TTL 0, or refused because the lease is unknown, makes the session LOST.
    """

    def __init__(
        self,
        session: EtcdSession,
        factory: _ChannelFactory,
        endpoints: Sequence[str],
        start_index: int,
        options: ConnectOptions,
    ) -> None:
        super().__init__(
            session,
            renew=_LeaseRenewal(session, factory, endpoints, start_index, options),
            interval_s=session.timeout_s / KEEPALIVES_PER_TTL,
            name=f"etcd-keepalive-{session.id}",
            what="etcd lease",
            logger=log,
        )


# -- watch -------------------------------------------------------------------


class _StreamBroken(Exception):
    pass


class _Compacted(Exception):
    pass


class EtcdWatch(Watch):
    """A level-triggered watch of the direct children of one directory.

    A background task holds an etcd watch stream from the revision after
    the last one this coordinator had seen when the watch was created, so no
    change after creation can be missed. It remembers the next revision to
    watch from; when the stream breaks it re-arms from there (and reports a
    change); when that revision was compacted it re-arms from a fresh read
    (and reports a change), never acting on a stale view.

    Example::

        async with coord.watch("groups/g/members/") as w:
            members = await coord.list("groups/g/members/")
            while not await w.wait(timeout=1.0):
                pass
            members = await coord.list("groups/g/members/")  # re-read
    """

    def __init__(self, coordinator: EtcdCoordinator, directory: str, start_revision: int) -> None:
        self._coordinator = coordinator
        self._directory = directory
        self._key = coordinator._full(directory)
        self._next_revision = start_revision
        self._changed = asyncio.Event()
        self._closed = False
        self._armed = False
        self._broken = False
        self.rearms = 0  # observable by tests
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name=f"etcd-watch-{directory}"
        )

    @property
    def next_revision(self) -> int:
        """The revision the stream delivers next: every event below it was seen."""
        return self._next_revision

    async def wait(self, timeout: float | None = None) -> bool:
        if self._closed:
            raise CoordinatorError(f"watch of {self._directory!r} is closed")
        try:
            await asyncio.wait_for(self._changed.wait(), timeout)
        except TimeoutError:
            return False
        if self._closed:
            raise CoordinatorError(f"watch of {self._directory!r} is closed")
        self._changed.clear()
        return True

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._changed.set()  # wake waiters; they raise "closed"
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task
        self._coordinator._watches.discard(self)

    async def _run(self) -> None:
        failures = 0
        while not self._closed:
            stubs = None
            metadata: Metadata = None
            try:
                stubs = self._coordinator._conn.stubs()
                metadata = await self._coordinator._conn.metadata(stubs)
                await self._stream(stubs, metadata)
                raise _StreamBroken("etcd closed the watch stream")
            except asyncio.CancelledError:
                raise
            except _Compacted:
                # Re-arm from a fresh read: report a change (the caller
                # re-reads) and watch from after that read.
                try:
                    revision = await self._coordinator._current_revision()
                except CoordinatorError as err:
                    log.debug("etcd watch of %r: re-read failed: %s", self._directory, err)
                    failures += 1
                    await self._backoff(failures)
                    continue
                self._next_revision = revision + 1
                self.rearms += 1
                self._changed.set()
            except Exception as err:
                if self._closed:
                    return
                self._broken = True
                if stubs is not None:
                    self._coordinator._conn.recover(stubs, metadata, err)
                if classify(err) is not Failure.TOKEN:
                    # A stream that was armed broke: start the backoff afresh.
                    failures = 1 if self._armed else failures + 1
                    log.debug("etcd watch of %r broken: %s", self._directory, err)
                    await self._backoff(failures)

    async def _backoff(self, failures: int) -> None:
        await self._coordinator._sleep(min(1.0, 0.05 * 2 ** min(failures, 6)))

    async def _stream(self, stubs: _Stubs, metadata: Metadata) -> None:
        """Hold one watch stream until it ends (EOF, error, compaction)."""
        self._armed = False
        call = stubs.watch.Watch(metadata=metadata)
        try:
            await call.write(
                rpc.WatchRequest(
                    create_request=rpc.WatchCreateRequest(
                        key=self._key,
                        range_end=_prefix_end(self._key),
                        start_revision=self._next_revision,
                        progress_notify=True,
                    )
                )
            )
            depth = len(self._key)
            while True:
                response = await call.read()
                if response is grpc.aio.EOF:
                    return
                if response.compact_revision:
                    raise _Compacted()
                if response.canceled:
                    raise _StreamBroken(f"watch canceled by etcd: {response.cancel_reason}")
                if response.created:
                    self._armed = True
                    if self._broken:
                        # Re-armed after a break: nothing was missed (we
                        # resume from the next revision) but say so anyway.
                        self._broken = False
                        self.rearms += 1
                        self._changed.set()
                changed = False
                # Events below this were delivered already (a stream re-armed
                # from _next_revision never repeats them; this guards anyway).
                floor = self._next_revision
                for event in response.events:
                    revision = int(event.kv.mod_revision)
                    if revision < floor:
                        continue
                    self._next_revision = max(self._next_revision, revision + 1)
                    # Deeper keys (``dir/sub/x``) are in the watched range but
                    # are not children: they advance the revision, never wake.
                    if b"/" not in event.kv.key[depth:]:
                        changed = True
                if not response.events and not response.created and response.header.revision:
                    # Progress notification: every event up to here was sent.
                    self._next_revision = max(self._next_revision, response.header.revision + 1)
                if changed:
                    self._changed.set()
        finally:
            call.cancel()


def _prefix_end(prefix: bytes) -> bytes:
    """The range end covering every key starting with ``prefix``."""
    data = bytearray(prefix)
    for i in reversed(range(len(data))):
        if data[i] < 0xFF:
            data[i] += 1
            return bytes(data[: i + 1])
    return b"\0"


# -- coordinator -------------------------------------------------------------


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
            raise ConfigError("etcd authentication needs both a username and a password")
        if self._options.session_timeout_s <= 0 or self._options.connect_timeout_s <= 0:
            raise ConfigError("session and connect timeouts must be positive")
        self._prefix = self._target.prefix.encode()
        self._factory = _ChannelFactory(self._target, self._options)
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
        self._conn = _AioConnection(
            self._factory, self._target.endpoints, self._options, self._rpc_timeout
        )
        self._sleep: Sleep = sleep or asyncio.sleep
        self._session: EtcdSession | None = None
        self._keepalive: _KeepAlive | None = None
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
        self._keepalive = _KeepAlive(
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

    async def list(self, prefix: str) -> list[Entry]:
        full = self._full(validate_dir(prefix))
        response = await self._call(
            f"list {prefix!r}",
            lambda s, md: s.kv.Range(
                rpc.RangeRequest(key=full, range_end=_prefix_end(full)),
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
        what = f"commit of {len(requests)} op(s) on {sorted(final) or 'no keys'}"
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

    def watch(self, prefix: str) -> EtcdWatch:
        validate_dir(prefix)
        self._check_open()
        # Every change after this instant has a revision above the highest one
        # this coordinator has observed (revisions are linearizable).
        watch = EtcdWatch(self, prefix, self._max_revision + 1)
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
        call: Callable[[_Stubs, Metadata], Awaitable[T]],
        *,
        idempotent: bool,
    ) -> T:
        """One RPC with retries: failover on transport errors, token refresh
        on an expired token; writes are retried only when certainly not
        applied. Every failure leaves through :func:`translate_error`."""
        self._check_open()
        policy = _RETRY_POLICY.copy(
            sleep=self._sleep,
            stop=tenacity.stop_after_delay(self._budget),
            retry=_RETRY_IDEMPOTENT if idempotent else _RETRY_WRITE,
        )
        try:
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
        except CoordinatorError:
            raise
        except Exception as err:
            error = translate_error(
                err, what, self.endpoints, username=self._options.username,
                idempotent=idempotent,
            )
            if isinstance(error, SessionLost) and self._session is not None:
                self._session.report(SessionState.LOST)
                if self._keepalive is not None:
                    self._keepalive.stop()
            raise error from err
        raise AssertionError("unreachable: tenacity either returns or raises")

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
