"""The etcd session: one lease, renewed from a keep-alive thread (see
:mod:`coordinators.session`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Sequence
from typing import Any, Final

from aetcd import rpc

from coordinators.errors import CoordinatorUnavailable
from coordinators.etcd.channel import ChannelFactory, Metadata
from coordinators.etcd.errors import Failure, classify, describe
from coordinators.protocol import ConnectOptions
from coordinators.session import KeepAliveThread, Renewal, ThreadedSession

log = logging.getLogger("coordinators.etcd")  # the backend's one logger

# Keep-alives per TTL: at TTL/3 two consecutive keep-alives may fail before
# the lease is in danger.
KEEPALIVES_PER_TTL: Final = 3

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
        factory: ChannelFactory,
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
                f"keep-alive failed at {endpoint}: {describe(err)}"
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


class KeepAlive(KeepAliveThread):
    """Renews the lease every TTL/3 from a thread of its own.

    A thread rather than an asyncio task: a blocked or busy event loop must
    not delay keep-alives (invariant 3 is still enforced by the deadline; this
    only keeps a healthy member from losing its lease). A keep-alive answered
    with TTL 0, or refused because the lease is unknown, makes the session LOST.
    """

    def __init__(
        self,
        session: EtcdSession,
        factory: ChannelFactory,
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
