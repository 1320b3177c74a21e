"""Time to data loss: how long until a lagging shard's oldest unread snapshot can expire.

Paimon expires snapshots when a writer commits (``ExpireSnapshotsImpl``, run
after each commit unless the table is ``write-only``). With the table's
options ``snapshot.num-retained.min`` (default 10), ``snapshot.num-retained.max``
(default unbounded) and ``snapshot.time-retained`` (default 1 h), a commit
expires snapshot ``s`` when

* at least ``num-retained.max`` snapshots are newer than ``s``, or
* at least ``num-retained.min`` snapshots are newer than ``s`` **and** ``s``
  was committed more than ``time-retained`` ago,

but never ``s`` at or after the smallest ``nextSnapshot`` of the table's
consumer files (every consumer id, not only this group's). A consumer file
whose modification time is older than ``consumer.expiration-time`` (unset by
default: consumers never expire) is deleted by the same commit first, so it
protects only until then. (``snapshot.expire.limit`` caps how many snapshots
one commit expires: it only delays expiry, and is ignored here.)

The estimate, for a shard whose next unread snapshot is ``n`` (the latest
being ``L``, ``L - n`` snapshots newer than ``n``, ``n`` committed ``a``
seconds ago), with the table written at ``w`` snapshots/s and the shard
reading at ``r`` snapshots/s (both measured, :class:`RateMeter`)::

    newer(t) = (L - n) + (w - r) t          # snapshots newer than the oldest unread
    age(t)   = a + (1 - r / w) t            # its age: each read moves it 1/w s forward
    expiry   = min(t: newer >= max,  max(t: newer >= min,  t: age > time-retained))
    loss     = max(expiry, protection)      # consumer files hold it until then

``protection`` is infinite while a consumer file at or below ``n`` exists and
cannot expire (no ``consumer.expiration-time``), the remaining life of the
youngest such file otherwise (a shard's own file is rewritten by each commit
that moves it, so this is the loss if the shard commits nothing more), and 0
without one (a consumer file ahead of the real position protects nothing).
No commits (``w = 0``): nothing expires. The result is an estimate (rates
change); a value of 0 means the next commit may expire the snapshot.

Example::

    retention = Retention.of_options(table.table.table_schema.options)
    est = estimate(retention, position=40, latest=90, oldest_age_s=3000.0,
                   write_rate=0.05, read_rate=0.0, protection_s=0.0)
    print(est.seconds, est.why)
"""

from __future__ import annotations

import json
import math
import time
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from pypaimon.common.time_utils import parse_duration

NUM_RETAINED_MIN = "snapshot.num-retained.min"
NUM_RETAINED_MAX = "snapshot.num-retained.max"
TIME_RETAINED = "snapshot.time-retained"
CONSUMER_EXPIRATION = "consumer.expiration-time"
WRITE_ONLY = "write-only"

DEFAULT_NUM_RETAINED_MIN = 10
DEFAULT_TIME_RETAINED_S = 3600.0


@dataclass(frozen=True)
class Retention:
    """The table options that decide when a snapshot expires (Paimon's defaults)."""

    num_retained_min: int = DEFAULT_NUM_RETAINED_MIN
    num_retained_max: int | None = None
    time_retained_s: float = DEFAULT_TIME_RETAINED_S
    consumer_expiration_s: float | None = None
    expires: bool = True

    @classmethod
    def of_options(cls, options: Mapping[str, Any]) -> Retention:
        """From a table's options (``table_schema.options``); a value that does
        not parse keeps Paimon's default (the writer would refuse it anyway)."""
        def number(key: str) -> int | None:
            try:
                return int(str(options[key]).strip())
            except (KeyError, ValueError):
                return None

        def seconds(key: str) -> float | None:
            try:
                return float(parse_duration(str(options[key]))) / 1000.0
            except (KeyError, ValueError):
                return None

        retain_min = number(NUM_RETAINED_MIN)
        time_retained = seconds(TIME_RETAINED)
        return cls(
            num_retained_min=DEFAULT_NUM_RETAINED_MIN if retain_min is None else retain_min,
            num_retained_max=number(NUM_RETAINED_MAX),
            time_retained_s=DEFAULT_TIME_RETAINED_S if time_retained is None else time_retained,
            consumer_expiration_s=seconds(CONSUMER_EXPIRATION),
            expires=str(options.get(WRITE_ONLY, "false")).strip().lower() != "true",
        )

    @classmethod
    def of_table(cls, pypaimon_table: Any) -> Retention:
        return cls.of_options(dict(getattr(pypaimon_table.table_schema, "options", {}) or {}))


@dataclass(frozen=True)
class ConsumerFile:
    """One consumer file of the table: its id, ``nextSnapshot`` and age (seconds
    since it was last written)."""

    consumer_id: str
    next_snapshot: int
    age_s: float


def _mtime_s(status: Any) -> float | None:
    mtime = getattr(status, "mtime", None)
    if mtime is None:
        return None
    if hasattr(mtime, "timestamp"):
        return float(mtime.timestamp())
    return float(mtime)


def consumer_files(file_io: Any, table_path: str, *, now: float | None = None
                   ) -> list[ConsumerFile]:
    """Every consumer file of the table (any consumer id), as Paimon's
    expiration sees them: one listing and one read per file."""
    directory = f"{table_path.rstrip('/')}/consumer"
    if not file_io.exists(directory):
        return []
    now = time.time() if now is None else now
    out: list[ConsumerFile] = []
    for status in file_io.list_status(directory) or []:
        name = str(getattr(status, "base_name", "") or str(status.path).rstrip("/")
                   .split("/")[-1])
        if not name.startswith("consumer-"):
            continue
        try:
            data = json.loads(file_io.read_file_utf8(f"{directory}/{name}"))
            next_snapshot = int(data["nextSnapshot"])
        except (OSError, ValueError, KeyError, TypeError):
            continue  # half-written or gone: Paimon's expiration skips it too
        mtime = _mtime_s(status)
        out.append(ConsumerFile(name.removeprefix("consumer-"), next_snapshot,
                                0.0 if mtime is None else max(0.0, now - mtime)))
    return out


def protection_s(consumers: Iterable[ConsumerFile], position: int,
                 retention: Retention) -> float:
    """How long the consumer files keep snapshot ``position`` from expiring:
    ``inf`` while one that protects it cannot expire, 0 without one, else
    the remaining life of the youngest protecting file (a shard's own file is
    rewritten at each commit that moves it: a shard that commits keeps its
    protection; one whose handler stalls longer than
    ``consumer.expiration-time`` loses it)."""
    protecting = [c for c in consumers if c.next_snapshot <= position]
    if not protecting:
        return 0.0
    ttl = retention.consumer_expiration_s
    if ttl is None:
        return math.inf
    return max(0.0, max(ttl - c.age_s for c in protecting))


@dataclass(frozen=True)
class DataLossEstimate:
    """Seconds until the shard's oldest unread snapshot can expire (None: no
    loss foreseen), and why, in words: ``caught up``, ``protected``
    (consumer files), ``no commits``, ``reading faster than written``,
    ``at risk``, ``expired`` (0: already lost)."""

    seconds: float | None
    why: str

    def to_dict(self) -> dict[str, Any]:
        return {"time_to_data_loss_s": None if self.seconds is None else round(self.seconds, 1),
                "data_loss": self.why}


NONE_UNREAD = DataLossEstimate(None, "caught up")
LOST = DataLossEstimate(0.0, "expired")


def _reach(target: float, now_value: float, speed: float) -> float:
    """Seconds until a value growing at ``speed`` reaches ``target``."""
    if now_value >= target:
        return 0.0
    return (target - now_value) / speed if speed > 0 else math.inf


def estimate(retention: Retention, *, position: int, latest: int, oldest_age_s: float,
             write_rate: float, read_rate: float, protection_s: float) -> DataLossEstimate:
    """The time to data loss of a shard at ``position`` (see the module docstring)."""
    if position > latest:
        return NONE_UNREAD
    if protection_s == math.inf:
        return DataLossEstimate(None, "protected")
    if not retention.expires or write_rate <= 0:
        return DataLossEstimate(None, "no commits")
    newer = float(latest - position)
    growth = write_rate - read_rate
    by_max = (math.inf if retention.num_retained_max is None
              else _reach(retention.num_retained_max, newer, growth))
    by_min = _reach(retention.num_retained_min, newer, growth)
    by_age = _reach(retention.time_retained_s, oldest_age_s, 1.0 - read_rate / write_rate)
    expiry = min(by_max, max(by_min, by_age))
    if expiry == math.inf:
        return DataLossEstimate(None, "reading faster than written")
    return DataLossEstimate(max(expiry, protection_s), "at risk")


def earliest_loss(estimates: Iterable[DataLossEstimate]) -> DataLossEstimate:
    """The group's (or member's) estimate: its slowest shard's."""
    found = list(estimates)
    timed = [e for e in found if e.seconds is not None]
    if timed:
        return min(timed, key=lambda e: e.seconds or 0.0)
    for why in ("protected", "reading faster than written", "no commits"):
        if any(e.why == why for e in found):
            return DataLossEstimate(None, why)
    return NONE_UNREAD


class RateMeter:
    """Snapshots per second of a growing id (a position) over the last
    ``window_s`` seconds of samples, and no more than its largest move per
    time since it last moved: a shard that stalls after reading as fast as
    the table is written does not pass for a fast reader for a whole window
    (the estimate errs short while it stalls)."""

    def __init__(self, window_s: float = 60.0) -> None:
        self.window_s = window_s
        self._samples: deque[tuple[float, int]] = deque()
        self._moved_at: float | None = None

    def add(self, value: int, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if self._samples and value < self._samples[-1][1]:
            self._samples.clear()  # moved back (a reset): start over
        if self._samples and value != self._samples[-1][1]:
            self._moved_at = now
        self._samples.append((now, value))
        while len(self._samples) > 2 and now - self._samples[1][0] >= self.window_s:
            self._samples.popleft()

    def rate(self) -> float:
        if len(self._samples) < 2:
            return 0.0
        (t0, v0), (t1, v1) = self._samples[0], self._samples[-1]
        if t1 <= t0:
            return 0.0
        window = (v1 - v0) / (t1 - t0)
        if self._moved_at is None or t1 <= self._moved_at:
            return window
        largest = max((b[1] - a[1] for a, b in pairwise(self._samples)), default=0)
        return min(window, largest / (t1 - self._moved_at))
