"""One connection to a ZooKeeper server on the event loop: framing and the handshake.

The packets are kazoo's (:mod:`kazoo.protocol.serialization` encodes and
decodes every request, reply and event); only the transport is ours: an
:class:`asyncio.Protocol` that cuts the byte stream into length-prefixed
frames, over TCP or TLS (the checks of kazoo's TLS socket: the CA, the
client certificate, the server's host name). The handshake is kazoo's
sequence: the connect request (the session id and password when resuming),
SASL (``pure-sasl``, as kazoo), then one auth packet (xid -4) per digest
credential. Used by :mod:`coordinators.zookeeper.aio`.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kazoo.exceptions import (
    EXCEPTIONS,
    AuthFailedError,
    ConnectionDropped,
    SessionExpiredError,
)
from kazoo.protocol.serialization import SASL, Auth, Connect, ReplyHeader

from coordinators.zookeeper.security import kazoo_log

log = logging.getLogger("coordinators.zookeeper")  # the backend's one logger

INT = struct.Struct("!i")
WATCH_XID = -1
PING_XID = -2
AUTH_XID = -4
# A frame longer than this is a broken stream, not a reply (jute.maxbuffer
# is 1 MiB by default).
MAX_FRAME = 64 * 1024 * 1024


def handshake_wait(timeout_s: float, hosts: int) -> float:
    """How long a reply of the login (SASL, auth packets) is waited for, in seconds.

    A session outlives a lost connection only if a new one is authenticated
    within its timeout of the last contact. A server that answers the connect
    request and then goes silent must leave room for another attempt: a third
    of the timeout at most (less with more hosts to try, as kazoo shares the
    timeout among them), never below 1 s.
    """
    return max(1.0, timeout_s / max(3, hosts))


def tls_context(ca: str | None, cert: str | None, key: str | None) -> ssl.SSLContext:
    """The TLS context kazoo would make: the system's CAs and ``ca``, host names checked."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_default_certs(ssl.Purpose.SERVER_AUTH)
    context.check_hostname = True
    context.verify_mode = ssl.CERT_REQUIRED
    if ca:
        context.load_verify_locations(ca)
    if cert:
        context.load_cert_chain(cert, key)
    return context


def packet(request: Any, xid: int | None) -> bytes:
    """A request as sent: length, xid, type, body (kazoo's ``_submit``)."""
    body = bytearray()
    if xid is not None:
        body += INT.pack(xid)
    if request.type is not None:
        body += INT.pack(request.type)
    body += request.serialize()
    return INT.pack(len(body)) + bytes(body)


class Framer(asyncio.Protocol):
    """Length-prefixed frames of one connection, handed to ``on_frame`` as they complete."""

    def __init__(self, on_frame: Callable[[bytes], None]) -> None:
        self.on_frame = on_frame
        self.transport: asyncio.Transport | None = None
        self.closed: asyncio.Future[BaseException | None] = (
            asyncio.get_running_loop().create_future()
        )
        self._buffer = bytearray()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        start, size = 0, len(buffer)
        while size - start >= 4:
            (length,) = INT.unpack_from(buffer, start)
            if length < 0 or length > MAX_FRAME:
                self.abort(ConnectionDropped(f"a frame of {length} bytes"))
                return
            if size - start - 4 < length:
                break
            frame = bytes(buffer[start + 4 : start + 4 + length])
            start += 4 + length
            self.on_frame(frame)
            if self.closed.done():
                return
        del buffer[:start]

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(exc)

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.closed.done():
            self.transport.write(data)

    def abort(self, why: BaseException | None = None) -> None:
        """Drop the connection at once (its ``closed`` future says why)."""
        if not self.closed.done():
            self.closed.set_result(why)
        if self.transport is not None:
            self.transport.abort()


@dataclass
class Session:
    """What the server gave: the session and its password, the negotiated timeout."""

    session_id: int
    password: bytes
    timeout_ms: int
    last_zxid: int


class Handshake:
    """The frames of a connection while it opens, read in order by one coroutine."""

    def __init__(self, framer: Framer) -> None:
        self.framer = framer
        self._frames: asyncio.Queue[bytes] = asyncio.Queue()
        framer.on_frame = self._frames.put_nowait

    def send(self, request: Any, xid: int | None) -> None:
        """Send a handshake packet, logged at DEBUG as kazoo logs it (redacted)."""
        kazoo_log.debug("Sending request(xid=%s): %s", xid, request)
        self.framer.write(packet(request, xid))

    async def read(self, timeout: float) -> bytes:
        get = asyncio.ensure_future(self._frames.get())
        try:
            done, _ = await asyncio.wait(
                (get, self.framer.closed), timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            if not get.done():
                get.cancel()
        if get in done:
            return get.result()
        if self.framer.closed.done():
            raise ConnectionDropped("the server closed the connection")
        raise ConnectionDropped(f"no reply within {timeout:g}s")

    async def reply(self, xid: int, timeout: float, session: Session) -> tuple[bytes, int]:
        """The next reply, which must be to ``xid``; raises its error."""
        frame = await self.read(timeout)
        header, offset = ReplyHeader.deserialize(frame, 0)
        if header.xid != xid:
            raise ConnectionDropped(f"reply to xid {header.xid}, expected {xid}")
        if header.zxid > 0:
            session.last_zxid = header.zxid
        if header.err:
            raise EXCEPTIONS[header.err]()
        return frame, offset


async def open_session(
    handshake: Handshake, resume: Session | None, timeout_ms: int, timeout: float
) -> Session:
    """Send the connect request; the session the server granted (or resumed)."""
    connect = Connect(
        0,
        resume.last_zxid if resume else 0,
        timeout_ms,
        resume.session_id if resume else 0,
        resume.password if resume else b"\x00" * 16,
        False,
    )
    handshake.send(connect, None)
    reply, _ = Connect.deserialize(await handshake.read(timeout), 0)
    if reply.time_out <= 0:
        raise SessionExpiredError("the session has expired")
    return Session(
        reply.session_id, reply.passwd, reply.time_out, resume.last_zxid if resume else 0
    )


async def authenticate(
    handshake: Handshake,
    session: Session,
    auth_data: list[tuple[str, str]],
    sasl_options: dict[str, str] | None,
    host: str,
    timeout: float,
) -> None:
    """SASL (if configured), then each digest credential, as kazoo does."""
    if sasl_options is not None:
        await _sasl(handshake, session, dict(sasl_options), host, timeout)
    for scheme, credential in auth_data:
        handshake.send(Auth(0, scheme, credential), AUTH_XID)
        await handshake.reply(AUTH_XID, timeout, session)


async def _sasl(
    handshake: Handshake, session: Session, options: dict[str, str], host: str, timeout: float
) -> None:
    """kazoo's ``_authenticate_with_sasl`` over the loop's connection."""
    import puresasl  # type: ignore[import-untyped]
    import puresasl.client  # type: ignore[import-untyped]

    options.setdefault("service", "zookeeper")
    if options.get("mechanism") == "DIGEST-MD5":
        host = "zk-sasl-md5"  # ZooKeeper's fixed realm for DIGEST-MD5
    client = puresasl.client.SASLClient(host=host, **options)
    challenge: bytes | None = None
    xid = 0
    while not client.complete:
        try:
            response = client.process(challenge=challenge)
        except puresasl.SASLProtocolException as err:
            raise AuthFailedError("SASL protocol error") from err
        except Exception as err:
            raise AuthFailedError("SASL error") from err
        if client.complete and not response:
            break
        xid += 1
        handshake.send(SASL(response or b""), xid)
        # A refusal is an error reply (ZooKeeper 3.8 sends AuthFailed), raised
        # by reply(). A connection that drops or goes silent here refused
        # nothing: its ConnectionDropped is a connection failure, and the
        # client goes on to the next attempt with the same session.
        frame, offset = await handshake.reply(xid, timeout, session)
        challenge, _ = SASL.deserialize(frame, offset)
    client.dispose()
