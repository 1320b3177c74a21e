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
    names of the URL. Passwords never reach logs, exceptions or reprs:
    kazoo's own debug logging of authentication packets is redacted.
"""

from __future__ import annotations

import asyncio
import builtins
import collections
import contextlib
import functools
import logging
import re
import socket
import ssl
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypeVar
from urllib.parse import parse_qsl, unquote, urlsplit

import tenacity
from kazoo.client import KazooClient
from kazoo.exceptions import (
    AuthFailedError,
    BadArgumentsError,
    BadVersionError,
    ConnectionClosedError,
    ConnectionDropped,
    ConnectionLoss,
    InvalidACLError,
    KazooException,
    NoAuthError,
    NoChildrenForEphemeralsError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    OperationTimeoutError,
    RequestTimeoutError,
    RolledBackError,
    RuntimeInconsistency,
    SASLException,
    SessionClosedRequireSaslError,
    SessionExpiredError,
    ZookeeperError,
    ZookeeperStoppedError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.serialization import SASL, Auth, Connect
from kazoo.protocol.states import EventType, KazooState, WatchedEvent
from kazoo.retry import KazooRetry
from kazoo.security import ACL, CREATOR_ALL_ACL, Id, Permissions

from coordinators import retry
from coordinators.credentials import refuse_plaintext_credentials
from coordinators.errors import (
    AuthenticationFailed,
    ConfigError,
    CoordinatorError,
    CoordinatorUnavailable,
    CorruptValue,
    ErrorTranslation,
    InvalidCoordinatorURL,
    PaimonGroupError,
    SessionLost,
    SessionSuspended,
)
from coordinators.protocol import (
    Check,
    ConnectOptions,
    Coordinator,
    Delete,
    Entry,
    Op,
    Put,
    Session,
    SessionState,
    Watch,
    validate_dir,
    validate_key,
)
from coordinators.session import SessionTransitions
from coordinators.urls import host_string, parse_hosts, redact_url, split_scheme

log = logging.getLogger(__name__)
# kazoo logs through this logger (see _RedactCredentials).
kazoo_log = logging.getLogger(__name__ + ".kazoo")

T = TypeVar("T")

DEFAULT_PORT: Final = 2181
RESERVED_PREFIX: Final = ".pg-"
FLAG_PREFIX: Final = ".pg-key."
EPOCH_PREFIX: Final = ".pg-epoch."
_NONCE = re.compile(r"[0-9a-f]{32}")
# How many (key, create_version) -> nonce entries a coordinator remembers.
_EPOCH_CACHE_SIZE: Final = 4096
_PERMS: Final = {
    "c": Permissions.CREATE,
    "r": Permissions.READ,
    "w": Permissions.WRITE,
    "d": Permissions.DELETE,
    "a": Permissions.ADMIN,
}


# Errors of a login that no retry will fix.
_AUTH_ERRORS: Final = (AuthFailedError, SASLException, SessionClosedRequireSaslError)


class _Conflict(CoordinatorUnavailable):
    """The state a write relied on changed before it was applied; re-plan it."""


# Reads are idempotent: one that lost its connection mid-flight is sent again.
_READ_RETRY: Final = retry.READS.copy(retry=tenacity.retry_if_exception_type(ConnectionLoss))
# Writes whose implicit guards failed re-read and try again.
_CONFLICT_RETRY: Final = retry.CONFLICTS.copy(retry=tenacity.retry_if_exception_type(_Conflict))


# ------------------------------------------------------------------------- URL


@dataclass(frozen=True, slots=True)
class ZkTarget:
    """A parsed ``zk://`` URL.

    Example::

        target = parse_url("zk://zk1:2181,zk2/paimon?acl=open")
        assert target.hosts == (("zk1", 2181), ("zk2", 2181))
        assert (target.chroot, target.acl) == ("/paimon", "open")
    """

    hosts: tuple[tuple[str, int], ...]
    chroot: str  # "" or "/a/b"
    acl: str | None = None

    def hosts_string(self) -> str:
        return ",".join(host_string(h) for h in self.hosts)

    def display(self) -> str:
        """The URL without anything secret."""
        url = f"zk://{self.hosts_string()}{self.chroot}"
        if self.acl is not None:
            shown = self.acl if self.acl in ("open", "creator") else "***"
            url += f"?acl={shown}"
        return url


def parse_url(url: str) -> ZkTarget:
    """The hosts, chroot and ACL of a ``zk://`` URL (one-line errors)."""
    shown = redact_url(url)
    _, rest = split_scheme(
        url, ("zk",), "a ZooKeeper URL", "zk://HOST:PORT[,HOST:PORT...][/CHROOT]"
    )
    try:
        parts = urlsplit("zk://" + rest)
    except ValueError as err:
        raise InvalidCoordinatorURL(f"malformed ZooKeeper URL {shown!r}") from err
    hosts = parse_hosts(parts.netloc, DEFAULT_PORT, "ZooKeeper", shown)
    chroot = unquote(parts.path).rstrip("/") if parts.path not in ("", "/") else ""
    if chroot:
        segments = chroot.split("/")[1:]
        if any(s in ("", ".", "..") for s in segments) or parts.path.endswith("//"):
            raise InvalidCoordinatorURL(f"invalid chroot {chroot!r} in ZooKeeper URL {shown!r}")
        if segments[0] == "zookeeper":
            raise InvalidCoordinatorURL(
                f"chroot {chroot!r} is inside ZooKeeper's own /zookeeper tree: choose another"
            )
    if parts.fragment:
        raise InvalidCoordinatorURL(f"ZooKeeper URL {shown!r} takes no fragment")
    acl: str | None = None
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if name != "acl":
            raise InvalidCoordinatorURL(
                f"unknown parameter {name!r} in ZooKeeper URL {shown!r}: only acl is accepted"
            )
        acl = value
    return ZkTarget(hosts, chroot, acl)


# ------------------------------------------------------------------------- ACL


def parse_acl(spec: str) -> tuple[ACL, ...]:
    """The ACL list of an ``acl`` setting (see the module docstring)."""
    entries = [e.strip() for e in spec.split(",") if e.strip()]
    if not entries:
        raise ConfigError("empty ZooKeeper acl: use creator, open, or SCHEME:ID:PERMS entries")
    acl: list[ACL] = []
    for entry in entries:
        if entry == "creator":
            acl.extend(CREATOR_ALL_ACL)
        elif entry == "open":
            acl.append(ACL(Permissions.ALL, Id("world", "anyone")))
        else:
            scheme, _, rest = entry.partition(":")
            ident, _, perms = rest.rpartition(":")
            if not scheme or not ident or not perms or any(p not in _PERMS for p in perms):
                raise ConfigError(
                    f"invalid ZooKeeper acl entry {entry.split(':', 1)[0]}:...: use creator, "
                    "open, or SCHEME:ID:PERMS with PERMS made of c, r, w, d, a"
                )
            mask = 0
            for p in perms:
                mask |= _PERMS[p]
            acl.append(ACL(mask, Id(scheme, ident)))
    return tuple(acl)


# -------------------------------------------------------------- credentials


@dataclass(frozen=True)
class _Credentials:
    """What kazoo needs to authenticate. Never printed."""

    scheme: Literal["digest", "sasl"]
    auth_data: list[tuple[str, str]] = field(repr=False)
    sasl_options: dict[str, str] | None = field(repr=False)
    secrets: tuple[str, ...] = field(repr=False)

    def __repr__(self) -> str:
        return f"_Credentials(scheme={self.scheme!r})"

    @property
    def mechanism(self) -> str:
        if self.sasl_options is None:
            return self.scheme
        return f"SASL {self.sasl_options.get('mechanism', 'DIGEST-MD5')}"

    @property
    def plaintext(self) -> bool:
        """Whether the password itself crosses the wire: digest sends
        ``user:password`` in its auth packet, SASL PLAIN sends it too;
        SASL DIGEST-MD5 answers a challenge instead."""
        if self.sasl_options is None:
            return True
        return str(self.sasl_options.get("mechanism", "")).upper() == "PLAIN"


def _credentials(options: ConnectOptions) -> _Credentials | None:
    username, password = options.username, options.password
    scheme = options.auth_scheme or ("digest" if username or password else None)
    if scheme is None:
        return None
    if scheme not in ("digest", "sasl"):
        raise ConfigError(f"unknown ZooKeeper auth scheme {scheme!r}: use digest or sasl")
    if not username or password is None:
        raise ConfigError(f"ZooKeeper {scheme} authentication needs both a username and a password")
    secret = password.reveal()
    if scheme == "digest":
        if ":" in username:
            raise ConfigError("a ZooKeeper digest username cannot contain ':'")
        return _Credentials("digest", [("digest", f"{username}:{secret}")], None, (secret,))
    sasl = {
        "mechanism": options.extra.get("sasl_mechanism", "DIGEST-MD5"),
        "username": username,
        "password": secret,
    }
    if "sasl_service" in options.extra:
        sasl["service"] = options.extra["sasl_service"]
    return _Credentials("sasl", [], sasl, (secret,))


class _RedactCredentials(logging.Filter):
    """Keeps credentials out of kazoo's log records.

    kazoo logs every request it sends at DEBUG, authentication packets
    included, and the session password at a lower level. One filter serves
    every coordinator of the process; each registers its secrets while open.
    """

    def __init__(self) -> None:
        super().__init__()
        self._secrets: collections.Counter[str] = collections.Counter()

    @property
    def secrets(self) -> tuple[str, ...]:
        return tuple(self._secrets)

    def add(self, secrets: Iterable[str]) -> None:
        self._secrets.update(s for s in secrets if s)

    def discard(self, secrets: Iterable[str]) -> None:
        self._secrets.subtract(s for s in secrets if s)
        for secret in [s for s, n in self._secrets.items() if n <= 0]:
            del self._secrets[secret]

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and args:
            redact_bytes = "passwd" in str(record.msg)
            record.args = tuple(
                f"{type(a).__name__}(<redacted>)"
                if isinstance(a, Auth | SASL | Connect) or (redact_bytes and isinstance(a, bytes))
                else a
                for a in args
            )
        secrets = self.secrets
        if secrets:
            message = record.getMessage()
            if any(s in message for s in secrets):
                for s in secrets:
                    message = message.replace(s, "***")
                record.msg, record.args = message, None
        return True


_REDACTOR: Final = _RedactCredentials()
kazoo_log.addFilter(_REDACTOR)


# -------------------------------------------------------------------- errors


def translate(err: BaseException, what: str) -> PaimonGroupError:
    """The one place where kazoo (and socket) errors become ours (raise it ``from err``)."""
    if isinstance(err, PaimonGroupError):
        return err
    name = type(err).__name__
    if isinstance(err, ConnectionClosedError):
        return CoordinatorError(f"ZooKeeper coordinator is closed ({what})")
    if isinstance(err, SessionClosedRequireSaslError):
        return AuthenticationFailed(
            f"ZooKeeper requires authentication ({what}): configure ConnectOptions "
            "username, password and auth_scheme"
        )
    if isinstance(err, AuthFailedError | SASLException):
        return AuthenticationFailed(
            f"ZooKeeper refused our credentials ({what}): check the username, the password "
            "and the auth scheme"
        )
    if isinstance(err, NoAuthError):
        return AuthenticationFailed(
            f"ZooKeeper denied access ({what}): the znode ACL does not grant the configured "
            "identity (wrong credentials, or znodes created by another identity)"
        )
    if isinstance(err, InvalidACLError):
        return ConfigError(f"ZooKeeper rejected our ACL ({what}): check the acl setting")
    if isinstance(err, NoChildrenForEphemeralsError):
        return ConfigError(f"a key cannot be created under an ephemeral key ({what})")
    if isinstance(err, BadArgumentsError):
        return ConfigError(f"ZooKeeper rejected the request ({what}): invalid characters in a key?")
    if isinstance(err, SessionExpiredError):
        return SessionLost(f"ZooKeeper session expired ({what}): open a new coordinator")
    if isinstance(
        err,
        ConnectionLoss
        | ConnectionDropped
        | OperationTimeoutError
        | RequestTimeoutError
        | ZookeeperStoppedError
        | KazooTimeoutError,
    ):
        return CoordinatorUnavailable(f"ZooKeeper connection problem ({what}): {name}; retry")
    if isinstance(err, ssl.SSLError):
        return AuthenticationFailed(f"TLS with ZooKeeper failed ({what}): {err.reason or name}")
    if isinstance(err, OSError):
        return CoordinatorUnavailable(f"cannot reach ZooKeeper ({what}): {err.strerror or name}")
    if isinstance(err, ZookeeperError):
        return CoordinatorError(f"ZooKeeper refused the request ({what}): {name}")
    return CoordinatorError(f"ZooKeeper client error ({what}): {name}")


# The one translation of kazoo (and socket) errors: ``with _translated(what):``.
_KAZOO: Final = ErrorTranslation((KazooException, OSError), translate)
_translated: Final = _KAZOO.translating


# ------------------------------------------------------------------- session


class ZooKeeperSession(Session):
    """A ZooKeeper session, as seen through kazoo's state listener and our heartbeats.

    Example (with a connected :class:`ZooKeeperCoordinator` ``coord``)::

        session = coord.session
        print(session.id)                  # "0x100003a5c8e0001", ZooKeeper's id
        session.add_listener(lambda state: print("session is", state.value))
        if not session.is_live(margin_s=1.0):
            ...                            # stop processing and committing
    """

    def __init__(self, raw_id: int, timeout_s: float, started_at: float) -> None:
        super().__init__(timeout_s)
        self.raw_id = raw_id
        # The server created the session after we sent the connect request.
        self._deadline = started_at + timeout_s

    @property
    def id(self) -> str:
        return f"0x{self.raw_id:x}"

    def mark(self, state: SessionState) -> None:
        """Move to ``state`` (no-op once LOST); a failing listener is logged."""
        try:
            self._set_state(state)
        except Exception:
            log.exception("ZooKeeper session %s: a state listener failed", self.id)


# ------------------------------------------------------------------ planning


@dataclass(frozen=True, slots=True)
class _KeyState:
    """What a key looks like on the server (read before a write)."""

    kind: Literal["absent", "dir", "key"]
    nonce: str = ""
    create_version: int = 0
    ephemeral: bool = False
    data_version: int = 0
    mzxid: int = 0
    children: int = 0
    value: bytes = b""
    # Created by an earlier operation of the transaction being planned.
    new: bool = False


_ASSUMED_KEY: Final = _KeyState("key")


@dataclass(frozen=True, slots=True)
class _TxnOp:
    kind: Literal["create", "delete", "set", "check"]
    path: str
    key: str
    explicit: bool  # a caller's Check (failure: commit returns False)
    data: bytes = b""
    version: int = -1
    ephemeral: bool = False


class _Txn:
    """The operations of one ``multi`` and where each came from."""

    def __init__(self) -> None:
        self.ops: list[_TxnOp] = []

    def add(self, op: _TxnOp) -> None:
        self.ops.append(op)


@dataclass(frozen=True, slots=True)
class _Failure:
    op: _TxnOp
    error: BaseException


# ---------------------------------------------------------------- coordinator


class ZooKeeperCoordinator(Coordinator):
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
        self._credentials = _credentials(options)
        if (
            self._credentials is not None
            and self._credentials.plaintext
            and not options.tls
            and not options.allow_plaintext_credentials
        ):
            raise refuse_plaintext_credentials(
                "ZooKeeper", f"{self._credentials.mechanism} authentication",
                "give a CA (tls_ca, --coordinator-ca) for TLS, or use SASL DIGEST-MD5",
            )
        acl_spec = self._target.acl if self._target.acl is not None else options.acl
        self._acl = parse_acl(acl_spec)
        # A TLS client certificate is an identity too (ZooKeeper's x509 provider).
        identified = self._credentials is not None or options.tls_cert is not None
        if not identified and any(e.id.scheme == "auth" for e in self._acl):
            raise ConfigError(
                f"ZooKeeper acl {acl_spec.split(',')[0]!r} needs an identity: set ConnectOptions "
                "username/password (digest or sasl) or a TLS client certificate, or choose "
                "acl=open to create world-accessible znodes (development servers only)"
            )
        self._check_tls(options)
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
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: Any = None
        self._session: ZooKeeperSession | None = None
        self._transitions: SessionTransitions | None = None
        self._heartbeat: asyncio.Task[None] | None = None
        self._retiring: asyncio.Task[None] | None = None
        self._heartbeat_kick = asyncio.Event()
        self._watches: set[_ZkWatch] = set()
        self._epochs: collections.OrderedDict[tuple[str, int], str] = collections.OrderedDict()
        self._closed = False
        # Set from kazoo's thread the moment kazoo reports LOST, before the
        # loop hears of it: no ephemeral create may start after that.
        self._lost_flag = False

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

    @property
    def session(self) -> ZooKeeperSession:
        if self._session is None:
            raise CoordinatorError(f"{self!r} is not connected: await connect() first")
        return self._session

    @contextlib.contextmanager
    def _translating(self, what: str) -> Iterator[None]:
        """Like :func:`_translated`, but once this session is LOST every failure
        is :class:`SessionLost`: a request in flight when the session was
        declared lost fails on the stopped kazoo client (ConnectionClosedError),
        and the owner must rejoin, not give up."""
        try:
            with _translated(what):
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
            value = await asyncio.wait_for(future, limit)
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
        return await _READ_RETRY.copy(sleep=self._sleep)(fn)

    async def _writing(self, fn: Callable[[], Awaitable[T]]) -> T:
        return await _CONFLICT_RETRY.copy(sleep=self._sleep)(fn)

    def _confirm(self, sent_at: float) -> None:
        """The server answered a request sent at ``sent_at``: the session lived then."""
        session, client = self._session, self._client
        if session is None or client is None or session.state is SessionState.LOST:
            return
        if _session_id_of(client) == session.raw_id:
            session.confirmed(sent_at)

    # -- paths -----------------------------------------------------------

    def _check_key(self, key: str) -> str:
        validate_key(key)
        self._check_segments(key, key.split("/"))
        return key

    def _check_dir(self, prefix: str) -> str:
        validate_dir(prefix)
        self._check_segments(prefix, prefix[:-1].split("/") if prefix else [])
        return prefix

    def _check_segments(self, shown: str, segments: list[str]) -> None:
        for segment in segments:
            if segment in (".", "..") or segment.startswith(RESERVED_PREFIX):
                raise ConfigError(
                    f"invalid coordinator key {shown!r} for ZooKeeper: path segments '.', '..' "
                    f"and those starting with {RESERVED_PREFIX!r} are reserved"
                )
        if not self._prefix and segments and segments[0] == "zookeeper":
            raise ConfigError(
                f"invalid coordinator key {shown!r}: /zookeeper is ZooKeeper's own tree; "
                "use a chroot in the URL"
            )

    def _znode(self, key: str) -> str:
        return f"{self._prefix}/{key}"

    def _dir_znode(self, head: str) -> str:
        """The znode of directory ``head/`` (``""``: the chroot itself)."""
        return f"{self._prefix}/{head}" if head else self._root

    def _parent_znode(self, key: str) -> str:
        return self._dir_znode(key.rpartition("/")[0])

    def _sibling(self, key: str, name: str) -> str:
        return _join(self._parent_znode(key), name)

    def _flag(self, key: str) -> str:
        return self._sibling(key, FLAG_PREFIX + key.rpartition("/")[2])

    def _epoch(self, key: str, nonce: str) -> str:
        return self._sibling(key, EPOCH_PREFIX + nonce)

    def _remember_epoch(self, key: str, create_version: int, nonce: str) -> None:
        self._epochs[(key, create_version)] = nonce
        self._epochs.move_to_end((key, create_version))
        while len(self._epochs) > _EPOCH_CACHE_SIZE:
            self._epochs.popitem(last=False)

    # -- lifecycle -------------------------------------------------------

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
                raise
            finally:
                done.set()

        connection._connect = _connect

    async def connect(self) -> None:
        if self._closed:
            raise CoordinatorError(f"{self!r} is closed; open a new coordinator")
        if self._session is not None:
            raise CoordinatorError(f"{self!r} is already connected")
        loop = asyncio.get_running_loop()
        self._loop = loop
        if self._credentials is not None:
            _REDACTOR.add(self._credentials.secrets)
        client = self._make_client()
        started_at = time.monotonic()
        limit = float(self._options.connect_timeout_s)
        try:
            connected = await loop.run_in_executor(
                None, _start_client, client, limit, self._handshake_done
            )
            if not connected or isinstance(self._handshake_error, _AUTH_ERRORS):
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
            self._session = ZooKeeperSession(_session_id_of(client) or 0, timeout_s, started_at)
            self._transitions = SessionTransitions(
                self._session, self._on_session_state, what="ZooKeeper session", logger=log
            )
            with _translated(f"prepare the chroot {self._root}"):
                await self._prepare_root()
        except BaseException:
            self._session = None
            self._transitions = None
            self._client = None
            await loop.run_in_executor(None, _stop_client, client)
            self._closed = True
            if self._credentials is not None:
                _REDACTOR.discard(self._credentials.secrets)
            raise
        if any(e.id == Id("world", "anyone") and e.perms & ~Permissions.READ for e in self._acl):
            log.warning("ZooKeeper coordinator %s creates world-writable znodes", self._url)
        self._heartbeat = loop.create_task(
            self._heartbeat_loop(), name=f"zk-heartbeat-{self.session.id}"
        )
        log.debug("connected to %s with session %s", self._url, self.session.id)

    async def _connect_failure(self, client: Any, limit: float) -> PaimonGroupError:
        if client.client_state == "AUTH_FAILED" or isinstance(
            self._handshake_error, _AUTH_ERRORS
        ):
            return translate(AuthFailedError(), "connect")
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
            except ssl.SSLCertVerificationError as err:
                return (
                    f"TLS certificate verification failed for ZooKeeper at {host}:{port}: "
                    f"{err.verify_message}"
                )
            except ssl.SSLError as err:
                return f"TLS handshake with ZooKeeper at {host}:{port} failed: {err.reason or err}"
            except OSError:
                continue
        return None

    async def _prepare_root(self) -> None:
        client = self._client
        if self._root != "/":
            await self._request(
                "create the chroot", client.ensure_path_async, self._root, list(self._acl)
            )
        # Reading it proves the credentials grant access (a wrong digest
        # password is not refused at login, only by the ACLs).
        await self._request("read the chroot", client.get_children_async, self._root)

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
            await self._loop.run_in_executor(None, _stop_client, client)
            if self._credentials is not None:
                _REDACTOR.discard(self._credentials.secrets)
        if self._session is not None:
            self._session.mark(SessionState.LOST)

    # -- session ---------------------------------------------------------

    def _on_kazoo_state(self, client: Any, state: str) -> None:
        """kazoo's state listener: runs on kazoo's connection thread, must not block."""
        if state == KazooState.LOST:
            self._lost_flag = True
        self._in_loop(self._apply_kazoo_state, state, _session_id_of(client))

    def _apply_kazoo_state(self, state: str, session_id: int | None) -> None:
        session, transitions = self._session, self._transitions
        if session is None or transitions is None or self._closed:
            return
        if state == KazooState.LOST:
            self._lose("the session expired or was closed by ZooKeeper")
        elif state == KazooState.SUSPENDED:
            transitions.unanswered("connection lost")
        elif state == KazooState.CONNECTED:
            if session_id != session.raw_id:
                self._lose("ZooKeeper opened a new session after the old one expired")
            elif session.state is SessionState.SUSPENDED:
                transitions.resumed()
            self._heartbeat_kick.set()
        for watch in list(self._watches):
            watch._connection_changed(state)

    def _lose(self, reason: str) -> None:
        self._lost_flag = True
        if self._transitions is not None:
            self._transitions.gone(reason)

    def _on_session_state(self, state: SessionState) -> None:
        """Apply a state decided by the session's transitions (on the loop)."""
        session = self._session
        if session is None:
            return
        if state is not SessionState.LOST:
            session.mark(state)
            return
        self._lost_flag = True
        if session.state is SessionState.LOST:
            return
        session.mark(SessionState.LOST)
        for watch in list(self._watches):
            watch._lost()
        # Stop kazoo before it works on for a replacement session (and end
        # that session, with anything created in it by mistake).
        client, loop = self._client, self._loop
        if client is not None and loop is not None and self._retiring is None:
            self._retiring = loop.create_task(self._retire(client), name="zk-retire")

    async def _retire(self, client: Any) -> None:
        assert self._loop is not None
        await self._loop.run_in_executor(None, _stop_client, client)

    def _require_session(self) -> ZooKeeperSession:
        """The session, if an ephemeral key may be created under it now."""
        self._live_client()  # raises SessionLost once LOST
        session = self.session
        if session.state is SessionState.SUSPENDED:
            raise SessionSuspended(
                f"ZooKeeper session {session.id} is suspended (no connection); retry once it "
                "is connected again"
            )
        return session

    async def _heartbeat_loop(self) -> None:
        """Confirm the session every third of its timeout; SUSPENDED if unanswered.

        kazoo pings only when nothing else is sent, and our requests count
        as its pings, so a server that hangs without closing the connection
        would go unnoticed by kazoo: an unanswered heartbeat is our signal.
        Every answered request confirms the session (:meth:`_recv`).
        """
        session, transitions = self.session, self._transitions
        assert transitions is not None
        while not self._closed and session.state is not SessionState.LOST:
            interval = max(session.timeout_s / 3, 0.05)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._heartbeat_kick.wait(), interval)
            self._heartbeat_kick.clear()
            client = self._client
            if client is None or self._closed:
                return
            if transitions.overdue():
                # The server may already have expired us and handed our keys
                # on; kazoo would only learn it on reconnection. Like
                # Curator, give up now: the owner rejoins with a new session.
                self._lose("no contact with ZooKeeper for longer than the session timeout")
                return
            if not client.connected:
                continue  # kazoo reconnects and tells us (CONNECTED or LOST)
            try:
                await self._recv(
                    self._send(client.exists_async, self._root), "a heartbeat", timeout=interval
                )
            except CoordinatorUnavailable:
                transitions.unanswered(f"heartbeat unanswered for {interval:.3g}s")
                continue
            except SessionExpiredError:
                self._lose("a heartbeat found the session expired")
                return
            except KazooException as err:
                log.debug("ZooKeeper heartbeat of session %s failed: %r", session.id, err)
                continue
            if _session_id_of(client) != session.raw_id:
                self._lose("ZooKeeper opened a new session after the old one expired")
                return
            if session.state is SessionState.SUSPENDED and client.connected:
                transitions.resumed()

    # -- reads -----------------------------------------------------------

    async def _read_states(self, keys: Iterable[str]) -> dict[str, _KeyState]:
        """The current state of each key (two pipelined reads per key)."""
        wanted = list(dict.fromkeys(keys))
        if not wanted:
            return {}
        client = self._live_client()

        async def read() -> dict[str, _KeyState]:
            sent = []
            for key in wanted:
                # Flag first: if the value znode read then shows a later
                # incarnation, checks built on the flag fail safely.
                sent.append(self._send(client.get_async, self._flag(key)))
                sent.append(self._send(client.get_async, self._znode(key)))
            replies = await self._recv_all(sent, "a read")
            return {
                key: self._state_of(key, replies[2 * i], replies[2 * i + 1])
                for i, key in enumerate(wanted)
            }

        return await self._reading(read)

    def _state_of(self, key: str, flag: Any, value: Any) -> _KeyState:
        for reply in (flag, value):
            if isinstance(reply, BaseException) and not isinstance(reply, NoNodeError):
                raise reply
        if isinstance(value, NoNodeError):
            return _KeyState("absent")
        data, stat = value
        if isinstance(flag, NoNodeError):
            return _KeyState("dir", data_version=stat.version, children=stat.numChildren)
        flag_data, flag_stat = flag
        nonce = bytes(flag_data).decode("ascii", "replace")
        if not _NONCE.fullmatch(nonce):
            raise CorruptValue(
                f"ZooKeeper znode {self._flag(key)} is not a key flag of this program"
            )
        self._remember_epoch(key, flag_stat.czxid, nonce)
        return _KeyState(
            "key",
            nonce=nonce,
            create_version=flag_stat.czxid,
            ephemeral=flag_stat.ephemeralOwner != 0,
            data_version=stat.version,
            mzxid=stat.mzxid,
            children=stat.numChildren,
            value=bytes(data),
        )

    @staticmethod
    def _entry(key: str, state: _KeyState) -> Entry | None:
        if state.kind != "key":
            return None
        return Entry(key, state.value, state.mzxid, state.create_version, state.ephemeral)

    async def get(self, key: str) -> Entry | None:
        self._check_key(key)
        with self._translating(f"get {key}"):
            states = await self._read_states([key])
        return self._entry(key, states[key])

    async def list(self, prefix: str) -> list[Entry]:
        self._check_dir(prefix)
        client = self._live_client()
        directory = self._dir_znode(prefix[:-1])
        with self._translating(f"list {prefix}"):

            async def children() -> list[str]:
                try:
                    names: list[str] = await self._request(
                        f"list {prefix}", client.get_children_async, directory
                    )
                except NoNodeError:
                    return []
                return names

            names = await self._reading(children)
            keys = sorted(
                prefix + n[len(FLAG_PREFIX) :] for n in names if n.startswith(FLAG_PREFIX)
            )
            states = await self._read_states(keys)
        entries = (self._entry(key, states[key]) for key in keys)
        return [e for e in entries if e is not None]

    # -- writes ----------------------------------------------------------

    async def _multi(self, txn: _Txn, what: str) -> _Failure | None:
        """Run ``txn`` as one ``multi``: None if applied, else the failing op."""
        client = self._live_client()
        request = client.transaction()
        for op in txn.ops:
            if op.kind == "create":
                request.create(op.path, op.data, acl=list(self._acl), ephemeral=op.ephemeral)
            elif op.kind == "delete":
                request.delete(op.path, op.version)
            elif op.kind == "set":
                request.set_data(op.path, op.data, op.version)
            else:
                request.check(op.path, op.version)
        results = await self._request(what, request.commit_async)
        for op, result in zip(txn.ops, results, strict=False):
            if isinstance(result, BaseException) and not isinstance(
                result, RolledBackError | RuntimeInconsistency
            ):
                return _Failure(op, result)
        if any(isinstance(r, BaseException) for r in results):
            return _Failure(txn.ops[0], RuntimeInconsistency())
        return None

    async def _ensure_parent(self, key: str) -> None:
        client = self._live_client()
        await self._request(
            f"create the parents of {key}",
            client.ensure_path_async,
            self._parent_znode(key),
            list(self._acl),
        )

    async def _after_failure(self, failure: _Failure) -> None:
        """Prepare the next attempt after an implicit guard failed; raises _Conflict."""
        error, op = failure.error, failure.op
        if isinstance(error, NoNodeError) and op.kind == "create":
            await self._ensure_parent(op.key)
        elif not isinstance(error, NodeExistsError | NoNodeError | BadVersionError | NotEmptyError):
            raise error
        raise _Conflict(
            "ZooKeeper writes kept conflicting with concurrent changes of the same keys; retry"
        )

    def _create_ops(
        self, txn: _Txn, key: str, state: _KeyState, value: bytes, nonce: str, ephemeral: bool
    ) -> None:
        """Make ``key`` (absent or a plain directory) a key with ``value``."""
        znode, flag, epoch = self._znode(key), self._flag(key), self._epoch(key, nonce)
        marker = nonce.encode("ascii")
        if state.kind == "absent":
            txn.add(_TxnOp("create", znode, key, False, value, ephemeral=ephemeral))
            txn.add(_TxnOp("create", flag, key, False, marker, ephemeral=ephemeral))
            txn.add(_TxnOp("create", epoch, key, False, ephemeral=ephemeral))
        elif ephemeral:
            # An ephemeral value znode: replace the (empty) directory znode.
            txn.add(_TxnOp("create", flag, key, False, marker, ephemeral=True))
            txn.add(_TxnOp("create", epoch, key, False, ephemeral=True))
            txn.add(_TxnOp("delete", znode, key, False, version=state.data_version))
            txn.add(_TxnOp("create", znode, key, False, value, ephemeral=True))
        else:
            txn.add(_TxnOp("create", flag, key, False, marker))
            txn.add(_TxnOp("create", epoch, key, False))
            txn.add(_TxnOp("set", znode, key, False, value))

    async def create(self, key: str, value: bytes, *, ephemeral: bool = False) -> Entry | None:
        self._check_key(key)
        value = bytes(value)
        if ephemeral:
            self._require_session()
        state: _KeyState | None = None

        async def attempt() -> Entry | None:
            nonlocal state
            current = state or _KeyState("absent")
            if current.kind == "key":
                return None
            if current.kind == "dir" and ephemeral and current.children:
                raise ConfigError(
                    f"cannot create ephemeral key {key!r}: keys exist below it, and ephemeral "
                    "keys cannot have children"
                )
            if ephemeral:
                self._require_session()
            nonce = uuid.uuid4().hex
            txn = _Txn()
            self._create_ops(txn, key, current, value, nonce, ephemeral)
            try:
                failure = await self._multi(txn, f"create {key}")
            except (ConnectionLoss, CoordinatorUnavailable):
                # Applied or not (or not yet: a request that timed out is still
                # queued)? Requests run in order, so a read sent now sees the
                # outcome, and our nonce tells whether the key is ours.
                state = (await self._read_states([key]))[key]
                if state.kind == "key" and state.nonce == nonce:
                    return await self._created(key, nonce, value, ephemeral)
                raise _Conflict(f"lost the connection while creating {key}; retry") from None
            if failure is None:
                return await self._created(key, nonce, value, ephemeral)
            if failure.op.path == self._flag(key) and isinstance(failure.error, NodeExistsError):
                return None  # the key exists
            state = None
            if not (isinstance(failure.error, NoNodeError) and failure.op.kind == "create"):
                state = (await self._read_states([key]))[key]
            await self._after_failure(failure)
            raise AssertionError("unreachable")

        with self._translating(f"create {key}"):
            return await self._writing(attempt)

    async def _created(self, key: str, nonce: str, value: bytes, ephemeral: bool) -> Entry:
        """The entry of the key we just created, from its epoch marker's stat."""
        client = self._live_client()

        async def read_marker() -> Any:
            return await self._request(f"read {key}", client.exists_async, self._epoch(key, nonce))

        stat = await self._reading(read_marker)
        if stat is None:
            # Deleted by someone else already: our incarnation is gone.
            raise _Conflict(f"{key} was deleted right after we created it; retry")
        if ephemeral:
            session = self.session
            if stat.ephemeralOwner != session.raw_id:
                await self._delete_ghost(key, nonce)
                self._lose("an ephemeral create landed in a new session")
                raise SessionLost(f"ZooKeeper session {session.id} is lost: open a new coordinator")
        self._remember_epoch(key, stat.czxid, nonce)
        # The value znode was written in the same transaction: mzxid == czxid.
        return Entry(key, value, stat.czxid, stat.czxid, ephemeral)

    async def _delete_ghost(self, key: str, nonce: str) -> None:
        """Delete an ephemeral key a replacement session created for us by mistake."""
        txn = _Txn()
        txn.add(_TxnOp("delete", self._epoch(key, nonce), key, False))
        txn.add(_TxnOp("delete", self._flag(key), key, False))
        txn.add(_TxnOp("delete", self._znode(key), key, False))
        try:
            await self._multi(txn, f"delete {key}")
        except (KazooException, CoordinatorError) as err:
            log.warning("could not delete %s created by a replacement session: %r", key, err)

    def _delete_ops(self, txn: _Txn, key: str, state: _KeyState) -> _KeyState:
        """Delete key ``key`` (state ``key``); the state it leaves."""
        txn.add(_TxnOp("delete", self._epoch(key, state.nonce), key, False))
        txn.add(_TxnOp("delete", self._flag(key), key, False))
        if state.children:
            # Keys below it keep its znode: leave it as a plain directory.
            txn.add(_TxnOp("set", self._znode(key), key, False))
            return _KeyState("dir", children=state.children)
        txn.add(_TxnOp("delete", self._znode(key), key, False))
        return _KeyState("absent")

    def _absence_ops(self, txn: _Txn, key: str, explicit: bool) -> None:
        """Fail the transaction if ``key`` exists (ZooKeeper has no 'check absent')."""
        flag = self._flag(key)
        txn.add(_TxnOp("create", flag, key, explicit))
        txn.add(_TxnOp("delete", flag, key, explicit))

    async def delete(self, key: str) -> bool:
        self._check_key(key)

        async def attempt() -> bool:
            state = (await self._read_states([key]))[key]
            if state.kind != "key":
                return False  # linearised at the read
            txn = _Txn()
            self._delete_ops(txn, key, state)
            failure = await self._multi(txn, f"delete {key}")
            if failure is None:
                return True
            await self._after_failure(failure)
            raise AssertionError("unreachable")

        with self._translating(f"delete {key}"):
            return await self._writing(attempt)

    async def commit(self, checks: Sequence[Check], ops: Sequence[Op]) -> bool:
        for check in checks:
            self._check_key(check.key)
        for op in ops:
            if not isinstance(op, Put | Delete):
                raise TypeError(f"commit takes Put and Delete operations, not {op!r}")
            self._check_key(op.key)
        if not checks and not ops:
            return True
        checks, ops = tuple(checks), tuple(ops)
        optimistic = True

        async def attempt() -> bool:
            nonlocal optimistic
            needed = self._plan_reads(checks, ops, optimistic)
            states = await self._read_states(needed)
            planned = self._plan(checks, ops, states, optimistic)
            if planned is None:
                return False  # a check already fails, for good
            try:
                failure = await self._multi(planned, "commit")
            except (ConnectionLoss, CoordinatorUnavailable) as err:
                raise CoordinatorUnavailable(
                    "lost the connection to ZooKeeper during a commit: it may or may not have "
                    "been applied; re-read before retrying"
                ) from err
            if failure is None:
                return True
            if failure.op.explicit and not (
                isinstance(failure.error, NoNodeError) and failure.op.kind == "create"
            ):
                return False
            optimistic = False
            await self._after_failure(failure)
            raise AssertionError("unreachable")

        with self._translating("commit"):
            return await self._writing(attempt)

    def _plan_reads(
        self, checks: Sequence[Check], ops: Sequence[Op], optimistic: bool
    ) -> builtins.list[str]:
        """The keys whose state a commit must read before it can be planned."""
        keys: builtins.list[str] = []
        for check in checks:
            if check.version is not None:
                keys.append(check.key)
            elif check.create_version is not None:
                if (check.key, check.create_version) not in self._epochs:
                    keys.append(check.key)
        for op in ops:
            if isinstance(op, Delete) or not optimistic:
                keys.append(op.key)
        return keys

    def _plan(
        self,
        checks: Sequence[Check],
        ops: Sequence[Op],
        states: dict[str, _KeyState],
        optimistic: bool,
    ) -> _Txn | None:
        """The ``multi`` of a commit, or None if a check fails already."""
        txn = _Txn()
        for check in checks:
            key = check.key
            if check.absent:
                self._absence_ops(txn, key, explicit=True)
            elif check.create_version is not None:
                nonce = self._epochs.get((key, check.create_version))
                if nonce is None:
                    state = states[key]
                    if state.kind != "key" or state.create_version != check.create_version:
                        return None  # that incarnation is gone, and never comes back
                    nonce = state.nonce
                txn.add(_TxnOp("check", self._epoch(key, nonce), key, True))
            else:
                state = states[key]
                if state.kind != "key" or state.mzxid != check.version:
                    return None  # written since (mzxid values are never reused)
                txn.add(_TxnOp("check", self._epoch(key, state.nonce), key, True))
                txn.add(_TxnOp("check", self._znode(key), key, True, version=state.data_version))
        current: dict[str, _KeyState] = {}
        guarded: set[str] = set()
        for op in ops:
            key = op.key
            found = current.get(key) or states.get(key) or (_ASSUMED_KEY if optimistic else None)
            assert found is not None, f"state of {key} not read"
            state = found
            if isinstance(op, Put):
                value = bytes(op.value)
                if state.kind == "key":
                    if not state.new:
                        # Still a key when the multi runs (maybe another
                        # incarnation: a put overwrites whatever is there).
                        txn.add(_TxnOp("check", self._flag(key), key, False))
                    txn.add(_TxnOp("set", self._znode(key), key, False, value))
                else:
                    nonce = uuid.uuid4().hex
                    self._create_ops(txn, key, state, value, nonce, ephemeral=False)
                    state = _KeyState("key", nonce=nonce, children=state.children, new=True)
            elif state.kind == "key":
                state = self._delete_ops(txn, key, state)
                guarded.add(key)
            elif key not in guarded:
                # Deleting an absent key is a no-op, but only if it is still
                # absent when the other writes are applied.
                self._absence_ops(txn, key, explicit=False)
                guarded.add(key)
            current[key] = state
        return txn

    # -- watches ---------------------------------------------------------

    def watch(self, prefix: str) -> Watch:
        self._check_dir(prefix)
        client = self._live_client()
        watch = _ZkWatch(self, prefix, self._dir_znode(prefix[:-1]), client.last_zxid)
        self._watches.add(watch)
        watch.start()
        return watch

    def _forget(self, watch: _ZkWatch) -> None:
        self._watches.discard(watch)

    def _last_zxid(self) -> int:
        client = self._client
        return int(client.last_zxid) if client is not None else 0


def _session_id_of(client: Any) -> int | None:
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


def _join(directory: str, name: str) -> str:
    return f"{directory}{name}" if directory.endswith("/") else f"{directory}/{name}"


def _start_client(client: Any, timeout_s: float, handshake: threading.Event | None) -> bool:
    """Start kazoo and wait for its first connection (blocking; runs in an executor).

    kazoo reports the connection as soon as the server accepts the session,
    before authenticating and before returning the negotiated timeout; wait
    for the end of the handshake too when we can see it.
    """
    deadline = time.monotonic() + timeout_s
    event = client.start_async()
    event.wait(timeout_s)
    if handshake is not None and client.connected:
        handshake.wait(max(0.0, deadline - time.monotonic()))
    return bool(client.connected)


def _stop_client(client: Any) -> None:
    """Stop kazoo, ending the session, and free its resources (blocking)."""
    try:
        client.stop()
        client.close()
    except Exception as err:
        log.warning("stopping the ZooKeeper client: %r", err)


# --------------------------------------------------------------------- watch


class _ZkWatch(Watch):
    """A level-triggered watch of a directory's direct children; see the module docstring."""

    def __init__(
        self, coordinator: ZooKeeperCoordinator, prefix: str, directory: str, seen: int
    ) -> None:
        self.prefix = prefix
        self._coordinator = coordinator
        self._dir = directory
        # Changes with a zxid above this one may be unseen by the caller.
        self._seen = seen
        self._dirty = False
        self._closed = False
        self._changed = asyncio.Event()
        self._rearm = asyncio.Event()
        self._rearm.set()
        # Keys whose value znode carries our data watch.
        self._armed: set[str] = set()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        loop = self._coordinator._loop
        assert loop is not None
        self._task = loop.create_task(self._arm_loop(), name=f"zk-watch-{self.prefix}")

    def _child(self, name: str) -> str:
        return _join(self._dir, name)

    # kazoo's callback thread
    def _on_event(self, event: WatchedEvent) -> None:
        self._coordinator._in_loop(self._fired, event)

    def _fired(self, event: WatchedEvent) -> None:
        if self._closed:
            return
        if event.type == EventType.NONE:
            self._armed.clear()  # kazoo dropped every watch (connection lost)
        elif event.path != self._dir:
            self._armed.discard(event.path.rpartition("/")[2])
        self._mark()
        self._rearm.set()

    def _connection_changed(self, state: str) -> None:
        if state == KazooState.CONNECTED or state == KazooState.LOST:
            self._armed.clear()
            self._mark()  # anything may have changed while we could not watch
            self._rearm.set()

    def _mark(self) -> None:
        self._dirty = True
        self._changed.set()

    def _lost(self) -> None:
        self._changed.set()  # waiters raise SessionLost

    async def _arm_loop(self) -> None:
        backoff = 0.05
        while not self._closed:
            await self._rearm.wait()
            self._rearm.clear()
            try:
                await self._arm()
                backoff = 0.05
            except asyncio.CancelledError:
                raise
            except Exception as err:
                if self._closed:
                    return
                log.debug("re-arming the watch on %s failed: %r", self.prefix, err)
                self._armed.clear()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                self._rearm.set()

    async def _arm(self) -> None:
        coordinator = self._coordinator
        client = coordinator._client
        if client is None or not client.connected:
            return  # re-armed when kazoo reports CONNECTED
        what = f"watch {self.prefix}"
        try:
            children, stat = await coordinator._request(
                what, client.get_children_async, self._dir, self._on_event, True
            )
        except NoNodeError:
            self._armed.clear()
            exists = await coordinator._request(
                what, client.exists_async, self._dir, self._on_event
            )
            if exists is not None:
                self._rearm.set()  # created in between: list it
            return
        if stat.pzxid > self._seen:
            self._mark()  # a key created or deleted since the caller last looked
        names = {n[len(FLAG_PREFIX) :] for n in children if n.startswith(FLAG_PREFIX)}
        self._armed &= names
        fresh = sorted(names - self._armed)
        sent = [
            coordinator._send(client.exists_async, self._child(n), self._on_event) for n in fresh
        ]
        replies = await coordinator._recv_all(sent, what)
        for name, reply in zip(fresh, replies, strict=True):
            if isinstance(reply, BaseException):
                self._rearm.set()
                continue
            self._armed.add(name)
            if reply is None or reply.mzxid > self._seen:
                self._mark()

    async def wait(self, timeout: float | None = None) -> bool:
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            if self._closed:
                raise CoordinatorError(f"watch on {self.prefix!r} is closed")
            self._coordinator._live_client()  # raises SessionLost once LOST
            if self._dirty:
                self._dirty = False
                # The caller reads after this: nothing up to here is news.
                self._seen = max(self._seen, self._coordinator._last_zxid())
                return True
            self._changed.clear()
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), remaining)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._coordinator._forget(self)
        self._changed.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
