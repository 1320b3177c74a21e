"""The group's one start (``groups/<group>/start``;
:class:`~paimon_group.protocol.records.GroupStart`).

Resolved once, by the first member that needs a start for a shard without a
position, and created if absent: a concurrent creator's wins and is used
instead, so every shard of a group starts from the same snapshot (see the
record's docstring for why that matters on bucket-unaware tables).

Example::

    start = await group_start(client, resolve)   # resolve() only if none is stored
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from coordinators.errors import CoordinatorUnavailable
from paimon_group.protocol.group import GroupClient
from paimon_group.protocol.records import GroupStart

__all__ = ["group_start", "read_group_start"]


async def read_group_start(client: GroupClient) -> GroupStart | None:
    """The group's stored start, or None."""
    entry = await client.coordinator.get(client.keys.start)
    return GroupStart.decode(entry.key, entry.value) if entry else None


async def group_start(client: GroupClient,
                      resolve: Callable[[], Awaitable[GroupStart]]) -> GroupStart:
    """The stored start, else ``resolve()``'s, created if absent (a concurrent
    creator's wins, and is returned instead)."""
    stored = await read_group_start(client)
    if stored is not None:
        return stored
    proposed = await resolve()
    if await client.coordinator.create(client.keys.start, proposed.encode()) is not None:
        return proposed
    stored = await read_group_start(client)
    if stored is None:  # created and deleted meanwhile (the group was deleted)
        raise CoordinatorUnavailable(f"group {client.group!r}: its start vanished; retry",
                                     retriable=True)
    return stored
