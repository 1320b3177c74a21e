"""The shared state of a ZooKeeper coordinator and its request plumbing.

kazoo runs its own threads. Every request is sent with kazoo's non-blocking
``*_async`` calls from the event loop; results, watch events and state
changes hop back to the loop with ``call_soon_threadsafe``."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import ssl
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, TypeVar

from kazoo.exceptions import (
    AuthFailedError,
    ConnectionLoss,
    SessionExpiredError,
    ZookeeperError,
)
from kazoo.security import ACL

from coordinators.errors import (
    CoordinatorError,
    CoordinatorUnavailable,
    SessionLost,
)
from coordinators.protocol import (
    ConnectOptions,
    SessionState,
)
from coordinators.session import SessionTransitions
from coordinators.zookeeper.errors import CONFLICT_RETRY, READ_RETRY, translated
from coordinators.zookeeper.security import Credentials
from coordinators.zookeeper.session import ZooKeeperSession
from coordinators.zookeeper.url import ZkTarget
from coordinators.zookeeper.watch import ZkWatch

log = logging.getLogger("coordinators.zookeeper")  # the backend's one logger

T = TypeVar("T")


class ZkCore:
    """The state the parts of :class:`ZooKeeperCoordinator` share, and the
    plumbing of requests: kazoo's non-blocking calls, answered on the loop."""

    _options: ConnectOptions
    _target: ZkTarget
    _credentials: Credentials | None
    _acl: tuple[ACL, ...]
    _url: str
    _root: str
    _prefix: str
    _sleep: Callable[[float], Awaitable[None]]
    _op_timeout_s: float
    # The longest request the servers read (their jute.maxbuffer), and the
    # bytes of our ACL in each create (coordinators/zookeeper/limits.py).
    _max_request: int
    _acl_bytes: int
    _requested_timeout_s: float
    _negotiated_timeout_s: float | None
    # Set (from kazoo's thread) when a connection attempt has finished
    # its handshake, authentication included, or failed.
    _handshake_done: threading.Event | None
    _handshake_error: BaseException | None
    # The TLS error of kazoo's last connection attempt to each (host, port).
    _tls_failures: dict[tuple[str, int], ssl.SSLError]
    _loop: asyncio.AbstractEventLoop | None
    _client: Any
    _session: ZooKeeperSession | None
    _transitions: SessionTransitions | None
    _heartbeat: asyncio.Task[None] | None
    _retiring: asyncio.Task[None] | None
    _heartbeat_kick: asyncio.Event
    _watches: set[ZkWatch]
    _epochs: collections.OrderedDict[tuple[str, int], str]
    _closed: bool
    # Set from kazoo's thread the moment kazoo reports LOST, before the
    # loop hears of it: no ephemeral create may start after that.
    _lost_flag: bool

    @property
    def client(self) -> Any:
        """The ZooKeeper client of the current connection (kazoo's, or the
        asyncio one: ``client_kind``), None while not connected. Read by the
        coordinator's watches, which arm on it, and by the backend's tests
        (its session id, its connection state); requests go through the
        coordinator's methods."""
        return self._client

    @property
    def session(self) -> ZooKeeperSession:
        if self._session is None:
            raise CoordinatorError(f"{self!r} is not connected: await connect() first")
        return self._session

    @contextlib.contextmanager
    def _translating(self, what: str) -> Iterator[None]:
        """Like :func:`translated`, but once this session is LOST every failure
        is :class:`SessionLost`: a request in flight when the session was
        declared lost fails on the stopped kazoo client (ConnectionClosedError),
        and the owner must rejoin, not give up."""
        try:
            with translated(what):
                yield
        except CoordinatorError as err:
            session = self._session
            lost = self._lost_flag or (session is not None
                                       and session.state is SessionState.LOST)
            if lost and not isinstance(err, SessionLost) and not self._closed:
                sid = session.id if session is not None else "?"
                raise SessionLost(
                    f"ZooKeeper session {sid} is lost ({what}): open a new coordinator"
                ) from err
            raise

    def _live_client(self) -> Any:
        if self._closed:
            raise CoordinatorError(f"{self!r} is closed")
        session = self._session
        if self._client is None or session is None or self._loop is None:
            raise CoordinatorError(f"{self!r} is not connected: await connect() first")
        if self._lost_flag or session.state is SessionState.LOST:
            raise SessionLost(f"ZooKeeper session {session.id} is lost: open a new coordinator")
        return self._client

    def _in_loop(self, fn: Callable[..., object], *args: object) -> None:
        """Run ``fn(*args)`` on the event loop; called from kazoo's threads."""
        loop = self._loop
        if loop is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop is closed
            loop.call_soon_threadsafe(fn, *args)

    def _send(self, fn: Callable[..., Any], *args: Any) -> tuple[float, asyncio.Future[Any]]:
        """Send one kazoo request now (non-blocking); its reply as a loop future.

        Requests are sent in call order and ZooKeeper answers a session's
        requests in order, which the multi-request reads below rely on.
        """
        assert self._loop is not None
        future: asyncio.Future[Any] = self._loop.create_future()
        sent_at = time.monotonic()
        result = fn(*args)
        if isinstance(result, asyncio.Future):  # the asyncio client: settled on the loop
            return sent_at, result
        result.rawlink(functools.partial(self._deliver, future))
        return sent_at, future

    def _deliver(self, future: asyncio.Future[Any], result: Any) -> None:
        self._in_loop(_settle, future, result)

    async def _recv(
        self, sent: tuple[float, asyncio.Future[Any]], what: str, timeout: float | None = None
    ) -> Any:
        """The reply to a request: its value, or kazoo's exception (not translated)."""
        sent_at, future = sent
        limit = self._op_timeout_s if timeout is None else timeout
        try:
            # Not asyncio.wait_for: on Python 3.11 it returns the reply and
            # drops a cancel of the caller that arrives as the reply does (a
            # cancelled read loop would then go on to its next request).
            async with asyncio.timeout(limit):
                value = await future
        except TimeoutError as err:
            raise CoordinatorUnavailable(
                f"ZooKeeper did not answer {what} within {limit:g}s; retry"
            ) from err
        except ZookeeperError as err:
            if not isinstance(err, ConnectionLoss | SessionExpiredError | AuthFailedError):
                self._confirm(sent_at)  # an error reply is still a reply
            raise
        self._confirm(sent_at)
        return value

    async def _request(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        return await self._recv(self._send(fn, *args), what)

    async def _recv_all(
        self, sent: Sequence[tuple[float, asyncio.Future[Any]]], what: str
    ) -> list[Any]:
        """Every reply, exceptions included as values (none left unretrieved)."""
        return list(
            await asyncio.gather(*(self._recv(s, what) for s in sent), return_exceptions=True)
        )

    async def _reading(self, fn: Callable[[], Awaitable[T]]) -> T:
        return await READ_RETRY.copy(sleep=self._sleep)(fn)

    async def _writing(self, fn: Callable[[], Awaitable[T]]) -> T:
        return await CONFLICT_RETRY.copy(sleep=self._sleep)(fn)

    def _confirm(self, sent_at: float) -> None:
        """The server answered a request sent at ``sent_at``: the session lived then."""
        session, client = self._session, self._client
        if session is None or client is None or session.state is SessionState.LOST:
            return
        if session_id_of(client) == session.raw_id:
            session.confirmed(sent_at)

    async def _stop_client(self, client: Any) -> None:
        """Stop either client, ending the session: the asyncio one on the loop,
        kazoo (blocking) in the loop's default executor."""
        close = getattr(client, "aclose", None)
        if close is not None:
            await close()
            return
        await asyncio.get_running_loop().run_in_executor(None, stop_client, client)

    def _forget(self, watch: ZkWatch) -> None:
        self._watches.discard(watch)

    def _last_zxid(self) -> int:
        client = self._client
        return int(client.last_zxid) if client is not None else 0

def session_id_of(client: Any) -> int | None:
    """The id of kazoo's current session (kazoo keeps it private; None between sessions)."""
    session_id = getattr(client, "_session_id", None)
    return int(session_id) if session_id is not None else None


def _settle(future: asyncio.Future[Any], result: Any) -> None:
    """Copy a ready kazoo async result into a loop future (on the loop)."""
    if future.done():  # timed out or cancelled meanwhile
        return
    error = result.exception
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result.value)


def start_client(
    client: Any, timeout_s: float, handshake: threading.Event | None,
    give_up: Callable[[], bool] = lambda: False,
) -> bool:
    """Start kazoo and wait for its first connection (blocking; runs in an executor).

    kazoo reports the connection as soon as the server accepts the session,
    before authenticating and before returning the negotiated timeout; wait
    for the end of the handshake too when we can see it. ``give_up()`` true
    (every server failed its TLS handshake) ends the wait early.
    """
    deadline = time.monotonic() + timeout_s
    event = client.start_async()
    while not event.wait(min(0.05, max(0.0, deadline - time.monotonic()))):
        if give_up() or time.monotonic() >= deadline:
            break
    if handshake is not None and client.connected:
        handshake.wait(max(0.0, deadline - time.monotonic()))
    return bool(client.connected)


def stop_client(client: Any) -> None:
    """Stop kazoo, ending the session, and free its resources (blocking)."""
    try:
        client.stop()
        client.close()
    except Exception as err:
        log.warning("stopping the ZooKeeper client: %r", err)
