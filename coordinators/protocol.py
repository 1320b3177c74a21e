"""The coordinator protocol: a small, session-scoped, linearizable key-value store.

Everything the group logic in :mod:`paimon_group` needs from etcd, ZooKeeper or
the embedded SQLite file is here, and nothing more:

* one **session** per :class:`Coordinator`, with a timeout and the states
  ``CONNECTED -> SUSPENDED -> LOST`` (and ``SUSPENDED -> CONNECTED`` where the
  backend can prove the same session survived). ``LOST`` is terminal: open a
  new coordinator, re-register and re-acquire. The session also keeps a local
  **deadline** on the monotonic clock: the latest instant at which the server
  is certain to still consider the session alive (the send time of the last
  acknowledged heartbeat plus the session timeout). A member stops processing
  and committing before that deadline minus a safety margin, whatever the
  state says, because a process pause can hide an expiry from the state
  machine (invariant 3).
* **create-if-absent**, optionally ephemeral (bound to the session and deleted
  by the server, or by the other processes, when the session ends);
* **get** and **list** of a directory, returning :class:`Entry` records;
* one atomic **commit** of several puts and deletes, guarded by checks on
  other keys (absent / create version equals / version equals), all evaluated
  in the same atomic operation as the writes (invariant 1);
* **delete**; and a level-triggered **watch** of a directory.

Keys are ``/``-separated relative paths such as ``groups/g1/members/m1``; they
never start or end with ``/``. A *directory* is a key prefix ending in ``/``;
:meth:`Coordinator.list` and :meth:`Coordinator.watch` take a directory and
cover its direct children only (``groups/g1/members/`` covers
``groups/g1/members/m1`` but not ``groups/g1/members/m1/x``). Ephemeral keys
never have children.

Versions. ``create_version`` is assigned when a key is created and is strictly
greater than the create version of any key created before it, on this
backend, ever (etcd: create revision; ZooKeeper: czxid; SQLite: a global
counter). It therefore serves as the fencing **epoch** of an ownership key.
``version`` changes on every write of the key and is only compared for
equality with a value read earlier.

Example (runnable with the embedded in-memory backend)::

    import asyncio
    from coordinators import Check, Put, open_coordinator

    async def main() -> None:
        async with open_coordinator("memory://example") as coord:
            owner = await coord.create("owners/0", b"me", ephemeral=True)
            assert owner is not None
            ok = await coord.commit(
                [Check.created_at("owners/0", owner.create_version)],
                [Put("positions/0", b"42")],
            )
            assert ok

    asyncio.run(main())
"""

from __future__ import annotations

import abc
import dataclasses
import enum
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Self

from coordinators.acls import show_acl_spec
from coordinators.credentials import masked_repr
from coordinators.errors import ConfigError

SessionListener = Callable[["SessionState"], None]


class SessionState(enum.Enum):
    """What a session's state means for ownership (compare kazoo's KazooState).

    CONNECTED
        The server confirmed the session recently. Ephemeral keys we created
        are ours, *as long as the local deadline has not passed*.
    SUSPENDED
        We cannot reach the server. The session may still be alive, or may
        already have expired server-side: ownership is **uncertain**, so stop
        processing and committing at once. Either CONNECTED (the same session
        survived) or LOST follows.
    LOST
        The session is gone and so are its ephemeral keys, possibly already
        re-created by other members. Terminal.
    """

    CONNECTED = "connected"
    SUSPENDED = "suspended"
    LOST = "lost"


@dataclass(frozen=True, slots=True)
class Entry:
    """A key as read from the coordinator (never a backend type)."""

    key: str
    value: bytes
    version: int
    create_version: int
    ephemeral: bool = False


@dataclass(frozen=True, slots=True)
class Check:
    """A guard of :meth:`Coordinator.commit`, evaluated atomically with it.

    Exactly one of the three forms: the key is absent; the key exists with this
    create version (the owner's epoch is still the same incarnation); the key
    exists with this version (nobody wrote it since we read it).
    """

    key: str
    absent: bool = False
    create_version: int | None = None
    version: int | None = None

    def __post_init__(self) -> None:
        forms = int(self.absent) + int(self.create_version is not None) + int(
            self.version is not None
        )
        if forms != 1:
            raise ValueError("a Check takes exactly one of absent, create_version, version")

    @classmethod
    def is_absent(cls, key: str) -> Check:
        return cls(key, absent=True)

    @classmethod
    def created_at(cls, key: str, create_version: int) -> Check:
        return cls(key, create_version=create_version)

    @classmethod
    def at_version(cls, key: str, version: int) -> Check:
        return cls(key, version=version)


@dataclass(frozen=True, slots=True)
class Put:
    """Create or overwrite a persistent key inside :meth:`Coordinator.commit`."""

    key: str
    value: bytes


@dataclass(frozen=True, slots=True)
class Delete:
    """Delete a key inside :meth:`Coordinator.commit` (a no-op when absent)."""

    key: str


Op = Put | Delete


class Secret:
    """A credential. Its repr, str and format never show the value.

    Deliberately not a dataclass: ``dataclasses.asdict`` of the options that
    hold it would turn a dataclass into ``{"value": ...}``, in the clear; a
    plain object stays a ``Secret`` (and ``json.dumps`` refuses it rather
    than printing it). Only :meth:`reveal` gives the value.
    """

    __slots__ = ("_value",)
    _value: str

    def __init__(self, value: str) -> None:
        object.__setattr__(self, "_value", value)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("a Secret is immutable")

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return repr(self)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash((Secret, self._value))

    def __reduce__(self) -> tuple[type[Secret], tuple[str]]:
        return (Secret, (self._value,))

    @property
    def value(self) -> str:
        """The value (same as :meth:`reveal`; kept for existing callers)."""
        return self._value

    def reveal(self) -> str:
        return self._value


@dataclass(frozen=True)
class ConnectOptions:
    """How to reach and authenticate to a coordinator; shared by all backends.

    Backends ignore what they cannot use. Nothing secret is in the repr.
    ``password`` is always a :class:`Secret` once constructed: one given as a
    ``str`` (or UTF-8 ``bytes``) is wrapped in one, so no repr, str, log or
    ``dataclasses.asdict`` dump of the options, or of a config holding them,
    shows it; another type is refused without showing its value.
    """

    session_timeout_s: float = 10.0
    connect_timeout_s: float = 10.0
    username: str | None = None
    password: Secret | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_server_name: str | None = None
    # ZooKeeper only: "digest" or "sasl"; and the ACL mode for created znodes.
    auth_scheme: str | None = None
    acl: str = "creator"
    extra: dict[str, str] = field(default_factory=dict)
    # A password that would cross the network in the clear (etcd without TLS,
    # ZooKeeper digest without TLS) is refused unless this is set
    # (``--allow-plaintext-credentials``); see :mod:`coordinators.credentials`.
    allow_plaintext_credentials: bool = False

    def __post_init__(self) -> None:
        password: object = self.password
        if isinstance(password, bytes):
            try:
                password = password.decode()
            except UnicodeDecodeError:
                raise ConfigError("the coordinator password must be UTF-8 text") from None
        if isinstance(password, str):
            object.__setattr__(self, "password", Secret(password))
        elif password is not None and not isinstance(password, Secret):
            raise ConfigError(f"the coordinator password must be a str or a Secret, not "
                              f"{type(password).__name__}")

    @property
    def tls(self) -> bool:
        return self.tls_ca is not None or self.tls_cert is not None

    def __repr__(self) -> str:
        # Like the generated repr, with secret-looking ``extra`` values masked
        # (the password is a Secret and masks itself) and the digest hashes
        # of a ZooKeeper ``acl`` list masked.
        shown = dataclasses.replace(self, acl=show_acl_spec(self.acl))
        return masked_repr(shown, "extra")

    __str__ = __repr__


def validate_key(key: str) -> str:
    if not key or key.startswith("/") or key.endswith("/") or "//" in key:
        raise ConfigError(f"invalid coordinator key {key!r}")
    return key


def validate_dir(prefix: str) -> str:
    if not prefix.endswith("/") or prefix.startswith("/") or "//" in prefix:
        raise ConfigError(f"invalid coordinator directory {prefix!r}: must end with '/'")
    return prefix


class Session(abc.ABC):
    """The session of one :class:`Coordinator`; see :class:`SessionState`."""

    def __init__(self, timeout_s: float, *, sent_at: float | None = None) -> None:
        """``sent_at``: the monotonic instant the request that opened the
        session was sent (default: now). The first deadline counts from it,
        never from the reply, which may come a round trip later."""
        self.timeout_s = timeout_s
        self._state = SessionState.CONNECTED
        self._listeners: list[SessionListener] = []
        # Monotonic instant until which the server certainly keeps the session.
        start = time.monotonic() if sent_at is None else sent_at
        self._deadline = start + timeout_s

    @property
    @abc.abstractmethod
    def id(self) -> str:
        """An opaque, printable identifier of the session (no secrets)."""

    @property
    def state(self) -> SessionState:
        return self._state

    @property
    def deadline(self) -> float:
        return self._deadline

    def confirmed(self, sent_at: float) -> None:
        """The server acknowledged a heartbeat *sent* at ``sent_at`` (monotonic).

        The server restarts its expiry timer no earlier than when the request
        was sent, so the session is certainly alive until ``sent_at + timeout``.
        """
        self._deadline = max(self._deadline, sent_at + self.timeout_s)

    def is_live(self, margin_s: float = 0.0, *, now: float | None = None) -> bool:
        """CONNECTED and the local deadline minus ``margin_s`` not yet passed
        at ``now`` (default: ``time.monotonic()``; a member passes its own
        clock's, the clock its loops read)."""
        return (
            self._state is SessionState.CONNECTED
            and (time.monotonic() if now is None else now) < self._deadline - margin_s
        )

    def add_listener(self, listener: SessionListener) -> None:
        self._listeners.append(listener)

    def remove_listener(self, listener: SessionListener) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    def _set_state(self, state: SessionState) -> None:
        """The one mutator of the state. LOST is terminal."""
        if self._state is SessionState.LOST or state is self._state:
            return
        self._state = state
        for listener in list(self._listeners):
            listener(state)


class Watch(abc.ABC):
    """A level-triggered notification on a directory.

    :meth:`wait` returns True as soon as something under the directory may
    have changed since the watch was created or since the previous ``wait``
    returned True; the caller then re-reads. Spurious wake-ups are allowed
    (after a reconnect, a compaction, a session change); a missed change is
    not.
    """

    @abc.abstractmethod
    async def wait(self, timeout: float | None = None) -> bool:
        """True on a (possible) change, False when ``timeout`` passed first."""

    @abc.abstractmethod
    async def close(self) -> None: ...

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


class Coordinator(abc.ABC):
    """A connection to one backend, holding exactly one session.

    Lifecycle: construct (through :func:`coordinators.open_coordinator`),
    ``await connect()`` (opens the session), use, ``await close()`` (ends the
    session, deleting its ephemeral keys at once). ``async with`` does both.

    All methods raise :class:`~coordinators.errors.CoordinatorError`
    subclasses only. Operations that need the session (ephemeral creates)
    raise :class:`~coordinators.errors.SessionLost` once it is LOST.
    """

    scheme: str = ""
    # The most shards a group may have on this backend (None: no bound of its
    # own): the group's records that grow with it must fit in one value.
    max_shards: int | None = None

    @property
    @abc.abstractmethod
    def session(self) -> Session:
        """The session; valid after :meth:`connect`."""

    @property
    @abc.abstractmethod
    def url(self) -> str:
        """The URL this coordinator was opened with, without credentials."""

    @abc.abstractmethod
    async def connect(self) -> None: ...

    @abc.abstractmethod
    async def close(self) -> None: ...

    @abc.abstractmethod
    async def get(self, key: str) -> Entry | None: ...

    async def get_many(self, keys: Sequence[str]) -> dict[str, Entry | None]:
        """The entry of each key (None where absent), read in as few requests
        as the backend allows: etcd one read-only transaction per 128 keys,
        ZooKeeper pipelined reads. Each entry is as :meth:`get` would give it;
        etcd reads them all at one revision, the others key by key.

        For a member that needs its own few keys out of a large directory:
        cheaper than :meth:`list` when the keys are few (a member's owner keys
        out of every shard's)."""
        out: dict[str, Entry | None] = {}
        for key in dict.fromkeys(keys):
            out[key] = await self.get(key)
        return out

    @abc.abstractmethod
    async def list(self, prefix: str) -> list[Entry]:
        """Direct children of directory ``prefix``, sorted by key."""

    @abc.abstractmethod
    async def create(self, key: str, value: bytes, *, ephemeral: bool = False) -> Entry | None:
        """Create ``key`` if absent; the new entry, or None if it existed."""

    @abc.abstractmethod
    async def commit(self, checks: Sequence[Check], ops: Sequence[Op]) -> bool:
        """Apply ``ops`` atomically iff every check holds; True if applied."""

    @abc.abstractmethod
    async def delete(self, key: str) -> bool:
        """Delete ``key``; True if it existed."""

    @abc.abstractmethod
    def watch(self, prefix: str, *, values: bool = True,
              children: Collection[str] | None = None) -> Watch:
        """A :class:`Watch` on the direct children of directory ``prefix``.

        ``values=False``: the caller needs keys created and deleted only (keys
        that are never updated, as owner keys), so a backend may skip what
        watching each key's value costs it: ZooKeeper then arms no watch per
        key (with 2,048 owner keys, 2,048 requests per member whenever the
        keys are created again). ``children``: the names of the only children
        the caller cares about (None: all), so a backend may leave the others
        unwatched: etcd then streams the range of those keys instead of every
        key under ``prefix`` (a group's directory holds every owner key and
        position: without it, each commit and owner change of the group went
        to every member's watch). A watch may always report more than asked.
        """

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    async def __aenter__(self) -> Self:
        await self.connect()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
