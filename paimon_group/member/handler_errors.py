"""The log of a raising handler: its traceback once, then one line per attempt.

A handler that keeps failing is retried (``max_handler_attempts`` per batch,
with backoff) on every shard handled at once, until one batch has used up its
attempts (:mod:`paimon_group.member.handler_retry`), so the same error comes
back many times. The first time an error is seen (its type and the line that raised it)
it is logged with its traceback; every later attempt with the same error is
one line naming it, the attempt and the batch.

Example::

    errors = HandlerErrors(max_attempts=5)
    errors.raised(err, shard=0, snapshot=2, attempt=1)  # WARNING with the traceback
    errors.raised(err, shard=1, snapshot=2, attempt=1)  # one line
"""

from __future__ import annotations

import logging
import traceback

log = logging.getLogger("paimon_group.member")

# Different errors remembered for their traceback; beyond these, every new
# kind of error is logged with its traceback each time (memory stays bounded).
MAX_REMEMBERED = 64

ErrorKey = tuple[str, str, int | None]


class HandlerErrors:
    """Which handler errors were already logged with their traceback."""

    def __init__(self, max_attempts: int) -> None:
        self.max_attempts = max_attempts
        self._seen: set[ErrorKey] = set()

    def raised(self, err: BaseException, *, shard: int, snapshot: int, attempt: int) -> None:
        """Log one failed call of the handler (WARNING)."""
        key = _key(err)
        first = key not in self._seen
        if first and len(self._seen) < MAX_REMEMBERED:
            self._seen.add(key)
        text = " ".join(f"{type(err).__name__}: {err}".split())
        log.warning("handler raised on shard %d snapshot %d (attempt %d of %d): %s%s",
                    shard, snapshot, attempt, self.max_attempts, text,
                    "" if first else " (traceback above)", exc_info=err if first else None)


def _key(err: BaseException) -> ErrorKey:
    """The error's type and the innermost line of its traceback."""
    frames = traceback.extract_tb(err.__traceback__)
    last = frames[-1] if frames else None
    return (type(err).__qualname__, last.filename if last else "", last.lineno if last else None)
