"""Session keep-alives that run off the event loop.

A keep-alive on the event loop is starved by anything that holds the loop: a
synchronous body in ``async for batch in member.batches()``, a slow handler
called inline, a long ``time.sleep`` in user code. Past the session timeout
the server side (or, for SQLite, the next writer) ends the session, and the
member delivers again, under a new epoch, what it had not committed yet. So
the etcd and the embedded (SQLite, memory) backends renew their sessions from
a **thread** of their own.

Two rules keep that safe (invariant 3):

* the local deadline only ever moves to ``sent_at + timeout``, where
  ``sent_at`` is the monotonic instant read *before* the renewal was sent
  (:meth:`Session.confirmed`); a renewal whose outcome is unknown never moves
  it;
* state changes found by the thread reach the session's listeners on the
  event loop's thread, through ``loop.call_soon_threadsafe``: listeners (the
  member's wake-ups, asyncio events) are not thread-safe. ``LOST`` is visible
  to :meth:`Session.is_live` at once (the deadline drops to minus infinity),
  even before the loop runs the listeners.

Example::

    import asyncio, time
    from coordinators.keepalive import KeepAliveThread, ThreadedSession

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


Renew = Callable[[], bool]


class KeepAliveThread(threading.Thread):
    """Calls ``renew()`` every ``interval_s`` and reports what it found.

    ``renew`` returns True when the server confirmed the session, False when
    the session is certainly gone (LOST, terminal: the thread ends), and
    raises when the outcome is unknown (SUSPENDED until a renewal succeeds;
    the deadline is left alone). The thread also ends with :meth:`stop` or
    once the event loop is closed (an abandoned coordinator is not kept
    alive by its thread).
    """

    def __init__(
        self, session: ThreadedSession, *, renew: Renew, interval_s: float, name: str
    ) -> None:
        super().__init__(name=name, daemon=True)
        self._session = session
        self._renew = renew
        self._interval_s = interval_s
        self._stop_event = threading.Event()

    def stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        session = self._session
        last_error = ""
        while not self._stop_event.wait(self._interval_s):
            if session._loop.is_closed():
                return
            sent_at = time.monotonic()
            try:
                alive = self._renew()
            except Exception as err:
                if self._stop_event.is_set():
                    return
                detail = str(err) if isinstance(err, CoordinatorError) else repr(err)
                if detail != last_error:
                    log.warning("session %s suspended: %s", session.id, detail)
                    last_error = detail
                session.report(SessionState.SUSPENDED)
                continue
            if not alive:
                log.warning(
                    "session %s expired: its ephemeral keys are gone",
                    session.id,
                )
                session.report(SessionState.LOST)
                return
            if last_error:
                log.info("session %s confirmed again", session.id)
                last_error = ""
            session.confirmed(sent_at)
            session.report(SessionState.CONNECTED)
