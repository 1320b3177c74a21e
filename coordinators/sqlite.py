"""The embedded coordinator: one SQLite file shared by the processes of one host.

Two URL forms:

* ``sqlite:///ABSOLUTE/PATH.db``: a database file (parent directories are
  created) shared by any number of processes **on one host**. Not for network
  file systems: SQLite's locking is unreliable there, and sessions rely on a
  clock shared by the processes (see "Sessions" below).
* ``memory://NAME``: an in-memory database shared by every coordinator opened
  with the same NAME in this process, alive while at least one of them is
  open. For unit tests and single-process demos.

Example::

    import asyncio
    from coordinators import Check, Put, open_coordinator

    async def main() -> None:
        async with open_coordinator("sqlite:////tmp/pg-example/coord.db") as coord:
            owner = await coord.create("owners/0", b"me", ephemeral=True)
            assert owner is not None
            assert await coord.commit(
                [Check.created_at("owners/0", owner.create_version)],
                [Put("positions/0", b"42")],
            )
            assert [e.key for e in await coord.list("owners/")] == ["owners/0"]

    asyncio.run(main())

Data model
    ``kv`` holds the keys, each with its directory (the key up to and
    including its last ``/``), value, ``version``, ``create_version`` and, for
    an ephemeral key, the id of the owning session. ``meta.revision`` is a
    global counter: every write transaction takes the next revision, which
    becomes the ``version`` of every key it writes and the ``create_version``
    of every key it creates. Revisions are never reused, so a key deleted and
    created again always gets a larger ``create_version`` (the fencing epoch).

Sessions
    ``sessions`` holds one row per live coordinator with its expiry instant on
    ``time.monotonic()``. On Linux that is CLOCK_MONOTONIC: one clock for the
    whole host, counting from boot, the same in every process, and immune to
    wall-clock jumps (NTP, ``date -s``), so an instant written by one process
    can be compared by another. (Containers in separate time namespaces would
    break this; they are not supported.) Rows written before the last reboot
    are meaningless, so the host's boot id is kept in ``meta`` and every
    session of an earlier boot is ended when the file is opened.

    Nobody can count on a dead process to delete its own keys, so expiry is
    enforced by the others: every write transaction, heartbeats included,
    first reaps the sessions whose expiry has passed, deleting their ephemeral
    keys in the same transaction. A SIGKILLed or SIGSTOPped process's keys
    therefore vanish about one session timeout after its last heartbeat, as
    soon as any other process writes (and every live process heartbeats at
    a quarter of its timeout). A process that finds its own row gone, because
    it was paused past its timeout, goes LOST; a heartbeat that cannot reach
    or lock the database makes it SUSPENDED until one succeeds again.

    A process stopped *inside* a write transaction holds the database's write
    lock and stalls every writer until it is continued or killed: every
    session then goes SUSPENDED, which is safe (nobody commits) but not live.
    Transactions are a few statements long, so this needs bad luck.

Change notification
    ``dirs`` records, per directory, the revision of the last write of one of
    its direct children (create, put, delete, expiry). A watch compares it
    with the value it saw last: one indexed SELECT for all of a coordinator's
    watches, every 25 ms while any of them is being waited on.

All SQLite calls of a coordinator run on its own single-thread executor, so
the event loop never blocks and operations run in the order they were issued;
except heartbeats, which run on a thread of their own so that a blocked event
loop cannot starve them (see :mod:`coordinators.session`). Both use the
same connection, one whole transaction at a time, under the database's lock.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import os
import re
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeVar
from urllib.parse import unquote, urlsplit

from coordinators.errors import (
    ConfigError,
    CoordinatorError,
    CoordinatorUnavailable,
    ErrorTranslation,
    InvalidCoordinatorURL,
    SessionLost,
)
from coordinators.protocol import (
    Check,
    ConnectOptions,
    Coordinator,
    Delete,
    Entry,
    Op,
    Put,
    SessionState,
    Watch,
    validate_dir,
    validate_key,
)
from coordinators.session import KeepAliveThread, ThreadedSession
from coordinators.urls import redact_url, split_scheme

log = logging.getLogger(__name__)

T = TypeVar("T")

# Marks a file as ours; a different value means another layout or program.
FORMAT: Final = "paimon-group-coordinator/1"
# How often a watch being waited on re-reads its directory's revision.
WATCH_POLL_INTERVAL_S: Final = 0.025
# How long a watch backs off after the database could not be read.
WATCH_ERROR_BACKOFF_S: Final = 0.5
_MEMORY_NAME = re.compile(r"[A-Za-z0-9._-]+")
_BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"

_SCHEMA: Final = (
    "CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS sessions ("
    " id TEXT PRIMARY KEY, expires_at REAL NOT NULL, timeout_s REAL NOT NULL,"
    " pid INTEGER NOT NULL) WITHOUT ROWID",
    "CREATE INDEX IF NOT EXISTS sessions_by_expiry ON sessions (expires_at)",
    "CREATE TABLE IF NOT EXISTS kv ("
    " key TEXT PRIMARY KEY, dir TEXT NOT NULL, value BLOB NOT NULL,"
    " version INTEGER NOT NULL, create_version INTEGER NOT NULL, session TEXT)",
    "CREATE INDEX IF NOT EXISTS kv_by_dir ON kv (dir, key)",
    "CREATE INDEX IF NOT EXISTS kv_by_session ON kv (session) WHERE session IS NOT NULL",
    "CREATE TABLE IF NOT EXISTS dirs (dir TEXT PRIMARY KEY, revision INTEGER NOT NULL)"
    " WITHOUT ROWID",
)

# SQLite primary result codes (the low byte of an extended code).
_SQLITE_BUSY: Final = 5
_SQLITE_LOCKED: Final = 6
_SQLITE_CORRUPT: Final = 11
_SQLITE_CANTOPEN: Final = 14
_SQLITE_NOTADB: Final = 26


# --------------------------------------------------------------------------- URLs


@dataclass(frozen=True, slots=True)
class _Target:
    kind: Literal["file", "memory"]
    # The absolute file path, or the in-memory database's name.
    location: str

    def describe(self) -> str:
        return self.location if self.kind == "file" else f"memory://{self.location}"


def parse_url(url: str) -> _Target:
    """The database a ``sqlite://`` or ``memory://`` URL names (one-line errors)."""
    shown = redact_url(url)
    scheme, rest = split_scheme(
        url, ("sqlite", "memory"), "an embedded coordinator URL",
        "sqlite:///ABSOLUTE/PATH.db or memory://NAME",
    )
    if scheme == "memory":
        if not _MEMORY_NAME.fullmatch(rest):
            raise InvalidCoordinatorURL(
                f"invalid in-memory coordinator URL {shown!r}: use memory://NAME, "
                "NAME made of letters, digits, '.', '_' and '-'"
            )
        return _Target("memory", rest)
    try:
        parts = urlsplit(url)
    except ValueError as err:
        raise InvalidCoordinatorURL(f"malformed SQLite coordinator URL {shown!r}") from err
    if parts.query or parts.fragment:
        raise InvalidCoordinatorURL(f"SQLite coordinator URL {shown!r} takes no query or fragment")
    path = unquote(parts.path)
    if parts.netloc or not path.startswith("/"):
        raise InvalidCoordinatorURL(
            f"the SQLite coordinator path in {shown!r} must be absolute: "
            "use sqlite:///ABSOLUTE/PATH.db (three slashes)"
        )
    if path.endswith("/") or "\x00" in path:
        raise InvalidCoordinatorURL(
            f"SQLite coordinator URL {shown!r} must name a file: sqlite:///ABSOLUTE/PATH.db"
        )
    return _Target("file", path)


def dir_of(key: str) -> str:
    """The directory holding ``key``: ``a/b/c`` -> ``a/b/``; ``a`` -> ``""``."""
    head, sep, _ = key.rpartition("/")
    return head + sep


# ---------------------------------------------------------------- error translation


def translate(err: BaseException, where: str) -> CoordinatorError:
    """The one place where SQLite errors become ours (raise it ``from err``)."""
    code = getattr(err, "sqlite_errorcode", None)
    primary = code & 0xFF if isinstance(code, int) else None
    reason = str(err) or type(err).__name__
    if primary in (_SQLITE_BUSY, _SQLITE_LOCKED):
        return CoordinatorUnavailable(
            f"SQLite coordinator {where} is locked by another connection ({reason}); retry"
        )
    if primary == _SQLITE_CANTOPEN:
        return CoordinatorUnavailable(
            f"cannot open SQLite coordinator {where} ({reason}): check the path and "
            "its permissions",
            retriable=False,
        )
    if primary in (_SQLITE_NOTADB, _SQLITE_CORRUPT):
        return CoordinatorError(
            f"SQLite coordinator {where} is corrupt or not a SQLite database ({reason}): "
            "restore it or point the URL at a new file"
        )
    if isinstance(err, sqlite3.OperationalError):
        return CoordinatorUnavailable(f"SQLite coordinator {where} failed: {reason}")
    return CoordinatorError(f"SQLite coordinator {where} failed: {reason}")


# The one translation of SQLite errors, around every call into sqlite3.
_SQLITE: Final = ErrorTranslation((sqlite3.Error,), translate)


# ------------------------------------------------------------------- the database


class _Database:
    """One connection; runs whole transactions on it, one at a time."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self._lock = threading.Lock()

    def run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        with self._lock:
            return fn(self.conn)

    def close(self) -> None:
        with self._lock:
            self.conn.close()


# In-memory databases by name, with how many coordinators use each. All
# coordinators of a name share one connection (serialised by the _Database
# lock): SQLite's shared-cache mode would let each have its own, but reports
# table-lock conflicts at once instead of waiting, and one connection makes
# every transaction trivially serialisable.
_memory_lock = threading.Lock()
_memory_dbs: dict[str, tuple[_Database, int]] = {}


def _acquire_memory(name: str, boot_id: str | None) -> _Database:
    with _memory_lock:
        found = _memory_dbs.get(name)
        if found is not None:
            db, users = found
        else:
            conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
            _init_schema(conn, boot_id, wal=False, where=f"memory://{name}")
            db, users = _Database(conn), 0
        _memory_dbs[name] = (db, users + 1)
        return db


def _release_memory(name: str) -> None:
    with _memory_lock:
        found = _memory_dbs.get(name)
        if found is None:
            return
        db, users = found
        if users > 1:
            _memory_dbs[name] = (db, users - 1)
            return
        del _memory_dbs[name]
    db.close()


def _open_file(path: str, busy_timeout_s: float, boot_id: str | None) -> _Database:
    parent = os.path.dirname(path)
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as err:
        raise CoordinatorUnavailable(
            f"cannot create the directory {parent} of SQLite coordinator {path}: "
            f"{err.strerror or err}",
            retriable=False,
        ) from err
    if os.path.isdir(path):
        raise CoordinatorError(f"SQLite coordinator path {path} is a directory, not a file")
    conn = sqlite3.connect(
        path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False
    )
    try:
        _init_schema(conn, boot_id, wal=True, where=path)
    except BaseException:
        conn.close()
        raise
    return _Database(conn)


def _boot_id() -> str | None:
    """This host's boot id: it changes, with CLOCK_MONOTONIC's origin, on reboot."""
    try:
        with open(_BOOT_ID_FILE, encoding="ascii") as f:
            return f.read().strip() or None
    except OSError:
        return None


def _init_schema(conn: sqlite3.Connection, boot_id: str | None, *, wal: bool, where: str) -> None:
    if wal:
        # WAL lets readers (watch polls, gets) run while a writer commits.
        # The mode is stored in the file; setting it again is a no-op.
        (mode,) = conn.execute("PRAGMA journal_mode=WAL").fetchone()
        if str(mode).lower() != "wal":
            log.warning("SQLite coordinator %s runs in journal mode %s, not WAL", where, mode)
    conn.execute("BEGIN IMMEDIATE")
    try:
        tables = {
            str(name)
            for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        }
        if tables and "meta" not in tables:
            raise CoordinatorError(
                f"{where} is a SQLite database of another program: "
                "point the coordinator URL at a new file"
            )
        for statement in _SCHEMA:
            conn.execute(statement)
        row = conn.execute("SELECT value FROM meta WHERE name = 'format'").fetchone()
        if row is None:
            conn.executemany(
                "INSERT INTO meta (name, value) VALUES (?, ?)",
                [("format", FORMAT), ("revision", 0), ("boot_id", boot_id)],
            )
        elif row[0] != FORMAT:
            raise CoordinatorError(
                f"{where} has coordinator format {row[0]!r}, this version reads {FORMAT!r}"
            )
        else:
            (stored_boot,) = conn.execute(
                "SELECT value FROM meta WHERE name = 'boot_id'"
            ).fetchone() or (None,)
            if boot_id is not None and stored_boot != boot_id:
                # Every session in the file belongs to a process of an earlier
                # boot, and its monotonic expiry counts from that boot.
                txn = _Txn(conn, time.monotonic())
                for (sid,) in conn.execute("SELECT id FROM sessions").fetchall():
                    txn.end_session(str(sid))
                txn.finish()
                conn.execute(
                    "INSERT OR REPLACE INTO meta (name, value) VALUES ('boot_id', ?)", (boot_id,)
                )
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


class _Txn:
    """Bookkeeping of one write transaction: its revision and touched directories."""

    def __init__(self, conn: sqlite3.Connection, now: float) -> None:
        self.conn = conn
        self.now = now
        self._revision: int | None = None
        self._dirs: set[str] = set()

    def revision(self) -> int:
        """This transaction's revision, taken from the global counter on first use."""
        if self._revision is None:
            (value,) = self.conn.execute(
                "UPDATE meta SET value = value + 1 WHERE name = 'revision' RETURNING value"
            ).fetchone()
            self._revision = int(value)
        return self._revision

    def touch(self, key: str) -> None:
        """Record that a direct child of ``key``'s directory changed."""
        self._dirs.add(dir_of(key))

    def end_session(self, session_id: str) -> None:
        """Delete a session and its ephemeral keys."""
        rows = self.conn.execute(
            "DELETE FROM kv WHERE session = ? RETURNING key", (session_id,)
        ).fetchall()
        for (key,) in rows:
            self.touch(str(key))
        self.conn.execute("DELETE FROM sessions WHERE id = ?", (session_id,))

    def reap(self) -> None:
        """End every session whose expiry instant has passed (ours included)."""
        expired = self.conn.execute(
            "SELECT id FROM sessions WHERE expires_at < ?", (self.now,)
        ).fetchall()
        for (sid,) in expired:
            log.info("SQLite coordinator: session %s expired; deleting its ephemeral keys", sid)
            self.end_session(str(sid))

    def finish(self) -> None:
        """Stamp every touched directory with this transaction's revision."""
        if not self._dirs:
            return
        revision = self.revision()
        self.conn.executemany(
            "INSERT INTO dirs (dir, revision) VALUES (?, ?)"
            " ON CONFLICT (dir) DO UPDATE SET revision = excluded.revision",
            [(d, revision) for d in sorted(self._dirs)],
        )


def _write(conn: sqlite3.Connection, body: Callable[[_Txn], T]) -> T:
    """Run ``body`` in one ``BEGIN IMMEDIATE`` transaction, after reaping.

    The clock is read after the write lock is taken, so no transaction
    serialised after this one can see a smaller "now" from this process.
    """
    conn.execute("BEGIN IMMEDIATE")
    try:
        txn = _Txn(conn, time.monotonic())
        txn.reap()
        result = body(txn)
        txn.finish()
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return result


def _entry(row: Sequence[Any]) -> Entry:
    key, value, version, create_version, session = row
    return Entry(
        key=str(key),
        value=bytes(value),
        version=int(version),
        create_version=int(create_version),
        ephemeral=session is not None,
    )


_COLUMNS: Final = "key, value, version, create_version, session"


# --------------------------------------------------------- transactions (blocking)


def _insert_session(session_id: str, timeout_s: float, txn: _Txn) -> None:
    txn.conn.execute(
        "INSERT INTO sessions (id, expires_at, timeout_s, pid) VALUES (?, ?, ?, ?)",
        (session_id, txn.now + timeout_s, timeout_s, os.getpid()),
    )


def _renew_session(session_id: str, timeout_s: float, txn: _Txn) -> bool:
    """Push our expiry to now + timeout; False if our row is gone (reaped)."""
    cursor = txn.conn.execute(
        "UPDATE sessions SET expires_at = ? WHERE id = ?", (txn.now + timeout_s, session_id)
    )
    return cursor.rowcount == 1


def _session_alive(txn: _Txn, session_id: str) -> bool:
    row = txn.conn.execute("SELECT 1 FROM sessions WHERE id = ?", (session_id,)).fetchone()
    return row is not None


_LOST: Final = "lost"


def _create(
    key: str, value: bytes, session_id: str | None, txn: _Txn
) -> Entry | Literal["lost"] | None:
    if txn.conn.execute("SELECT 1 FROM kv WHERE key = ?", (key,)).fetchone() is not None:
        return None
    if session_id is not None and not _session_alive(txn, session_id):
        return _LOST
    revision = txn.revision()
    txn.conn.execute(
        "INSERT INTO kv (key, dir, value, version, create_version, session)"
        " VALUES (?, ?, ?, ?, ?, ?)",
        (key, dir_of(key), value, revision, revision, session_id),
    )
    txn.touch(key)
    return Entry(key, value, revision, revision, ephemeral=session_id is not None)


def _check_holds(conn: sqlite3.Connection, check: Check) -> bool:
    row = conn.execute(
        "SELECT version, create_version FROM kv WHERE key = ?", (check.key,)
    ).fetchone()
    if check.absent:
        return row is None
    if row is None:
        return False
    version, create_version = int(row[0]), int(row[1])
    if check.create_version is not None:
        return create_version == check.create_version
    return version == check.version


def _commit(checks: Sequence[Check], ops: Sequence[Op], txn: _Txn) -> bool:
    conn = txn.conn
    if not all(_check_holds(conn, check) for check in checks):
        return False
    for op in ops:
        if isinstance(op, Put):
            revision = txn.revision()
            # An existing key keeps its create version and, if ephemeral,
            # its owning session (like a ZooKeeper setData).
            conn.execute(
                "INSERT INTO kv (key, dir, value, version, create_version, session)"
                " VALUES (?, ?, ?, ?, ?, NULL)"
                " ON CONFLICT (key) DO UPDATE SET value = excluded.value,"
                " version = excluded.version",
                (op.key, dir_of(op.key), bytes(op.value), revision, revision),
            )
            txn.touch(op.key)
        else:
            _delete(op.key, txn)
    return True


def _delete(key: str, txn: _Txn) -> bool:
    if txn.conn.execute("DELETE FROM kv WHERE key = ? RETURNING key", (key,)).fetchone() is None:
        return False
    txn.revision()
    txn.touch(key)
    return True


def _get(key: str, conn: sqlite3.Connection) -> Entry | None:
    row = conn.execute(f"SELECT {_COLUMNS} FROM kv WHERE key = ?", (key,)).fetchone()
    return None if row is None else _entry(row)


def _list(prefix: str, conn: sqlite3.Connection) -> list[Entry]:
    # BINARY collation orders UTF-8 bytes, i.e. code points: Python's str order.
    rows = conn.execute(
        f"SELECT {_COLUMNS} FROM kv WHERE dir = ? ORDER BY key", (prefix,)
    ).fetchall()
    return [_entry(row) for row in rows]


def _dir_revisions(dirs: Iterable[str], conn: sqlite3.Connection) -> dict[str, int]:
    wanted = sorted(set(dirs))
    if not wanted:
        return {}
    marks = ",".join("?" * len(wanted))
    rows = conn.execute(f"SELECT dir, revision FROM dirs WHERE dir IN ({marks})", wanted).fetchall()
    found = {str(d): int(r) for d, r in rows}
    return {d: found.get(d, 0) for d in wanted}


# ------------------------------------------------------------------ the coordinator


class SqliteSession(ThreadedSession):
    """A row in the ``sessions`` table, kept alive by a heartbeat thread."""

    def __init__(
        self, session_id: str, timeout_s: float, loop: asyncio.AbstractEventLoop
    ) -> None:
        super().__init__(timeout_s, loop)
        self._id = session_id

    @property
    def id(self) -> str:
        return self._id

    def mark(self, state: SessionState) -> None:
        """Move to ``state`` (no-op once LOST); same as :meth:`report`."""
        self.report(state)


class SqliteCoordinator(Coordinator):
    """A coordinator on a SQLite file (``sqlite:///PATH``) or in memory (``memory://NAME``).

    Example::

        import asyncio
        from coordinators import ConnectOptions, open_coordinator

        async def main() -> None:
            options = ConnectOptions(session_timeout_s=5.0)
            async with open_coordinator("memory://demo", options) as a:
                async with a.watch("members/") as members:
                    async with open_coordinator("memory://demo", options) as b:
                        await b.create("members/b", b"", ephemeral=True)
                        assert await members.wait(timeout=5.0)
                        assert [e.key for e in await a.list("members/")] == ["members/b"]
                    # b closed: its ephemeral key is gone at once.
                    assert await members.wait(timeout=5.0)
                    assert await a.list("members/") == []

        asyncio.run(main())
    """

    scheme = "sqlite"

    def __init__(self, url: str, options: ConnectOptions | None = None) -> None:
        self._target = parse_url(url)
        self._url = redact_url(url)
        options = options or ConnectOptions()
        if not options.session_timeout_s > 0:
            raise ConfigError(f"session timeout must be positive, got {options.session_timeout_s}")
        self._options = options
        self._timeout_s = float(options.session_timeout_s)
        self._heartbeat_interval_s = max(self._timeout_s / 4, 0.01)
        # How long one statement waits for another process's write lock. A
        # heartbeat that waits this long and fails makes the session SUSPENDED
        # while there is still at least half the timeout left.
        self._busy_timeout_s = min(max(self._timeout_s / 4, 0.05), 5.0)
        self.scheme = "memory" if self._target.kind == "memory" else "sqlite"
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._db: _Database | None = None
        self._session: SqliteSession | None = None
        self._heartbeat: KeepAliveThread | None = None
        self._watches: set[_SqliteWatch] = set()
        self._poller: asyncio.Task[None] | None = None
        self._closed = False

    # -- plumbing

    @property
    def url(self) -> str:
        return self._url

    @property
    def session(self) -> SqliteSession:
        if self._session is None:
            raise CoordinatorError(f"{self!r} is not connected: await connect() first")
        return self._session

    def _where(self) -> str:
        return self._target.describe()

    def _live(self) -> tuple[concurrent.futures.ThreadPoolExecutor, _Database]:
        if self._closed:
            raise CoordinatorError(f"{self!r} is closed")
        if self._executor is None or self._db is None or self._session is None:
            raise CoordinatorError(f"{self!r} is not connected: await connect() first")
        return self._executor, self._db

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn`` on our executor thread.

        If the caller is cancelled, the transaction still runs to its end on
        the thread: a cancelled commit may or may not have been applied.
        """
        executor, db = self._live()
        return await self._run_on(executor, db, fn)

    @_SQLITE.handles(lambda self, *args: self._where())
    async def _run_on(
        self,
        executor: concurrent.futures.Executor,
        db: _Database,
        fn: Callable[[sqlite3.Connection], T],
    ) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(executor, db.run, fn)

    async def _write(self, body: Callable[[_Txn], T]) -> T:
        return await self._run(functools.partial(_write, body=body))

    # -- lifecycle

    async def connect(self) -> None:
        if self._closed:
            raise CoordinatorError(f"{self!r} is closed; open a new coordinator")
        if self._session is not None:
            raise CoordinatorError(f"{self!r} is already connected")
        executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"coordinator-{self.scheme}"
        )
        try:
            db = await asyncio.wait_for(
                self._open(executor), timeout=self._options.connect_timeout_s
            )
        except TimeoutError as err:
            executor.shutdown(wait=False)
            raise CoordinatorUnavailable(
                f"timed out after {self._options.connect_timeout_s}s opening "
                f"SQLite coordinator {self._where()}"
            ) from err
        except BaseException:
            executor.shutdown(wait=False)
            raise
        session = SqliteSession(uuid.uuid4().hex, self._timeout_s, asyncio.get_running_loop())
        # The base class set the deadline to now + timeout before the row
        # exists; the row's expiry is computed later, so the deadline is safe.
        try:
            await self._run_on(
                executor,
                db,
                functools.partial(
                    _write, body=functools.partial(_insert_session, session.id, self._timeout_s)
                ),
            )
        except BaseException:
            await self._release(executor, db)
            raise
        self._executor, self._db, self._session = executor, db, session
        # Heartbeats run on a thread of their own, never on the event loop:
        # a loop held by user code (a synchronous body of ``async for``)
        # must not let the session expire (see coordinators.session).
        self._heartbeat = KeepAliveThread(
            session,
            renew=functools.partial(self._renew, db, session),
            interval_s=self._heartbeat_interval_s,
            name=f"sqlite-heartbeat-{session.id}",
        )
        self._heartbeat.start()
        log.debug("connected to %s with session %s", self._where(), session.id)

    @_SQLITE.handles(lambda self, *args: self._where())
    async def _open(self, executor: concurrent.futures.Executor) -> _Database:
        loop = asyncio.get_running_loop()
        target, boot_id = self._target, _boot_id()
        opener: Callable[[], _Database]
        if target.kind == "memory":
            opener = functools.partial(_acquire_memory, target.location, boot_id)
        else:
            opener = functools.partial(_open_file, target.location, self._busy_timeout_s, boot_id)
        return await loop.run_in_executor(executor, opener)

    async def _release(
        self, executor: concurrent.futures.ThreadPoolExecutor, db: _Database
    ) -> None:
        closer: Callable[[], None]
        if self._target.kind == "memory":
            closer = functools.partial(_release_memory, self._target.location)
        else:
            closer = db.close
        try:
            await asyncio.get_running_loop().run_in_executor(executor, closer)
        except sqlite3.Error as err:
            log.warning("closing %s: %s", self._where(), err)
        finally:
            executor.shutdown(wait=False)

    async def close(self) -> None:
        """End the session (its ephemeral keys go at once) and release the file."""
        if self._closed:
            return
        self._closed = True
        heartbeat, self._heartbeat = self._heartbeat, None
        if heartbeat is not None:
            heartbeat.stop()
            # At most one renewal in flight: one busy timeout of waiting.
            await asyncio.to_thread(heartbeat.join, self._busy_timeout_s + 5.0)
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
        self._poller = None
        for watch in list(self._watches):
            watch._shut()
        executor, db, session = self._executor, self._db, self._session
        if executor is None or db is None or session is None:
            return
        try:
            await self._run_on(
                executor,
                db,
                functools.partial(_write, body=lambda txn: txn.end_session(session.id)),
            )
        except CoordinatorError as err:
            # Others reap the session once its timeout passes.
            log.warning("closing session %s on %s: %s", session.id, self._where(), err)
        session.mark(SessionState.LOST)
        await self._release(executor, db)

    @_SQLITE.handles(lambda self, *args: self._where())
    def _renew(self, db: _Database, session: SqliteSession) -> bool:
        """One heartbeat, on the heartbeat thread: True if our row was renewed,
        False if it was reaped (LOST); raises CoordinatorError when unknown.

        Thread safety: ``db.run`` holds the database's lock for the whole
        transaction, so the heartbeat and the executor's operations never use
        the connection at once. The row's new expiry is read from the clock
        inside the transaction, after the thread's ``sent_at``, so the local
        deadline ``sent_at + timeout`` is never later than the row's.
        """
        renew = functools.partial(_renew_session, session.id, self._timeout_s)
        return db.run(functools.partial(_write, body=renew))

    # -- operations

    async def get(self, key: str) -> Entry | None:
        return await self._run(functools.partial(_get, validate_key(key)))

    async def list(self, prefix: str) -> list[Entry]:
        return await self._run(functools.partial(_list, validate_dir(prefix)))

    async def create(self, key: str, value: bytes, *, ephemeral: bool = False) -> Entry | None:
        validate_key(key)
        session_id: str | None = None
        if ephemeral:
            self._live()
            session = self.session
            if session.state is SessionState.LOST:
                raise SessionLost(f"session {session.id} is lost; open a new coordinator")
            session_id = session.id
        result = await self._write(functools.partial(_create, key, bytes(value), session_id))
        if isinstance(result, str):  # _LOST: our row was reaped
            self.session.mark(SessionState.LOST)
            raise SessionLost(f"session {self.session.id} expired; open a new coordinator")
        return result

    async def commit(self, checks: Sequence[Check], ops: Sequence[Op]) -> bool:
        for check in checks:
            validate_key(check.key)
        for op in ops:
            if not isinstance(op, Put | Delete):
                raise TypeError(f"commit takes Put and Delete operations, not {op!r}")
            validate_key(op.key)
        return await self._write(functools.partial(_commit, tuple(checks), tuple(ops)))

    async def delete(self, key: str) -> bool:
        return await self._write(functools.partial(_delete, validate_key(key)))

    def watch(self, prefix: str) -> Watch:
        validate_dir(prefix)
        executor, db = self._live()
        # Submitted now, so the snapshot is taken before any operation the
        # caller issues after watch() returns (the executor is FIFO): a
        # change after the caller's next read is always seen as new.
        initial = executor.submit(db.run, functools.partial(_dir_revisions, [prefix]))
        watch = _SqliteWatch(self, prefix, initial)
        self._watches.add(watch)
        return watch

    # -- watch polling

    def _forget(self, watch: _SqliteWatch) -> None:
        self._watches.discard(watch)

    def _ensure_poller(self) -> None:
        if self._closed:
            return
        if self._poller is None or self._poller.done():
            self._poller = asyncio.create_task(self._poll_loop(), name="sqlite-watch-poller")

    async def _poll_loop(self) -> None:
        """Poll the watched directories while anyone waits on one of them."""
        while True:
            waiting = [w for w in self._watches if w.waiting]
            if not waiting or self._closed:
                return
            try:
                revisions = await self._run(
                    functools.partial(_dir_revisions, [w.prefix for w in waiting])
                )
            except CoordinatorError as err:
                log.debug("watch poll of %s failed: %s", self._where(), err)
                for watch in waiting:
                    watch._wake(spurious=True)
                await asyncio.sleep(WATCH_ERROR_BACKOFF_S)
                continue
            for watch in waiting:
                watch._observe(revisions.get(watch.prefix, 0))
            await asyncio.sleep(WATCH_POLL_INTERVAL_S)


class _SqliteWatch(Watch):
    """Level-triggered: compares the directory's revision with the one seen last."""

    def __init__(
        self,
        coordinator: SqliteCoordinator,
        prefix: str,
        initial: concurrent.futures.Future[dict[str, int]],
    ) -> None:
        self.prefix = prefix
        self._coordinator = coordinator
        self._initial: concurrent.futures.Future[dict[str, int]] | None = initial
        # Revision reported by the last True (the snapshot at creation at first).
        self._seen = 0
        # Highest revision observed by the poller; revisions only grow, so a
        # poll that raced with the initial snapshot cannot look like a change.
        self._latest = 0
        self._spurious = False
        self._closed = False
        self._waiters = 0
        self._event = asyncio.Event()

    @property
    def waiting(self) -> bool:
        return self._waiters > 0 and not self._closed

    def _observe(self, revision: int) -> None:
        if revision > self._latest:
            self._latest = revision
        if self._latest > self._seen:
            self._event.set()

    def _wake(self, *, spurious: bool) -> None:
        self._spurious = self._spurious or spurious
        self._event.set()

    def _shut(self) -> None:
        self._closed = True
        self._coordinator._forget(self)
        self._event.set()

    async def _settle_initial(self) -> None:
        initial, self._initial = self._initial, None
        if initial is None:
            return
        try:
            revisions = await asyncio.wrap_future(initial)
        except sqlite3.Error:
            # Unknown starting point: report a (possibly spurious) change.
            self._spurious = True
            return
        self._seen = revisions.get(self.prefix, 0)
        self._latest = max(self._latest, self._seen)

    async def wait(self, timeout: float | None = None) -> bool:
        if self._closed:
            raise CoordinatorError(f"watch on {self.prefix!r} is closed")
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        self._waiters += 1
        try:
            await self._settle_initial()
            self._coordinator._ensure_poller()
            while True:
                if self._closed:
                    raise CoordinatorError(f"watch on {self.prefix!r} is closed")
                if self._spurious or self._latest > self._seen:
                    self._spurious = False
                    self._seen = max(self._seen, self._latest)
                    return True
                self._event.clear()
                remaining = None if deadline is None else deadline - loop.time()
                if remaining is not None and remaining <= 0:
                    return False
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._event.wait(), remaining)
        finally:
            self._waiters -= 1

    async def close(self) -> None:
        self._shut()
        initial, self._initial = self._initial, None
        if initial is not None:
            initial.cancel()
