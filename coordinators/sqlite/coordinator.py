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
import sqlite3
import uuid
from collections.abc import Callable, Collection, Sequence
from typing import Final, TypeVar

import tenacity

from coordinators import retry
from coordinators.errors import (
    ConfigError,
    CoordinatorError,
    CoordinatorUnavailable,
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
from coordinators.session import KeepAliveThread
from coordinators.sqlite.database import (
    Database,
    acquire_memory,
    open_file,
    read_boot_id,
    release_memory,
)
from coordinators.sqlite.errors import SQLITE_ERRORS
from coordinators.sqlite.session import SqliteSession
from coordinators.sqlite.store import (
    Txn,
    commit_ops,
    create_entry,
    delete_entry,
    dir_revisions,
    get_entry,
    insert_session,
    list_entries,
    renew_session,
    run_write,
)
from coordinators.sqlite.url import parse_url
from coordinators.sqlite.watch import SqliteWatch
from coordinators.urls import redact_url

log = logging.getLogger("coordinators.sqlite")  # the backend's one logger

T = TypeVar("T")

# How often a watch being waited on re-reads its directory's revision.
WATCH_POLL_INTERVAL_S: Final = 0.025
# How long a watch backs off after the database could not be read.
WATCH_ERROR_BACKOFF_S: Final = 0.5

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
        self._db: Database | None = None
        self._session: SqliteSession | None = None
        self._heartbeat: KeepAliveThread | None = None
        self._watches: set[SqliteWatch] = set()
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

    def _live(self) -> tuple[concurrent.futures.ThreadPoolExecutor, Database]:
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

    async def _register(self, executor: concurrent.futures.ThreadPoolExecutor, db: Database,
                        session: SqliteSession, opening: tenacity.AsyncRetrying) -> None:
        """Insert the session's row (retried like the open: many members
        joining at once may keep the write lock longer than the busy timeout;
        the insert then did not happen). The base class set the deadline to
        now + timeout before the row exists; the row's expiry is computed
        later, so the deadline is safe. On failure the database is closed."""
        register = functools.partial(
            self._run_on, executor, db,
            functools.partial(
                run_write, body=functools.partial(insert_session, session.id, self._timeout_s)
            ),
        )
        try:
            await asyncio.wait_for(opening(register), timeout=self._options.connect_timeout_s)
        except TimeoutError as err:
            await self._release(executor, db)
            raise CoordinatorUnavailable(
                f"timed out after {self._options.connect_timeout_s}s registering a session "
                f"in SQLite coordinator {self._where()}"
            ) from err
        except BaseException:
            await self._release(executor, db)
            raise

    @SQLITE_ERRORS.handles(lambda self, *args: self._where())
    async def _run_on(
        self,
        executor: concurrent.futures.Executor,
        db: Database,
        fn: Callable[[sqlite3.Connection], T],
    ) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(executor, db.run, fn)

    async def _write(self, body: Callable[[Txn], T]) -> T:
        return await self._run(functools.partial(run_write, body=body))

    # -- lifecycle

    async def connect(self) -> None:
        if self._closed:
            raise CoordinatorError(f"{self!r} is closed; open a new coordinator")
        if self._session is not None:
            raise CoordinatorError(f"{self!r} is already connected")
        executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"coordinator-{self.scheme}"
        )
        # Two processes opening a new file at once: one may find it locked
        # while the other sets WAL mode and the schema (SQLite does not wait
        # for that lock): retriable, so retried within the connect timeout,
        # or members started together would fail to join.
        opening = retry.OPENS.copy(sleep=asyncio.sleep)
        try:
            db: Database = await asyncio.wait_for(
                opening(self._open, executor), timeout=self._options.connect_timeout_s
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
        await self._register(executor, db, session, opening)
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

    @SQLITE_ERRORS.handles(lambda self, *args: self._where())
    async def _open(self, executor: concurrent.futures.Executor) -> Database:
        loop = asyncio.get_running_loop()
        target, boot_id = self._target, read_boot_id()
        opener: Callable[[], Database]
        if target.kind == "memory":
            opener = functools.partial(acquire_memory, target.location, boot_id)
        else:
            opener = functools.partial(open_file, target.location, self._busy_timeout_s, boot_id)
        return await loop.run_in_executor(executor, opener)

    async def _release(
        self, executor: concurrent.futures.ThreadPoolExecutor, db: Database
    ) -> None:
        closer: Callable[[], None]
        if self._target.kind == "memory":
            closer = functools.partial(release_memory, self._target.location)
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
                functools.partial(run_write, body=lambda txn: txn.end_session(session.id)),
            )
        except CoordinatorError as err:
            # Others reap the session once its timeout passes.
            log.warning("closing session %s on %s: %s", session.id, self._where(), err)
        session.mark(SessionState.LOST)
        await self._release(executor, db)

    @SQLITE_ERRORS.handles(lambda self, *args: self._where())
    def _renew(self, db: Database, session: SqliteSession) -> bool:
        """One heartbeat, on the heartbeat thread: True if our row was renewed,
        False if it was reaped (LOST); raises CoordinatorError when unknown.

        Thread safety: ``db.run`` holds the database's lock for the whole
        transaction, so the heartbeat and the executor's operations never use
        the connection at once. The row's new expiry is read from the clock
        inside the transaction, after the thread's ``sent_at``, so the local
        deadline ``sent_at + timeout`` is never later than the row's.
        """
        renew = functools.partial(renew_session, session.id, self._timeout_s)
        return db.run(functools.partial(run_write, body=renew))

    # -- operations

    async def get(self, key: str) -> Entry | None:
        return await self._run(functools.partial(get_entry, validate_key(key)))

    async def list(self, prefix: str) -> list[Entry]:
        return await self._run(functools.partial(list_entries, validate_dir(prefix)))

    async def create(self, key: str, value: bytes, *, ephemeral: bool = False) -> Entry | None:
        validate_key(key)
        session_id: str | None = None
        if ephemeral:
            self._live()
            session = self.session
            if session.state is SessionState.LOST:
                raise SessionLost(f"session {session.id} is lost; open a new coordinator")
            session_id = session.id
        result = await self._write(functools.partial(create_entry, key, bytes(value), session_id))
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
        return await self._write(functools.partial(commit_ops, tuple(checks), tuple(ops)))

    async def delete(self, key: str) -> bool:
        return await self._write(functools.partial(delete_entry, validate_key(key)))

    def watch(self, prefix: str, *, values: bool = True,
              children: Collection[str] | None = None) -> Watch:
        # values, children: nothing to save (one poll of the directory's
        # revisions either way).
        validate_dir(prefix)
        executor, db = self._live()
        # Submitted now, so the snapshot is taken before any operation the
        # caller issues after watch() returns (the executor is FIFO): a
        # change after the caller's next read is always seen as new.
        initial = executor.submit(db.run, functools.partial(dir_revisions, [prefix]))
        watch = SqliteWatch(self, prefix, initial)
        self._watches.add(watch)
        return watch

    # -- watch polling

    def _forget(self, watch: SqliteWatch) -> None:
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
                    functools.partial(dir_revisions, [w.prefix for w in waiting])
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
