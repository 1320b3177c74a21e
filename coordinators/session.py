"""Keeping a session alive: one owner of its CONNECTED/SUSPENDED/LOST transitions.

Every backend renews its session its own way (an etcd lease keep-alive, a
row update in SQLite, an ``exists`` round trip to ZooKeeper), but what an
outcome means is the same everywhere, and is decided here only
(:class:`SessionTransitions`):

* a renewal the server **confirmed** moves the local deadline to
  ``sent_at + timeout``, where ``sent_at`` is the monotonic instant read
  *before* the renewal was sent (:meth:`Session.confirmed`), and makes the
  session CONNECTED;
* a renewal whose outcome is **unknown** (no answer, an error) makes it
  SUSPENDED and never moves the deadline;
* a renewal that finds the session **gone** makes it LOST, for good;
* SUSPENDED past the deadline (:meth:`SessionTransitions.overdue`) means the
  server may already have expired the session: the backend declares it LOST.

A keep-alive on the event loop is starved by anything that holds the loop: a
synchronous body in ``async for batch in member.batches()``, a slow handler
called inline, a long ``time.sleep`` in user code. Past the session timeout
the server side (or, for SQLite, the next writer) ends the session, and the
member delivers again, under a new epoch, what it had not committed yet. So
the etcd and the embedded (SQLite, memory) backends renew their sessions from
a **thread** of their own (:class:`KeepAliveThread`, given a
:class:`Renewal`). ZooKeeper's client (kazoo) runs its own threads and
answers on the event loop; its heartbeat is a task that drives the same
:class:`SessionTransitions`.

State changes found by a thread reach the session's listeners on the event
loop's thread, through ``loop.call_soon_threadsafe`` (:class:`ThreadedSession`):
listeners (the member's wake-ups, asyncio events) are not thread-safe.
``LOST`` is visible to :meth:`Session.is_live` at once (the deadline drops to
minus infinity), even before the loop runs the listeners.

Example::

    import asyncio, time
    from coordinators.session import KeepAliveThread, ThreadedSession

    class Demo(ThreadedSession):
        @property
        def id(self) -> str:
            return "demo"

    async def main() -> None:
        session = Demo(2.0, asyncio.get_running_loop())
        thread = KeepAliveThread(session, renew=lambda: True, interval_s=0.5, name="demo")
        thread.start()
        time.sleep(3.0)           # the loop is blocked; the thread renews anyway
        assert session.is_live()
        thread.stop()
        await asyncio.to_thread(thread.join, 5)

    asyncio.run(main())
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections.abc import Callable

from coordinators.errors import CoordinatorError
from coordinators.protocol import Session, SessionState

log = logging.getLogger(__name__)

Report = Callable[[SessionState], None]
Renew = Callable[[], bool]


class SessionTransitions:
    """What each renewal outcome means for the session's state, and its logs.

    ``report`` applies a state to the session (and whatever else the backend
    ties to it); ``what`` names the session in log lines ("etcd lease",
    "ZooKeeper session"). Warnings are logged once per distinct problem, not
    once per failed renewal.
    """

    def __init__(
        self,
        session: Session,
        report: Report,
        *,
        what: str = "session",
        logger: logging.Logger = log,
    ) -> None:
        self._session = session
        self._report = report
        self._what = what
        self._log = logger
        self._last_problem = ""

    def _name(self) -> str:
        return f"{self._what} {self._session.id}"

    def confirmed(self, sent_at: float) -> None:
        """The server confirmed a renewal sent at ``sent_at`` (monotonic)."""
        self._session.confirmed(sent_at)
        self.resumed()

    def resumed(self) -> None:
        """The same session is reachable again (the deadline is left alone)."""
        if self._last_problem or self._session.state is SessionState.SUSPENDED:
            self._log.info("%s confirmed again", self._name())
        self._last_problem = ""
        self._report(SessionState.CONNECTED)

    def unanswered(self, problem: str) -> None:
        """A renewal's outcome is unknown: SUSPENDED; the deadline is left alone."""
        if problem != self._last_problem:
            self._log.warning("%s suspended: %s", self._name(), problem)
            self._last_problem = problem
        self._report(SessionState.SUSPENDED)

    def gone(self, reason: str) -> None:
        """The session certainly ended: LOST, for good."""
        if self._session.state is not SessionState.LOST:
            self._log.warning("%s is lost (%s): its ephemeral keys are gone", self._name(), reason)
        self._report(SessionState.LOST)

    def overdue(self) -> bool:
        """SUSPENDED past the deadline: the server may have expired the session."""
        session = self._session
        return session.state is SessionState.SUSPENDED and time.monotonic() > session.deadline


class ThreadedSession(Session):
    """A session whose state may be reported from any thread.

    Built on the event loop's thread. :meth:`report` records the new state
    at once (under a lock) and hands the listener calls to the loop.
    """

    def __init__(
        self,
        timeout_s: float,
        loop: asyncio.AbstractEventLoop,
        *,
        sent_at: float | None = None,
    ) -> None:
        super().__init__(timeout_s, sent_at=sent_at)
        self._loop = loop
        self._loop_thread = threading.get_ident()
        self._reported = SessionState.CONNECTED
        self._report_lock = threading.Lock()

    @property
    def loop_closed(self) -> bool:
        return self._loop.is_closed()

    def confirmed(self, sent_at: float) -> None:
        # Under the lock: a confirmation racing with a LOST report must not
        # lift the deadline back up after LOST dropped it.
        with self._report_lock:
            if self._reported is SessionState.LOST:
                return
            super().confirmed(sent_at)

    def report(self, state: SessionState) -> None:
        """Record ``state`` from any thread; listeners run on the event loop."""
        with self._report_lock:
            if self._reported is SessionState.LOST or state is self._reported:
                return
            self._reported = state
            if state is SessionState.LOST:
                # Visible to is_live() at once, before the loop runs the update.
                self._deadline = -math.inf
        try:
            if threading.get_ident() == self._loop_thread:
                self._apply(state)
            else:
                self._loop.call_soon_threadsafe(self._apply, state)
        except RuntimeError:  # the loop is closed: nobody is listening
            pass

    def _apply(self, state: SessionState) -> None:
        """Runs on the loop's thread: the state change and its listeners."""
        try:
            self._set_state(state)
        except Exception:
            log.exception("session %s: a state listener failed", self.id)


class Renewal:
    """One backend's renewal of its session, called on the keeper's thread.

    :meth:`renew` returns True when the server confirmed the session, False
    when the session is certainly gone, and raises when the outcome is
    unknown (a :class:`CoordinatorError` says why in one line).
    """

    def renew(self) -> bool:
        raise NotImplementedError

    def retry_delay(self, failures: int, interval_s: float) -> float:
        """How long to wait after ``failures`` failed renewals in a row."""
        return interval_s

    def interrupt(self) -> None:
        """Cut a renewal in flight short (called by :meth:`KeepAliveThread.stop`)."""

    def close(self) -> None:
        """Free the renewal's resources, on the keeper's thread as it ends."""


class _CallRenewal(Renewal):
    def __init__(self, renew: Renew) -> None:
        self._renew = renew

    def renew(self) -> bool:
        return self._renew()


class KeepAliveThread(threading.Thread):
    """Renews a session every ``interval_s`` from a thread of its own.

    The outcome of each renewal goes through :class:`SessionTransitions`. The
    thread ends with :meth:`stop`, once the session is LOST, or once the
    event loop is closed (an abandoned coordinator is not kept alive by its
    thread).
    """

    def __init__(
        self,
        session: ThreadedSession,
        *,
        renew: Renew | Renewal,
        interval_s: float,
        name: str,
        what: str = "session",
        logger: logging.Logger = log,
    ) -> None:
        super().__init__(name=name, daemon=True)
        self._session = session
        self._renewal = renew if isinstance(renew, Renewal) else _CallRenewal(renew)
        self._interval_s = interval_s
        self._transitions = SessionTransitions(
            session, session.report, what=what, logger=logger
        )
        self._stop_event = threading.Event()

    def stop(self) -> None:
        self._stop_event.set()
        self._renewal.interrupt()

    def run(self) -> None:
        try:
            self._beat()
        finally:
            self._renewal.close()

    def _beat(self) -> None:
        session, transitions = self._session, self._transitions
        failures = 0
        wait_s = self._interval_s
        while not self._stop_event.wait(wait_s):
            if session.loop_closed:
                return
            sent_at = time.monotonic()
            try:
                alive = self._renewal.renew()
            except Exception as err:
                if self._stop_event.is_set():
                    return
                failures += 1
                transitions.unanswered(
                    str(err) if isinstance(err, CoordinatorError) else repr(err)
                )
                wait_s = self._renewal.retry_delay(failures, self._interval_s)
                continue
            if not alive:
                transitions.gone("expired")
                return
            failures = 0
            transitions.confirmed(sent_at)
            wait_s = max(0.0, sent_at + self._interval_s - time.monotonic())
