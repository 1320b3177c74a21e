"""Making, starting and stopping the kazoo client."""

from __future__ import annotations

import contextlib
import functools
import socket
import ssl
import threading
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import (
    AuthFailedError,
    ConnectionDropped,
    SessionClosedRequireSaslError,
)
from kazoo.retry import KazooRetry

from coordinators.errors import (
    AuthenticationFailed,
    CoordinatorUnavailable,
    PaimonGroupError,
)
from coordinators.urls import host_string
from coordinators.zookeeper.errors import AUTH_ERRORS, translate
from coordinators.zookeeper.guard import AclGuard
from coordinators.zookeeper.handler import PollingHandler
from coordinators.zookeeper.heartbeat import Heartbeat
from coordinators.zookeeper.security import kazoo_log
from coordinators.zookeeper.wire import handshake_wait


class ZkClient(AclGuard, Heartbeat):
    """The kazoo client of a coordinator: its options, its handshake, its chroot."""

    def _make_client(self) -> Any:
        options, credentials = self._options, self._credentials
        tls: dict[str, Any] = {}
        if options.tls:
            tls = {
                "use_ssl": True,
                "ca": options.tls_ca,
                "certfile": options.tls_cert,
                "keyfile": options.tls_key,
                "verify_certs": True,
                "check_hostname": True,
            }
        client = KazooClient(
            hosts=self._target.hosts_string(),
            handler=PollingHandler(),
            timeout=self._requested_timeout_s,
            auth_data=credentials.auth_data if credentials else None,
            sasl_options=dict(credentials.sasl_options)
            if credentials and credentials.sasl_options
            else None,
            default_acl=list(self._acl),
            # Reconnect quickly: a session survives only if we are back
            # within its timeout.
            connection_retry=KazooRetry(
                max_tries=-1,
                delay=0.05,
                backoff=2,
                max_delay=max(0.2, min(2.0, self._requested_timeout_s / 4)),
            ),
            logger=kazoo_log,
            **tls,
        )
        self._capture_negotiated_timeout(client)
        _retry_a_lost_login(client)
        client.add_listener(functools.partial(self._on_kazoo_state, client))
        return client

    def _capture_negotiated_timeout(self, client: Any) -> None:
        """Learn the session timeout the server granted (kazoo keeps it private).

        kazoo's connection handler returns ``read_timeout = negotiated * 2/3``
        (in ms) from ``_connect``; wrap it. If kazoo's internals differ, the
        requested timeout is used.

        The wrapper also turns a server that refuses our SASL login with an
        error reply (rather than by closing the connection) into kazoo's
        AuthFailedError: kazoo handles that one (AUTH_FAILED, no more
        reconnecting) but lets the other kill its connection thread.
        """
        connection = getattr(client, "_connection", None)
        original = getattr(connection, "_connect", None)
        if connection is None or original is None:
            return

        done = self._handshake_done = threading.Event()

        def _connect(host: str, hostip: str, port: int) -> Any:
            # kazoo reports CONNECTED from inside this call: clear first, so
            # whoever sees CONNECTED waits for the end of this very attempt.
            done.clear()
            self._handshake_error = None
            try:
                timeouts = original(host, hostip, port)
                with contextlib.suppress(Exception):
                    self._negotiated_timeout_s = float(timeouts[0]) * 1.5 / 1000.0
                return timeouts
            except SessionClosedRequireSaslError as err:
                self._handshake_error = err
                raise AuthFailedError("SASL authentication refused") from err
            except BaseException as err:
                self._handshake_error = err
                tls = tls_error_of(err)
                if tls is not None:  # kazoo logs it and retries: keep it
                    self._tls_failures[(host.strip("[]"), int(port))] = tls
                raise
            finally:
                done.set()

        connection._connect = _connect

    async def _connect_failure(self, client: Any, limit: float) -> PaimonGroupError:
        if client.client_state == "AUTH_FAILED" or isinstance(
            self._handshake_error, AUTH_ERRORS
        ):
            return translate(AuthFailedError(), "connect")
        for (host, port), tls in list(self._tls_failures.items())[:1]:
            return AuthenticationFailed(tls_message(host, port, tls))
        if self._options.tls:
            assert self._loop is not None
            problem = await self._loop.run_in_executor(None, self._probe_tls)
            if problem is not None:
                return AuthenticationFailed(problem)
        return CoordinatorUnavailable(
            f"could not connect to ZooKeeper at {self._target.hosts_string()} within {limit:g}s"
        )

    def _probe_tls(self) -> str | None:
        """Why a TLS handshake with the servers fails, if it does (blocking)."""
        options = self._options
        context = ssl.create_default_context(cafile=options.tls_ca)
        if options.tls_cert and options.tls_key:
            try:
                context.load_cert_chain(options.tls_cert, options.tls_key)
            except (OSError, ssl.SSLError) as err:
                return f"cannot load the TLS client certificate or key: {err.strerror or err}"
        for host, port in self._target.hosts:
            try:
                with socket.create_connection((host, port), timeout=5) as raw:
                    with context.wrap_socket(raw, server_hostname=host):
                        return None
            except ssl.SSLError as err:
                return tls_message(host, port, err)
            except OSError:
                continue
        return None

    def _tls_gave_up(self) -> bool:
        """Every server of the URL failed its TLS handshake (kazoo would retry
        until the connect timeout, with nothing better to say then)."""
        failed = self._tls_failures
        return bool(failed) and all((h, p) in failed for h, p in self._target.hosts)

    async def _prepare_root(self) -> None:
        client = self._client
        if self._root != "/":
            await self._request(
                "create the chroot", client.ensure_path_async, self._root, list(self._acl)
            )
        # Reading it proves the credentials grant access (a wrong digest
        # password is not refused at login, only by the ACLs).
        await self._request("read the chroot", client.get_children_async, self._root)
        # Made by us just now or by someone else before: its ACL must be ours
        # (coordinators/zookeeper/guard.py); the server's root is not ours to judge.
        await self._learn_identities()
        if self._root != "/" and not self._open_to_all():
            await self._judge([""])
        self._trusted.add("")


def _retry_a_lost_login(client: Any) -> None:
    """A connection lost during SASL is a failed attempt, not a refusal.

    kazoo turns a connection that drops during SASL into AuthFailedError
    (AUTH_FAILED: it never connects again and the session dies with it), and
    waits for each SASL reply as long as the whole session timeout with one
    host, so a server that goes silent there outlives the session. Its SASL
    step is wrapped: each reply is waited for :func:`handshake_wait` at most,
    and a drop becomes ConnectionDropped, which kazoo retries on the next
    attempt with the same session. A refusal (an error reply) stays
    AuthFailedError. Without kazoo's internals, kazoo's own behaviour stays.
    """
    connection = getattr(client, "_connection", None)
    original = getattr(connection, "_authenticate_with_sasl", None)
    if connection is None or original is None:
        return
    hosts = max(1, len(getattr(client, "hosts", ())))

    def _authenticate_with_sasl(host: str, timeout: float) -> Any:
        # kazoo passes the negotiated timeout shared among the hosts (seconds).
        wait = min(timeout, handshake_wait(timeout * hosts, hosts))
        try:
            return original(host, wait)
        except AuthFailedError as err:
            if isinstance(err.__cause__, ConnectionDropped):
                raise ConnectionDropped("the connection dropped during SASL") from err
            raise

    connection._authenticate_with_sasl = _authenticate_with_sasl


def tls_error_of(err: BaseException) -> ssl.SSLError | None:
    """The TLS error behind a failed connection attempt: kazoo turns it into
    ConnectionDropped("socket connection error: ..."), raised while handling it."""
    seen: BaseException | None = err
    for _ in range(5):
        if seen is None:
            return None
        if isinstance(seen, ssl.SSLError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def tls_message(host: str, port: int, err: ssl.SSLError) -> str:
    """One line naming the server and what TLS refused."""
    where = f"ZooKeeper at {host_string((host, port))}"
    if isinstance(err, ssl.SSLCertVerificationError):
        return f"TLS certificate verification failed for {where}: {err.verify_message}"
    return f"TLS handshake with {where} failed: {err.reason or err}"
