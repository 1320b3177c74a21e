"""Lag: how far shards are behind their table, from snapshot and manifest metadata.

One module for every reader of lag: ``describe`` and ``list``
(:class:`SnapshotFacts`), a member's ``/metrics`` and its progress line
(:class:`OwnedLag`).

Definitions (per shard with position ``n`` = next snapshot to read, and the
table's latest snapshot ``L``):

``lag_snapshots``
    ``max(0, L + 1 - n)``: snapshots committed but not yet read (null for a
    shard without a position: it has never started).
``lag_seconds``
    Age of the oldest unread snapshot: now minus the commit time of snapshot
    ``n``; 0 when nothing is unread. This is how far behind real time the
    shard is, whatever the write rate.
``unread_rows``
    An estimate of the rows waiting: the row counts, from the manifests, of
    the files the unread snapshots added in the shard's buckets (deltas, or
    changelogs for tables with a changelog producer; snapshots a follow-up
    read skips, such as compactions, count 0: the planner's own rule,
    :func:`~paimon_group.reading.steps.follow_up_scans`). Counted before merging, so
    an update counts once per write. At most ``max_snapshots`` unread
    snapshots are read; beyond that the value is a lower bound and
    ``unread_rows_complete`` is false.
``expired``
    ``n`` is older than the earliest retained snapshot: the shard cannot
    continue (it stops with ``SnapshotExpired``) until its position is reset.
``data_loss``
    The time to data loss (:mod:`paimon_group.ops.retention`): how long until
    snapshot ``n`` can expire, from the table's retention options, its
    consumer files, the write rate (recent snapshots' commit times) and the
    shard's read rate (measured by a running member; 0 where unknown, as in
    ``describe``: the estimate then assumes the shard stalls, a lower bound).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from paimon_group.ops.retention import (
    LOST,
    NONE_UNREAD,
    ConsumerFile,
    DataLossEstimate,
    RateMeter,
    Retention,
    consumer_files,
    earliest_loss,
    estimate,
    protection_s,
)
from paimon_group.protocol.sharding import Sharding, ShardRule
from paimon_group.reading.steps import follow_up_scans, increment_manifests
from paimon_group.reading.table import ShardedTable
from paimon_group.store.files import is_object_store
from paimon_group.store.handed_over import HandedOverFileIO

log = logging.getLogger("paimon_group.describe")

DEFAULT_MAX_SNAPSHOTS = 200
"""How many unread snapshots' manifests :class:`SnapshotFacts` reads at most."""

IN_FLIGHT_S = 10.0
"""A shard one snapshot behind for less than this is reading it: no time to
data loss is estimated for it (nor consumer files read)."""

CONSUMER_FILES_REFRESH_S = 15.0
"""How long the consumer files read for the time to data loss are reused (a
shard's file rewritten since is seen late: the estimate errs short)."""

WRITE_RATE_SNAPSHOTS = 20
"""The write rate is measured over the last this many snapshots (and the time
since the latest: a table no longer written has its rate fall)."""


@dataclass(frozen=True)
class ShardProgress:
    """How far one shard is behind the table."""

    lag_snapshots: int | None
    lag_seconds: float | None
    unread_rows: int | None
    unread_rows_complete: bool
    expired: bool
    data_loss: DataLossEstimate = NONE_UNREAD

    @staticmethod
    def unknown() -> ShardProgress:
        return ShardProgress(None, None, None, False, False)


class SnapshotFacts:
    """Lag of shards against a table, from snapshot and manifest metadata.

    Snapshots never change once committed, so their commit times and per-shard
    row counts are cached: a ``describe --watch`` or a metrics scrape re-reads
    only the snapshots committed since the previous call. Blocking (file
    system reads): call it from a worker thread in async code.

    Example::

        facts = SnapshotFacts(table, num_shards=4)
        progress = facts.progress({0: 12, 1: 15, 2: None, 3: 15})
        print(progress[0].lag_snapshots, progress[0].lag_seconds)
    """

    def __init__(
        self,
        table: ShardedTable,
        num_shards: int,
        *,
        max_snapshots: int = DEFAULT_MAX_SNAPSHOTS,
        count_rows: bool = True,
        rule: ShardRule = ShardRule.BUCKET,
    ) -> None:
        self.table = table
        self.num_shards = num_shards
        self.sharding = Sharding(rule, num_shards)
        self.max_snapshots = max(1, max_snapshots)
        self.count_rows = count_rows
        self.latest: int | None = None
        self.earliest: int | None = None
        self._times: dict[int, int] = {}
        self._rows: dict[int, dict[int, int]] = {}
        self._changelog = table.changelog_producer != "none"
        self._manifest_lists: Any = None
        self._manifests: Any = None
        self._retention: Retention | None = None
        # (monotonic time read, wall time read, the files)
        self._consumers: tuple[float, float, list[ConsumerFile]] | None = None

    def refresh(self, *, known_latest: int | None = None, earliest: bool = True) -> None:
        """Re-read the latest and earliest snapshot ids (``known_latest``: the
        latest as someone found it moments ago, then not read; ``earliest``
        False: the earliest is left as it was)."""
        self.latest = known_latest if known_latest is not None else \
            self.table.latest_snapshot_id()
        if not earliest:
            return
        self.earliest = self.table.earliest_snapshot_id()
        if self.earliest is not None:
            # Expired snapshots never come back: forget them.
            for cache in (self._times, self._rows):
                for sid in [s for s in cache if s < self.earliest]:
                    del cache[sid]

    def commit_time_ms(self, snapshot_id: int) -> int | None:
        cached = self._times.get(snapshot_id)
        if cached is None:
            cached = self.table.snapshot_commit_time_ms(snapshot_id)
            if cached is None:
                return None
            self._times[snapshot_id] = cached
        return cached

    def _rows_by_shard(self, snapshot_id: int) -> dict[int, int] | None:
        """Rows a follow-up read of ``snapshot_id`` delivers per shard (file metadata)."""
        cached = self._rows.get(snapshot_id)
        if cached is not None:
            return cached
        snapshot = self.table.snapshot(snapshot_id)
        if snapshot is None:
            return None
        if snapshot_id not in self._times:
            self._times[snapshot_id] = int(snapshot.time_millis)
        rows: dict[int, int] = {}
        if follow_up_scans(snapshot, changelog=self._changelog):
            if self._manifest_lists is None:
                from pypaimon.manifest.manifest_file_manager import ManifestFileManager
                from pypaimon.manifest.manifest_list_manager import ManifestListManager

                self._manifest_lists = ManifestListManager(self.table.table)
                self._manifests = ManifestFileManager(self.table.table)
                handed_over = getattr(self.table, "handed_over", None)
                if handed_over is not None:  # what the group's head handed over
                    file_io = self.table.table.file_io
                    self._manifest_lists.file_io = self._manifests.file_io = HandedOverFileIO(
                        file_io, handed_over, self.table.manifest_dir(),
                        keep=is_object_store(file_io))
            manifests = increment_manifests(self._manifest_lists, snapshot,
                                            changelog=self._changelog)
            if manifests:
                for entry in self._manifests.read_entries_parallel(manifests, max_workers=2):
                    if int(entry.bucket) >= 0:  # the pending bucket is read by no one
                        shard = self.sharding.shard_of_entry(entry)
                        rows[shard] = rows.get(shard, 0) + int(entry.file.row_count)
        self._rows[snapshot_id] = rows
        return rows

    def progress(
        self, positions: Mapping[int, int | None], *, now: float | None = None,
        known_latest: int | None = None, lazy: bool = False,
        read_rates: Mapping[int, float] | None = None,
    ) -> dict[int, ShardProgress]:
        """Per shard its progress, for positions ``{shard: next_snapshot or None}``.
        ``lazy``: the earliest snapshot is read only when a shard lags (a
        member's progress line and metrics: on an object store each id is
        requests, and a caught-up member needs neither). ``read_rates``
        (snapshots/s per shard) refine the time to data loss."""
        self.refresh(known_latest=known_latest, earliest=not lazy)
        if lazy and any(n is not None and n <= (self.latest or 0) for n in positions.values()):
            self.refresh(known_latest=self.latest)
        out, starts = self._lags(positions, now)
        if starts and self.latest is not None and self.count_rows:
            self._count_unread(out, starts, self.latest)
        if starts and self.latest is not None:
            try:
                self._estimate_loss(out, positions, read_rates or {}, now)
            except Exception as err:  # an estimate only: never break describe or metrics
                log.debug("time to data loss not estimated: %s", err)
        return out

    def write_rate(self, now: float | None = None) -> float:
        """Snapshots committed per second, over the last
        :data:`WRITE_RATE_SNAPSHOTS` snapshots and until ``now``."""
        latest = self.latest
        if latest is None:
            return 0.0
        first = max(self.earliest or 1, latest - WRITE_RATE_SNAPSHOTS)
        if first >= latest:
            return 0.0
        # A commit time read before (the lag's oldest unread snapshots are)
        # within the window measures as well, without a request.
        known = [sid for sid in self._times if first <= sid < latest]
        if known:
            first = min(known)
        first_ms = self.commit_time_ms(first)
        if first_ms is None:  # expired since the earliest was read
            self.refresh(known_latest=latest)
            first = max(self.earliest or latest, latest - WRITE_RATE_SNAPSHOTS)
            first_ms = self.commit_time_ms(first) if first < latest else None
            if first_ms is None:
                return 0.0
        seconds = (time.time() if now is None else now) - first_ms / 1000.0
        return (latest - first) / max(seconds, 1e-3)

    def _consumer_files(self, now: float | None) -> list[ConsumerFile]:
        """The table's consumer files, read again at most every
        :data:`CONSUMER_FILES_REFRESH_S` (a listing and a read per file:
        requests on an object store). Their ages are of ``now`` all the same."""
        at = time.monotonic()
        cached = self._consumers
        if cached is None or at - cached[0] >= CONSUMER_FILES_REFRESH_S:
            read_at = time.time()
            try:
                files = consumer_files(self.table.table.file_io, self.table.table_path,
                                       now=read_at)
            except Exception as err:  # unreadable: estimate as if none protected
                log.debug("consumer files not read: %s", err)
                files = []
            cached = self._consumers = (at, read_at, files)
        _, read_at, files = cached
        since = (time.time() if now is None else now) - read_at
        return [ConsumerFile(c.consumer_id, c.next_snapshot, max(0.0, c.age_s + since))
                for c in files]

    def retention(self) -> Retention:
        if self._retention is None:
            self._retention = Retention.of_table(self.table.table)
        return self._retention

    def _estimate_loss(
        self, out: dict[int, ShardProgress], positions: Mapping[int, int | None],
        read_rates: Mapping[int, float], now: float | None,
    ) -> None:
        """Fill in the time to data loss of every lagging shard in ``out``
        (a shard reading its one new snapshot is left as caught up)."""
        assert self.latest is not None
        lagging: dict[int, int] = {}
        for shard, p in out.items():
            n = positions.get(shard)
            if p.expired:
                out[shard] = ShardProgress(p.lag_snapshots, p.lag_seconds, p.unread_rows,
                                           p.unread_rows_complete, True, LOST)
            elif n is not None and p.lag_seconds is not None and p.lag_snapshots and (
                    p.lag_snapshots > 1 or p.lag_seconds >= IN_FLIGHT_S):
                lagging[shard] = n
        if not lagging:
            return  # no consumer file read: the steady state of a member costs nothing
        retention = self.retention()
        consumers = self._consumer_files(now)
        write_rate = self.write_rate(now)
        for shard, n in lagging.items():
            p = out[shard]
            assert p.lag_seconds is not None
            loss = estimate(retention, position=n, latest=self.latest,
                            oldest_age_s=p.lag_seconds, write_rate=write_rate,
                            read_rate=max(0.0, read_rates.get(shard, 0.0)),
                            protection_s=protection_s(consumers, n, retention))
            out[shard] = ShardProgress(p.lag_snapshots, p.lag_seconds, p.unread_rows,
                                       p.unread_rows_complete, p.expired, loss)

    def _lags(
        self, positions: Mapping[int, int | None], now: float | None
    ) -> tuple[dict[int, ShardProgress], dict[int, int]]:
        """Lag in snapshots and seconds per shard, and the first unread
        snapshot of every lagging shard, clipped to retained snapshots."""
        now_ms = (time.time() if now is None else now) * 1000.0
        latest, earliest = self.latest, self.earliest
        out: dict[int, ShardProgress] = {}
        starts: dict[int, int] = {}
        for shard, n in positions.items():
            if n is None:
                out[shard] = ShardProgress.unknown()
                continue
            lag = max(0, (latest or 0) + 1 - n)
            if lag == 0 or latest is None:
                out[shard] = ShardProgress(lag, 0.0, 0, True, False)
                continue
            expired = earliest is not None and n < earliest
            first_unread = max(n, earliest) if earliest is not None else n
            starts[shard] = first_unread
            oldest = self.commit_time_ms(first_unread)
            lag_seconds = None if oldest is None else max(0.0, (now_ms - oldest) / 1000.0)
            out[shard] = ShardProgress(lag, lag_seconds, None, False, expired)
        return out, starts

    def _count_unread(
        self, out: dict[int, ShardProgress], starts: Mapping[int, int], latest: int
    ) -> None:
        """Fill in the unread rows of the lagging shards (``starts``) in ``out``."""
        window_start = max(min(starts.values()), latest - self.max_snapshots + 1)
        per_snapshot: dict[int, dict[int, int]] = {}
        try:
            for sid in range(window_start, latest + 1):
                rows = self._rows_by_shard(sid)
                if rows is not None:
                    per_snapshot[sid] = rows
        except Exception as err:  # an estimate only: never break describe or metrics
            log.debug("unread rows not estimated: %s", err)
            return
        for shard, first_unread in starts.items():
            total = sum(
                rows.get(shard, 0) for sid, rows in per_snapshot.items() if sid >= first_unread
            )
            p = out[shard]
            complete = first_unread >= window_start and not p.expired
            out[shard] = ShardProgress(p.lag_snapshots, p.lag_seconds, total, complete, p.expired,
                                       p.data_loss)


# -- a running member's own shards ----------------------------------------------

OWNED_ROWS_SNAPSHOTS = 20
"""A running member counts the unread rows of at most this many snapshots
(beyond them its figure is a lower bound); each snapshot's manifests once."""


class LagSource(Protocol):
    """What :class:`OwnedLag` reads of a running member (a
    :class:`~paimon_group.member.GroupMember`): public attributes only."""

    @property
    def table(self) -> ShardedTable | None: ...

    @property
    def num_shards(self) -> int: ...

    @property
    def owned_shards(self) -> list[int]: ...

    def shard_positions(self) -> dict[int, int | None]:
        """Per owned shard the oldest snapshot it still needs, as the
        coordinator accepted it (so a resolved start whose full scan is not
        delivered yet never shows as "caught up"), or None."""


@dataclass(frozen=True)
class ShardLag:
    """One owned shard's position and lag."""

    position: int | None
    lag_snapshots: int | None
    lag_seconds: float | None
    data_loss: DataLossEstimate = NONE_UNREAD
    read_rate: float = 0.0
    unread_rows: int | None = 0
    unread_rows_complete: bool = True


class OwnedLag:
    """The lag of the shards a running member owns, computed at most once per
    ``refresh_s`` (snapshot metadata cached; rows counted over the last
    :data:`OWNED_ROWS_SNAPSHOTS` unread snapshots, each read once). Thread-safe: a
    metrics scrape and the progress line call it from their own threads."""

    def __init__(self, member: LagSource, *, refresh_s: float = 1.0) -> None:
        self.member = member
        self.refresh_s = refresh_s
        self._lock = threading.Lock()
        self._facts: SnapshotFacts | None = None
        self._lag: dict[int, ShardLag] = {}
        self._latest: int | None = None
        self._at = -1e18
        # A group of several tables: each table's facts by the first group
        # shard of its range, and its latest snapshot by its name.
        self._table_facts: dict[int, SnapshotFacts] = {}
        self._latests: dict[str, int | None] = {}
        # Per shard its position over the last minute: the read rate.
        self._reads: dict[int, RateMeter] = {}

    def rule(self) -> ShardRule:
        """The member's sharding rule. Read where present: a stand-in that
        knows none routes as groups did before rules existed (``bucket``)."""
        rule: ShardRule = getattr(self.member, "sharding", ShardRule.BUCKET)
        return rule

    def refresh(self) -> None:
        """Recompute the lag unless it was computed less than ``refresh_s`` ago."""
        with self._lock:
            now = time.monotonic()
            if now - self._at < self.refresh_s:
                return
            self._at = now
            self._compute()

    def _compute(self) -> None:
        member = self.member
        # A GroupMember's tables are its core's (the seam for tooling).
        tables = getattr(member, "tables", None) or \
            getattr(getattr(member, "core", None), "tables", None)
        if tables is not None and not getattr(tables, "single", True):
            self._compute_tables(list(tables))
            return
        table = member.table
        num_shards = int(member.num_shards or 0)
        if table is None or num_shards < 1:
            self._lag, self._latest = {}, None
            return
        rule = self.rule()
        facts = self._facts
        if facts is None or facts.num_shards != num_shards or facts.sharding.rule != rule:
            # Our own wrapper (and snapshot manager) over the member's table,
            # so this thread shares no reader state with the member's.
            own = ShardedTable(table.table, warehouse=table.warehouse,
                               identifier=table.identifier)
            # The member's handed-over manifests (paimon_group.store.handed_over):
            # what the row count reads of unread snapshots is kept there for
            # the member's planner, which reads the same files next.
            own.handed_over = getattr(table, "handed_over", own.handed_over)
            facts = self._facts = SnapshotFacts(own, num_shards, rule=rule,
                                                max_snapshots=OWNED_ROWS_SNAPSHOTS)
        positions = dict(member.shard_positions())
        rates = self._read_rates(positions)
        # The group's published head (member/head.py) says the latest while
        # it is fresh: no request for it.
        published = getattr(member, "published_latest", None)
        known = published() if callable(published) else None
        progress = facts.progress(positions, known_latest=known, lazy=True, read_rates=rates)
        self._latest = facts.latest
        self._lag = {s: ShardLag(positions.get(s), p.lag_snapshots, p.lag_seconds,
                                 p.data_loss, rates.get(s, 0.0), p.unread_rows,
                                 p.unread_rows_complete)
                     for s, p in progress.items()}

    def _compute_tables(self, tables: list[Any]) -> None:
        """The lag of a member of a group of several tables: each owned shard
        against its own table (``tables``: the member's
        :class:`~paimon_group.member.tables.MemberTable` objects), in the
        table's shard numbers."""
        positions = dict(self.member.shard_positions())
        rates = self._read_rates(positions)
        lag: dict[int, ShardLag] = {}
        latests: dict[str, int | None] = {}
        for table in tables:
            first, shards = int(table.range.first), int(table.range.shards)
            mine = {s - first: n for s, n in positions.items() if first <= s < first + shards}
            if table.gone or not mine:
                continue
            facts = self._table_facts.get(first)
            if facts is None or facts.table.table is not table.table.table:
                own = ShardedTable(table.table.table, warehouse=table.table.warehouse,
                                   identifier=table.table.identifier)
                facts = self._table_facts[first] = SnapshotFacts(
                    own, shards, rule=ShardRule.parse(table.range.sharding),
                    max_snapshots=OWNED_ROWS_SNAPSHOTS)
            progress = facts.progress(mine, lazy=True, read_rates={
                local: rates[first + local] for local in mine if first + local in rates})
            latests[str(table.name)] = facts.latest
            for local, p in progress.items():
                s = first + local
                lag[s] = ShardLag(positions.get(s), p.lag_snapshots, p.lag_seconds, p.data_loss,
                                  rates.get(s, 0.0), p.unread_rows, p.unread_rows_complete)
        self._lag, self._latests, self._latest = lag, latests, None

    def _read_rates(self, positions: Mapping[int, int | None]) -> dict[int, float]:
        """Snapshots/s each shard moved over the last minute (shards gone are forgotten)."""
        for shard in [s for s in self._reads if s not in positions]:
            del self._reads[shard]
        rates: dict[int, float] = {}
        for shard, n in positions.items():
            if n is None:
                continue
            meter = self._reads.setdefault(shard, RateMeter())
            meter.add(n)
            rates[shard] = meter.rate()
        return rates

    def shards(self) -> dict[int, ShardLag]:
        """The last computed lag per shard (owned when computed)."""
        with self._lock:
            return dict(self._lag)

    @property
    def latest(self) -> int | None:
        """The table's latest snapshot when the lag was last computed (a group
        of several tables: None, see :attr:`latests`)."""
        return self._latest

    @property
    def latests(self) -> dict[str, int | None]:
        """A group of several tables: the latest snapshot of each table whose
        shards the member owned when the lag was last computed, by name."""
        return dict(self._latests)

    def owned_loss(self) -> DataLossEstimate:
        """The time to data loss of the slowest shard the member owns."""
        owned = set(self.member.owned_shards)
        return earliest_loss(x.data_loss for s, x in self.shards().items() if s in owned)

    def owned_total(self) -> int | None:
        """Unread snapshots summed over the shards the member owns (None: unknown)."""
        self.refresh()
        owned = set(self.member.owned_shards)
        lags = [x.lag_snapshots for s, x in self.shards().items()
                if s in owned and x.lag_snapshots is not None]
        if not owned:
            return 0
        return sum(lags) if lags else None
