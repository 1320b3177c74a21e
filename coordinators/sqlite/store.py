"""The data model in SQL: one write transaction at a time, and the blocking
statements of every operation (run on the coordinator's executor thread or,
for heartbeats, on the keep-alive thread)."""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final, Literal, TypeVar

from coordinators.protocol import (
    Check,
    Entry,
    Op,
    Put,
)

log = logging.getLogger("coordinators.sqlite")  # the backend's one logger

T = TypeVar("T")

def dir_of(key: str) -> str:
    """The directory holding ``key``: ``a/b/c`` -> ``a/b/``; ``a`` -> ``""``."""
    head, sep, _ = key.rpartition("/")
    return head + sep

class Txn:
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


def run_write(conn: sqlite3.Connection, body: Callable[[Txn], T]) -> T:
    """Run ``body`` in one ``BEGIN IMMEDIATE`` transaction, after reaping.

    The clock is read after the write lock is taken, so no transaction
    serialised after this one can see a smaller "now" from this process.
    """
    conn.execute("BEGIN IMMEDIATE")
    try:
        txn = Txn(conn, time.monotonic())
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


def insert_session(session_id: str, timeout_s: float, txn: Txn) -> None:
    txn.conn.execute(
        "INSERT INTO sessions (id, expires_at, timeout_s, pid) VALUES (?, ?, ?, ?)",
        (session_id, txn.now + timeout_s, timeout_s, os.getpid()),
    )


def renew_session(session_id: str, timeout_s: float, txn: Txn) -> bool:
    """Push our expiry to now + timeout; False if our row is gone (reaped)."""
    cursor = txn.conn.execute(
        "UPDATE sessions SET expires_at = ? WHERE id = ?", (txn.now + timeout_s, session_id)
    )
    return cursor.rowcount == 1


def _session_alive(txn: Txn, session_id: str) -> bool:
    row = txn.conn.execute("SELECT 1 FROM sessions WHERE id = ?", (session_id,)).fetchone()
    return row is not None


_LOST: Final = "lost"


def create_entry(
    key: str, value: bytes, session_id: str | None, txn: Txn
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


def commit_ops(checks: Sequence[Check], ops: Sequence[Op], txn: Txn) -> bool:
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
            delete_entry(op.key, txn)
    return True


def delete_entry(key: str, txn: Txn) -> bool:
    if txn.conn.execute("DELETE FROM kv WHERE key = ? RETURNING key", (key,)).fetchone() is None:
        return False
    txn.revision()
    txn.touch(key)
    return True


def get_entry(key: str, conn: sqlite3.Connection) -> Entry | None:
    row = conn.execute(f"SELECT {_COLUMNS} FROM kv WHERE key = ?", (key,)).fetchone()
    return None if row is None else _entry(row)


def list_entries(prefix: str, conn: sqlite3.Connection) -> list[Entry]:
    # BINARY collation orders UTF-8 bytes, i.e. code points: Python's str order.
    rows = conn.execute(
        f"SELECT {_COLUMNS} FROM kv WHERE dir = ? ORDER BY key", (prefix,)
    ).fetchall()
    return [_entry(row) for row in rows]


def dir_revisions(dirs: Iterable[str], conn: sqlite3.Connection) -> dict[str, int]:
    wanted = sorted(set(dirs))
    if not wanted:
        return {}
    marks = ",".join("?" * len(wanted))
    rows = conn.execute(f"SELECT dir, revision FROM dirs WHERE dir IN ({marks})", wanted).fetchall()
    found = {str(d): int(r) for d, r in rows}
    return {d: found.get(d, 0) for d in wanted}
