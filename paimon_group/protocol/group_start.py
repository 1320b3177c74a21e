"""The group's one start (``groups/<group>/start``;
:class:`~paimon_group.protocol.records.GroupStart`).

Resolved once, by the first member that needs a start for a shard without a
position, and created if absent: a concurrent creator's wins and is used
instead, so every shard of a group starts from the same snapshot (see the
record's docstring for why that matters on bucket-unaware tables).

Under ``--on-data-loss skip``, when the full scan of a bucket-unaware
table's start expired before a shard delivered it, the start moves forward
once for the whole group (:func:`move_group_start`, a compare-and-set: a
concurrent mover's wins and is used instead), and every shard scans the
moved start in full (docs/operations.md, "Time to data loss").

Example::

    start = await group_start(client, resolve)   # resolve() only if none is stored
    moved = await move_group_start(client, start.moves, proposed)
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from coordinators.errors import CoordinatorUnavailable
from coordinators.protocol import Check, Put
from paimon_group.protocol.group import GroupClient
from paimon_group.protocol.records import GroupStart

__all__ = ["group_start", "move_group_start", "read_group_start"]


async def read_group_start(client: GroupClient, table: int | None = None) -> GroupStart | None:
    """The group's stored start, or None. ``table``: the position in a group of
    several tables' map of the table whose start is read (None: the group's
    one table; :meth:`~paimon_group.protocol.names.GroupKeys.start_of`)."""
    entry = await client.coordinator.get(client.keys.start_of(table))
    return GroupStart.decode(entry.key, entry.value) if entry else None


async def group_start(client: GroupClient,
                      resolve: Callable[[], Awaitable[GroupStart]],
                      table: int | None = None) -> GroupStart:
    """The stored start, else ``resolve()``'s, created if absent (a concurrent
    creator's wins, and is returned instead). ``table``: as :func:`read_group_start`."""
    stored = await read_group_start(client, table)
    if stored is not None:
        return stored
    proposed = await resolve()
    if await client.coordinator.create(client.keys.start_of(table),
                                       proposed.encode()) is not None:
        return proposed
    stored = await read_group_start(client, table)
    if stored is None:  # created and deleted meanwhile (the group was deleted)
        raise CoordinatorUnavailable(f"group {client.group!r}: its start vanished; retry",
                                     retriable=True)
    return stored


async def move_group_start(client: GroupClient, moves: int, proposed: GroupStart,
                           table: int | None = None) -> GroupStart:
    """Move the group's start forward to ``proposed`` (whose ``moves`` is
    ``moves + 1``) if the stored one is still the one of ``moves`` moves (or
    none is stored); the stored start afterwards: ``proposed``, or the start a
    concurrent mover stored first (then ``proposed`` is dropped). One
    compare-and-set on the start's version: of two members that find the
    start expired at once, one moves it and both use that move. ``table``: as
    :func:`read_group_start`."""
    key = client.keys.start_of(table)
    for _ in range(3):
        entry = await client.coordinator.get(key)
        stored = GroupStart.decode(entry.key, entry.value) if entry else None
        if stored is not None and stored.moves != moves:
            return stored  # moved already (or this member's start is older still)
        if entry is None:
            if await client.coordinator.create(key, proposed.encode()) is not None:
                return proposed
            continue
        if await client.coordinator.commit([Check.at_version(key, entry.version)],
                                           [Put(key, proposed.encode())]):
            return proposed
    raise CoordinatorUnavailable(f"group {client.group!r}: its start kept changing while it "
                                 "was moved; retry", retriable=True)
