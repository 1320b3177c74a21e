"""A ZooKeeper client on the event loop, without threads: kazoo's packets, our transport.

The coordinator's default client; kazoo is the other (``?client=kazoo`` in the
URL, or ``PAIMON_GROUP_ZK_CLIENT=kazoo``; docs/zookeeper.md, "Client: kazoo or
the asyncio connection"). It offers the part of :class:`kazoo.client.KazooClient`
the coordinator uses, with the same names, values and exceptions, except that
each ``*_async`` call returns an :class:`asyncio.Future` (settled on the loop
as its reply is read, with no thread hand-off) and that starting and stopping
are coroutines (:meth:`AioZkClient.start`, :meth:`AioZkClient.aclose`).

* **Requests** are written at once when connected (queued while
  reconnecting, sent in order on the next connection; a request whose
  caller gave up before it was sent is dropped); replies come back in xid
  order and settle the oldest pending future, as in kazoo
  (``_read_response``): an ``exists`` of a missing znode is ``None``, any
  other error code its kazoo exception.
* **multiRead** (:meth:`AioZkClient.get_many_async`, ZooKeeper 3.6+): the
  ``GetData`` of many paths in one message, each answered on its own
  (:class:`~coordinators.zookeeper.aio_txn.MultiRead`); kazoo has none.
  ``multi_read`` turns False once a server answered ``UnimplementedError``.
* **Watches** are registered when the reply that set them arrives and fire
  once (xid -1). On a lost connection every watch is dropped, and the
  coordinator's watches re-arm when CONNECTED is reported, as they do on
  kazoo, which drops them too: neither client sends ``SetWatches``.
* **Pings** (xid -2) go out when nothing is outstanding and nothing was
  sent for a third of the negotiated timeout; a connection with a request
  or a ping outstanding and nothing received for two thirds of the timeout
  (less up to 0.4 s) is dropped, as kazoo drops it.
* **Reconnection**: to the next host of the list (shuffled once), with the
  session id and password, backing off from 50 ms; requests in flight fail
  with ``ConnectionLoss``. The listeners hear SUSPENDED when a connection
  drops and CONNECTED once a new one is authenticated.
* **Expiry**: a server that no longer knows the session ends the client
  (EXPIRED_SESSION, the listeners hear LOST, every request fails with
  ``SessionExpiredError``): unlike kazoo it opens no new session, which the
  coordinator would never use anyway. A refused login (an error reply)
  ends it too (AUTH_FAILED); a connection that drops or goes silent during
  the login refused nothing: it is a failed attempt like any other, and the
  next one resumes the same session.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import random
import ssl
import time
from collections.abc import Callable
from typing import Any

from kazoo.exceptions import (
    EXCEPTIONS,
    AuthFailedError,
    ConnectionClosedError,
    ConnectionDropped,
    ConnectionLoss,
    NodeExistsError,
    NoNodeError,
    SASLException,
    SessionClosedRequireSaslError,
    SessionExpiredError,
    ZookeeperError,
)
from kazoo.protocol.serialization import (
    Close,
    Create,
    Exists,
    GetACL,
    GetChildren,
    GetChildren2,
    GetData,
    PingInstance,
    ReplyHeader,
    Watch,
)
from kazoo.protocol.states import EVENT_TYPE_MAP, KazooState, KeeperState, WatchedEvent
from kazoo.security import ACL

from coordinators.zookeeper.aio_txn import AioTransaction, MultiRead
from coordinators.zookeeper.security import kazoo_log
from coordinators.zookeeper.wire import (
    PING_XID,
    WATCH_XID,
    Framer,
    Handshake,
    Session,
    authenticate,
    handshake_wait,
    open_session,
    packet,
)

log = logging.getLogger("coordinators.zookeeper")  # the backend's one logger

Watcher = Callable[[WatchedEvent], object]
_Pending = tuple[Any, "asyncio.Future[Any]", int, Watcher | None]
# Errors of a login: no retry fixes them.
_LOGIN_ERRORS = (AuthFailedError, SASLException, SessionClosedRequireSaslError)
_CREATED, _DELETED, _CHANGED, _CHILD = 1, 2, 3, 4


class AioZkClient:
    """kazoo's client surface on the event loop; see the module docstring."""

    def __init__(
        self,
        hosts: list[tuple[str, int]],
        *,
        timeout_s: float,
        auth_data: list[tuple[str, str]] | None = None,
        sasl_options: dict[str, str] | None = None,
        tls: Callable[[], ssl.SSLContext] | None = None,
        max_delay_s: float = 2.0,
    ) -> None:
        self._hosts = list(hosts)
        random.shuffle(self._hosts)
        self._timeout_ms = int(timeout_s * 1000)
        self._auth_data = list(auth_data or [])
        self._sasl_options = sasl_options
        self._tls = tls
        # The context of the client's connections (_tls_context): built for
        # the first, again only after a connection failed in TLS.
        self._context: ssl.SSLContext | None = None
        self._max_delay_s = max_delay_s
        self.client_state: str = KeeperState.CLOSED
        self.last_zxid = 0
        self._session_id: int | None = None
        self._session: Session | None = None
        self.negotiated_timeout_s: float | None = None
        # The error that ended the first connection attempts, if any.
        self.handshake_error: BaseException | None = None
        self._listeners: list[Callable[[str], object]] = []
        self._data_watchers: dict[str, set[Watcher]] = collections.defaultdict(set)
        self._child_watchers: dict[str, set[Watcher]] = collections.defaultdict(set)
        self._queue: collections.deque[tuple[Any, asyncio.Future[Any], Watcher | None]] = (
            collections.deque()
        )
        self._pending: collections.deque[_Pending] = collections.deque()
        self._framer: Framer | None = None  # the connection, once open and authenticated
        self._outbox: list[bytes] = []  # packets written at the end of this turn of the loop
        self._xid = 0
        self._last_send = 0.0
        self._last_recv = 0.0
        self._ping_sent: float | None = None
        self._first: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        # False once a server answered a multiRead with UnimplementedError (before 3.6).
        self.multi_read = True

    # -- the surface the coordinator uses -------------------------------------

    @property
    def connected(self) -> bool:
        return self._framer is not None

    @property
    def client_id(self) -> tuple[int, bytes] | None:
        """The session's id and password, as kazoo's ``client_id``."""
        session = self._session
        return (session.session_id, session.password) if session is not None else None

    def add_listener(self, listener: Callable[[str], object]) -> None:
        self._listeners.append(listener)

    async def start(self, timeout: float) -> bool:
        """Open the session; True once connected and authenticated within ``timeout``."""
        self._first = asyncio.Event()
        self.client_state = KeeperState.CONNECTING
        self._task = asyncio.get_running_loop().create_task(self._run(), name="zk-connection")
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._first.wait()
        return self.connected

    async def aclose(self) -> None:
        """Close the session (its ephemeral znodes go at once) and the connection."""
        if self._stopping:
            return
        self._stopping = True
        framer = self._framer
        if framer is not None:
            closing = self._call(Close())
            with contextlib.suppress(Exception):
                async with asyncio.timeout(max(1.0, self._timeout_ms / 3000)):
                    await asyncio.shield(closing)
            framer.abort()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._end(KeeperState.CLOSED, ConnectionClosedError("Connection has been closed"))

    def exists_async(self, path: str, watch: Watcher | None = None) -> asyncio.Future[Any]:
        return self._call(Exists(path, watch), watch)

    def get_async(self, path: str, watch: Watcher | None = None) -> asyncio.Future[Any]:
        return self._call(GetData(path, watch), watch)

    def get_many_async(self, paths: list[str]) -> asyncio.Future[Any]:
        """``GetData`` of each path in one message (``multiRead``, ZooKeeper 3.6+): per
        path ``(data, stat)`` or the kazoo exception of its error, in order."""
        return self._call(MultiRead(tuple(paths)))

    def get_children_async(
        self, path: str, watch: Watcher | None = None, include_data: bool = False
    ) -> asyncio.Future[Any]:
        request = GetChildren2(path, watch) if include_data else GetChildren(path, watch)
        return self._call(request, watch)

    def get_acls_async(self, path: str) -> asyncio.Future[Any]:
        return self._call(GetACL(path))

    def create_async(
        self, path: str, value: bytes = b"", acl: list[ACL] | None = None,
        ephemeral: bool = False,
    ) -> asyncio.Future[Any]:
        return self._call(Create(path, value, list(acl or []), 1 if ephemeral else 0))

    def ensure_path_async(self, path: str, acl: list[ACL] | None = None) -> asyncio.Future[Any]:
        """Create ``path`` and its missing parents (persistent, ``acl``); True."""
        return asyncio.ensure_future(self._ensure_path(path, list(acl or [])))

    def transaction(self) -> AioTransaction:
        return AioTransaction(self._call)

    def call_async(self, request: Any) -> asyncio.Future[Any]:
        """Send any request kazoo's way could (an object with ``type``,
        ``serialize`` and ``deserialize``); its decoded reply."""
        return self._call(request)

    # -- requests -----------------------------------------------------------

    def _call(self, request: Any, watch: Watcher | None = None) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        state = self.client_state
        if state == KeeperState.AUTH_FAILED:
            future.set_exception(AuthFailedError())
        elif state == KeeperState.EXPIRED_SESSION:
            future.set_exception(SessionExpiredError())
        elif (self._stopping and not isinstance(request, Close)) or state == KeeperState.CLOSED:
            future.set_exception(ConnectionClosedError("Connection has been closed"))
        elif self._framer is not None:
            self._write(self._framer, request, future, watch)
        else:
            self._queue.append((request, future, watch))
        return future

    def _write(
        self, framer: Framer, request: Any, future: asyncio.Future[Any], watch: Watcher | None
    ) -> None:
        """Send in xid order; the requests of one turn of the loop go out in one write."""
        self._xid = self._xid % 2147483647 + 1
        if kazoo_log.isEnabledFor(logging.DEBUG):  # as kazoo logs them (redacted)
            kazoo_log.debug("Sending request(xid=%s): %s", self._xid, request)
        if not self._outbox:
            asyncio.get_running_loop().call_soon(self._flush, framer)
        self._outbox.append(packet(request, self._xid))
        self._pending.append((request, future, self._xid, watch))
        self._last_send = time.monotonic()

    def _flush(self, framer: Framer) -> None:
        if framer is not self._framer:
            return  # that connection is gone, and its packets were dropped with it
        outbox, self._outbox = self._outbox, []
        if outbox:
            framer.write(b"".join(outbox))

    async def _ensure_path(self, path: str, acl: list[ACL]) -> bool:
        if await self.exists_async(path) is not None:
            return True
        parent = path.rpartition("/")[0]
        if parent:
            await self._ensure_path(parent, acl)
        with contextlib.suppress(NodeExistsError):
            await self.create_async(path, b"", acl)
        return True

    # -- replies ------------------------------------------------------------

    def _on_frame(self, frame: bytes) -> None:
        self._last_recv = time.monotonic()
        header, offset = ReplyHeader.deserialize(frame, 0)
        if header.xid == PING_XID:
            self._ping_sent = None
        elif header.xid == WATCH_XID:
            self._on_event(frame, offset)
        elif header.xid > 0:
            self._on_reply(header, frame, offset)

    def _on_reply(self, header: Any, frame: bytes, offset: int) -> None:
        framer = self._framer
        if not self._pending:
            if framer is not None:
                framer.abort(ConnectionDropped(f"a reply to xid {header.xid} never sent"))
            return
        request, future, xid, watch = self._pending.popleft()
        if header.zxid and header.zxid > 0:
            self.last_zxid = header.zxid
        if header.xid != xid:
            _fail(future, ConnectionDropped(f"reply to xid {header.xid}, expected {xid}"))
            if framer is not None:
                framer.abort(ConnectionDropped("replies out of order"))
            return
        missing = header.err == NoNodeError.code and request.type == Exists.type
        if header.err and not missing:
            _fail(future, EXCEPTIONS[header.err]())
            return
        try:
            value = None if missing else _decode(request, frame, offset)
        except Exception as err:  # a reply kazoo's codec cannot read
            log.exception("ZooKeeper reply to %s could not be decoded", type(request).__name__)
            _fail(future, err)
            return
        if kazoo_log.isEnabledFor(logging.DEBUG):
            kazoo_log.debug("Received response(xid=%s): %r", xid, value)
        if not future.done():
            future.set_result(value)
        if watch is not None and not self._stopping:
            if isinstance(request, GetChildren | GetChildren2):
                self._child_watchers[request.path].add(watch)
            else:
                self._data_watchers[request.path].add(watch)

    def _on_event(self, frame: bytes, offset: int) -> None:
        event, _ = Watch.deserialize(frame, offset)
        path = event.path
        watchers: set[Watcher] = set()
        if event.type in (_CREATED, _CHANGED, _DELETED):
            watchers |= self._data_watchers.pop(path, set())
        if event.type in (_DELETED, _CHILD):
            watchers |= self._child_watchers.pop(path, set())
        if self._stopping or not watchers:
            return
        fired = WatchedEvent(EVENT_TYPE_MAP[event.type], KeeperState.CONNECTED, path)
        for watcher in watchers:
            try:
                watcher(fired)
            except Exception:
                log.exception("a ZooKeeper watcher failed")

    # -- the connection -----------------------------------------------------

    async def _run(self) -> None:
        """Connect, serve, reconnect: until stopped, expired or refused."""
        delay = 0.05
        attempt = 0
        while not self._stopping:
            host, port = self._hosts[attempt % len(self._hosts)]
            attempt += 1
            try:
                if await self._serve(host, port):
                    delay = 0.05
                    continue
            except (SessionExpiredError, *_LOGIN_ERRORS) as err:
                self._fatal(err)
                return
            except ssl.SSLError as err:
                self._context = None  # built again for the next attempt
                if self._session is None:  # no first connection: a TLS setup error
                    self._fatal(err)
                    return
                log.debug("TLS with ZooKeeper at %s:%s failed: %r", host, port, err)
            except (OSError, ConnectionDropped, ZookeeperError, TimeoutError) as err:
                log.info("ZooKeeper connection to %s:%s failed: %r", host, port, err)
            if attempt % len(self._hosts) == 0:
                await asyncio.sleep(delay * random.uniform(0.8, 1.2))
                delay = min(delay * 2, self._max_delay_s)

    async def _serve(self, host: str, port: int) -> bool:
        """One connection: open it, serve it until it drops. True if it was opened."""
        loop = asyncio.get_running_loop()
        timeout = max(1.0, self._timeout_ms / 1000 / len(self._hosts))
        context = self._tls_context()
        async with asyncio.timeout(timeout):
            _, framer = await loop.create_connection(
                lambda: Framer(self._on_frame), host, port, ssl=context,
                server_hostname=host if context is not None else None,
            )
        try:
            await self._handshake(framer, host, timeout)
            self._connected(framer)
            await self._keep(framer)
            return True
        finally:
            if framer.closed.done() and isinstance(framer.closed.result(), ssl.SSLError):
                self._context = None  # the connection ended in TLS: built again
            framer.abort()
            self._disconnected(framer)

    def _tls_context(self) -> ssl.SSLContext | None:
        """The TLS context of a connection (None: plaintext): one per client,
        built at its first connection and again only after one failed in TLS
        (a rotated certificate or CA file is read then), not at every
        attempt (each build loads the system's CAs: milliseconds of the loop)."""
        if self._tls is None:
            return None
        if self._context is None:
            self._context = self._tls()
        return self._context

    async def _handshake(self, framer: Framer, host: str, timeout: float) -> None:
        handshake = Handshake(framer)
        if self._session is not None:
            self._session.last_zxid = self.last_zxid
        session = await open_session(handshake, self._session, self._timeout_ms, timeout)
        if self._session is not None and session.session_id != self._session.session_id:
            raise SessionExpiredError("the server opened a new session")
        session.last_zxid = max(session.last_zxid, self.last_zxid)
        self._session, self._session_id = session, session.session_id
        self.negotiated_timeout_s = session.timeout_ms / 1000
        timeout = handshake_wait(session.timeout_ms / 1000, len(self._hosts))
        try:
            await authenticate(
                handshake, session, self._auth_data, self._sasl_options, host, timeout
            )
        except ZookeeperError as err:
            if isinstance(err, _LOGIN_ERRORS):
                raise
            raise AuthFailedError(f"login refused: {type(err).__name__}") from err
        self.last_zxid = max(self.last_zxid, session.last_zxid)
        framer.on_frame = self._on_frame

    def _connected(self, framer: Framer) -> None:
        self._framer, self._xid, self._ping_sent = framer, 0, None
        self.client_state = KeeperState.CONNECTED
        queued, self._queue = self._queue, collections.deque()
        for request, future, watch in queued:
            if not future.done():  # its caller gave up: never sent
                self._write(framer, request, future, watch)
        self._last_send = self._last_recv = time.monotonic()
        self._tell(KazooState.CONNECTED)
        if self._first is not None:
            self._first.set()

    async def _keep(self, framer: Framer) -> None:
        """Ping when idle for a third of the timeout; drop a connection that stopped answering.

        Stopped answering: a request or a ping is outstanding and nothing came
        for two thirds of the timeout, less a little (kazoo's read timeout and
        jitter), so that a server that hangs is left before the coordinator's
        heartbeat gives up on it, as kazoo does.
        """
        assert self._session is not None
        third = self._session.timeout_ms / 3000
        limit = 2 * third - min(0.4, third / 10)
        while not framer.closed.done():
            now = time.monotonic()
            if self._pending or self._ping_sent is not None:
                due = self._last_recv + limit
                if now >= due:
                    framer.abort(ConnectionDropped("no reply for two thirds of the timeout"))
                    break
            else:
                due = self._last_send + third
                if now >= due:
                    framer.write(packet(PingInstance, PING_XID))
                    self._ping_sent = self._last_send = now
                    continue
            await asyncio.wait({framer.closed}, timeout=min(max(0.01, due - now), third / 4))

    def _disconnected(self, framer: Framer) -> None:
        if self._framer is not framer:
            return
        self._framer = None
        self._outbox = []
        lost = ConnectionLoss("the connection to ZooKeeper was lost")
        pending, self._pending = self._pending, collections.deque()
        for _, future, _, _ in pending:
            _fail(future, lost)
        # Watches are not re-sent: the coordinator's re-arm on CONNECTED.
        self._data_watchers.clear()
        self._child_watchers.clear()
        if not self._stopping:
            self.client_state = KeeperState.CONNECTING
            self._tell(KazooState.SUSPENDED)

    def _fatal(self, err: BaseException) -> None:
        self.handshake_error = err
        if isinstance(err, SessionExpiredError):
            self._session_id = None
            self._end(KeeperState.EXPIRED_SESSION, SessionExpiredError())
            self._tell(KazooState.LOST)
        elif isinstance(err, _LOGIN_ERRORS):
            self._end(KeeperState.AUTH_FAILED, AuthFailedError())
        else:
            self._end(KeeperState.CLOSED, ConnectionClosedError(f"{type(err).__name__}"))
        if self._first is not None:
            self._first.set()

    def _end(self, state: str, error: BaseException) -> None:
        """No more connections: fail everything queued or in flight with ``error``."""
        self.client_state = state
        self._framer = None
        self._outbox = []
        for _, future, _ in self._queue:
            _fail(future, error)
        for _, future, _, _ in self._pending:
            _fail(future, error)
        self._queue.clear()
        self._pending.clear()
        self._data_watchers.clear()
        self._child_watchers.clear()

    def _tell(self, state: str) -> None:
        for listener in list(self._listeners):
            try:
                listener(state)
            except Exception:
                log.exception("a ZooKeeper state listener failed")


def _decode(request: Any, frame: bytes, offset: int) -> Any:
    """The value kazoo's codec reads from a reply (as kazoo's ``_read_response``)."""
    if isinstance(request, Close):
        return True
    return request.deserialize(frame, offset)


def _fail(future: asyncio.Future[Any], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)
