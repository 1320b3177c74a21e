"""gRPC channels to etcd: plaintext or TLS, endpoint failover, and the
authentication token."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import grpc  # type: ignore[import-untyped]
import grpc.aio  # type: ignore[import-untyped]
from aetcd import rpc

from coordinators.errors import ConfigError
from coordinators.etcd.errors import Failure, classify
from coordinators.etcd.url import EtcdTarget
from coordinators.protocol import ConnectOptions

log = logging.getLogger("coordinators.etcd")  # the backend's one logger

Metadata = tuple[tuple[str, str], ...] | None

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

# -- channels ----------------------------------------------------------------


class ChannelFactory:
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
class Stubs:
    """The stubs of one channel incarnation (``generation`` detects failovers)."""

    generation: int
    endpoint: str
    kv: Any
    lease: Any
    watch: Any
    auth: Any


class AioConnection:
    """The asyncio channel of a coordinator: endpoint failover and auth token.

    One endpoint at a time; on a transport failure the next endpoint is used
    (only if the failure happened on the current channel, so that many
    concurrent failures rotate once). The token is fetched lazily and
    refreshed when etcd says it is invalid (expired simple token, stale auth
    revision), under a lock so that one expiry causes one authentication.
    """

    def __init__(
        self,
        factory: ChannelFactory,
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
        self._stubs: Stubs | None = None
        self._token: str | None = None
        self._auth_lock = asyncio.Lock()
        self._old_channels: set[asyncio.Task[None]] = set()
        self.authentications = 0  # observable by tests

    @property
    def index(self) -> int:
        return self._index

    def stubs(self) -> Stubs:
        if self._stubs is None:
            endpoint = self._endpoints[self._index]
            self._channel = self._factory.aio(endpoint)
            self._generation += 1
            self._stubs = Stubs(
                self._generation,
                endpoint,
                rpc.KVStub(self._channel),
                rpc.LeaseStub(self._channel),
                rpc.WatchStub(self._channel),
                rpc.AuthStub(self._channel),
            )
        return self._stubs

    async def metadata(self, stubs: Stubs) -> Metadata:
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

    def recover(self, stubs: Stubs, metadata: Metadata, err: BaseException) -> None:
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
