"""The embedded backend's watch: a directory's revision, compared with the one seen last."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import sqlite3
from typing import Protocol

from coordinators.errors import CoordinatorError
from coordinators.protocol import Watch


class _Poller(Protocol):
    """What a watch needs of its coordinator (which polls for all its watches)."""

    def _forget(self, watch: SqliteWatch) -> None: ...

    def _ensure_poller(self) -> None: ...


class SqliteWatch(Watch):
    """Level-triggered: compares the directory's revision with the one seen last."""

    def __init__(
        self,
        coordinator: _Poller,
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
