"""A TCP proxy in front of ZooKeeper that breaks chosen connections in their handshake.

Built on :class:`tests.support.proxy.TcpProxy` (same lifecycle, ``port``,
``connections_accepted``). ZooKeeper's handshake is the connect request and
its response, then (with SASL) the SASL exchange, then the session's requests.
``fault_next(kind)`` arms a fault for the next accepted connection only: the
proxy forwards its connect request (and the response), and when the client
sends its next packet (its first SASL token) it

``drop``
    resets both sides (RST): the server connection ends mid-SASL;
``stall``
    swallows that packet and everything after it, in both directions: the
    client hears nothing more, as from a server that hangs, until it gives up.

``cut()`` resets every established connection at once (the connection cut
that makes a client reconnect). Every other connection is forwarded as is.

Example::

    proxy = ZkHandshakeFaultProxy("127.0.0.1", server.port)
    proxy.start()
    proxy.fault_next("drop")
    proxy.cut()            # the client reconnects: that connection drops mid-SASL
    ...                    # the one after passes
    proxy.stop()
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from typing import Literal

from tests.support.proxy import TcpProxy, _rst

Fault = Literal["drop", "stall"]


class ZkHandshakeFaultProxy(TcpProxy):
    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        super().__init__(upstream_host, upstream_port)
        self._armed: Fault | None = None
        self.faulted: list[Fault] = []  # the faults applied, in order

    def fault_next(self, fault: Fault) -> None:
        """Break the next connection accepted, once, with ``fault``."""
        self._on_loop(lambda: setattr(self, "_armed", fault))

    def cut(self) -> None:
        """Reset every established connection (new ones are accepted as usual)."""

        def reset() -> None:
            for writer in list(self._writers):
                _rst(writer)

        self._on_loop(reset)

    def _on_loop(self, fn: object) -> None:
        loop = self._loop
        assert loop is not None, "start() the proxy first"

        async def run() -> None:
            fn()  # type: ignore[operator]

        asyncio.run_coroutine_threadsafe(run(), loop).result(timeout=10)

    async def _handle(
        self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter
    ) -> None:
        fault, self._armed = self._armed, None
        if fault is None:
            await super()._handle(client_r, client_w)
            return
        self.connections_accepted += 1
        try:
            up_r, up_w = await asyncio.open_connection(*self.upstream)
        except OSError:
            _rst(client_w)
            return
        self._writers.update((client_w, up_w))
        try:
            await asyncio.gather(
                self._handshake(fault, client_r, up_w, client_w),
                self._pipe(up_r, client_w),
            )
        finally:
            for w in (client_w, up_w):
                self._writers.discard(w)
                w.transport.abort()

    async def _handshake(
        self,
        fault: Fault,
        client_r: asyncio.StreamReader,
        up_w: asyncio.StreamWriter,
        client_w: asyncio.StreamWriter,
    ) -> None:
        """Forward the connect request; break the connection at the next packet."""
        with contextlib.suppress(OSError, ConnectionError, asyncio.IncompleteReadError):
            header = await client_r.readexactly(4)
            (length,) = struct.unpack("!i", header)
            up_w.write(header + await client_r.readexactly(length))
            await up_w.drain()
            if not await client_r.read(65536):  # the first SASL token (or the end)
                return
            self.faulted.append(fault)
            if fault == "drop":
                _rst(client_w)
                _rst(up_w)
                return
            while await client_r.read(65536):  # stall: swallow until the client leaves
                pass
