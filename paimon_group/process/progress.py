"""The progress line: what a running member did in the last few seconds.

Every ``interval_s`` (``--progress-interval-s``, default 5) a member logs at
INFO one line with the batches and rows its handler took since the previous
line, the row rate, the shards it owns and its lag (unread snapshots summed
over those shards)::

    progress: 12 batches, 3400 rows in 5 s (680 rows/s); shards [0, 1]; lag 0 snapshots

A lagging member adds the rows waiting (from the manifests of its unread
snapshots, ``>=`` beyond the last 20), the lag's age and the time to data
loss of its slowest shard (:mod:`paimon_group.ops.retention`)::

    progress: 1 batches, 20 rows in 5 s (4 rows/s); shards [0, 1]; lag 37 snapshots,
    1200 rows, 95 s; data loss in 4 m 10 s (shard 1)

(one line), ``data loss: protected`` while consumer files protect its
snapshots for good. An idle member that is caught up stays quiet (no line without a batch or a
lag). Each delivered batch is logged at DEBUG by the member itself.

Lag is computed as the metrics compute it (:class:`~paimon_group.ops.lag.OwnedLag`, in a
worker thread: it reads snapshot files), at most once per line.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Protocol

from paimon_group.ops.lag import LagSource, OwnedLag, ShardLag
from paimon_group.ops.retention import earliest_loss

log = logging.getLogger("paimon_group.progress")

DEFAULT_INTERVAL_S = 5.0


def duration_text(seconds: float) -> str:
    """``4 m 10 s``, ``2 h 5 m``, ``12 s``."""
    s = int(max(0.0, seconds))
    if s >= 3600:
        return f"{s // 3600} h {s % 3600 // 60} m"
    if s >= 60:
        return f"{s // 60} m {s % 60} s"
    return f"{s} s"


def loss_text(shards: Mapping[int, ShardLag], owned: list[int]) -> str:
    """``, 1200 rows, 95 s; data loss in 4 m 10 s (shard 1)`` for the owned
    lagging shards, or "" when none lags."""
    lagging = {s: x for s, x in shards.items() if s in owned and x.lag_snapshots}
    if not lagging:
        return ""
    oldest = max((x.lag_seconds or 0.0) for x in lagging.values())
    rows = sum(x.unread_rows or 0 for x in lagging.values())
    at_least = "" if all(x.unread_rows_complete for x in lagging.values()) else ">= "
    lag = f", {at_least}{rows} rows, {oldest:.0f} s"
    loss = earliest_loss(x.data_loss for x in lagging.values())
    if loss.seconds is None:
        return f"{lag}; data loss: {loss.why}"
    slowest = min(s for s, x in lagging.items() if x.data_loss.seconds == loss.seconds)
    when = "now" if loss.why == "expired" else f"in {duration_text(loss.seconds)}"
    return f"{lag}; data loss {when} (shard {slowest})"


def progress_line(batches: int, rows: int, seconds: float, shards: list[int],
                  lag: int | None, loss: str = "") -> str:
    rate = rows / seconds if seconds > 0 else 0.0
    lag_text = "unknown" if lag is None else f"{lag} snapshots"
    return (f"progress: {batches} batches, {rows} rows in {seconds:.0f} s "
            f"({rate:.0f} rows/s); shards {shards}; lag {lag_text}{loss}")


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
            owned = sorted(member.owned_shards)
            log.info(progress_line(new_batches, new_rows, now - since, owned, lag,
                                   loss_text(lag_of.shards(), owned) if lag else ""),
                     extra={"group": member.group_name, "member": member.member_id})
        batches, rows, since = member.stats.batches, member.stats.rows, now
