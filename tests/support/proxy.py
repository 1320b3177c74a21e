"""A loopback TCP proxy for fault tests: pass, delay, blackhole or reset connections.

toxiproxy is not installable here, so this is a small asyncio proxy run in a
thread of the test process. It listens on a free 127.0.0.1 port and forwards
every connection to ``upstream``. The mode applies to all connections, new and
established, at once:

``pass``
    forward bytes as they come.
``delay``
    forward each chunk after ``delay_s`` seconds (order kept).
``blackhole``
    accept new connections, read and discard everything in both directions:
    the peer sees a silent network (no RST, no FIN), like a cut cable.
``reset``
    close every established connection with RST and refuse new ones the same
    way (accept, then RST at once).

Leaving ``blackhole`` resets the connections that lost bytes in it (their
protocol stream has a hole), so the clients reconnect through the proxy.

Example::

    proxy = TcpProxy("127.0.0.1", 2379)
    proxy.start()
    url = f"etcd://127.0.0.1:{proxy.port}/prefix"
    proxy.set_mode("blackhole"); ...; proxy.set_mode("pass")
    proxy.stop()
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from typing import Literal

Mode = Literal["pass", "delay", "blackhole", "reset"]
MODES: tuple[Mode, ...] = ("pass", "delay", "blackhole", "reset")


def _rst(writer: asyncio.StreamWriter) -> None:
    """Abort with RST (SO_LINGER 0), not a FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class TcpProxy:
    def __init__(self, upstream_host: str, upstream_port: int, *, delay_s: float = 0.5) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.delay_s = delay_s
        self.mode: Mode = "pass"
        self.port = 0
        self.connections_accepted = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.base_events.Server | None = None
        self._thread: threading.Thread | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._ready = threading.Event()

    @property
    def host(self) -> str:
        return "127.0.0.1"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    # -- lifecycle -----------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="tcp-proxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout=10):
            raise RuntimeError("proxy did not start")

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._server = loop.run_until_complete(
            asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.close()

    def stop(self) -> None:
        loop = self._loop
        if loop is None:
            return

        async def shutdown() -> None:
            assert self._server is not None
            self._server.close()
            for w in list(self._writers):
                w.transport.abort()
            loop.stop()

        asyncio.run_coroutine_threadsafe(shutdown(), loop)
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._loop = None

    def set_mode(self, mode: Mode) -> None:
        """Switch every connection, established and new, to ``mode``."""
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
        loop = self._loop
        assert loop is not None, "start() the proxy first"

        async def apply() -> None:
            healed = self.mode == "blackhole" and mode != "blackhole"
            self.mode = mode
            # A connection that lost bytes in the blackhole cannot carry on
            # (its protocol stream has a hole): on heal it is reset, as the
            # peer's TCP stack would eventually time it out.
            if mode == "reset" or healed:
                for w in list(self._writers):
                    _rst(w)

        asyncio.run_coroutine_threadsafe(apply(), loop).result(timeout=10)

    # -- forwarding ------------------------------------------------------------

    async def _handle(self, client_r: asyncio.StreamReader,
                      client_w: asyncio.StreamWriter) -> None:
        self.connections_accepted += 1
        if self.mode == "reset":
            _rst(client_w)
            return
        if self.mode == "blackhole":
            # No upstream at all: swallow until the mode changes or the peer goes.
            self._writers.add(client_w)
            try:
                while self.mode == "blackhole" and await client_r.read(65536):
                    pass
            finally:
                self._writers.discard(client_w)
                client_w.transport.abort()
            return
        try:
            up_r, up_w = await asyncio.open_connection(*self.upstream)
        except OSError:
            _rst(client_w)
            return
        self._writers.update((client_w, up_w))
        try:
            await asyncio.gather(self._pipe(client_r, up_w), self._pipe(up_r, client_w))
        finally:
            for w in (client_w, up_w):
                self._writers.discard(w)
                w.transport.abort()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, ConnectionError, asyncio.CancelledError):
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                if self.mode == "blackhole":
                    continue  # the bytes vanish; the peer hears nothing
                if self.mode == "reset":
                    break
                if self.mode == "delay":
                    await asyncio.sleep(self.delay_s)
                writer.write(data)
                await writer.drain()
        if self.mode == "reset":
            _rst(writer)
