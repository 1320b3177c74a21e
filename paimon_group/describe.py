"""``paimon-group describe``: everything an operator needs to see about one group.

The report is a plain dict (printed as JSON by ``describe --json``, as rich
tables by :mod:`paimon_group.render`):

* the group: ``group``, ``exists``, ``table``, ``num_shards``, ``sharding``
  (the group's rule: ``{"rule": ..., "formula": ...}``, see
  :mod:`paimon_group.sharding`), ``table_kind`` (fixed, dynamic, unaware or
  postpone), ``state``
  (``empty``: no live member; ``stable``: the published assignment names
  exactly the live members and every shard is owned by the member it is
  assigned to; ``rebalancing``: anything else), ``generation``, ``leader``,
  ``leader_epoch``, ``latest_snapshot``, ``earliest_snapshot``, and totals;
* ``members``: per live member its id, host, pid, version, start time,
  owned and assigned shards and session (``live``); a member the assignment
  still names but whose session is gone is listed with session ``gone``;
* ``shards``: per shard its ``owner``, ``epoch``, ``assigned_to``,
  ``next_snapshot`` (the next snapshot it will read), ``lag_snapshots``,
  ``lag_seconds``, ``unread_rows``, ``last_commit`` and the value of its
  Paimon consumer file.

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
    read skips, such as compactions, count 0). Counted before merging, so an
    update counts once per write. At most ``max_snapshots`` unread snapshots
    are read; beyond that the value is a lower bound and
    ``unread_rows_complete`` is false.
``expired``
    ``n`` is older than the earliest retained snapshot: the shard cannot
    continue (it stops with ``SnapshotExpired``) until its position is reset.

Example::

    report = asyncio.run(describe_group(coord, "orders", table))
    print(report["state"], report["total_lag_snapshots"])
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from coordinators.base import Coordinator
from coordinators.errors import ConfigError
from paimon_group.group import GroupClient, GroupState
from paimon_group.mirror import ConsumerMirror
from paimon_group.names import consumer_id
from paimon_group.sharding import Sharding, ShardRule
from paimon_group.table import ShardedTable

log = logging.getLogger("paimon_group.describe")

DEFAULT_MAX_SNAPSHOTS = 200
"""How many unread snapshots' manifests :class:`SnapshotFacts` reads at most."""


class GroupNotFound(ConfigError):
    """The named group has no state in this coordinator."""


def group_status(members: int, assignment_members: set[str], live: set[str],
                 owners_match: bool) -> str:
    """``empty``, ``stable`` or ``rebalancing`` (see the module docstring)."""
    if members == 0:
        return "empty"
    if assignment_members == live and owners_match:
        return "stable"
    return "rebalancing"


@dataclass(frozen=True)
class ShardProgress:
    """How far one shard is behind the table."""

    lag_snapshots: int | None
    lag_seconds: float | None
    unread_rows: int | None
    unread_rows_complete: bool
    expired: bool

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

    def refresh(self) -> None:
        """Re-read the latest and earliest snapshot ids."""
        self.latest = self.table.latest_snapshot_id()
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
        # The planner's rule (pypaimon's follow-up scanners): deltas of APPEND
        # snapshots, or changelogs of snapshots that have one.
        scannable = (
            bool(snapshot.changelog_manifest_list)
            if self._changelog
            else snapshot.commit_kind == "APPEND"
        )
        if scannable:
            if self._manifest_lists is None:
                from pypaimon.manifest.manifest_file_manager import ManifestFileManager
                from pypaimon.manifest.manifest_list_manager import ManifestListManager

                self._manifest_lists = ManifestListManager(self.table.table)
                self._manifests = ManifestFileManager(self.table.table)
            if self._changelog:
                manifests = self._manifest_lists.read_changelog(snapshot)
            else:
                manifests = self._manifest_lists.read_delta(snapshot)
            if manifests:
                for entry in self._manifests.read_entries_parallel(manifests, max_workers=2):
                    if int(entry.bucket) >= 0:  # the pending bucket is read by no one
                        shard = self.sharding.shard_of_entry(entry)
                        rows[shard] = rows.get(shard, 0) + int(entry.file.row_count)
        self._rows[snapshot_id] = rows
        return rows

    def progress(
        self, positions: Mapping[int, int | None], *, now: float | None = None
    ) -> dict[int, ShardProgress]:
        """Per shard its progress, for positions ``{shard: next_snapshot or None}``."""
        self.refresh()
        now_ms = (time.time() if now is None else now) * 1000.0
        latest, earliest = self.latest, self.earliest
        out: dict[int, ShardProgress] = {}
        # The unread range of every lagging shard, clipped to retained snapshots.
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
        if not starts or latest is None or not self.count_rows:
            return out
        window_start = max(min(starts.values()), latest - self.max_snapshots + 1)
        per_snapshot: dict[int, dict[int, int]] = {}
        try:
            for sid in range(window_start, latest + 1):
                rows = self._rows_by_shard(sid)
                if rows is not None:
                    per_snapshot[sid] = rows
        except Exception as err:  # an estimate only: never break describe or metrics
            log.debug("unread rows not estimated: %s", err)
            return out
        for shard, first_unread in starts.items():
            total = sum(
                rows.get(shard, 0) for sid, rows in per_snapshot.items() if sid >= first_unread
            )
            p = out[shard]
            complete = first_unread >= window_start and not p.expired
            out[shard] = ShardProgress(p.lag_snapshots, p.lag_seconds, total, complete, p.expired)
        return out


def _consumer_files(table: ShardedTable, group: str) -> dict[int, int]:
    try:
        return ConsumerMirror(table.table.file_io, table.table_path, group).all()
    except Exception as err:
        log.debug("consumer files of %s not read: %s", group, err)
        return {}


async def describe_group(
    coordinator: Coordinator,
    group: str,
    table: ShardedTable | None,
    *,
    facts: SnapshotFacts | None = None,
    max_snapshots: int = DEFAULT_MAX_SNAPSHOTS,
) -> dict[str, Any]:
    """The describe report of ``group`` (see the module docstring).

    ``facts`` may be passed in (and kept) by callers that describe the same
    group repeatedly, so snapshot metadata is read once. A group that does not
    exist gives a report with ``exists`` false and no shards.
    """
    client = GroupClient(coordinator, group)
    state = await client.state()
    return await report_from_state(group, state, table, facts=facts, max_snapshots=max_snapshots)


async def report_from_state(
    group: str,
    state: GroupState,
    table: ShardedTable | None,
    *,
    facts: SnapshotFacts | None = None,
    max_snapshots: int = DEFAULT_MAX_SNAPSHOTS,
    count_rows: bool = True,
) -> dict[str, Any]:
    """The describe report from an already-read :class:`GroupState`.

    ``count_rows`` False skips the unread-rows estimate (no manifest reads).
    """
    num_shards = state.meta.num_shards if state.meta else 0
    rule = ShardRule.parse(state.meta.sharding if state.meta else None)
    # A pinned but undelivered full scan still needs its snapshot: lag counts from it.
    positions = {s: (state.positions[s].effective if s in state.positions else None)
                 for s in range(num_shards)}
    progress: dict[int, ShardProgress] = {}
    files: dict[int, int] = {}
    latest: int | None = None
    earliest: int | None = None
    latest_time_ms: int | None = None
    if table is not None and num_shards:
        if facts is None or facts.num_shards != num_shards or facts.sharding.rule is not rule:
            facts = SnapshotFacts(table, num_shards, max_snapshots=max_snapshots,
                                  count_rows=count_rows, rule=rule)
        used = facts

        def read_table() -> tuple[dict[int, ShardProgress], dict[int, int], int | None]:
            prog = used.progress(positions)
            latest_ms = used.commit_time_ms(used.latest) if used.latest is not None else None
            return prog, _consumer_files(table, group), latest_ms

        progress, files, latest_time_ms = await asyncio.to_thread(read_table)
        latest, earliest = facts.latest, facts.earliest
    elif table is not None:
        latest = await asyncio.to_thread(table.latest_snapshot_id)

    owned_by: dict[str, list[int]] = {}
    for shard, view in state.owners.items():
        owned_by.setdefault(view.member_id, []).append(shard)
    shards: list[dict[str, Any]] = []
    for shard in range(num_shards):
        owner = state.owners.get(shard)
        pos = state.positions.get(shard)
        p = progress.get(shard)
        if p is None:
            p = ShardProgress.unknown()
            if pos is not None and latest is not None:
                p = ShardProgress(max(0, latest + 1 - pos.effective), None, None, False,
                                  False)
        shards.append(
            {
                "shard": shard,
                "owner": owner.member_id if owner else None,
                "epoch": owner.epoch if owner else None,
                "owner_generation": owner.generation if owner else None,
                "assigned_to": state.assignment.owner_of(shard) if state.assignment else None,
                "next_snapshot": pos.next_snapshot if pos else None,
                "pending_full_scan": pos.full_scan if pos else None,
                "lag_snapshots": p.lag_snapshots,
                "lag_seconds": p.lag_seconds,
                "unread_rows": p.unread_rows,
                "unread_rows_complete": p.unread_rows_complete,
                "expired": p.expired,
                "last_commit": pos.committed_at if pos else None,
                "last_commit_by": pos.member_id if pos else None,
                "consumer_id": consumer_id(group, shard),
                "consumer_file": files.get(shard),
            }
        )
    live = set(state.members)
    assigned = set(state.assignment.shards) if state.assignment else set()
    owners_match = all(s["owner"] is not None and s["owner"] == s["assigned_to"] for s in shards)
    members: list[dict[str, Any]] = [
        {
            "member_id": m,
            "host": info.host,
            "pid": info.pid,
            "version": info.version,
            "started_at": info.started_at,
            "owned_shards": sorted(owned_by.get(m, [])),
            "assigned_shards": state.assignment.shards_of(m) if state.assignment else [],
            "session": info.session,
            "session_state": "live",
            "leader": m == state.leader,
        }
        for m, info in sorted(state.members.items())
    ]
    # Members the assignment still names but whose session ended (crashed,
    # or waited for by a rebalance delay): shown so that operators see them.
    # Not for an empty group: its last assignment names whoever ran last.
    for m in sorted(assigned - live if live else set()):
        members.append(
            {
                "member_id": m,
                "host": None,
                "pid": None,
                "version": None,
                "started_at": None,
                "owned_shards": sorted(owned_by.get(m, [])),
                "assigned_shards": state.assignment.shards_of(m) if state.assignment else [],
                "session": None,
                "session_state": "gone",
                "leader": False,
            }
        )
    lags = [s["lag_seconds"] for s in shards if s["lag_seconds"] is not None]
    unread = [s["unread_rows"] for s in shards if s["unread_rows"] is not None]
    return {
        "group": group,
        "exists": state.meta is not None,
        "table": state.meta.table if state.meta else None,
        "created_at": state.meta.created_at if state.meta else None,
        "num_shards": num_shards,
        "sharding": (
            {"rule": rule.value, "formula": rule.formula} if state.meta is not None else None
        ),
        "table_kind": table.kind.value if table is not None else None,
        "state": group_status(len(live), assigned, live, owners_match),
        "generation": state.assignment.generation if state.assignment else 0,
        "leader": state.leader,
        "leader_epoch": state.leader_epoch,
        "latest_snapshot": latest,
        "earliest_snapshot": earliest,
        "latest_commit_time": latest_time_ms / 1000.0 if latest_time_ms is not None else None,
        "members": members,
        "shards": shards,
        "total_lag_snapshots": sum(s["lag_snapshots"] or 0 for s in shards),
        "max_lag_seconds": max(lags) if lags else None,
        "total_unread_rows": sum(unread) if unread else None,
        "expired_shards": [s["shard"] for s in shards if s["expired"]],
        "described_at": time.time(),
    }
