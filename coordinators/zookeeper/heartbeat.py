"""Following the session: kazoo's state changes and our heartbeats, through
the one owner of the session's transitions (:mod:`coordinators.session`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from kazoo.exceptions import (
    KazooException,
    SessionExpiredError,
)
from kazoo.protocol.states import KazooState

from coordinators.errors import (
    CoordinatorUnavailable,
    SessionSuspended,
)
from coordinators.protocol import SessionState
from coordinators.zookeeper.core import ZkCore, session_id_of
from coordinators.zookeeper.session import ZooKeeperSession

log = logging.getLogger("coordinators.zookeeper")  # the backend's one logger


class Heartbeat(ZkCore):
    """The session's state, from kazoo's listener and a heartbeat task."""

    def _on_kazoo_state(self, client: Any, state: str) -> None:
        """kazoo's state listener: runs on kazoo's connection thread, must not block."""
        if state == KazooState.LOST:
            self._lost_flag = True
        self._in_loop(self._apply_kazoo_state, state, session_id_of(client))

    def _apply_kazoo_state(self, state: str, session_id: int | None) -> None:
        session, transitions = self._session, self._transitions
        if session is None or transitions is None or self._closed:
            return
        if state == KazooState.LOST:
            self._lose("the session expired or was closed by ZooKeeper")
        elif state == KazooState.SUSPENDED:
            transitions.unanswered("connection lost")
        elif state == KazooState.CONNECTED:
            if session_id != session.raw_id:
                self._lose("ZooKeeper opened a new session after the old one expired")
            elif session.state is SessionState.SUSPENDED:
                transitions.resumed()
            self._heartbeat_kick.set()
        for watch in list(self._watches):
            watch._connection_changed(state)

    def _lose(self, reason: str) -> None:
        self._lost_flag = True
        if self._transitions is not None:
            self._transitions.gone(reason)

    def _on_session_state(self, state: SessionState) -> None:
        """Apply a state decided by the session's transitions (on the loop)."""
        session = self._session
        if session is None:
            return
        if state is not SessionState.LOST:
            session.mark(state)
            return
        self._lost_flag = True
        if session.state is SessionState.LOST:
            return
        session.mark(SessionState.LOST)
        for watch in list(self._watches):
            watch._lost()
        # Stop kazoo before it works on for a replacement session (and end
        # that session, with anything created in it by mistake).
        client, loop = self._client, self._loop
        if client is not None and loop is not None and self._retiring is None:
            self._retiring = loop.create_task(self._retire(client), name="zk-retire")

    async def _retire(self, client: Any) -> None:
        await self._stop_client(client)

    def _require_session(self) -> ZooKeeperSession:
        """The session, if an ephemeral key may be created under it now."""
        self._live_client()  # raises SessionLost once LOST
        session = self.session
        if session.state is SessionState.SUSPENDED:
            raise SessionSuspended(
                f"ZooKeeper session {session.id} is suspended (no connection); retry once it "
                "is connected again"
            )
        return session

    async def _heartbeat_loop(self) -> None:
        """Confirm the session every third of its timeout; SUSPENDED if unanswered.

        kazoo pings only when nothing else is sent, and our requests count
        as its pings, so a server that hangs without closing the connection
        would go unnoticed by kazoo: an unanswered heartbeat is our signal.
        Every answered request confirms the session (:meth:`_recv`).
        """
        session, transitions = self.session, self._transitions
        assert transitions is not None
        while not self._closed and session.state is not SessionState.LOST:
            interval = max(session.timeout_s / 3, 0.05)
            # Due a third of the timeout after the last confirmation, a
            # heartbeat's or any other answered request's: a session whose
            # requests are answered anyway needs none (the deadline stays at
            # least two thirds of the timeout ahead, as with a heartbeat).
            wait = session.deadline - session.timeout_s + interval - time.monotonic()
            kicked = False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._heartbeat_kick.wait(), wait if wait > 0 else interval
                )
                kicked = True
            self._heartbeat_kick.clear()
            client = self._client
            if client is None or self._closed:
                return
            confirmed_at = session.deadline - session.timeout_s
            if not kicked and time.monotonic() < confirmed_at + interval:
                continue  # confirmed meanwhile
            if transitions.overdue():
                # The server may already have expired us and handed our keys
                # on; kazoo would only learn it on reconnection. Like
                # Curator, give up now: the owner rejoins with a new session.
                self._lose("no contact with ZooKeeper for longer than the session timeout")
                return
            if not client.connected:
                continue  # kazoo reconnects and tells us (CONNECTED or LOST)
            try:
                await self._recv(
                    self._send(client.exists_async, self._root), "a heartbeat", timeout=interval
                )
            except CoordinatorUnavailable:
                transitions.unanswered(f"heartbeat unanswered for {interval:.3g}s")
                continue
            except SessionExpiredError:
                self._lose("a heartbeat found the session expired")
                return
            except KazooException as err:
                log.debug("ZooKeeper heartbeat of session %s failed: %r", session.id, err)
                continue
            if session_id_of(client) != session.raw_id:
                self._lose("ZooKeeper opened a new session after the old one expired")
                return
            if session.state is SessionState.SUSPENDED and client.connected:
                transitions.resumed()
