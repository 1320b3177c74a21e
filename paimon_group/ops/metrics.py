"""Prometheus metrics and Kubernetes probes of one running member.

:func:`serve_metrics` starts an HTTP server **on its own thread** (so a busy
or blocked event loop can never stall a probe; :mod:`~paimon_group.ops.http_server`:
idle clients cost no thread, at most 64 connections are open, a client has
5 s to send its request) that answers:

``/metrics``
    Prometheus text format, from a registry of this member only (never the
    process-global one, so several members in one process do not collide).
``/healthz``
    200 while the process is alive and its control loop responsive (the loop
    last ticked less than ``max_loop_lag_s`` ago); 503 otherwise, and 503
    once the member has FAILED. Point the liveness probe here.
``/readyz``
    200 when the member is ready (joined, named in the group's published
    assignment, and every shard assigned to it is acquired); 503 otherwise.
    Point the readiness probe here.

Metrics (every one labelled ``group`` and ``member``; no label ever holds a
coordinator URL or a credential). In a group of several tables
(docs/many-tables.md) the per-shard series (``{shard}``) are labelled ``table``
too (the shard's table, ``database.table``; ``shard`` stays the group's
number), and ``paimon_group_table_latest_snapshot`` is one series per
``table`` whose shards the member owns:

==============================================  ===========================================
``paimon_group_shards``                         the group's shard count (once joined)
``paimon_group_owned_shards``                   shards this member owns now
``paimon_group_assigned_shards``                shards the assignment gives it
``paimon_group_shard_position{shard}``          next snapshot the shard reads
``paimon_group_shard_lag_snapshots{shard}``     snapshots committed but unread
``paimon_group_shard_lag_seconds{shard}``       age of the oldest unread snapshot
``paimon_group_lag_snapshots``                  sum over owned shards with a position
``paimon_group_shard_lag_rows{shard}``          rows the unread snapshots added (estimate)
``paimon_group_lag_rows``                       unread rows summed over owned shards
``paimon_group_shard_time_to_data_loss_seconds{shard}``  until its oldest unread snapshot
                                                can expire (+Inf: no loss foreseen)
``paimon_group_time_to_data_loss_seconds``      the same, of the slowest owned shard
``paimon_group_skipped_snapshots_total``        snapshots lost to expiry and skipped
                                                (``--on-data-loss skip``)
``paimon_group_table_latest_snapshot``          the table's latest snapshot id
``paimon_group_batches_total``                  batches delivered (handler returned)
``paimon_group_rows_total``                     rows delivered
``paimon_group_handler_seconds``                handler latency histogram
``paimon_group_handler_errors_total``           handler exceptions (retried or not)
``paimon_group_commits_total``                  accepted position commits
``paimon_group_rejected_commits_total``         commits fenced off: another member owns it
``paimon_group_refused_commits_total``          commits not attempted: session closed
``paimon_group_rebalances_total``               new assignments followed after the first
``paimon_group_generation``                     generation of the followed assignment
``paimon_group_leader``                         1 if this member leads the group
``paimon_group_ready``                          1 if /readyz would answer 200
``paimon_group_loop_lag_seconds``               time since the control loop last ticked
``paimon_group_session_state{state}``           1 for the session's state (none: no session), 0 else
``paimon_group_member_state{state}``            1 for the member's state, 0 for the others
``paimon_group_member_info{version}``           always 1
``paimon_group_shards_moved_total{how}``        shards gone: revoked, released, lost
``paimon_group_sharding_info{rule,table_kind}``  always 1: the sharding rule
==============================================  ===========================================

Lag is computed when scraped (at most once per ``lag_refresh_s``; snapshot
metadata is cached) from the owned shards' positions and the table's latest
snapshot, reading only the snapshot files it has not read before.

Example::

    server = serve_metrics(member, 9400)       # before or after member.start()
    ...
    server.close()
"""

from __future__ import annotations

import logging
import math
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from paimon_group.config.timing import MIN_STUCK_LOOP_S, MemberTiming
from paimon_group.member import VERSION
from paimon_group.ops.http_server import TEXT, HttpServer, Response
from paimon_group.ops.lag import LagSource, OwnedLag
from paimon_group.protocol.records import Assignment
from paimon_group.protocol.table_map import NotInMap, TableMap

log = logging.getLogger("paimon_group.metrics")

HANDLER_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                   120.0, 300.0)
SESSION_STATES = ("connected", "suspended", "lost", "none")
MEMBER_STATES = ("created", "joining", "running", "rejoining", "leaving", "stopped", "failed")
DEFAULT_MAX_LOOP_LAG_S = MIN_STUCK_LOOP_S  # the default is MemberTiming.stuck_loop_s


class StatsView(Protocol):
    """The counters of a member (:class:`~paimon_group.member.MemberStats`)."""

    @property
    def batches(self) -> int: ...

    @property
    def rows(self) -> int: ...

    @property
    def commits(self) -> int: ...

    @property
    def rejected_commits(self) -> int: ...

    @property
    def shards_moved(self) -> Mapping[str, int]: ...

    @property
    def refused_commits(self) -> int: ...

    @property
    def rebalances(self) -> int: ...

    @property
    def handler_errors(self) -> int: ...

    @property
    def handler_seconds(self) -> list[float]: ...


class TimingView(Protocol):
    @property
    def timing(self) -> MemberTiming: ...


class MemberView(LagSource, Protocol):
    """Everything metrics and probes read of a member (a
    :class:`~paimon_group.member.GroupMember`): public attributes only."""

    @property
    def group_name(self) -> str: ...

    @property
    def member_id(self) -> str: ...

    @property
    def config(self) -> TimingView: ...

    @property
    def stats(self) -> StatsView: ...

    @property
    def assignment(self) -> Assignment | None: ...

    @property
    def is_leader(self) -> bool: ...

    @property
    def ready(self) -> bool: ...

    @property
    def session_state(self) -> str: ...

    @property
    def state(self) -> Any:
        """A :class:`~paimon_group.member.MemberState` (or its value)."""

    def loop_lag(self) -> float: ...


_Family = Callable[[str, str, float], Metric]
"""Makes a gauge or a counter of the member's labels."""


def _state_value(member: MemberView) -> str:
    return str(getattr(member.state, "value", member.state))


class _HandlerHistogram:
    """Turns the member's list of handler durations into histogram buckets."""

    def __init__(self, buckets: tuple[float, ...] = HANDLER_BUCKETS) -> None:
        self.bounds = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.total = 0.0
        self._seen = 0
        self._source: Any = None

    def update(self, durations: list[float]) -> None:
        if durations is not self._source or len(durations) < self._seen:
            # A new (or trimmed) list: start counting it from its beginning.
            self._source, self._seen = durations, 0
        new = durations[self._seen:]
        self._seen += len(new)
        for d in new:
            self.total += d
            for i, bound in enumerate(self.bounds):
                if d <= bound:
                    self.counts[i] += 1
                    break
            else:
                self.counts[-1] += 1

    def family(self, labels: list[str], values: list[str]) -> HistogramMetricFamily:
        h = HistogramMetricFamily("paimon_group_handler_seconds",
                                  "Handler latency per batch (seconds).", labels=labels)
        cumulative = 0
        buckets: list[tuple[str, float]] = []
        for bound, count in zip(self.bounds, self.counts, strict=False):
            cumulative += count
            buckets.append((repr(float(bound)), float(cumulative)))
        cumulative += self.counts[-1]
        buckets.append(("+Inf", float(cumulative)))
        h.add_metric(values, buckets, self.total)
        return h


class MemberCollector(Collector):
    """A prometheus collector reading one :class:`~paimon_group.member.GroupMember`."""

    def __init__(self, member: MemberView, *, lag_refresh_s: float = 1.0) -> None:
        self.member = member
        self.lag_refresh_s = lag_refresh_s
        self.lag = OwnedLag(member, refresh_s=lag_refresh_s)
        self._lock = threading.Lock()
        self._histogram = _HandlerHistogram()

    def owned_lag(self) -> int | None:
        """Unread snapshots summed over the shards the member owns (None: unknown)."""
        return self.lag.owned_total()

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            yield from self._collect()

    def _collect(self) -> Iterator[Metric]:
        m = self.member
        labels = ["group", "member"]
        values = [str(m.group_name), str(m.member_id)]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=labels)
            g.add_metric(values, value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(name, doc, labels=labels)
            c.add_metric(values, value)
            return c

        try:
            self.lag.refresh()
        except Exception as err:  # a metric, never a crash of the scrape
            log.debug("lag not computed: %s", err)
        yield from self._shard_families(gauge, labels, values)
        yield from self._counter_families(counter, labels, values)
        self._histogram.update(m.stats.handler_seconds)
        yield self._histogram.family(labels, values)
        yield from self._state_families(gauge, labels, values)

    def _shard_families(self, gauge: _Family, labels: list[str],
                        values: list[str]) -> Iterator[Metric]:
        """Shard counts, and per owned shard its position and lag."""
        m = self.member
        owned = list(m.owned_shards)
        assignment = m.assignment
        assigned = assignment.shards_of(m.member_id) if assignment is not None else []
        num_shards = int(m.num_shards or 0)
        if num_shards:
            yield gauge("paimon_group_shards", "Shard count of the group.", num_shards)
        yield gauge("paimon_group_owned_shards", "Shards this member owns.", len(owned))
        yield gauge("paimon_group_assigned_shards", "Shards assigned to this member.",
                    len(assigned))
        table_of = self._table_names()
        shard_labels = [*labels, "shard"] if table_of is None else [*labels, "shard", "table"]
        families, total_lag, total_rows = self._per_shard(shard_labels, values, owned, table_of)
        yield from families
        yield gauge("paimon_group_time_to_data_loss_seconds",
                    "Seconds until the oldest unread snapshot of the slowest owned shard can "
                    "expire (estimate; +Inf: no loss foreseen).",
                    _seconds(self.lag.owned_loss().seconds))
        yield gauge("paimon_group_lag_snapshots", "Unread snapshots summed over owned shards.",
                    total_lag)
        yield gauge("paimon_group_lag_rows", "Unread rows summed over owned shards (estimate).",
                    total_rows)
        if self.lag.latest is not None:
            yield gauge("paimon_group_table_latest_snapshot", "The table's latest snapshot id.",
                        self.lag.latest)
        latests = {t: n for t, n in self.lag.latests.items() if n is not None}
        if latests:  # a group of several tables: one series per table
            family = GaugeMetricFamily("paimon_group_table_latest_snapshot",
                                       "The table's latest snapshot id.",
                                       labels=[*labels, "table"])
            for name, latest in sorted(latests.items()):
                family.add_metric([*values, name], latest)
            yield family

    def _table_names(self) -> Callable[[int], str] | None:
        """A group of several tables: the name of the table holding a group
        shard (the ``table`` label of the per-shard series); None for a group
        of one table, whose series keep their labels."""
        member = self.member
        meta = getattr(member, "meta", None) or getattr(getattr(member, "core", None), "meta", None)
        tables = getattr(meta, "tables", None)
        if not isinstance(tables, TableMap):
            return None
        known = tables

        def name(shard: int) -> str:
            try:
                return known.locate(shard)[0].name
            except NotInMap:  # a range the member's record does not hold yet
                return ""

        return name

    def _per_shard(self, labels: list[str], values: list[str], owned: list[int],
                   table_of: Callable[[int], str] | None = None,
                   ) -> tuple[list[Metric], int, int]:
        """Per owned shard its position, lag and time to data loss; the sums of
        the snapshot and row lags."""
        families = {name: GaugeMetricFamily(name, doc, labels=labels)
                    for name, doc in _SHARD_GAUGES}
        total_lag = total_rows = 0
        lags = self.lag.shards()
        for shard in sorted(s for s in lags if s in owned):
            x = lags[shard]
            shard_values = [*values, str(shard)] if table_of is None else \
                [*values, str(shard), table_of(shard)]
            found: dict[str, float | None] = {
                "paimon_group_shard_position": x.position,
                "paimon_group_shard_lag_snapshots": x.lag_snapshots,
                "paimon_group_shard_lag_seconds": x.lag_seconds,
                "paimon_group_shard_lag_rows":
                    None if x.position is None else x.unread_rows,
                "paimon_group_shard_time_to_data_loss_seconds":
                    None if x.position is None else _seconds(x.data_loss.seconds),
            }
            for name, value in found.items():
                if value is not None:
                    families[name].add_metric(shard_values, value)
            total_lag += x.lag_snapshots or 0
            total_rows += (x.unread_rows or 0) if x.position is not None else 0
        return list(families.values()), total_lag, total_rows

    def _counter_families(self, counter: _Family, labels: list[str],
                          values: list[str]) -> Iterator[Metric]:
        stats = self.member.stats
        yield counter("paimon_group_batches", "Batches delivered to the handler.", stats.batches)
        yield counter("paimon_group_rows", "Rows delivered to the handler.", stats.rows)
        yield counter("paimon_group_handler_errors", "Handler exceptions.", stats.handler_errors)
        yield counter("paimon_group_commits", "Accepted position commits.", stats.commits)
        yield counter("paimon_group_rejected_commits",
                      "Position commits rejected because another member owns the shard "
                      "(fenced).", stats.rejected_commits)
        yield counter("paimon_group_refused_commits",
                      "Position commits not attempted because the session was closed.",
                      stats.refused_commits)
        moved = CounterMetricFamily(
            "paimon_group_shards_moved",
            "Shards that left this member: revoked (a rebalance, handed off), released "
            "(a graceful leave, handed off), lost (no clean handoff).",
            labels=[*labels, "how"])
        for how in ("revoked", "released", "lost"):
            moved.add_metric([*values, how], stats.shards_moved.get(how, 0))
        yield moved
        yield counter("paimon_group_rebalances", "Assignments followed after the first.",
                      stats.rebalances)
        yield counter("paimon_group_skipped_snapshots",
                      "Snapshots expired before they were read, skipped (--on-data-loss skip).",
                      getattr(stats, "skipped_snapshots", 0))

    def _state_families(self, gauge: _Family, labels: list[str],
                        values: list[str]) -> Iterator[Metric]:
        """The member's role and states, and its static facts."""
        m = self.member
        assignment = m.assignment
        yield gauge("paimon_group_generation", "Generation of the followed assignment.",
                    assignment.generation if assignment is not None else 0)
        yield gauge("paimon_group_leader", "1 if this member leads the group.",
                    1 if m.is_leader else 0)
        yield gauge("paimon_group_ready",
                    "1 if joined, assigned, and every assigned shard is acquired.",
                    1 if m.ready else 0)
        yield gauge("paimon_group_loop_lag_seconds",
                    "Seconds since the member's control loop last ticked.", m.loop_lag())
        yield _one_of("paimon_group_session_state",
                      "1 for the coordinator session's current state.", labels, values,
                      SESSION_STATES, str(m.session_state))
        yield _one_of("paimon_group_member_state", "1 for the member's current state.",
                      labels, values, MEMBER_STATES, _state_value(m))
        info = GaugeMetricFamily("paimon_group_member_info", "Static facts of this member.",
                                 labels=[*labels, "version"])
        info.add_metric([*values, VERSION], 1)
        yield info
        table = m.table
        if int(m.num_shards or 0) and table is not None:
            rule = self.lag.rule()
            sharding = GaugeMetricFamily(
                "paimon_group_sharding_info", "The group's sharding rule and table kind.",
                labels=[*labels, "rule", "table_kind"])
            sharding.add_metric([*values, rule.value, table.kind.value], 1)
            yield sharding


_SHARD_GAUGES: tuple[tuple[str, str], ...] = (
    ("paimon_group_shard_position", "Next snapshot the shard reads."),
    ("paimon_group_shard_lag_snapshots", "Snapshots committed to the table but not yet read."),
    ("paimon_group_shard_lag_seconds", "Age of the shard's oldest unread snapshot (seconds)."),
    ("paimon_group_shard_lag_rows",
     "Rows the shard's unread snapshots added (from the manifests, before merging; "
     "a lower bound beyond the last 20 unread snapshots)."),
    ("paimon_group_shard_time_to_data_loss_seconds",
     "Seconds until the shard's oldest unread snapshot can expire (estimate; +Inf: "
     "no loss foreseen; 0: expired or expirable at the next commit)."),
)
"""The per-shard gauges of a member's owned shards, in the order exported."""


def _seconds(value: float | None) -> float:
    """A time to data loss as a gauge value (None: +Inf, no loss foreseen)."""
    return math.inf if value is None else value


def _one_of(name: str, doc: str, labels: list[str], values: list[str],
            states: tuple[str, ...], current: str) -> GaugeMetricFamily:
    """A gauge per state: 1 for ``current``, 0 for the others."""
    family = GaugeMetricFamily(name, doc, labels=[*labels, "state"])
    for state in states:
        family.add_metric([*values, state], 1 if state == current else 0)
    return family


def health(member: MemberView, max_loop_lag_s: float) -> tuple[bool, str]:
    """(healthy, reason) for ``/healthz``."""
    state = _state_value(member)
    if state == "failed":
        return False, "member failed"
    if state != "running":
        # Not looping (yet, or any more, or reconnecting with its own bounded
        # retries, which fail the member when exhausted): alive is all we can say.
        return True, state
    lag = float(member.loop_lag())
    if lag > max_loop_lag_s:
        return False, f"control loop stalled for {lag:.1f}s"
    return True, f"{state}, loop ticked {lag:.1f}s ago"


class MetricsServer:
    """The HTTP server of :func:`serve_metrics` (:class:`HttpServer`: idle
    clients cost no thread, connections are bounded and time out);
    ``close()`` stops it."""

    def __init__(self, member: MemberView, port: int, *, host: str = "0.0.0.0",
                 max_loop_lag_s: float | None = None, lag_refresh_s: float = 1.0) -> None:
        self.member = member
        self.registry = CollectorRegistry(auto_describe=False)
        self.collector = MemberCollector(member, lag_refresh_s=lag_refresh_s)
        self.registry.register(self.collector)
        if max_loop_lag_s is None:
            max_loop_lag_s = member.config.timing.stuck_loop_s
        self.max_loop_lag_s = max_loop_lag_s
        routes = {"/metrics": self._metrics, "/healthz": self._healthz, "/readyz": self._readyz}
        # /metrics computes lag (it may read snapshot files): on a worker thread.
        self.http = HttpServer(host, port, routes, name="pg-metrics", blocking={"/metrics"})
        self.port: int = self.http.port
        log.info("serving /metrics, /healthz and /readyz on port %d", self.port,
                 extra={"group": member.group_name, "member": member.member_id})

    def _metrics(self) -> Response:
        return 200, generate_latest(self.registry), CONTENT_TYPE_LATEST

    def _healthz(self) -> Response:
        ok, reason = health(self.member, self.max_loop_lag_s)
        return (200 if ok else 503), (reason + "\n").encode(), TEXT

    def _readyz(self) -> Response:
        ready = bool(self.member.ready)
        return (200, b"ready\n", TEXT) if ready else (503, b"not ready\n", TEXT)

    def close(self) -> None:
        self.http.close()


def serve_metrics(member: MemberView, port: int, *, host: str | None = None) -> MetricsServer:
    """Serve ``/metrics``, ``/healthz`` and ``/readyz`` of ``member`` on ``port``
    (0: a free port, see ``.port``) from a background thread.

    The address is ``host``, else ``$PAIMON_GROUP_METRICS_HOST``, else all
    interfaces (``0.0.0.0``: Prometheus and the kubelet scrape from outside).
    """
    address = host or os.environ.get("PAIMON_GROUP_METRICS_HOST") or "0.0.0.0"
    return MetricsServer(member, port, host=address)
