"""The progress line: what a running member did in the last few seconds.

Every ``interval_s`` (``--progress-interval-s``, default 5) a member logs at
INFO one line with the batches and rows its handler took since the previous
line, the row rate, the shards it owns and its lag (unread snapshots summed
over those shards)::

    progress: 12 batches, 3400 rows in 5 s (680 rows/s); shards [0, 1]; lag 0 snapshots

An idle member that is caught up stays quiet (no line without a batch or a
lag). Each delivered batch is logged at DEBUG by the member itself.

Lag is computed as the metrics compute it (:class:`~paimon_group.ops.lag.OwnedLag`, in a
worker thread: it reads snapshot files), at most once per line.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Protocol

from paimon_group.ops.lag import LagSource, OwnedLag

log = logging.getLogger("paimon_group.progress")

DEFAULT_INTERVAL_S = 5.0


def progress_line(batches: int, rows: int, seconds: float, shards: list[int],
                  lag: int | None) -> str:
    rate = rows / seconds if seconds > 0 else 0.0
    lag_text = "unknown" if lag is None else f"{lag} snapshots"
    return (f"progress: {batches} batches, {rows} rows in {seconds:.0f} s "
            f"({rate:.0f} rows/s); shards {shards}; lag {lag_text}")


class Counts(Protocol):
    @property
    def batches(self) -> int: ...

    @property
    def rows(self) -> int: ...


class ProgressSource(LagSource, Protocol):
    """What the progress line reads of a member (public attributes only)."""

    @property
    def group_name(self) -> str: ...

    @property
    def member_id(self) -> str: ...

    @property
    def stats(self) -> Counts: ...


async def report_progress(member: ProgressSource,
                          interval_s: float = DEFAULT_INTERVAL_S) -> None:
    """Log a progress line every ``interval_s`` until cancelled."""
    lag_of = OwnedLag(member, refresh_s=0.0)
    batches, rows, since = member.stats.batches, member.stats.rows, time.monotonic()
    while True:
        await asyncio.sleep(interval_s)
        try:
            lag = await asyncio.to_thread(lag_of.owned_total)
        except Exception as err:  # a log line never stops the member
            log.debug("lag not computed: %s", err)
            lag = None
        now = time.monotonic()
        new_batches = member.stats.batches - batches
        new_rows = member.stats.rows - rows
        if new_batches or lag:
            log.info(progress_line(new_batches, new_rows, now - since,
                                   sorted(member.owned_shards), lag),
                     extra={"group": member.group_name, "member": member.member_id})
        batches, rows, since = member.stats.batches, member.stats.rows, now
