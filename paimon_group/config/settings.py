"""Every tunable setting, declared once: its name, type, default, unit and help,
and how each entry point spells it.

A :class:`Setting` is the one place a default is written. The front ends are
generated from these declarations: :class:`~paimon_group.config.member.MemberConfig`'s
field defaults, the ``paimon-group run`` options (flag, environment variable
``PAIMON_GROUP_<FLAG>``, ``--config`` key, help; :mod:`paimon_group.cli.options`)
and the Spark source's options (:mod:`paimon_group.spark.source.options`).
Defaults that follow from another setting are derived, not declared: the
safety margin from the session timeout (:mod:`paimon_group.config.timing`),
the coordinator's session timeout from ``session_timeout_s``.

A setting renamed keeps its former flags (``former_flags``): they still work,
with one deprecation line on stderr, as do their environment variables and
``--config`` keys. A setting with a unit ends its flag and its Spark option
name with it (``-s``, ``_ms``).

The group, warehouse, table, coordinator and catalog options are not here:
they name what a member joins and reads, and have no default to restate.

Example::

    >>> SESSION_TIMEOUT_S.default, SESSION_TIMEOUT_S.flag, SESSION_TIMEOUT_S.env
    (10.0, '--session-timeout-s', 'PAIMON_GROUP_SESSION_TIMEOUT_S')
    >>> REBALANCE_DELAY_S.former_flags
    ('--rebalance-delay',)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from paimon_group.protocol.assignor import ASSIGNORS

__all__ = [
    "DEFAULT_PARALLEL_SHARDS",
    "ENV_PREFIX",
    "LOG_LEVELS",
    "MEMBER_SETTINGS",
    "PENDING_SETTINGS",
    "RUN_SETTINGS",
    "SETTINGS",
    "SPARK_SETTINGS",
    "Setting",
    "env_name",
    "setting",
]

ENV_PREFIX = "PAIMON_GROUP_"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

DEFAULT_PARALLEL_SHARDS = max(1, min(4, os.cpu_count() or 1))
"""Default ``max_parallel_shards``: one shard per CPU, at most 4. pypaimon's
merge of primary-key rows holds the GIL, so more reading threads than CPUs
only contend for it (measured in docs/benchmarks.md); pypaimon's own reads
use at most one thread per CPU as well."""


def env_name(flag: str) -> str:
    """The environment variable of a flag: ``--poll-interval-ms`` ->
    ``PAIMON_GROUP_POLL_INTERVAL_MS``."""
    return ENV_PREFIX + flag.lstrip("-").upper().replace("-", "_")


@dataclass(frozen=True)
class Setting:
    """One setting. ``name`` is its Python name (a ``MemberConfig`` field, a
    ``SourceOptions`` field or a ``run`` parameter); ``type`` the type of its
    value as given in text (``int``, ``float``, ``str``, ``bool``; a flag for
    ``bool``). ``bound``: ``"positive"`` or ``"non-negative"`` for numbers
    that have one (the CLI checks a non-negative bound itself, the member
    checks the rest). ``flag`` and ``spark``: its ``run`` flag and its Spark
    option name, None where that entry point does not take it.
    ``shown_default`` is how help and docs show a default computed on this
    host."""

    name: str
    type: type
    default: Any
    help: str
    unit: str = ""
    flag: str | None = None
    former_flags: tuple[str, ...] = ()
    spark: str | None = None
    choices: tuple[str, ...] | None = None
    bound: str = ""
    metavar: str | None = None
    path: bool = False
    shown_default: str | None = None

    @property
    def env(self) -> str | None:
        """``PAIMON_GROUP_<FLAG>``: the environment variable ``run`` reads (None: no flag)."""
        return env_name(self.flag) if self.flag else None

    @property
    def former_envs(self) -> tuple[str, ...]:
        """The environment variables of the former flags (still read, with a warning)."""
        return tuple(env_name(flag) for flag in self.former_flags)


# -- the member's settings (MemberConfig, in its field order) ------------------

MEMBER_ID = Setting(
    "member_id", str, None, flag="--member-id", spark="member_id",
    help="Stable member id (static membership). Default: the pod name in Kubernetes, "
         "else HOST-PID-RANDOM.")
SHARDS = Setting(
    "shards", int, None, flag="--shards", spark="shards", bound="positive",
    help="Shard count of a new group (default: the table's bucket count; 4 for tables "
         "without a fixed bucket count). See README, table kinds.")
ASSIGNOR = Setting(
    "assignor", str, None, flag="--assignor", spark="assignor", choices=ASSIGNORS,
    help="How a new group's leader assigns shards: count (equal shard counts) or load "
         "(equal rows per member, from the manifests). Default: the group's stored one; "
         "count for a new group.")
START = Setting(
    "start", str, "latest-full", flag="--start", spark="start",
    help="Where a shard without a position starts: latest-full, latest, earliest, "
         "snapshot:N, timestamp:ISO-8601.")
POLL_INTERVAL_MS = Setting(
    "poll_interval_ms", int, 1000, unit="ms", flag="--poll-interval-ms", bound="positive",
    help="How often an idle shard looks for a new snapshot.")
SESSION_TIMEOUT_S = Setting(
    "session_timeout_s", float, 10.0, unit="s", flag="--session-timeout-s",
    spark="session_timeout_s", bound="positive",
    help="The coordinator session (lease) timeout: a member that stops heartbeating loses "
         "its shards after this long. The member's other timings derive from it (it stops "
         "processing a quarter of it before its session could expire); the coordinator's "
         "connect timeout is a separate one.")
REVOKE_TIMEOUT_S = Setting(
    "revoke_timeout_s", float, 10.0, unit="s", flag="--revoke-timeout-s",
    spark="revoke_timeout_s", bound="positive",
    help="How long a revoked shard's batch in flight may take before it is abandoned.")
SHUTDOWN_TIMEOUT_S = Setting(
    "shutdown_timeout_s", float, 30.0, unit="s", flag="--shutdown-timeout-s",
    bound="positive", help="Graceful SIGTERM handoff must finish within this.")
REBALANCE_DELAY_S = Setting(
    "rebalance_delay_s", float, 0.0, unit="s", flag="--rebalance-delay-s",
    former_flags=("--rebalance-delay",), spark="rebalance_delay_s", bound="non-negative",
    help="Seconds the leader keeps the shards of a member that vanished without a "
         "goodbye, waiting for it to come back (static membership).")
INCLUDE_ROW_KIND = Setting(
    "include_row_kind", bool, False, flag="--include-row-kind", spark="include_row_kind",
    help="Add the _row_kind column.")
COLUMNS = Setting(
    "columns", str, None, flag="--columns", metavar="A,B,...",
    help="Read only these columns (the others are never decoded).")
MAX_HANDLER_ATTEMPTS = Setting(
    "max_handler_attempts", int, 5, flag="--max-handler-attempts", bound="positive",
    help="Calls of the handler for one batch (with backoff) before the member fails with "
         "exit 3; the batch is not committed.")
MAX_PARALLEL_SHARDS = Setting(
    "max_parallel_shards", int, DEFAULT_PARALLEL_SHARDS, flag="--max-parallel-shards",
    bound="positive", shown_default="one per CPU, at most 4",
    help="Batches of different shards in the handler at once (1: one by one). Never two "
         "batches of the same shard.")
HANDLER_BACKOFF_S = Setting(
    "handler_backoff_s", float, 0.5, unit="s",
    help="The first wait between two calls of a failing handler (doubling, at most 30 s).")
SAFETY_MARGIN_S = Setting(
    "safety_margin_s", float, None, unit="s",
    help="The member stops processing and committing this long before its local session "
         "deadline. None: a quarter of session_timeout_s.")
MIRROR_INTERVAL_S = Setting(
    "mirror_interval_s", float, None, unit="s",
    help="How often, at most, a shard's consumer file is rewritten with its committed "
         "position. None: 1 s on a local warehouse, longer on an object store.")
HISTORY_PATH = Setting(
    "history_path", str, None, flag="--history", path=True,
    help="Append a JSONL history of deliveries and commits here (for audits; created "
         "0600, a symbolic link is refused).")
ON_DATA_LOSS = Setting(
    "on_data_loss", str, "fail", flag="--on-data-loss", choices=("fail", "skip"),
    help="A shard whose next snapshot expired unread: fail (stop, naming the lost "
         "snapshots and the reset command) or skip (move on to the earliest retained "
         "snapshot, with a WARNING; Spark's failOnDataLoss=false).")
FORMING_WAIT_S = Setting(
    "forming_wait_s", float, 1.0, unit="s", flag="--forming-wait-s",
    former_flags=("--forming-wait",), spark="forming_wait_s", bound="non-negative",
    help="A starting group's burst of arrivals is assigned once they pause this many "
         "seconds (at most 60 s); a lone member is assigned at once. 0: never wait "
         "(Kafka's group.initial.rebalance.delay.ms).")

TABLES_REFRESH_S = Setting(
    "tables_refresh_s", float, 30.0, unit="s", flag="--tables-refresh-s",
    spark="tables_refresh_s", bound="positive",
    help="How often a group of several tables lists the catalog again: a table its "
         "patterns match that was created meanwhile joins the group, one dropped or "
         "re-created is found (docs/many-tables.md).")

MEMBER_SETTINGS = (
    MEMBER_ID, SHARDS, ASSIGNOR, START, POLL_INTERVAL_MS, SESSION_TIMEOUT_S,
    REVOKE_TIMEOUT_S, SHUTDOWN_TIMEOUT_S, REBALANCE_DELAY_S, INCLUDE_ROW_KIND, COLUMNS,
    MAX_HANDLER_ATTEMPTS, MAX_PARALLEL_SHARDS, HANDLER_BACKOFF_S, SAFETY_MARGIN_S,
    MIRROR_INTERVAL_S, HISTORY_PATH, ON_DATA_LOSS, FORMING_WAIT_S, TABLES_REFRESH_S,
)
"""The member's settings, in ``MemberConfig``'s field order."""

# -- the Spark source's own -------------------------------------------------------

HOLD_TIMEOUT_S = Setting(
    "hold_timeout_s", float, 300.0, unit="s", spark="hold_timeout_s", bound="positive",
    help="How long a revocation waits for Spark to complete a planned batch of the query.")
METADATA_COLUMNS = Setting(
    "metadata_columns", bool, False, spark="metadata_columns",
    help="Append _pg_shard, _pg_snapshot and _pg_epoch.")
MAX_SNAPSHOTS_PER_BATCH = Setting(
    "max_snapshots_per_batch", int, None, spark="max_snapshots_per_batch", bound="positive",
    help="At most this many snapshots of a shard per micro-batch (None: no cap).")
MAX_ROWS_PER_BATCH = Setting(
    "max_rows_per_batch", int, None, spark="max_rows_per_batch", bound="positive",
    help="About this many rows per micro-batch at most (None: no cap).")
READY_TIMEOUT_S = Setting(
    "ready_timeout_s", float, 30.0, unit="s", spark="ready_timeout_s", bound="positive",
    help="How long the query's start waits for its member to hold its assigned shards.")
FAIL_ON_DATA_LOSS = Setting(
    "fail_on_data_loss", bool, True, spark="failondataloss",
    help="A shard whose next snapshot expired unread fails the query (false: skipped past).")

SPARK_SETTINGS = tuple(s for s in (*MEMBER_SETTINGS, HOLD_TIMEOUT_S, METADATA_COLUMNS,
                                   MAX_SNAPSHOTS_PER_BATCH, MAX_ROWS_PER_BATCH,
                                   READY_TIMEOUT_S, FAIL_ON_DATA_LOSS) if s.spark)
"""The settings the Spark source takes as options (``SourceOptions`` fields)."""

# -- the run command's own (the process around the member) ------------------------

PROGRESS_INTERVAL_S = Setting(
    "progress_interval_s", float, 5.0, unit="s", flag="--progress-interval-s",
    bound="non-negative",
    help="Log a progress line (batches, rows, rate, lag) at INFO this often while there is "
         "work; 0: never. Each batch is logged at DEBUG.")
LOG_FORMAT = Setting(
    "log_format", str, "text", flag="--log-format", choices=("text", "json"),
    help="Log lines as text or as one JSON object per line.")
LOG_LEVEL = Setting(
    "log_level", str, "INFO", flag="--log-level", choices=LOG_LEVELS,
    help="INFO: state changes and a progress line every few seconds; DEBUG: one line per "
         "batch, and the client libraries' own logs.")
SPARK_MASTER = Setting(
    "spark_master", str, "local[*]", flag="--spark-master",
    help="Spark master of the --spark-handler's session.")

RUN_SETTINGS = (PROGRESS_INTERVAL_S, LOG_FORMAT, LOG_LEVEL, SPARK_MASTER)
"""The settings of ``paimon-group run`` that are not the member's."""

PENDING_SETTINGS: tuple[Setting, ...] = ()
"""Settings of a slice not yet wired into the member: no ``run`` flag, no Spark
option, no ``MemberConfig`` field until it is (docs/many-tables.md)."""

SETTINGS = (*MEMBER_SETTINGS, *(s for s in SPARK_SETTINGS if s not in MEMBER_SETTINGS),
            *RUN_SETTINGS, *PENDING_SETTINGS)
"""Every setting, each once."""

_BY_NAME = {s.name: s for s in SETTINGS}


def setting(name: str) -> Setting:
    """The setting called ``name`` (a KeyError for an unknown one)."""
    return _BY_NAME[name]
