"""The ``paimon-group`` command line.

Every ``run`` option can also come from the environment as
``PAIMON_GROUP_<OPTION>`` (upper case, ``-`` as ``_``, e.g.
``PAIMON_GROUP_METRICS_PORT``) and from a TOML or YAML file given with
``--config PATH`` (keys are the option names, ``-`` or ``_``). Precedence:
flags > environment > file > defaults. Coordinator passwords come from a file
(``--coordinator-password-file``) or the environment
(``PAIMON_GROUP_COORDINATOR_PASSWORD``), never from a flag.

Errors of bad input print one line, ``error: ...``, and exit 2; other
failures exit 1 (a handler that kept failing: 3).

The package: :data:`main` (the command group) and ``run`` here; the options,
declared once, in :mod:`~paimon_group.cli.options`; ``describe`` (and
``--watch``) in :mod:`~paimon_group.cli.describe`; the operations commands in
:mod:`~paimon_group.cli.admin`.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

import click

from coordinators.errors import ConfigError
from coordinators.registry import open_coordinator
from paimon_group.cli.admin import delete, list_command, members, reset
from paimon_group.cli.describe import describe
from paimon_group.cli.errors import OneLineErrors, friendly_errors
from paimon_group.cli.options import (
    LOG_LEVELS,
    build_connect_options,
    catalog_option,
    catalog_options,
    config_option,
    coordinator_options,
    env,
    group_option,
    table_options,
)
from paimon_group.cli.version import version_option
from paimon_group.config.member import (
    DEFAULT_PARALLEL_SHARDS,
    MemberConfig,
    local_coordinator_url,
    resolve_coordinator,
)
from paimon_group.protocol.assignor import ASSIGNORS

__all__ = ["build_connect_options", "main", "run", "setup_logging"]


def setup_logging(fmt: str, level: str) -> None:
    """Configure the process's logging for ``run`` (``--log-format``, ``--log-level``)."""
    from paimon_group.process.logs import configure_logging

    configure_logging(fmt, level)


@click.group(cls=OneLineErrors, context_settings={"help_option_names": ["-h", "--help"],
                                                  "max_content_width": 100})
@version_option
def main() -> None:
    """Coordinated, sharded consumer groups for Apache Paimon tables."""


@main.command()
@config_option
@group_option
@table_options
@click.option("--handler", envvar=env("handler"), metavar="MODULE:CALLABLE",
              help="Called with each ShardBatch.")
@click.option("--spark-handler", envvar=env("spark-handler"), metavar="MODULE:CALLABLE",
              help="Called with (DataFrame, ShardBatch) for each batch.")
@coordinator_options
@click.option("--member-id", envvar=env("member-id"),
              help="Stable member id (static membership). Default: the pod name in "
                   "Kubernetes, else HOST-PID-RANDOM.")
@click.option("--shards", type=int, envvar=env("shards"),
              help="Shard count of a new group (default: the table's bucket count; 4 for "
                   "tables without a fixed bucket count). See README, table kinds.")
@click.option("--assignor", type=click.Choice(ASSIGNORS, case_sensitive=False),
              envvar=env("assignor"),
              help="How a new group's leader assigns shards: count (equal shard counts) or "
                   "load (equal rows per member, from the manifests). Default: the group's "
                   "stored one; count for a new group.")
@click.option("--start", default="latest-full", show_default=True, envvar=env("start"),
              help="Where a shard without a position starts: latest-full, latest, earliest, "
                   "snapshot:N, timestamp:ISO-8601.")
@click.option("--poll-interval-ms", type=int, default=1000, show_default=True,
              envvar=env("poll-interval-ms"),
              help="How often an idle shard looks for a new snapshot.")
@click.option("--session-timeout-s", type=float, default=10.0, show_default=True,
              envvar=env("session-timeout-s"),
              help="The coordinator session (lease) timeout: a member that stops "
                   "heartbeating loses its shards after this long; also the connect timeout.")
@click.option("--revoke-timeout-s", type=float, default=10.0, show_default=True,
              envvar=env("revoke-timeout-s"),
              help="How long a revoked shard's batch in flight may take before it is "
                   "abandoned.")
@click.option("--shutdown-timeout-s", type=float, default=30.0, show_default=True,
              envvar=env("shutdown-timeout-s"),
              help="Graceful SIGTERM handoff must finish within this.")
@click.option("--rebalance-delay", type=float, default=0.0, show_default=True,
              envvar=env("rebalance-delay"),
              help="Seconds the leader keeps the shards of a member that vanished without "
                   "a goodbye, waiting for it to come back (static membership).")
@click.option("--forming-wait", type=click.FloatRange(min=0), default=1.0, show_default=True,
              envvar=env("forming-wait"),
              help="A starting group's burst of arrivals is assigned once they pause this "
                   "many seconds (at most 60 s); a lone member is assigned at once. 0: never "
                   "wait (Kafka's group.initial.rebalance.delay.ms).")
@click.option("--max-handler-attempts", type=int, default=5, show_default=True,
              envvar=env("max-handler-attempts"),
              help="Calls of the handler for one batch (with backoff) before the member "
                   "fails with exit 3; the batch is not committed.")
@click.option("--max-parallel-shards", type=int, default=DEFAULT_PARALLEL_SHARDS,
              show_default="one per CPU, at most 4", envvar=env("max-parallel-shards"),
              help="Batches of different shards in the handler at once (1: one by one). "
                   "Never two batches of the same shard.")
@click.option("--on-data-loss", type=click.Choice(["fail", "skip"]), default="fail",
              show_default=True, envvar=env("on-data-loss"),
              help="A shard whose next snapshot expired unread: fail (stop, naming the lost "
                   "snapshots and the reset command) or skip (move on to the earliest "
                   "retained snapshot, with a WARNING; Spark's failOnDataLoss=false).")
@click.option("--include-row-kind", is_flag=True, default=False,
              envvar=env("include-row-kind"), help="Add the _row_kind column.")
@click.option("--columns", envvar=env("columns"), metavar="A,B,...",
              help="Read only these columns (the others are never decoded).")
@click.option("--metrics-port", type=click.IntRange(0, 65535), envvar=env("metrics-port"),
              help="Serve /metrics, /healthz and /readyz on this port.")
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text",
              show_default=True, envvar=env("log-format"),
              help="Log lines as text or as one JSON object per line.")
@click.option("--log-level", type=click.Choice(LOG_LEVELS, case_sensitive=False),
              default="INFO", show_default=True, envvar=env("log-level"),
              help="INFO: state changes and a progress line every few seconds; DEBUG: "
                   "one line per batch, and the client libraries' own logs.")
@click.option("--progress-interval-s", type=click.FloatRange(min=0), default=5.0,
              show_default=True, envvar=env("progress-interval-s"),
              help="Log a progress line (batches, rows, rate, lag) at INFO this often while "
                   "there is work; 0: never. Each batch is logged at DEBUG.")
@click.option("--history", envvar=env("history"), type=click.Path(dir_okay=False),
              help="Append a JSONL history of deliveries and commits here (for audits; "
                   "created 0600, a symbolic link is refused).")
@click.option("--spark-master", default="local[*]", show_default=True,
              envvar=env("spark-master"),
              help="Spark master of the --spark-handler's session.")
@click.option("--spark-remote", envvar=env("spark-remote"),
              help="Spark Connect address sc://HOST:PORT (instead of --spark-master).")
@friendly_errors
def run(**kw: Any) -> None:
    """Run one member of a group until SIGTERM or SIGINT (then hand off and exit 0)."""
    _stop_cleanly_before_joining()  # until the member's own signal handlers
    setup_logging(kw["log_format"], kw["log_level"])
    if bool(kw["handler"]) == bool(kw["spark_handler"]):
        raise ConfigError("give exactly one of --handler or --spark-handler")
    member_id = kw["member_id"] or _kubernetes_pod_name()
    cfg = MemberConfig(
        group=kw["group"],
        warehouse=kw["warehouse"],
        table=kw["table"],
        # "local" or none at all resolved here, so that a refusal names the flag.
        coordinator=resolve_coordinator(kw["warehouse"], kw["coordinator"]),
        member_id=member_id,
        shards=kw["shards"],
        assignor=kw["assignor"],
        start=kw["start"],
        poll_interval_ms=kw["poll_interval_ms"],
        session_timeout_s=kw["session_timeout_s"],
        catalog_options=catalog_options(kw["catalog_option"]),
        revoke_timeout_s=kw["revoke_timeout_s"],
        shutdown_timeout_s=kw["shutdown_timeout_s"],
        rebalance_delay_s=kw["rebalance_delay"],
        forming_wait_s=kw["forming_wait"],
        include_row_kind=kw["include_row_kind"],
        columns=kw["columns"],
        max_handler_attempts=kw["max_handler_attempts"],
        max_parallel_shards=kw["max_parallel_shards"],
        connect=build_connect_options(kw),  # its session timeout: the one above
        history_path=kw["history"],
        on_data_loss=kw["on_data_loss"],
    )
    from paimon_group.process.preflight import check_coordinator_target
    from paimon_group.reading.start import parse_start
    parse_start(cfg.start)
    # Bad coordinator options (a password over plaintext) fail here, in one
    # line, before the table is opened or anything is joined.
    open_coordinator(cfg.coordinator_url, cfg.connect_options())
    check_coordinator_target(cfg.coordinator_url, create=True,
                             default_url=local_coordinator_url(cfg.warehouse))
    from paimon_group.process import preflight
    from paimon_group.process.handlers import load_callable

    table = preflight.check_table(cfg.warehouse, cfg.table, cfg.catalog_options, cfg.columns,
                                  shards=cfg.shards)
    preflight.check_history_path(cfg.history_path)
    preflight.check_metrics_port(kw["metrics_port"])
    from paimon_group.process.runner import run_until_signalled

    if kw["handler"]:
        handler = load_callable(kw["handler"], what="handler")
    else:
        from paimon_group.spark.handler import spark_handler_from_spec

        handler = spark_handler_from_spec(
            kw["spark_handler"], master=kw["spark_master"], remote=kw["spark_remote"]
        )
    preflight.probe_coordinator(cfg.coordinator_url, cfg.connect_options())
    run_until_signalled(cfg, handler, metrics_port=kw["metrics_port"],
                        progress_interval_s=kw["progress_interval_s"], table=table)


def _stop_cleanly_before_joining() -> None:
    for stop_signal in (signal.SIGTERM, signal.SIGINT):
        signal.signal(stop_signal, _stop_before_joining)


def _stop_before_joining(signum: int, frame: Any) -> None:
    """Until the member's own handler takes over (just before it joins), a
    SIGTERM or SIGINT (Ctrl-C) ends the process with 0: a pod stopped while it
    starts is a clean stop, not a crash (exit 143, or 1 "aborted"). At once:
    nothing is joined, held or created yet. Not by raising
    SystemExit, which would land wherever the signal did (inside an event
    loop being built, a half-closed client): ``os._exit`` after flushing. A
    Spark session started by ``--spark-handler`` ends with us (its JVM stops
    when our end of its pipe closes)."""
    sys.stdout.flush()
    sys.stderr.write(f"stopped before joining the group ({signal.Signals(signum).name})\n")
    sys.stderr.flush()
    os._exit(0)


def _kubernetes_pod_name() -> str | None:
    """In Kubernetes the pod name (HOSTNAME) is a stable member id for StatefulSets."""
    if os.environ.get("KUBERNETES_SERVICE_HOST") and os.environ.get("HOSTNAME"):
        return os.environ["HOSTNAME"]
    return None


@main.command()
@click.option("--workers", default=3, show_default=True, type=click.IntRange(1, 16),
              help="Worker processes (1 to 16).")
@click.option("--seconds", default=40.0, show_default=True, type=click.FloatRange(min=5),
              help="How long the demo writes (at least 5: a worker is killed and restarted "
                   "meanwhile).")
@click.option("--dir", "directory", type=click.Path(file_okay=False),
              help="Where to put the demo warehouse, the coordinator and the workers' logs, "
                   "kept at the end (default: a new temporary directory, removed at the end "
                   "of a demo that delivered every row).")
@click.option("--keep", is_flag=True,
              help="Keep the demo's temporary directory (its path is printed).")
@click.option("--warehouse", default=None,
              help="A warehouse for the demo's table demo.events instead (s3://...: the "
                   "endpoint and keys as --catalog-option, or in PAIMON_GROUP_CATALOG_OPTION); "
                   "the coordinator and the logs stay in --dir.")
@catalog_option
@friendly_errors
def demo(workers: int, seconds: float, directory: str | None, keep: bool,
         warehouse: str | None, catalog_option: tuple[str, ...]) -> None:
    """A local warehouse, a writer, WORKERS members; one is killed and restarted."""
    from paimon_group.process.demo import run_demo

    ok = run_demo(workers=workers, seconds=seconds, directory=directory, warehouse=warehouse,
                  catalog_options=catalog_options(catalog_option), keep=keep)
    sys.exit(0 if ok else 1)


for _command in (describe, list_command, reset, delete, members):
    main.add_command(_command)

if __name__ == "__main__":  # pragma: no cover
    main()
