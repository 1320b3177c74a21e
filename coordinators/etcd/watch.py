"""The etcd watch: a prefix watch stream that remembers the revision it has seen."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Collection
from typing import Protocol

import grpc  # type: ignore[import-untyped]
import grpc.aio  # type: ignore[import-untyped]
from aetcd import rpc

from coordinators.errors import CoordinatorError
from coordinators.etcd.channel import AioConnection, Metadata, Stubs
from coordinators.etcd.errors import Failure, classify
from coordinators.protocol import Watch

log = logging.getLogger("coordinators.etcd")  # the backend's one logger

# -- watch -------------------------------------------------------------------


class _StreamBroken(Exception):
    pass


class _Compacted(Exception):
    pass


class _Host(Protocol):
    """What a watch needs of its coordinator."""

    _conn: AioConnection
    _watches: set[EtcdWatch]
    _sleep: Callable[[float], Awaitable[None]]

    def _full(self, key: str) -> bytes: ...

    async def _current_revision(self) -> int: ...


class EtcdWatch(Watch):
    """A level-triggered watch of the direct children of one directory.

    A background task holds an etcd watch stream from the revision after
    the last one this coordinator had seen when the watch was created, so no
    change after creation can be missed. It remembers the next revision to
    watch from; when the stream breaks it re-arms from there (and reports a
    change); when that revision was compacted it re-arms from a fresh read
    (and reports a change), never acting on a stale view.

    Example::

        async with coord.watch("groups/g/members/") as w:
            members = await coord.list("groups/g/members/")
            while not await w.wait(timeout=1.0):
                pass
            members = await coord.list("groups/g/members/")  # re-read
    """

    def __init__(self, coordinator: _Host, directory: str, start_revision: int, *,
                 children: Collection[str] | None = None) -> None:
        self._coordinator = coordinator
        self._directory = directory
        self._key = coordinator._full(directory)
        # Only these children wake (None: every direct child). The stream
        # then covers the key range from the first to the last of them, not
        # the whole directory: a group's directory holds every owner key and
        # position, whose changes etcd would otherwise send to every member.
        self._children = (None if children is None else
                          frozenset(name.encode() for name in children))
        if self._children:
            self._range = (self._key + min(self._children), self._key + max(self._children)
                           + b"\0")
        else:
            self._range = (self._key, prefix_end(self._key))
        self._next_revision = start_revision
        self._changed = asyncio.Event()
        self._closed = False
        self._armed = False
        self._broken = False
        self.rearms = 0  # observable by tests
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name=f"etcd-watch-{directory}"
        )

    @property
    def next_revision(self) -> int:
        """The revision the stream delivers next: every event below it was seen."""
        return self._next_revision

    async def wait(self, timeout: float | None = None) -> bool:
        if self._closed:
            raise CoordinatorError(f"watch of {self._directory!r} is closed")
        try:
            await asyncio.wait_for(self._changed.wait(), timeout)
        except TimeoutError:
            return False
        if self._closed:
            raise CoordinatorError(f"watch of {self._directory!r} is closed")
        self._changed.clear()
        return True

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._changed.set()  # wake waiters; they raise "closed"
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task
        self._coordinator._watches.discard(self)

    async def _run(self) -> None:
        failures = 0
        while not self._closed:
            stubs = None
            metadata: Metadata = None
            try:
                stubs = self._coordinator._conn.stubs()
                metadata = await self._coordinator._conn.metadata(stubs)
                await self._stream(stubs, metadata)
                raise _StreamBroken("etcd closed the watch stream")
            except asyncio.CancelledError:
                raise
            except _Compacted:
                # Re-arm from a fresh read: report a change (the caller
                # re-reads) and watch from after that read.
                try:
                    revision = await self._coordinator._current_revision()
                except CoordinatorError as err:
                    log.debug("etcd watch of %r: re-read failed: %s", self._directory, err)
                    failures += 1
                    await self._backoff(failures)
                    continue
                self._next_revision = revision + 1
                self.rearms += 1
                self._changed.set()
            except Exception as err:
                if self._closed:
                    return
                self._broken = True
                if stubs is not None:
                    self._coordinator._conn.recover(stubs, metadata, err)
                if classify(err) is not Failure.TOKEN:
                    # A stream that was armed broke: start the backoff afresh.
                    failures = 1 if self._armed else failures + 1
                    log.debug("etcd watch of %r broken: %s", self._directory, err)
                    await self._backoff(failures)

    async def _backoff(self, failures: int) -> None:
        await self._coordinator._sleep(min(1.0, 0.05 * 2 ** min(failures, 6)))

    async def _stream(self, stubs: Stubs, metadata: Metadata) -> None:
        """Hold one watch stream until it ends (EOF, error, compaction)."""
        self._armed = False
        call = stubs.watch.Watch(metadata=metadata)
        try:
            await call.write(
                rpc.WatchRequest(
                    create_request=rpc.WatchCreateRequest(
                        key=self._range[0],
                        range_end=self._range[1],
                        start_revision=self._next_revision,
                        progress_notify=True,
                    )
                )
            )
            depth = len(self._key)
            while True:
                response = await call.read()
                if response is grpc.aio.EOF:
                    return
                if response.compact_revision:
                    raise _Compacted()
                if response.canceled:
                    raise _StreamBroken(f"watch canceled by etcd: {response.cancel_reason}")
                if response.created:
                    self._armed = True
                    if self._broken:
                        # Re-armed after a break: nothing was missed (we
                        # resume from the next revision) but say so anyway.
                        self._broken = False
                        self.rearms += 1
                        self._changed.set()
                changed = False
                # Events below this were delivered already (a stream re-armed
                # from _next_revision never repeats them; this guards anyway).
                floor = self._next_revision
                for event in response.events:
                    revision = int(event.kv.mod_revision)
                    if revision < floor:
                        continue
                    self._next_revision = max(self._next_revision, revision + 1)
                    # Deeper keys (``dir/sub/x``) are in the watched range but
                    # are not children: they advance the revision, never wake.
                    name = event.kv.key[depth:]
                    if b"/" not in name and (self._children is None or name in self._children):
                        changed = True
                if not response.events and not response.created and response.header.revision:
                    # Progress notification: every event up to here was sent.
                    self._next_revision = max(self._next_revision, response.header.revision + 1)
                if changed:
                    self._changed.set()
        finally:
            call.cancel()


def prefix_end(prefix: bytes) -> bytes:
    """The range end covering every key starting with ``prefix``."""
    data = bytearray(prefix)
    for i in reversed(range(len(data))):
        if data[i] < 0xFF:
            data[i] += 1
            return bytes(data[: i + 1])
    return b"\0"
