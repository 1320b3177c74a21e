"""The control loop's watches, each open only while it can matter.

* ``group``: the leader and assignment keys, the only children of the group's
  directory that change while it runs. Every member, always.
* ``members``: the member list. The leader's alone: it computes the
  assignment from it; a follower learns the outcome from the group watch.
* ``owners``: the owner keys. Only while the member waits to acquire a shard:
  its previous owner's release wakes it.

Why not all three, always: in a group of 200 members x 2,048 shards every
owner change of a rebalance, every commit's position and every member's
arrival went to every member's open watches (etcd streams a directory's whole
key range: 8,000 watch responses per rebalance, each parsed by the member's
event loop while the members that had to release waited behind it). Closed,
they cost the server and the member nothing.

A watch reports the changes after it was opened. One opened between a round
and the next wait may have missed a change made after the round's read and
before the opening, so :meth:`ControlWatches.update` returns the names of the
watches it opened, and the caller takes them as fired: the round it runs then
re-reads what they watch, after they were opened. (etcd's watch starts at the
revision after the last read and would report it anyway; the others may not.)

Waiting (:meth:`ControlWatches.wait`) never loses a change: the waiters that
lost the race are cancelled and then awaited, and a waiter whose change had
arrived when the cancel reached it still finishes its ``wait()``, which
clears the watch's flag; its result counts (dropped, the change would be
seen only at the next tick). The local flag is cleared only when its waiter saw it.

Example::

    watches = ControlWatches.of_group(coord, GroupKeys("g"))
    fired = await watches.update(leading=False, acquiring=False) or \\
        await watches.wait(wake, timeout=2.5)
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from coordinators.protocol import Coordinator, Watch
from paimon_group.protocol.names import GroupKeys

NAMES = ("group", "members", "owners")


async def first_of(waiters: list[asyncio.Future[Any]], timeout: float) -> None:
    """Wait until one of ``waiters`` is done or ``timeout``; then cancel the
    others and await them all, so that each has finished (a waiter whose
    result was ready when its cancel came still completes: its result counts)."""
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)


class ControlWatches:
    """The open watches by name (see the module docstring); ``opener`` makes
    a new watch for a name."""

    def __init__(self, opener: Callable[[str], Watch]) -> None:
        self._opener = opener
        self._open: dict[str, Watch] = {"group": opener("group")}

    @classmethod
    def of_group(cls, coord: Coordinator, keys: GroupKeys) -> ControlWatches:
        def opener(name: str) -> Watch:
            if name == "group":
                return coord.watch(keys.dir, children=(
                    keys.last_segment(keys.leader), keys.last_segment(keys.assignment)))
            if name == "members":
                return coord.watch(keys.members_dir)
            # Owner keys are created and deleted, never updated.
            return coord.watch(keys.owners_dir, values=False)

        return cls(opener)

    @property
    def names(self) -> tuple[str, ...]:
        """The names of the open watches, in :data:`NAMES` order."""
        return tuple(name for name in NAMES if name in self._open)

    async def update(self, *, leading: bool, acquiring: bool) -> set[str]:
        """Open the members watch while ``leading`` and the owners watch while
        ``acquiring``, close them otherwise; the names of the watches opened
        now (the caller re-reads what they watch)."""
        opened: set[str] = set()
        for name, wanted in (("members", leading), ("owners", acquiring)):
            if wanted and name not in self._open:
                self._open[name] = self._opener(name)
                opened.add(name)
            elif not wanted and name in self._open:
                watch = self._open.pop(name)
                with contextlib.suppress(Exception):
                    await watch.close()
        return opened

    async def wait(self, wake: asyncio.Event, timeout: float) -> set[str]:
        """Which open watches fired, with "local" if ``wake`` was set, or
        ``{"timeout"}``."""
        watched = [(name, self._open[name]) for name in self.names]
        waiters = [asyncio.ensure_future(w.wait(timeout)) for _, w in watched]
        local = asyncio.ensure_future(wake.wait())
        await first_of([*waiters, local], timeout)
        fired = {name for (name, _), w in zip(watched, waiters, strict=True)
                 if not w.cancelled() and w.exception() is None and w.result()}
        if not local.cancelled() and local.exception() is None:
            wake.clear()
            fired.add("local")
        return fired or {"timeout"}

    async def close(self) -> None:
        watches, self._open = list(self._open.values()), {}
        for watch in watches:
            with contextlib.suppress(Exception):
                await watch.close()
