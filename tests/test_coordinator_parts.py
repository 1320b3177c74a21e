"""The parts the three coordinator backends share: URLs, error translation,
retry policies and the session's transitions (no server needed)."""

from __future__ import annotations

import asyncio
import sqlite3
import time

import pytest
import tenacity

from coordinators import retry
from coordinators.errors import (
    CoordinatorError,
    CoordinatorUnavailable,
    ErrorTranslation,
    InvalidCoordinatorURL,
    PaimonGroupError,
    SessionLost,
)
from coordinators.protocol import Session, SessionState
from coordinators.session import SessionTransitions
from coordinators.urls import host_string, parse_hosts, split_scheme

# -- URLs ----------------------------------------------------------------------


def test_hosts_default_ports_and_ipv6() -> None:
    hosts = parse_hosts("a,b:2,[::1]:3", 9, "X", "x://...")
    assert hosts == (("a", 9), ("b", 2), ("::1", 3))
    assert [host_string(h) for h in hosts] == ["a:9", "b:2", "[::1]:3"]


@pytest.mark.parametrize("netloc", ["", "h:0", "h:70000", "h:port", "[::1", "bad host"])
def test_bad_hosts_fail_with_one_line(netloc: str) -> None:
    with pytest.raises(InvalidCoordinatorURL) as caught:
        parse_hosts(netloc, 9, "X", "x://shown")
    assert "\n" not in str(caught.value)


def test_credentials_in_the_host_part_are_refused_unseen() -> None:
    with pytest.raises(InvalidCoordinatorURL) as caught:
        parse_hosts("alice:hunter2@h:1", 9, "X", "x://***@h:1")
    assert "hunter2" not in str(caught.value)
    assert "ConnectOptions" in str(caught.value)


def test_scheme_is_case_insensitive_and_checked() -> None:
    assert split_scheme("ZK://h/x", ("zk",), "a ZooKeeper URL", "zk://H") == ("zk", "h/x")
    with pytest.raises(InvalidCoordinatorURL, match="not a ZooKeeper URL"):
        split_scheme("etcd://u:pw@h", ("zk",), "a ZooKeeper URL", "zk://H")


# -- error translation ---------------------------------------------------------


def _translate(err: BaseException, what: str) -> PaimonGroupError:
    return CoordinatorUnavailable(f"{what}: {type(err).__name__}")


SQLITE = ErrorTranslation((sqlite3.Error,), _translate)


class _Store:
    where = "db"

    @SQLITE.handles(lambda self, key: f"get {key} from {self.where}")
    def get(self, key: str) -> str:
        raise sqlite3.OperationalError("locked")

    @SQLITE.handles(lambda self, key: f"put {key}")
    async def put(self, key: str) -> None:
        raise sqlite3.DatabaseError("corrupt")

    @SQLITE.handles(lambda self: "ours")
    async def lost(self) -> None:
        raise SessionLost("gone")

    @SQLITE.handles(lambda self: "other")
    def other(self) -> None:
        raise KeyError("not a backend error")


def test_translation_of_sync_and_async_calls() -> None:
    store = _Store()
    with pytest.raises(CoordinatorUnavailable, match="get k from db: OperationalError") as sync:
        store.get("k")
    assert isinstance(sync.value.__cause__, sqlite3.OperationalError)
    with pytest.raises(CoordinatorUnavailable, match="put k: DatabaseError") as coro:
        asyncio.run(store.put("k"))
    assert isinstance(coro.value.__cause__, sqlite3.DatabaseError)


def test_our_errors_and_foreign_ones_pass_through() -> None:
    store = _Store()
    with pytest.raises(SessionLost, match="gone"):
        asyncio.run(store.lost())
    with pytest.raises(KeyError):
        store.other()
    with pytest.raises(CoordinatorUnavailable, match="open: OperationalError"):
        with SQLITE.translating("open"):
            raise sqlite3.OperationalError("no such file")


# -- retry policies ------------------------------------------------------------


def test_policies_take_an_injected_sleep_and_keep_their_stop() -> None:
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    calls = 0

    async def flaky() -> None:
        nonlocal calls
        calls += 1
        raise ConnectionError("down")

    policy = retry.READS.copy(
        retry=tenacity.retry_if_exception_type(ConnectionError), sleep=sleep
    )
    with pytest.raises(ConnectionError):
        asyncio.run(policy(flaky))
    assert calls == 4 and len(slept) == 3
    assert all(0 <= s <= 1.0 for s in slept)


def test_rejoin_retries_only_retriable_errors() -> None:
    async def no_sleep(seconds: float) -> None:
        return None

    attempts: list[type[BaseException]] = []

    async def join(error: PaimonGroupError) -> None:
        attempts.append(type(error))
        if len(attempts) < 3:
            raise error

    policy = retry.REJOIN.copy(sleep=no_sleep, stop=tenacity.stop_after_attempt(5))
    asyncio.run(policy(join, CoordinatorUnavailable("down")))
    assert attempts == [CoordinatorUnavailable] * 3
    attempts.clear()
    with pytest.raises(CoordinatorError):
        asyncio.run(policy(join, CoordinatorError("refused")))
    assert attempts == [CoordinatorError]


# -- the session's transitions -------------------------------------------------


class _Session(Session):
    @property
    def id(self) -> str:
        return "s1"

    def apply_now(self, state: SessionState) -> None:
        """The state applied at once: no event loop runs in these tests, so
        :meth:`Session.report`'s hop to the loop would not apply it."""
        self._set_state(state)


def _session_and_transitions() -> tuple[_Session, SessionTransitions]:
    session = _Session(10.0, sent_at=100.0)
    return session, SessionTransitions(session, session.apply_now)


def test_confirmed_moves_the_deadline_from_the_send_time() -> None:
    session, transitions = _session_and_transitions()
    transitions.unanswered("no answer")
    assert session.state is SessionState.SUSPENDED
    transitions.confirmed(105.0)
    assert session.state is SessionState.CONNECTED
    assert session.deadline == 115.0


def test_unanswered_never_moves_the_deadline_and_lost_is_terminal() -> None:
    session, transitions = _session_and_transitions()
    transitions.unanswered("no answer")
    assert session.deadline == 110.0
    transitions.gone("expired")
    assert session.state is SessionState.LOST
    transitions.confirmed(200.0)
    transitions.resumed()
    assert session.state is SessionState.LOST


def test_overdue_only_when_suspended_past_the_deadline() -> None:
    session = _Session(0.05)
    transitions = SessionTransitions(session, session.apply_now)
    time.sleep(0.1)
    assert not transitions.overdue()  # CONNECTED: the backend's own check decides
    transitions.unanswered("no answer")
    assert transitions.overdue()
    fresh = _Session(60.0)
    fresh_transitions = SessionTransitions(fresh, fresh.apply_now)
    fresh_transitions.unanswered("no answer")
    assert not fresh_transitions.overdue()


def test_each_problem_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    _session, transitions = _session_and_transitions()
    caplog.set_level("INFO", logger="coordinators.session")
    for _ in range(3):
        transitions.unanswered("no answer")
    transitions.unanswered("refused")
    transitions.confirmed(101.0)
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [
        "session s1 suspended: no answer",
        "session s1 suspended: refused",
        "session s1 confirmed again",
    ]
