"""Opening the database: a file shared by the processes of one host, or an
in-memory database shared by the coordinators of one process; its schema,
and the sessions of an earlier boot ended on open."""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import Final, TypeVar

from coordinators.errors import (
    CoordinatorError,
    CoordinatorUnavailable,
)
from coordinators.sqlite.store import Txn

log = logging.getLogger("coordinators.sqlite")  # the backend's one logger

T = TypeVar("T")

# Marks a file as ours; a different value means another layout or program.
FORMAT: Final = "paimon-group-coordinator/1"

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

# ------------------------------------------------------------------- the database


class Database:
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
# coordinators of a name share one connection (serialised by the Database
# lock): SQLite's shared-cache mode would let each have its own, but reports
# table-lock conflicts at once instead of waiting, and one connection makes
# every transaction trivially serialisable.
_memory_lock = threading.Lock()
_memory_dbs: dict[str, tuple[Database, int]] = {}


def acquire_memory(name: str, boot_id: str | None) -> Database:
    with _memory_lock:
        found = _memory_dbs.get(name)
        if found is not None:
            db, users = found
        else:
            conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
            _init_schema(conn, boot_id, wal=False, where=f"memory://{name}")
            db, users = Database(conn), 0
        _memory_dbs[name] = (db, users + 1)
        return db


def release_memory(name: str) -> None:
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


def open_file(path: str, busy_timeout_s: float, boot_id: str | None) -> Database:
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
    return Database(conn)


def read_boot_id() -> str | None:
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
                txn = Txn(conn, time.monotonic())
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
