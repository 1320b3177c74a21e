"""The ZooKeeper session, as seen by the coordinator."""

from __future__ import annotations

import logging

from coordinators.protocol import (
    Session,
    SessionState,
)

log = logging.getLogger("coordinators.zookeeper")  # the backend's one logger


# ------------------------------------------------------------------- session


class ZooKeeperSession(Session):
    """A ZooKeeper session, as seen through kazoo's state listener and our heartbeats.

    Example (with a connected :class:`ZooKeeperCoordinator` ``coord``)::

        session = coord.session
        print(session.id)                  # "0x100003a5c8e0001", ZooKeeper's id
        session.add_listener(lambda state: print("session is", state.value))
        if not session.is_live(margin_s=1.0):
            ...                            # stop processing and committing
    """

    def __init__(self, raw_id: int, timeout_s: float, started_at: float) -> None:
        super().__init__(timeout_s)
        self.raw_id = raw_id
        # The server created the session after we sent the connect request.
        self._deadline = started_at + timeout_s

    @property
    def id(self) -> str:
        return f"0x{self.raw_id:x}"

    def mark(self, state: SessionState) -> None:
        """Move to ``state`` (no-op once LOST); a failing listener is logged."""
        try:
            self._set_state(state)
        except Exception:
            log.exception("ZooKeeper session %s: a state listener failed", self.id)
