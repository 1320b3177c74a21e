"""The ZooKeeper coordinator (kazoo): ``zk://HOST:PORT[,HOST:PORT...][/CHROOT][?acl=...]``.

Example (needs a ZooKeeper server with TLS on port 2281 and digest
authentication allowed; digest without TLS is refused unless
``allow_plaintext_credentials=True``)::

    import asyncio
    from coordinators import Check, ConnectOptions, Put, Secret, open_coordinator

    async def main() -> None:
        options = ConnectOptions(
            username="app", password=Secret("s3cret"), tls_ca="/etc/zk/ca.pem"
        )
        async with open_coordinator("zk://127.0.0.1:2281/paimon", options) as coord:
            owner = await coord.create("owners/0", b"me", ephemeral=True)
            assert owner is not None
            assert await coord.commit(
                [Check.created_at("owners/0", owner.create_version)],
                [Put("positions/0", b"42")],
            )

    asyncio.run(main())

URL
    Comma-separated ``HOST[:PORT]`` (default port 2181; IPv6 in brackets),
    then an optional chroot under which every znode of this coordinator
    lives (created at connect, with our ACL). The only query parameter is
    ``acl`` (it overrides :attr:`ConnectOptions.acl`). Credentials never go
    in the URL: they are :class:`~coordinators.protocol.ConnectOptions` fields.
    The chroot is applied by this module (kazoo sees absolute paths), so it
    can be created with our ACL; ``/zookeeper`` is never touched.

Znode layout
    A key ``a/b/name`` is three znodes in the directory znode ``/a/b``
    (under the chroot):

    ``/a/b/name``
        the value. Also the directory znode of keys ``a/b/name/...``, if any.
    ``/a/b/.pg-key.name``
        the **key flag**: it exists iff the key exists. Its data is the
        incarnation nonce (32 hex digits); its ``czxid`` is the key's
        ``create_version``; its ``ephemeralOwner`` says whether the key is
        ephemeral.
    ``/a/b/.pg-epoch.<nonce>``
        the **epoch marker** of this incarnation of the key: created and
        deleted in the same transactions as the flag, never re-created (the
        nonce is random), and therefore proof, while it exists, that the
        incarnation it was created with is still the current one.

    The three are created in one ``multi`` (ephemeral together, in the same
    session, so they also die together) and deleted in one ``multi``. A
    key's value znode that has children (keys below it) is not deleted with
    the key: its flag and marker are, and it stays as a plain directory.
    Directory znodes are created on demand, persistent, outside
    transactions, and never deleted. Names starting with ``.pg-`` are
    reserved: :meth:`list` and watches skip them, and keys may not use them.

Why a flag and a marker (fencing without ABA)
    ``Check(key, create_version=x)`` must fail, in the same transaction as
    the writes it guards, once the incarnation ``x`` of the key is gone, even
    if the key has been created again since. ZooKeeper's ``multi`` can only
    check a znode's existence and *data version*, and the data version of a
    re-created znode starts again at 0, so a check on the key's own znode
    cannot tell the old owner's incarnation from the new owner's: a stale
    owner (its session expired while it was paused) would pass. The epoch
    marker of incarnation ``x`` is a znode no other incarnation ever has, so
    the commit checks that it exists: ``check(.pg-epoch.<nonce of x>, -1)``.
    The nonce of ``x`` is read from the flag (whose ``czxid`` must be ``x``)
    once and cached; a cached nonce can only be dead, never wrong.

    The flag, at a fixed path, makes "the key exists" and "the key is
    absent" checkable: ``Check.is_absent`` and every create of a key become
    ``create(flag)`` (plus ``delete(flag)`` for the check), which fails with
    NodeExists iff the key exists, whatever happened to its value znode.

Versions
    ``create_version`` is the flag's ``czxid``: a zxid, so strictly greater
    than that of any key created earlier, on the whole ensemble, ever.
    ``version`` is the value znode's ``mzxid``, which changes on every write
    and is never reused. ``Check(key, version=m)`` reads the key, refuses at
    once if its ``mzxid`` is not ``m`` (it can never be ``m`` again), and
    otherwise checks, in the transaction, the marker of the incarnation read
    *and* the value znode's data version read: while the marker exists the
    value znode is the same znode, whose data version only grows, so an
    unchanged data version means an unchanged ``mzxid``.

Commits
    One ``multi``: first the checks (translated as above), then the writes.
    How to write a key depends on its current state (a ``Put`` creates three
    znodes for a new key but sets the value of an existing one), so a commit
    reads what it needs first and adds an *implicit* guard for each state it
    relied on (``check(flag)`` before a ``setData``, ``create(flag)`` for a
    new key, the marker deletion for a delete). If the ``multi`` fails on an
    explicit check, the commit returns False; if it fails on an implicit
    guard only, the state changed under us: the commit re-reads and tries
    again (bounded, with jittered backoff). A ``Put`` of a key assumed to
    exist needs no read the first time (the guard catches the other cases),
    and the owner's epoch check uses the cached nonce: the steady-state
    commit of a position is one round trip.

Sessions
    The coordinator's session is the ZooKeeper session. kazoo's SUSPENDED
    (connection lost) and CONNECTED map to ours; so does a heartbeat (a
    ``exists`` of the chroot every third of the session timeout) left
    unanswered for a third of the timeout, which catches a server that hangs
    without closing the connection. SUSPENDED past the session deadline (no
    confirmation for a whole timeout) becomes LOST: the server may have
    expired the session, and kazoo would only learn it when it reconnects.
    Every answered request confirms the session with its send time
    (:meth:`Session.confirmed`), using the timeout the server negotiated if
    it is shorter than the one asked for.
    An expired session is LOST for good. kazoo would then open a *new*
    session on its own; the coordinator notices (kazoo reports LOST, or the
    session id changed), stays LOST, and stops kazoo at once, which ends any
    replacement session. From then on every operation (and every
    :meth:`Watch.wait`) raises :class:`~coordinators.errors.SessionLost`:
    open a new coordinator. An ephemeral create that raced with the expiry
    and landed in a replacement session is detected (its
    ``ephemeralOwner``) and deleted. Fencing never depends on this: a stale
    commit that reaches the server fails its epoch check.

Watches
    ZooKeeper watches fire once and kazoo drops them on disconnection, so a
    watch re-arms after every event: a child watch on the directory znode
    and a data watch on each key's value znode. Changes made while a watch
    was not armed are found by zxid: the directory's ``pzxid`` and each
    value znode's ``mzxid`` are compared with the client's last seen zxid at
    the moment :meth:`Watch.wait` last returned True (the caller re-reads
    after that, so anything newer is a change it has not seen). Every
    reconnection reports a (possibly spurious) change.

Threads
    kazoo runs its own threads. Every request is sent with kazoo's
    non-blocking ``*_async`` calls from the event loop; results, watch events
    and state changes hop back to the loop with ``call_soon_threadsafe``.
    Only starting and stopping the client block, and they run in the loop's
    default executor.

Security
    Authentication: ``digest`` (default when a username is set) or ``sasl``
    (DIGEST-MD5 through the ``pure-sasl`` package; ``extra["sasl_mechanism"]``
    picks another mechanism pure-sasl supports). ACLs, on every znode we
    create (the chroot included): ``acl="creator"`` (the default) is
    ZooKeeper's ``CREATOR_ALL_ACL``: all rights to the authenticated
    identities of the creating session (its digest or SASL user, and the
    x509 identity of its TLS client certificate), nobody else. Without any
    identity there is no creator, and the only ACLs that would let the other
    members in are world-accessible ones, so the coordinator refuses to
    start unless the ACL is chosen explicitly: ``acl=open`` (world:anyone,
    all rights: for development and isolated test servers only; logged as a
    warning at connect) or an explicit list. ``acl`` is a comma-separated list of ``creator``,
    ``open``, and ``SCHEME:ID:PERMS`` entries (``PERMS`` from ``crwda``),
    e.g. ``creator,sasl:auditor:r``. TLS (``ConnectOptions.tls_*``) always
    verifies the server certificate and its host name against the host
    names of the URL; a TLS failure is said at once, naming the server.
    Passwords never reach logs, exceptions or reprs: kazoo's own debug
    logging of authentication packets is redacted, and an ACL is shown with
    its digest hashes masked. A chroot or a directory znode that exists
    already is used only if its ACL grants nothing beyond ours
    (:mod:`coordinators.zookeeper.guard`): the chroot is checked at connect,
    any other directory before its first use.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import ssl
import threading
import time
from collections.abc import Awaitable, Callable, Collection
from typing import Any

from kazoo.security import Id, Permissions

from coordinators.acls import show_acl_spec
from coordinators.credentials import refuse_plaintext_credentials
from coordinators.errors import (
    CREDENTIALS_HOW,
    ConfigError,
    CoordinatorError,
)
from coordinators.protocol import (
    ConnectOptions,
    Coordinator,
    SessionState,
    Watch,
)
from coordinators.session import SessionTransitions
from coordinators.zookeeper.choice import ClientChoice
from coordinators.zookeeper.client import ZkClient
from coordinators.zookeeper.core import session_id_of
from coordinators.zookeeper.errors import AUTH_ERRORS, translated
from coordinators.zookeeper.keys import Keys
from coordinators.zookeeper.limits import acl_size, max_request_of
from coordinators.zookeeper.security import (
    REDACTOR,
    credentials_of,
    log_secrets,
    parse_acl,
)
from coordinators.zookeeper.session import ZooKeeperSession
from coordinators.zookeeper.url import parse_url
from coordinators.zookeeper.watch import ZkWatch

log = logging.getLogger("coordinators.zookeeper")  # the backend's one logger


class ZooKeeperCoordinator(Keys, ZkClient, ClientChoice, Coordinator):
    """A coordinator on a ZooKeeper ensemble; see the module docstring.

    Example::

        import asyncio
        from coordinators import ConnectOptions, open_coordinator

        async def main() -> None:
            # A development server without authentication: opt in to open ACLs.
            url = "zk://127.0.0.1:2181/demo?acl=open"
            async with open_coordinator(url, ConnectOptions(session_timeout_s=6)) as a:
                async with a.watch("members/") as members:
                    await a.create("members/a", b"", ephemeral=True)
                    assert await members.wait(timeout=10)
                    assert [e.key for e in await a.list("members/")] == ["members/a"]

        asyncio.run(main())
    """

    scheme = "zk"
    # A group's assignment (every shard, its load, and every member thrice)
    # is one value, under jute.maxbuffer (1 MiB) with its request: at 16,384
    # shards and 1,000 members of 128-character ids, every field full, it is
    # 765 KB (docs/zookeeper.md, "Values and groups: the size limit").
    max_shards = 16384

    def __init__(
        self,
        url: str,
        options: ConnectOptions | None = None,
        *,
        sleep: Callable[[float], Awaitable[None]] | None = None,
    ) -> None:
        self._target = parse_url(url)
        options = options or ConnectOptions()
        if not options.session_timeout_s > 0:
            raise ConfigError(f"session timeout must be positive, got {options.session_timeout_s}")
        if not options.connect_timeout_s > 0:
            raise ConfigError(f"connect timeout must be positive, got {options.connect_timeout_s}")
        self._options = options
        self._credentials = credentials_of(options)
        acl_spec = self._target.acl if self._target.acl is not None else options.acl
        self._acl = parse_acl(acl_spec)
        self._acl_bytes = acl_size(self._acl)
        self._max_request = max_request_of(options.extra)
        self._check_identity(acl_spec, options)
        self._check_tls(options)
        # Kept out of kazoo's logs: the password, and the digest hashes of the
        # ACL (of entries we configured, and of our own identity).
        self._log_secrets = log_secrets(self._credentials, self._acl)
        self._url = self._target.display()
        self._root = self._target.chroot or "/"
        self._prefix = self._target.chroot  # "" for the server root
        self._sleep = sleep or asyncio.sleep
        self._op_timeout_s = float(options.connect_timeout_s)
        self._requested_timeout_s = float(options.session_timeout_s)
        self._negotiated_timeout_s: float | None = None
        # Set (from kazoo's thread) when a connection attempt has finished
        # its handshake, authentication included, or failed.
        self._handshake_done: threading.Event | None = None
        self._handshake_error: BaseException | None = None
        # The TLS errors of kazoo's connection attempts, by (host, port).
        self._tls_failures: dict[tuple[str, int], ssl.SSLError] = {}
        # Directories whose ACL was found acceptable, and what our ACL grants.
        self._trusted: set[str] = set()
        self._grants: dict[Id, int] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: Any = None
        self._session: ZooKeeperSession | None = None
        self._transitions: SessionTransitions | None = None
        self._heartbeat: asyncio.Task[None] | None = None
        self._retiring: asyncio.Task[None] | None = None
        self._heartbeat_kick = asyncio.Event()
        self._watches: set[ZkWatch] = set()
        self._epochs: collections.OrderedDict[tuple[str, int], str] = collections.OrderedDict()
        self._closed = False
        # Set from kazoo's thread the moment kazoo reports LOST, before the
        # loop hears of it: no ephemeral create may start after that.
        self._lost_flag = False

    def _check_identity(self, acl_spec: str, options: ConnectOptions) -> None:
        """No password in the clear; an identity for a ``creator`` ACL."""
        credentials = self._credentials
        if (
            credentials is not None
            and credentials.plaintext
            and not options.tls
            and not options.allow_plaintext_credentials
        ):
            raise refuse_plaintext_credentials(
                "ZooKeeper", f"{credentials.mechanism} authentication",
                "give a CA (tls_ca, --coordinator-ca) for TLS, or use SASL DIGEST-MD5",
            )
        # A TLS client certificate is an identity too (ZooKeeper's x509 provider).
        identified = self._credentials is not None or options.tls_cert is not None
        if not identified and any(e.id.scheme == "auth" for e in self._acl):
            raise ConfigError(
                f"ZooKeeper acl {show_acl_spec(acl_spec)!r} needs an identity: credentials "
                f"({CREDENTIALS_HOW}) or a TLS client certificate (--coordinator-cert), or add "
                "?acl=open to the zk:// URL for world-accessible znodes (development only)"
            )

    def _check_tls(self, options: ConnectOptions) -> None:
        if (options.tls_cert is None) != (options.tls_key is None):
            raise ConfigError("ZooKeeper TLS client authentication needs both tls_cert and tls_key")
        name = options.tls_server_name
        if name is not None and any(host != name for host, _ in self._target.hosts):
            raise ConfigError(
                "tls_server_name is not supported by the ZooKeeper backend: name the servers "
                "in the URL as their certificates do"
            )

    # -- plumbing --------------------------------------------------------

    @property
    def url(self) -> str:
        return self._url

    async def connect(self) -> None:
        if self._closed:
            raise CoordinatorError(f"{self!r} is closed; open a new coordinator")
        if self._session is not None:
            raise CoordinatorError(f"{self!r} is already connected")
        loop = asyncio.get_running_loop()
        self._loop = loop
        client = self._make_client() if self.client_kind == "kazoo" else self._make_aio_client()
        REDACTOR.add(self._log_secrets)
        started_at = time.monotonic()
        limit = float(self._options.connect_timeout_s)
        try:
            connected = await self._start_chosen(client, limit, self._tls_gave_up)
            if not connected or isinstance(self._handshake_error, AUTH_ERRORS):
                raise await self._connect_failure(client, limit)
            self._client = client
            timeout_s = self._requested_timeout_s
            negotiated = self._negotiated_timeout_s
            if negotiated is not None and negotiated < timeout_s - 1e-3:
                log.warning(
                    "ZooKeeper granted a %.3gs session timeout instead of %.3gs "
                    "(the server's minSessionTimeout/maxSessionTimeout)",
                    negotiated,
                    timeout_s,
                )
                timeout_s = negotiated
            self._session = ZooKeeperSession(session_id_of(client) or 0, timeout_s, started_at)
            self._transitions = SessionTransitions(
                self._session, self._on_session_state, what="ZooKeeper session", logger=log
            )
            with translated(f"prepare the chroot {self._root}"):
                await self._prepare_root()
        except BaseException:
            self._session = None
            self._transitions = None
            self._client = None
            await self._stop_client(client)
            self._closed = True
            REDACTOR.discard(self._log_secrets)
            raise
        if any(e.id == Id("world", "anyone") and e.perms & ~Permissions.READ for e in self._acl):
            log.warning("ZooKeeper coordinator %s creates world-writable znodes", self._url)
        self._heartbeat = loop.create_task(
            self._heartbeat_loop(), name=f"zk-heartbeat-{self.session.id}"
        )
        log.debug("connected to %s with session %s", self._url, self.session.id)

    async def close(self) -> None:
        """End the session (its ephemeral keys go at once) and stop kazoo."""
        if self._closed:
            return
        self._closed = True
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heartbeat
            self._heartbeat = None
        for watch in list(self._watches):
            await watch.close()
        if self._retiring is not None:
            await self._retiring
        client, self._client = self._client, None
        if client is not None and self._loop is not None:
            await self._stop_client(client)
            REDACTOR.discard(self._log_secrets)
        if self._session is not None:
            self._session.mark(SessionState.LOST)

    def watch(self, prefix: str, *, values: bool = True,
              children: Collection[str] | None = None) -> Watch:
        self._check_dir(prefix)
        client = self._live_client()
        watch = ZkWatch(self, prefix, self._dir_znode(prefix[:-1]), client.last_zxid,
                         values=values, children=children)
        self._watches.add(watch)
        watch.start()
        return watch
