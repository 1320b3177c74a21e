"""The table head's key, ``groups/<group>/table/head``: read and watched by
every member, written by the leader alone.

What the record says (the latest snapshot, the beat, the snapshot's text,
the table's identity) and when it is published are the member's
(:mod:`paimon_group.member.head`); this is the key's only writer. A
publication is one commit guarded by the publisher's leader epoch: a deposed
leader cannot publish (its check fails). The head is a hint, never a
position: no position moves by it.

Example (in-memory backend)::

    import asyncio
    from coordinators import open_coordinator
    from paimon_group.protocol.group import GroupClient
    from paimon_group.protocol.table_head import TableHead

    async def main() -> None:
        async with open_coordinator("memory://head-doc") as coord:
            group = GroupClient(coord, "orders")
            epoch = await group.try_lead("m1")
            assert epoch is not None
            head = TableHead(coord, group.keys)
            assert await head.publish(epoch, b'{"latest": 4, "beat": 1}')
            assert await head.read() == b'{"latest": 4, "beat": 1}'

    asyncio.run(main())
"""

from __future__ import annotations

from coordinators.protocol import Check, Coordinator, Put, Watch
from paimon_group.protocol.names import GroupKeys

__all__ = ["TableHead"]


class TableHead:
    """The head key of one group over one coordinator session."""

    def __init__(self, coordinator: Coordinator, keys: GroupKeys) -> None:
        self._coord, self._keys = coordinator, keys

    def watch(self) -> Watch:
        """A watch of the head's directory (it changes at each publication)."""
        return self._coord.watch(self._keys.head_dir)

    async def read(self) -> bytes | None:
        """The published record's bytes, or None when none is published."""
        entry = await self._coord.get(self._keys.head)
        return None if entry is None else entry.value

    async def publish(self, leader_epoch: int, value: bytes) -> bool:
        """Write ``value`` if the leader key still has ``leader_epoch``, in
        the same commit; False when we no longer lead."""
        return await self._coord.commit([Check.created_at(self._keys.leader, leader_epoch)],
                                        [Put(self._keys.head, value)])
