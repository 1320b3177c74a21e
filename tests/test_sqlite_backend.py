"""What only the embedded SQLite backend does: URLs, files, reaping, lock-induced suspension.

The behaviour every backend shares is in tests/conformance/.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from coordinators import (
    ConfigError,
    ConnectOptions,
    CoordinatorError,
    CoordinatorUnavailable,
    InvalidCoordinatorURL,
    SessionLost,
    SessionState,
    open_coordinator,
)
from coordinators.sqlite import SqliteCoordinator, dir_of, parse_url, read_boot_id, translate
from tests.conformance.waiting import drain, wait_until_listed
from tests.support.waiting import eventually


def sqlite_url(path: Path) -> str:
    return f"sqlite://{path}"


def write_file(path: Path, data: bytes) -> None:
    path.write_bytes(data)


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "coord.db"


@pytest.fixture
def raw(db_path: Path) -> Iterator[sqlite3.Connection]:
    """A plain connection to the coordinator file, for looking behind the API."""
    conn = sqlite3.connect(db_path, isolation_level=None, timeout=30.0)
    yield conn
    conn.close()


# ----------------------------------------------------------------------------- URLs


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("sqlite:///tmp/x/coord.db", ("file", "/tmp/x/coord.db")),
        ("SQLITE:///tmp/a%20b.db", ("file", "/tmp/a b.db")),
        ("memory://unit-test_1.a", ("memory", "unit-test_1.a")),
    ],
)
def test_parse_url(url: str, expected: tuple[str, str]) -> None:
    target = parse_url(url)
    assert (target.kind, target.location) == expected


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("sqlite://relative.db", "must be absolute"),
        ("sqlite://dir/relative.db", "must be absolute"),
        ("sqlite://localhost/tmp/x.db", "must be absolute"),
        ("sqlite:///", "must name a file"),
        ("sqlite:///tmp/dir/", "must name a file"),
        ("sqlite:///tmp/x.db?mode=ro", "no query"),
        ("memory://", "memory://NAME"),
        ("memory://a/b", "memory://NAME"),
        ("memory://has space", "memory://NAME"),
        ("etcd://127.0.0.1:2379", "not an embedded coordinator URL"),
    ],
)
def test_bad_urls_fail_with_one_clear_line(url: str, says: str) -> None:
    with pytest.raises(InvalidCoordinatorURL) as caught:
        SqliteCoordinator(url, ConnectOptions())
    message = str(caught.value)
    assert says in message
    assert "\n" not in message


def test_bad_url_through_the_registry(tmp_path: Path) -> None:
    with pytest.raises(InvalidCoordinatorURL, match="must be absolute"):
        open_coordinator("sqlite://coord.db")


def test_credentials_never_appear_in_errors() -> None:
    with pytest.raises(InvalidCoordinatorURL) as caught:
        open_coordinator("sqlite://user:hunter2@host/x.db")
    assert "hunter2" not in str(caught.value)


def test_registry_opens_both_schemes(db_path: Path) -> None:
    file_coord = open_coordinator(sqlite_url(db_path))
    memory_coord = open_coordinator("memory://registry")
    assert isinstance(file_coord, SqliteCoordinator) and file_coord.scheme == "sqlite"
    assert isinstance(memory_coord, SqliteCoordinator) and memory_coord.scheme == "memory"
    assert file_coord.url == sqlite_url(db_path)


def test_session_timeout_must_be_positive(db_path: Path) -> None:
    with pytest.raises(ConfigError, match="positive"):
        SqliteCoordinator(sqlite_url(db_path), ConnectOptions(session_timeout_s=0))


def test_dir_of() -> None:
    assert dir_of("a/b/c") == "a/b/"
    assert dir_of("a") == ""


def test_translate_sqlite_errors() -> None:
    def error(code: int, message: str) -> sqlite3.Error:
        err = (
            sqlite3.OperationalError(message) if code in (5, 14) else sqlite3.DatabaseError(message)
        )
        err.sqlite_errorcode = code
        return err

    busy = translate(error(5, "database is locked"), "/x.db")
    assert isinstance(busy, CoordinatorUnavailable) and busy.retriable
    cannot_open = translate(error(14, "unable to open database file"), "/x.db")
    assert isinstance(cannot_open, CoordinatorUnavailable) and not cannot_open.retriable
    corrupt = translate(error(26, "file is not a database"), "/x.db")
    assert type(corrupt) is CoordinatorError and "corrupt" in str(corrupt)
    assert "/x.db" in str(corrupt)


# ---------------------------------------------------------------------------- files


@pytest.mark.asyncio
async def test_parent_directories_are_created_and_wal_is_on(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "er" / "coord.db"
    async with open_coordinator(sqlite_url(path)):
        assert path.is_file()
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        conn.close()


@pytest.mark.asyncio
async def test_corrupt_file_is_refused_clearly(db_path: Path) -> None:
    write_file(db_path, b"this is not a database, just some text\n" * 200)
    coordinator = open_coordinator(sqlite_url(db_path))
    with pytest.raises(CoordinatorError) as caught:
        await coordinator.connect()
    message = str(caught.value)
    assert str(db_path) in message and "corrupt or not a SQLite database" in message
    assert "\n" not in message
    await coordinator.close()


@pytest.mark.asyncio
async def test_database_of_another_program_is_refused(db_path: Path) -> None:
    conn = sqlite3.connect(db_path)
    conn.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY)")
    conn.commit()
    conn.close()
    with pytest.raises(CoordinatorError, match="another program"):
        await open_coordinator(sqlite_url(db_path)).connect()


@pytest.mark.asyncio
async def test_directory_instead_of_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CoordinatorError, match="is a directory"):
        await open_coordinator(sqlite_url(tmp_path)).connect()


@pytest.mark.asyncio
async def test_parent_that_is_a_file_is_refused(tmp_path: Path) -> None:
    write_file(tmp_path / "plain", b"x")
    with pytest.raises(CoordinatorUnavailable, match="cannot create the directory") as caught:
        await open_coordinator(sqlite_url(tmp_path / "plain" / "coord.db")).connect()
    assert not caught.value.retriable


@pytest.mark.asyncio
@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
async def test_unreadable_file_is_refused(db_path: Path) -> None:
    async with open_coordinator(sqlite_url(db_path)):
        pass
    os.chmod(db_path, 0)
    try:
        with pytest.raises(CoordinatorError) as caught:
            await open_coordinator(sqlite_url(db_path)).connect()
        assert str(db_path) in str(caught.value)
    finally:
        os.chmod(db_path, 0o600)


# ------------------------------------------------------------------------ lifecycle


@pytest.mark.asyncio
async def test_use_before_connect_and_after_close_is_refused(db_path: Path) -> None:
    coordinator = open_coordinator(sqlite_url(db_path))
    with pytest.raises(CoordinatorError, match="not connected"):
        await coordinator.get("k")
    with pytest.raises(CoordinatorError, match="not connected"):
        _ = coordinator.session
    await coordinator.connect()
    with pytest.raises(CoordinatorError, match="already connected"):
        await coordinator.connect()
    watch = coordinator.watch("w/")
    await coordinator.close()
    assert coordinator.session.state is SessionState.LOST
    with pytest.raises(CoordinatorError, match="closed"):
        await coordinator.get("k")
    with pytest.raises(CoordinatorError, match="closed"):
        await watch.wait(timeout=0.1)
    with pytest.raises(CoordinatorError, match="closed"):
        await coordinator.connect()


@pytest.mark.asyncio
async def test_close_deletes_the_session_row_and_its_keys(
    db_path: Path, raw: sqlite3.Connection
) -> None:
    coordinator = open_coordinator(sqlite_url(db_path))
    await coordinator.connect()
    await coordinator.create("m/a", b"", ephemeral=True)
    await coordinator.create("p/a", b"")
    session_id = coordinator.session.id
    assert raw.execute("SELECT id FROM sessions").fetchall() == [(session_id,)]
    await coordinator.close()
    assert raw.execute("SELECT id FROM sessions").fetchall() == []
    assert raw.execute("SELECT key FROM kv ORDER BY key").fetchall() == [("p/a",)]


@pytest.mark.asyncio
async def test_memory_databases_are_shared_by_name_and_freed_with_the_last_user() -> None:
    name = f"memory://unit-{uuid.uuid4().hex}"
    async with open_coordinator(name) as a, open_coordinator(name) as b:
        await a.create("k", b"v")
        entry = await b.get("k")
        assert entry is not None and entry.value == b"v"
        async with open_coordinator(f"memory://other-{uuid.uuid4().hex}") as other:
            assert await other.get("k") is None
    async with open_coordinator(name) as fresh:
        assert await fresh.get("k") is None


# ------------------------------------------------------------------- reaping by peers


def insert_foreign_session(
    raw: sqlite3.Connection, session_id: str, expires_at: float, keys: list[str]
) -> None:
    """A session of some other process, with ephemeral keys, written directly."""
    raw.execute("BEGIN IMMEDIATE")
    (revision,) = raw.execute(
        "UPDATE meta SET value = value + 1 WHERE name = 'revision' RETURNING value"
    ).fetchone()
    raw.execute(
        "INSERT INTO sessions (id, expires_at, timeout_s, pid) VALUES (?, ?, 1.0, 1)",
        (session_id, expires_at),
    )
    for key in keys:
        raw.execute(
            "INSERT INTO kv (key, dir, value, version, create_version, session)"
            " VALUES (?, ?, x'', ?, ?, ?)",
            (key, dir_of(key), revision, revision, session_id),
        )
    raw.execute("COMMIT")


@pytest.mark.asyncio
async def test_any_write_reaps_expired_sessions_and_wakes_watches(
    db_path: Path, raw: sqlite3.Connection
) -> None:
    async with open_coordinator(sqlite_url(db_path)) as coordinator:
        insert_foreign_session(raw, "dead", time.monotonic() - 1.0, ["members/dead"])
        insert_foreign_session(raw, "alive", time.monotonic() + 3600.0, ["members/alive"])
        async with coordinator.watch("members/") as watch:
            assert [e.key for e in await coordinator.list("members/")] == [
                "members/alive",
                "members/dead",
            ]
            await drain(watch)
            assert await coordinator.commit([], [])
            await wait_until_listed(watch, coordinator, "members/", ["members/alive"])
        sessions = {row[0] for row in raw.execute("SELECT id FROM sessions")}
        assert "dead" not in sessions and "alive" in sessions


@pytest.mark.asyncio
async def test_sessions_of_an_earlier_boot_are_ended_on_open(
    db_path: Path, raw: sqlite3.Connection
) -> None:
    if read_boot_id() is None:
        pytest.skip("this host has no boot id")
    async with open_coordinator(sqlite_url(db_path)):
        pass
    insert_foreign_session(raw, "before-reboot", time.monotonic() + 3600.0, ["members/old"])
    raw.execute("UPDATE meta SET value = 'some-earlier-boot' WHERE name = 'boot_id'")
    async with open_coordinator(sqlite_url(db_path)) as coordinator:
        assert await coordinator.get("members/old") is None
    stored = raw.execute("SELECT value FROM meta WHERE name = 'boot_id'").fetchone()
    assert stored == (read_boot_id(),)


@pytest.mark.asyncio
async def test_reaped_session_is_lost_and_cannot_create_ephemerals(
    db_path: Path, raw: sqlite3.Connection
) -> None:
    async with open_coordinator(sqlite_url(db_path)) as coordinator:
        states: list[SessionState] = []
        coordinator.session.add_listener(states.append)
        await coordinator.create("m/mine", b"", ephemeral=True)
        # Another process reaped us (we were paused past our expiry).
        raw.execute("DELETE FROM sessions")
        with pytest.raises(SessionLost):
            await coordinator.create("m/again", b"", ephemeral=True)
        assert coordinator.session.state is SessionState.LOST
        assert states == [SessionState.LOST]
        with pytest.raises(SessionLost):
            await coordinator.create("m/again", b"", ephemeral=True)
        # Persistent keys do not need the session.
        assert await coordinator.create("p/still", b"") is not None


# ------------------------------------------------------------- lock-induced suspension


@pytest.mark.asyncio
async def test_locked_database_suspends_then_reconnects(
    db_path: Path, raw: sqlite3.Connection
) -> None:
    options = ConnectOptions(session_timeout_s=2.0)
    async with open_coordinator(sqlite_url(db_path), options) as coordinator:
        session = coordinator.session
        states: list[SessionState] = []
        session.add_listener(states.append)
        await coordinator.create("m/mine", b"", ephemeral=True)

        raw.execute("BEGIN IMMEDIATE")  # another process holds the write lock
        try:

            async def suspended() -> bool:
                return session.state is SessionState.SUSPENDED

            await eventually(suspended, "session SUSPENDED while the database is locked")
            assert not session.is_live()
            before = session.deadline
        finally:
            raw.execute("ROLLBACK")

        async def connected() -> bool:
            return session.state is SessionState.CONNECTED

        await eventually(connected, "session CONNECTED once the lock is released")
        assert session.deadline > before
        assert states[:2] == [SessionState.SUSPENDED, SessionState.CONNECTED]
        entry = await coordinator.get("m/mine")
        assert entry is not None and entry.ephemeral


@pytest.mark.asyncio
async def test_locked_past_the_timeout_the_session_is_lost(
    db_path: Path, raw: sqlite3.Connection
) -> None:
    options = ConnectOptions(session_timeout_s=1.0)
    async with open_coordinator(sqlite_url(db_path), options) as coordinator:
        session = coordinator.session
        await coordinator.create("m/mine", b"", ephemeral=True)

        raw.execute("BEGIN IMMEDIATE")
        try:
            (expires_at,) = raw.execute(
                "SELECT expires_at FROM sessions WHERE id = ?", (session.id,)
            ).fetchone()

            async def expired() -> bool:
                return time.monotonic() > float(expires_at)

            await eventually(expired, "the session's expiry instant passed")
            assert not session.is_live()
        finally:
            raw.execute("ROLLBACK")

        async def lost() -> bool:
            return session.state is SessionState.LOST

        await eventually(lost, "session LOST after its expiry passed unconfirmed")
        assert await coordinator.get("m/mine") is None
        with pytest.raises(SessionLost):
            await coordinator.create("m/mine", b"", ephemeral=True)


@pytest.mark.asyncio
async def test_event_loop_runs_while_a_call_waits_for_the_lock(
    db_path: Path, raw: sqlite3.Connection
) -> None:
    async with open_coordinator(sqlite_url(db_path)) as coordinator:
        raw.execute("BEGIN IMMEDIATE")
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ticking = asyncio.create_task(ticker())
        try:
            with pytest.raises(CoordinatorUnavailable, match="locked"):
                await coordinator.commit([], [])
        finally:
            raw.execute("ROLLBACK")
            ticking.cancel()
        assert ticks > 0


@pytest.mark.asyncio
async def test_a_file_locked_while_another_process_sets_it_up_is_retried(
        db_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Opening a new file while another process sets WAL mode and the schema
    fails at once with "database is locked" (SQLite does not wait for that
    lock): retriable, and retried within the connect timeout (issue 29: 1 in
    20 pairs of starts failed)."""
    import coordinators.sqlite.coordinator as backend

    real_open, calls = backend.open_file, []

    def locked_twice(*args: object) -> object:
        calls.append(1)
        if len(calls) <= 2:
            err = sqlite3.OperationalError("database is locked")
            err.sqlite_errorcode = 5
            raise err
        return real_open(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(backend, "open_file", locked_twice)
    async with open_coordinator(sqlite_url(db_path)) as coordinator:
        assert await coordinator.create("k", b"v") is not None
    assert len(calls) == 3


@pytest.mark.asyncio
async def test_a_file_that_stays_locked_fails_within_the_connect_timeout(
        db_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import coordinators.sqlite.coordinator as backend
    from coordinators.protocol import ConnectOptions

    def locked(*args: object) -> object:
        err = sqlite3.OperationalError("database is locked")
        err.sqlite_errorcode = 5
        raise err

    monkeypatch.setattr(backend, "open_file", locked)
    coordinator = open_coordinator(sqlite_url(db_path), ConnectOptions(connect_timeout_s=1.0))
    with pytest.raises(CoordinatorUnavailable):
        await coordinator.connect()


def test_twenty_pairs_of_processes_start_on_a_new_file_without_a_failure(
        tmp_path: Path) -> None:
    """Two real processes start a member each on the same new file at the same
    instant, 20 times (a new file each round): no failure, and no unreadable
    consumer-file origin either."""
    import subprocess
    import sys

    from tests.support.group_procs import REPO
    from tests.support.tables import make_pk_table

    wh = tmp_path / "wh"
    make_pk_table(str(wh), "db.t", buckets=2)
    script = (
        "import asyncio, sys, time\n"
        "from paimon_group import GroupMember, MemberConfig\n"
        "async def main():\n"
        "    wh, base, me, t0 = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])\n"
        "    for i in range(20):\n"
        "        while time.time() < t0 + 0.6 * i:\n"
        "            await asyncio.sleep(0.001)\n"
        "        m = GroupMember(MemberConfig(group='g', warehouse=wh, table='db.t',\n"
        "            coordinator=f'sqlite://{base}/c{i}.sqlite', member_id=me,\n"
        "            session_timeout_s=5))\n"
        "        try:\n"
        "            await m.start()\n"
        "        except Exception as err:\n"
        "            print(f'round {i}: {err!r}', flush=True)\n"
        "        await m.stop()\n"
        "asyncio.run(main())\n"
    )
    t0 = str(time.time() + 6.0)  # both processes imported by then
    procs = [subprocess.Popen([sys.executable, "-c", script, str(wh), str(tmp_path), f"m{j}",
                               t0], cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for j in range(2)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert not any("round " in out or "unreadable consumer-file origin" in out
                   for out in outs), outs
    assert len(list(tmp_path.glob("c*.sqlite"))) == 20
