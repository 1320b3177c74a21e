"""The HTTP server of ``/metrics`` and the probes, bounded whoever connects.

It answers ``GET`` and ``HEAD`` (the same head, no body) of a fixed set of
paths, as an origin-form target (``/healthz``) or an absolute-form one
(``http://host:port/healthz``), from **a thread of its own**, an
event loop where each connection is a coroutine, not a thread: a client that
connects and sends nothing costs a socket, never a thread. Its bounds:

* a client has :data:`IDLE_TIMEOUT_S` to send its whole request (the request
  line and the headers, at most :data:`MAX_HEAD_BYTES`), and as long again to
  take the answer; else it is closed. A deadline for the request, not for each
  read: a client trickling a byte at a time is closed as well;
* at most :data:`MAX_CONNECTIONS` connections are open at once: a new one
  closes the oldest that has not sent its request yet (a probe that connects
  and asks at once is answered while idle clients pile up), or is closed itself
  when every open one is being answered;
* the answers of the paths that may block (``/metrics`` computes lag) are made
  by :data:`WORKERS` threads; the others on the server's own loop, so a slow
  scrape never delays a probe.

One answer per connection (``Connection: close``), as HTTP/1.0. Closing
the server ends the connections still open quietly (their clients see the
connection closed; nothing is logged above DEBUG).

Example::

    server = HttpServer("127.0.0.1", 0, {"/healthz": lambda: (200, b"ok\\n", TEXT)},
                        name="pg-metrics")
    ...  # GET http://127.0.0.1:{server.port}/healthz
    server.close()
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import urllib.parse
from collections.abc import Callable, Collection, Mapping
from concurrent.futures import ThreadPoolExecutor
from http import HTTPStatus

log = logging.getLogger("paimon_group.metrics")

MAX_CONNECTIONS = 64
IDLE_TIMEOUT_S = 5.0
MAX_HEAD_BYTES = 16 * 1024
WORKERS = 2
TEXT = "text/plain; charset=utf-8"
METHODS = ("GET", "HEAD")

Response = tuple[int, bytes, str]
"""Status, body and content type."""
Route = Callable[[], Response]


class HttpServer:
    """Serves ``routes`` (path -> answer) on ``host:port`` (0: a free port, see
    ``.port``) until :meth:`close`; the paths in ``blocking`` are answered by the
    worker threads. Binding errors (a port in use) are raised here."""

    def __init__(self, host: str, port: int, routes: Mapping[str, Route], *, name: str,
                 blocking: Collection[str] = (), max_connections: int = MAX_CONNECTIONS,
                 idle_timeout_s: float = IDLE_TIMEOUT_S) -> None:
        self.routes = dict(routes)
        self.blocking = frozenset(blocking)
        self.max_connections = max_connections
        self.idle_timeout_s = idle_timeout_s
        sock = socket.create_server((host, port))
        self.port = int(sock.getsockname()[1])
        self._pool = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix=name)
        self._loop = asyncio.new_event_loop()
        self._open = 0
        # The connections that have not sent their request yet, oldest first.
        self._waiting: dict[asyncio.StreamWriter, None] = {}
        self._server: asyncio.AbstractServer | None = None
        self._closed = False
        # Set on the server's loop once close() began: the connections'
        # coroutines it cancels end quietly.
        self._stopping = False
        started = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(sock, started), name=name,
                                        daemon=True)
        self._thread.start()
        started.wait()

    def close(self) -> None:
        """Stop serving and free the port (once; a second call does nothing)."""
        if self._closed:
            return
        self._closed = True
        if self._thread.is_alive():
            stopped = asyncio.run_coroutine_threadsafe(self._stop(), self._loop)
            try:
                stopped.result(timeout=5)
            except Exception as err:  # the port is freed by the loop's end anyway
                log.debug("metrics server stop: %s", err)
            self._thread.join(timeout=5)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _serve(self, sock: socket.socket, started: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._server = self._loop.run_until_complete(
                asyncio.start_server(self._connection, sock=sock, limit=MAX_HEAD_BYTES))
        finally:
            started.set()
        try:
            self._loop.run_forever()
        finally:
            self._loop.close()

    async def _stop(self) -> None:
        self._stopping = True
        if self._server is not None:
            self._server.close()  # the listening socket: the port is free
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)
        self._loop.call_soon(self._loop.stop)

    async def _connection(self, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        if self._open >= self.max_connections and not self._close_oldest_waiting():
            log.debug("metrics http: %d connections answering, one more refused", self._open)
            writer.transport.abort()
            return
        self._open += 1
        self._waiting[writer] = None
        try:
            await self._exchange(reader, writer)
        except (TimeoutError, ConnectionError, ValueError) as err:
            # Too slow (a deadline), gone, or a line over MAX_HEAD_BYTES.
            log.debug("metrics http: connection closed: %s", type(err).__name__)
            writer.transport.abort()
        except asyncio.CancelledError:
            writer.transport.abort()
            if not self._stopping:
                raise
            # Ended by close(): returned, not raised, since asyncio's stream
            # server (Python 3.11) logs a connection coroutine that ends
            # cancelled as an ERROR with its traceback.
            log.debug("metrics http: connection closed with the server")
        finally:
            self._open -= 1

    async def _exchange(self, reader: asyncio.StreamReader,
                        writer: asyncio.StreamWriter) -> None:
        """Read one request from the connection, answer it, close it."""
        try:
            request = await asyncio.wait_for(_read_request(reader), self.idle_timeout_s)
        finally:
            self._waiting.pop(writer, None)
        if request is None:
            writer.transport.abort()
            return
        status, body, content_type = await self._answer(request)
        head_only = request.split(None, 1)[0] == "HEAD"
        writer.write(_response(status, body, content_type, head_only=head_only))
        await asyncio.wait_for(writer.drain(), self.idle_timeout_s)
        writer.close()

    def _close_oldest_waiting(self) -> bool:
        """Close the oldest connection that has not sent its request (False:
        every open connection is being answered)."""
        if not self._waiting:
            return False
        oldest = next(iter(self._waiting))
        del self._waiting[oldest]
        oldest.transport.abort()  # its coroutine sees the end of its input
        return True

    async def _answer(self, request: str) -> Response:
        parts = request.split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            return HTTPStatus.BAD_REQUEST, b"bad request\n", TEXT
        method, target = parts[0], parts[1]
        if method not in METHODS:
            return HTTPStatus.NOT_IMPLEMENTED, b"only GET and HEAD\n", TEXT
        path = _path_of(target)
        route = self.routes.get(path)
        if route is None:
            return HTTPStatus.NOT_FOUND, f"not found: {', '.join(self.routes)}\n".encode(), TEXT
        if path in self.blocking:
            return await self._loop.run_in_executor(self._pool, _safely, path, route)
        return _safely(path, route)


async def _read_request(reader: asyncio.StreamReader) -> str | None:
    """The request line, once the headers after it have been read to the blank
    line; None if the client closed first or sent more than MAX_HEAD_BYTES."""
    request: str | None = None
    size = 0
    while True:
        line = await reader.readline()
        size += len(line)
        if not line or size > MAX_HEAD_BYTES:
            return None
        if request is None:
            if line.strip():  # blank lines before the request line are allowed
                request = line.decode("latin-1")
        elif not line.strip():
            return request


def _safely(path: str, route: Route) -> Response:
    try:
        return route()
    except Exception as err:
        log.warning("metrics request %s failed: %s", path, err)
        return HTTPStatus.INTERNAL_SERVER_ERROR, b"internal error\n", TEXT


def _path_of(target: str) -> str:
    """The path of a request target: origin form (``/healthz?x``) or
    absolute form (``http://host:port/healthz?x``, any case of the scheme)."""
    if "://" in target and not target.startswith("/"):
        split = urllib.parse.urlsplit(target)
        if split.scheme.lower() in ("http", "https"):
            return split.path or "/"
    return target.split("?", 1)[0]


def _response(status: int, body: bytes, content_type: str, *, head_only: bool = False
              ) -> bytes:
    """The answer; ``head_only`` (HEAD): its head alone, with the body's length."""
    allow = f"Allow: {', '.join(METHODS)}\r\n" if status == HTTPStatus.NOT_IMPLEMENTED else ""
    head = (f"HTTP/1.0 {status} {HTTPStatus(status).phrase}\r\n"
            f"Content-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\n"
            f"{allow}"
            "Connection: close\r\n\r\n")
    return head.encode("latin-1") + (b"" if head_only else body)
