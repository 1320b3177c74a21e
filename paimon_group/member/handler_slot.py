"""A handler's slot in its step: one of the ``max_parallel_shards`` the
step's batches share, and the step's other handlers to wait for before a
batch's output is committed.

The read loop bounds how many handlers run at once (their reads and writes
take the CPU). What a batch waits for once its handler returned, a sink's
target commit, is not handler work and must not keep the step's next shard
from starting: with 8 shards and 2 slots, a slot held through each commit
made the step four commit intervals long. So the batch's deliverer gives its
slot back when the handler returns, and takes it again for a retry.

And a sink commits at most once per interval: the batches of one step share
a commit only if they are sealed together. A batch whose handler returned
therefore waits (:meth:`HandlerSlot.handled`) until every other batch of the
step is handled too (its handler returned, or its delivery ended: failed,
revoked, its files gone), then seals its output; the step's batches reach
the sink at once, and the step costs one target commit. The step's
positions are committed together anyway (the step's commit lane), so the
wait delays no position.

Example::

    step = StepHandlers(len(deliveries))          # the read loop, per step
    async with HandlerSlot(gate, step) as slot:   # per batch
        await process(batch, slot)                # the handler holds the slot;
                                                  # await slot.handled(), then seal
"""

from __future__ import annotations

import asyncio

__all__ = ["HandlerSlot", "StepHandlers"]


class StepHandlers:
    """The handlers of one step: open once each of ``expected`` batches is
    handled."""

    def __init__(self, expected: int) -> None:
        self._left = expected
        self._all = asyncio.Event()
        if expected <= 0:
            self._all.set()

    def arrive(self) -> None:
        """One batch of the step is handled (called once per batch)."""
        self._left -= 1
        if self._left <= 0:
            self._all.set()

    async def wait(self) -> None:
        await self._all.wait()


class HandlerSlot:
    """One slot of ``gate`` for one batch of ``step``, held from ``async
    with`` until released; the batch arrives at ``step`` once handled or
    when the slot's ``async with`` ends, whichever is first."""

    def __init__(self, gate: asyncio.Semaphore, step: StepHandlers | None = None) -> None:
        self._gate = gate
        self._step = step
        self._held = False
        self._arrived = False

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

    async def handled(self) -> None:
        """The handler returned: give the slot back, and wait until every
        batch of the step is handled (at once without a step)."""
        self.release()
        self._arrive()
        if self._step is not None:
            await self._step.wait()

    def _arrive(self) -> None:
        if not self._arrived:
            self._arrived = True
            if self._step is not None:
                self._step.arrive()

    async def __aenter__(self) -> HandlerSlot:
        await self.hold()
        return self

    def close(self) -> None:
        """The batch's delivery ended: the slot back, the batch arrived."""
        self.release()
        self._arrive()

    async def __aexit__(self, *exc: object) -> None:
        self.close()
