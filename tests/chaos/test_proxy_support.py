"""The loopback TCP proxy of scenario 8 does what it says (no group involved, fast)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from tests.support.proxy import TcpProxy


@pytest.fixture
def echo_proxy() -> Iterator[TcpProxy]:
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # closed at teardown

            def echo(c: socket.socket = conn) -> None:
                with c:
                    try:
                        while data := c.recv(1024):
                            c.sendall(data)
                    except OSError:
                        pass

            threading.Thread(target=echo, daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    proxy = TcpProxy(*server.getsockname(), delay_s=0.3)
    proxy.start()
    try:
        yield proxy
    finally:
        proxy.stop()
        stop.set()
        server.close()


def connect(proxy: TcpProxy) -> socket.socket:
    return socket.create_connection((proxy.host, proxy.port), timeout=5)


def test_pass_and_delay(echo_proxy: TcpProxy) -> None:
    with connect(echo_proxy) as s:
        s.sendall(b"hi")
        assert s.recv(10) == b"hi"
        echo_proxy.set_mode("delay")
        s.sendall(b"slow")
        assert s.recv(10) == b"slow"  # order and content kept, only later


def test_blackhole_is_silent_then_heal_resets(echo_proxy: TcpProxy) -> None:
    with connect(echo_proxy) as s:
        echo_proxy.set_mode("blackhole")
        s.sendall(b"lost")
        s.settimeout(0.5)
        with pytest.raises(TimeoutError):
            s.recv(10)  # no answer, no FIN, no RST: a cut cable
        echo_proxy.set_mode("pass")
        s.settimeout(5)
        with pytest.raises(ConnectionResetError):
            s.recv(10)  # its stream has a hole: reset on heal
    with connect(echo_proxy) as s:
        s.sendall(b"back")
        assert s.recv(10) == b"back"


def test_reset_established_and_new(echo_proxy: TcpProxy) -> None:
    with connect(echo_proxy) as s:
        s.sendall(b"x")
        assert s.recv(10) == b"x"
        echo_proxy.set_mode("reset")
        with pytest.raises(ConnectionResetError):
            s.recv(10)
    # A new connection is accepted and reset at once (seen at connect or read).
    with pytest.raises(ConnectionResetError):
        with connect(echo_proxy) as s:
            s.sendall(b"y")
            s.recv(10)
