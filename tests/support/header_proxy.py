"""An HTTP reverse proxy that drops request headers: a store that ignores them.

A real S3-compatible store may accept ``If-None-Match: *`` on an upload and
ignore it (an older MinIO, some gateways): the upload then replaces the key.
This proxy makes the suite's S3 server (moto) such a store: it listens on a
free 127.0.0.1 port, drops the named headers from every request it forwards
(moto checks no signature), and forwards everything else as it comes. Each
request gets a connection of its own upstream (``Connection: close``), so the
proxy parses only request heads, never bodies. A thread per connection.

Example::

    proxy = HeaderDroppingProxy("127.0.0.1", s3_server.port, drop=["If-None-Match"])
    proxy.start()
    options = catalog_options(proxy.endpoint)
    ...
    assert proxy.dropped > 0
    proxy.stop()
"""

from __future__ import annotations

import contextlib
import socket
import socketserver
import threading
from collections.abc import Iterable

MAX_HEAD = 64 * 1024


class HeaderDroppingProxy:
    def __init__(self, upstream_host: str, upstream_port: int, *,
                 drop: Iterable[str]) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.drop = frozenset(name.lower().encode() for name in drop)
        self.dropped = 0  # request headers dropped so far
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        forward = self._forward

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                forward(self.request)

        self._server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name="header-proxy", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        with self._lock:
            for sock in self._sockets:  # idle connections of the clients' pools
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _head(self, head: bytes) -> bytes:
        """The request head without the dropped headers, with ``Connection: close``."""
        first, *fields = head.split(b"\r\n")
        kept = [first]
        for line in fields:
            name = line.split(b":", 1)[0].strip().lower()
            if name in self.drop:
                with self._lock:
                    self.dropped += 1
            elif name != b"connection":
                kept.append(line)
        kept.append(b"Connection: close")
        return b"\r\n".join(kept) + b"\r\n\r\n"

    def _forward(self, client: socket.socket) -> None:
        with self._lock:
            self._sockets.add(client)
        upstream: socket.socket | None = None
        try:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = client.recv(65536)
                if not chunk or len(data) > MAX_HEAD:
                    return
                data += chunk
            head, rest = data.split(b"\r\n\r\n", 1)
            upstream = socket.create_connection(self.upstream, timeout=60)
            with self._lock:
                self._sockets.add(upstream)
            upstream.sendall(self._head(head) + rest)
            # The body (if any) as it comes; the answer until the server
            # closes (Connection: close), then the client's connection.
            upload = threading.Thread(target=_pipe, args=(client, upstream), daemon=True)
            upload.start()
            _pipe(upstream, client)
        except OSError:
            pass  # a client gone, or the proxy stopped
        finally:
            for sock in (client, upstream):
                if sock is not None:
                    with self._lock:
                        self._sockets.discard(sock)
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR)
                    sock.close()


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            sink.sendall(data)
