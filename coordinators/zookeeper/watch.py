"""The ZooKeeper watch: re-armed after every event, changes found by zxid."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Collection, Sequence
from typing import Any, Protocol

from kazoo.exceptions import NoNodeError
from kazoo.protocol.states import EventType, KazooState, WatchedEvent

from coordinators.errors import CoordinatorError
from coordinators.protocol import Watch
from coordinators.zookeeper.layout import FLAG_PREFIX, child_znode

log = logging.getLogger("coordinators.zookeeper")  # the backend's one logger


# --------------------------------------------------------------------- watch


class _Host(Protocol):
    """What a watch needs of its coordinator."""

    _loop: asyncio.AbstractEventLoop | None

    @property
    def client(self) -> Any: ...

    def _in_loop(self, fn: Callable[..., object], *args: object) -> None: ...

    def _send(self, fn: Callable[..., Any], *args: Any) -> tuple[float, asyncio.Future[Any]]: ...

    async def _request(self, what: str, fn: Callable[..., Any], *args: Any) -> Any: ...

    async def _recv_all(
        self, sent: Sequence[tuple[float, asyncio.Future[Any]]], what: str
    ) -> list[Any]: ...

    def _live_client(self) -> Any: ...

    def _last_zxid(self) -> int: ...

    def _forget(self, watch: ZkWatch) -> None: ...


class ZkWatch(Watch):
    """A level-triggered watch of a directory's direct children; see the module docstring."""

    def __init__(
        self, coordinator: _Host, prefix: str, directory: str, seen: int, *, values: bool = True,
        children: Collection[str] | None = None,
    ) -> None:
        self.prefix = prefix
        # Without values, only the children watch is armed: a key created or
        # deleted changes the directory's children (and its pzxid, which also
        # catches a delete and re-create between two looks).
        self._values = values
        # With ``children``, data watches are armed on those children only.
        self._children = None if children is None else frozenset(children)
        self._coordinator = coordinator
        self._dir = directory
        # Changes with a zxid above this one may be unseen by the caller.
        self._seen = seen
        self._dirty = False
        self._closed = False
        self._changed = asyncio.Event()
        self._rearm = asyncio.Event()
        self._rearm.set()
        # Set when a caller takes a change (wait() returned True): while a
        # change is still untaken, nothing new can be told, so re-arming (a
        # listing of every child) waits for this. A caller that does not
        # wait on the watch for a while (a member with nothing to acquire
        # and its owners watch) then costs no listing per change.
        self._taken = asyncio.Event()
        # Keys whose value znode carries our data watch.
        self._armed: set[str] = set()
        # Keys whose data watch fired and that no ``exists`` looked at since:
        # the change is told by that look, or, if the key is no longer
        # listed, by the next re-arm (see _fired).
        self._unchecked: set[str] = set()
        # The keys of the last listing while the directory's child watch it
        # set has not fired since (None: list again). A value's change then
        # re-arms that value's data watch only: no key was created or deleted.
        self._listed: set[str] | None = None
        self._unlisted = 0  # how many times _listed was dropped
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        loop = self._coordinator._loop
        assert loop is not None
        self._task = loop.create_task(self._arm_loop(), name=f"zk-watch-{self.prefix}")

    def _child(self, name: str) -> str:
        return child_znode(self._dir, name)

    # kazoo's callback thread
    def _on_event(self, event: WatchedEvent) -> None:
        self._coordinator._in_loop(self._fired, event)

    def _fired(self, event: WatchedEvent) -> None:
        if self._closed:
            return
        if event.type == EventType.NONE:
            self._armed.clear()  # kazoo dropped every watch (connection lost)
            self._unlist()
        elif event.path != self._dir:
            # A value changed or went. This is not told yet: the re-arm's
            # ``exists`` (sent at once unless a change is still untaken)
            # tells it, by its mzxid against ``_seen``. A notification
            # carries no zxid, so a caller told now would take the change
            # with ``_seen`` at the client's last reply, which may predate
            # the change; the re-arm would then find the change newer and
            # wake the caller a second time for the one change it read.
            name = event.path.rpartition("/")[2]
            self._armed.discard(name)
            self._unchecked.add(name)
            self._rearm.set()
            return
        else:
            self._unlist()  # a key created or deleted, or the directory
        self._mark()
        self._rearm.set()

    def _connection_changed(self, state: str) -> None:
        if state == KazooState.CONNECTED or state == KazooState.LOST:
            self._armed.clear()
            self._unlist()
            self._mark()  # anything may have changed while we could not watch
            self._rearm.set()

    def _unlist(self) -> None:
        self._listed = None
        self._unlisted += 1

    def _mark(self) -> None:
        self._dirty = True
        self._changed.set()

    def _lost(self) -> None:
        self._changed.set()  # waiters raise SessionLost

    async def _arm_loop(self) -> None:
        backoff = 0.05
        while not self._closed:
            await self._rearm.wait()
            while self._dirty and not self._closed:
                self._taken.clear()
                await self._taken.wait()
            self._rearm.clear()
            try:
                await self._arm()
                backoff = 0.05
            except asyncio.CancelledError:
                raise
            except Exception as err:
                if self._closed:
                    return
                log.debug("re-arming the watch on %s failed: %r", self.prefix, err)
                self._armed.clear()
                self._unlist()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                self._rearm.set()

    async def _arm(self) -> None:
        coordinator = self._coordinator
        client = coordinator.client
        if client is None or not client.connected:
            self._tell_unchecked()
            return  # re-armed when kazoo reports CONNECTED
        names = self._listed
        if names is None or not self._values:
            unlisted = self._unlisted
            listed = await self._list(client)
            if listed is None or not self._values:
                self._tell_unchecked()
                return
            names = listed
            if unlisted == self._unlisted:  # the child watch has not fired since
                self._listed = listed
        self._armed &= names
        fresh = sorted(names - self._armed)
        what = f"watch {self.prefix}"
        sent = [
            coordinator._send(client.exists_async, self._child(n), self._on_event) for n in fresh
        ]
        replies = await coordinator._recv_all(sent, what)
        for name, reply in zip(fresh, replies, strict=True):
            if isinstance(reply, BaseException):
                self._rearm.set()
                continue
            self._armed.add(name)
            self._unchecked.discard(name)
            if reply is None or reply.mzxid > self._seen:
                self._mark()
        if self._unchecked - names:
            # A fired key that the listing no longer holds: deleted. Its
            # directory's child watch tells it too; this does not rely on it.
            self._unchecked &= names
            self._mark()

    def _tell_unchecked(self) -> None:
        """Tell fired keys that this re-arm cannot look at."""
        if self._unchecked:
            self._unchecked.clear()
            self._mark()

    async def _list(self, client: Any) -> set[str] | None:
        """List the directory with a child watch: the keys watched (None: no directory)."""
        coordinator = self._coordinator
        what = f"watch {self.prefix}"
        try:
            children, stat = await coordinator._request(
                what, client.get_children_async, self._dir, self._on_event, True
            )
        except NoNodeError:
            self._armed.clear()
            exists = await coordinator._request(
                what, client.exists_async, self._dir, self._on_event
            )
            if exists is not None:
                self._rearm.set()  # created in between: list it
            return None
        if stat.pzxid > self._seen:
            self._mark()  # a key created or deleted since the caller last looked
        names = {n[len(FLAG_PREFIX) :] for n in children if n.startswith(FLAG_PREFIX)}
        if self._children is not None:
            names &= self._children
        return names

    async def wait(self, timeout: float | None = None) -> bool:
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            if self._closed:
                raise CoordinatorError(f"watch on {self.prefix!r} is closed")
            self._coordinator._live_client()  # raises SessionLost once LOST
            if self._dirty:
                self._dirty = False
                # The caller reads after this: nothing up to here is news.
                self._seen = max(self._seen, self._coordinator._last_zxid())
                self._taken.set()
                return True
            self._changed.clear()
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), remaining)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._coordinator._forget(self)
        self._changed.set()
        self._taken.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
