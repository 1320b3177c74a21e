"""A handler's slot: one of the ``max_parallel_shards`` a step's batches share.

The read loop bounds how many handlers run at once (their reads and writes
take the CPU); what a batch waits for once its handler returned (a sink's
target commit, held for the commit interval so that the step's batches share
one snapshot) is not handler work, and must not keep the step's next shard
from starting: with 8 shards and 2 slots, a slot held through each commit
made the step four commit intervals long. So the batch's deliverer releases
its slot when the handler returns (:meth:`HandlerSlot.release`) and takes it
again for a retry (:meth:`HandlerSlot.hold`).

Example::

    async with HandlerSlot(gate) as slot:    # the read loop
        await process(batch, slot)           # the handler runs holding it,
                                             # the sink's commit is awaited after release()
"""

from __future__ import annotations

import asyncio

__all__ = ["HandlerSlot"]


class HandlerSlot:
    """One slot of ``gate``, held from ``async with`` until released."""

    def __init__(self, gate: asyncio.Semaphore) -> None:
        self._gate = gate
        self._held = False

    @property
    def held(self) -> bool:
        return self._held

    async def hold(self) -> None:
        """Take the slot (again); at once if held."""
        if not self._held:
            await self._gate.acquire()
            self._held = True

    def release(self) -> None:
        """Give the slot back (the handler returned); idempotent."""
        if self._held:
            self._held = False
            self._gate.release()

    async def __aenter__(self) -> HandlerSlot:
        await self.hold()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.release()
