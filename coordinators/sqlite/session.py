"""The embedded backend's session: a row in the ``sessions`` table."""

from __future__ import annotations

import asyncio

from coordinators.protocol import SessionState
from coordinators.session import ThreadedSession


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
