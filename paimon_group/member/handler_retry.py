"""The retries of a member's handler, and the member's decision to fail.

``run(handler)`` calls the handler again on a batch it raised on, with
backoff, up to ``max_handler_attempts`` calls. Once one batch has used them
all the member has decided to fail (:class:`~paimon_group.errors.HandlerFailed`),
and a :class:`HandlerRetries` makes that decision hold for every batch of the
run at once:

- no batch reaches the handler any more: :meth:`HandlerRetries.check`,
  called before every call, raises the first ``HandlerFailed``;
- a retry waiting out its backoff wakes at once (the policy's sleep ends when
  the decision is made) and stops without calling the handler again;
- a call already running in its thread is not interrupted: a batch it
  handles is committed as any other, one it raises on stops there.

So the member fails once the handler calls in flight when the first batch
gave up have returned, whatever the other shards' attempts and backoff.

Example::

    retries = HandlerRetries(policy, max_attempts=5)    # per run(handler)
    async for attempt in retries.for_batch(retry_if):   # per batch
        retries.check()                                 # the member failed: stop
        with attempt:
            ...                                         # one call of the handler
    ...
    retries.give_up(err, shard=0, snapshot=2)           # out of attempts: raises
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import NoReturn

import tenacity

from paimon_group.errors import HandlerFailed

__all__ = ["HandlerRetries"]


class HandlerRetries:
    """The retry policy of one ``run(handler)`` and its first ``HandlerFailed``."""

    def __init__(self, policy: tenacity.AsyncRetrying, max_attempts: int) -> None:
        self._policy = policy
        self._max_attempts = max_attempts
        self._failed: HandlerFailed | None = None
        self._gave_up = asyncio.Event()

    @property
    def failed(self) -> HandlerFailed | None:
        """The first batch's ``HandlerFailed``, once one gave up."""
        return self._failed

    def for_batch(self, retry: tenacity.retry_base) -> tenacity.AsyncRetrying:
        """The policy for one batch: retried as ``retry`` says, its backoff
        cut short once the member has decided to fail."""
        return self._policy.copy(retry=retry, sleep=self._sleep)

    def give_up(self, err: Exception, *, shard: int, snapshot: int) -> NoReturn:
        """The batch of ``shard`` at ``snapshot`` used up its attempts, the
        last raising ``err``: raise the member's ``HandlerFailed``, the first
        batch's that gave up (this one's if it is the first)."""
        if self._failed is None:
            failed = HandlerFailed(
                f"handler failed {self._max_attempts} times on shard {shard} snapshot "
                f"{snapshot}: {type(err).__name__}: {err}")
            failed.__cause__ = err
            self._failed = failed
            self._gave_up.set()
        raise self._failed

    def check(self) -> None:
        """Raise the first ``HandlerFailed`` if a batch gave up."""
        if self._failed is not None:
            raise self._failed

    async def _sleep(self, seconds: float) -> None:
        """The backoff between two calls: ``seconds``, or until a batch gives up."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._gave_up.wait()
