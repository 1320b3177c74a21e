"""The named retry policies, as tenacity data built once.

Each policy is a :class:`tenacity.AsyncRetrying` template: how long to wait
between attempts, and (where it is fixed) when to stop. A caller takes a copy
with what only it knows: the predicate of what to retry (a backend's own
exception types), a stop that depends on its options, and the ``sleep`` to
use, injectable so that tests need not wait::

    policy = retry.READS.copy(retry=tenacity.retry_if_exception_type(ConnectionLoss),
                              sleep=asyncio.sleep)
    value = await policy(read)

A retried operation must be safe to repeat: reads always are; a write only
when it certainly was not applied, or when it re-reads what it relied on.

==================  =============================================================
policy              used for
==================  =============================================================
``READS``           ZooKeeper reads that lost their connection mid-flight
``CONFLICTS``       ZooKeeper writes whose implicit guards failed: re-read, re-plan
``RPCS``            etcd calls (stop: the connect-timeout budget of each call)
``REJOIN``          a member re-joining after its session was lost
``OPENS``           opening a SQLite coordinator file another process is setting up
``SINK_RACES``      a Paimon sink's commit that another writer's took the snapshot id of
``handler(n, s)``   a user handler, ``n`` attempts with backoff from ``s`` seconds
==================  =============================================================
"""

from __future__ import annotations

from typing import Final

import tenacity

from coordinators.errors import PaimonGroupError

RETRIABLE: Final = tenacity.retry_if_exception(
    lambda err: isinstance(err, PaimonGroupError) and err.retriable
)
"""Retry the errors whose class (or instance) says trying again may succeed."""

READS: Final = tenacity.AsyncRetrying(
    stop=tenacity.stop_after_attempt(4),
    wait=tenacity.wait_random_exponential(multiplier=0.05, max=1.0),
    reraise=True,
)

CONFLICTS: Final = tenacity.AsyncRetrying(
    stop=tenacity.stop_after_attempt(30),
    wait=tenacity.wait_random_exponential(multiplier=0.002, max=0.25),
    reraise=True,
)

RPCS: Final = tenacity.AsyncRetrying(
    wait=tenacity.wait_random_exponential(multiplier=0.05, max=1.0),
    reraise=True,
)

OPENS: Final = tenacity.AsyncRetrying(
    retry=RETRIABLE,
    wait=tenacity.wait_random_exponential(multiplier=0.02, max=0.5),
    reraise=True,
)
"""Stopped by the caller's connect timeout (``asyncio.wait_for`` around it)."""

SINK_RACES: Final = tenacity.Retrying(
    stop=tenacity.stop_after_attempt(50),
    wait=tenacity.wait_random_exponential(multiplier=0.002, max=0.2),
    retry=tenacity.retry_if_result(lambda won: won is False),
)
"""Synchronous (the sink's committer is a thread); retried while an attempt
returns False (lost the race: judged again on the newer snapshot). Random
waits: without them two writers committing back to back took turns badly,
one losing 50 races in a row (``commit_interval_s=0``, 200 batches each)."""

REJOIN: Final = tenacity.AsyncRetrying(
    retry=RETRIABLE,
    wait=tenacity.wait_exponential(multiplier=0.2, max=5),
    reraise=True,
)


def handler(attempts: int, backoff_s: float) -> tenacity.AsyncRetrying:
    """At most ``attempts`` calls (at least one), waiting ``backoff_s`` doubled
    each time, at most 30 s, between them."""
    return tenacity.AsyncRetrying(
        stop=tenacity.stop_after_attempt(max(1, attempts)),
        wait=tenacity.wait_exponential(multiplier=backoff_s, max=30),
        reraise=True,
    )
