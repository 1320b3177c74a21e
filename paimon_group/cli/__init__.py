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
declared once, in :mod:`~paimon_group.cli.options` (``run``'s settings
generated there from :mod:`paimon_group.config.settings`); ``describe`` (and
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
    SettingsCommand,
    build_connect_options,
    catalog_option,
    catalog_options,
    config_option,
    coordinator_options,
    env,
    group_option,
    param_name,
    setting_options,
    subscription_options,
)
from paimon_group.cli.version import version_option
from paimon_group.config.member import (
    MemberConfig,
    local_coordinator_url,
    resolve_coordinator,
)
from paimon_group.config.settings import MEMBER_SETTINGS, RUN_SETTINGS

__all__ = ["build_connect_options", "main", "run", "run_config", "setup_logging"]


def setup_logging(fmt: str, level: str) -> None:
    """Configure the process's logging for ``run`` (``--log-format``, ``--log-level``)."""
    from paimon_group.process.logs import configure_logging

    configure_logging(fmt, level)


@click.group(cls=OneLineErrors, context_settings={"help_option_names": ["-h", "--help"],
                                                  "max_content_width": 100})
@version_option
def main() -> None:
    """Coordinated, sharded consumer groups for Apache Paimon tables."""


@main.command(cls=SettingsCommand)
@config_option
@group_option
@subscription_options
@click.option("--handler", envvar=env("handler"), metavar="MODULE:CALLABLE",
              help="Called with each ShardBatch.")
@click.option("--spark-handler", envvar=env("spark-handler"), metavar="MODULE:CALLABLE",
              help="Called with (DataFrame, ShardBatch) for each batch.")
@coordinator_options
@setting_options(*MEMBER_SETTINGS)
@click.option("--metrics-port", type=click.IntRange(0, 65535), envvar=env("metrics-port"),
              help="Serve /metrics, /healthz and /readyz on this port.")
@setting_options(*RUN_SETTINGS)
@click.option("--spark-remote", envvar=env("spark-remote"),
              help="Spark Connect address sc://HOST:PORT (instead of --spark-master).")
@friendly_errors
def run(**kw: Any) -> None:
    """Run one member of a group until SIGTERM or SIGINT (then hand off and exit 0)."""
    _stop_cleanly_before_joining()  # until the member's own signal handlers
    setup_logging(kw["log_format"], kw["log_level"])
    if bool(kw["handler"]) == bool(kw["spark_handler"]):
        raise ConfigError("give exactly one of --handler or --spark-handler")
    cfg = run_config(kw)
    from paimon_group.process.preflight import check_coordinator_target
    # Bad coordinator options (a password over plaintext) fail here, in one
    # line, before the table is opened or anything is joined.
    open_coordinator(cfg.coordinator_url, cfg.connect_options())
    check_coordinator_target(cfg.coordinator_url, create=True,
                             default_url=local_coordinator_url(cfg.warehouse))
    from paimon_group.process import preflight
    from paimon_group.process.handlers import load_callable

    table = None
    if cfg.single_table:
        table = preflight.check_table(cfg.warehouse, cfg.table, cfg.catalog_options,
                                      cfg.columns, shards=cfg.shards)
    else:  # the member opens the catalog and lists its tables itself
        preflight.check_tables(cfg.warehouse, cfg.subscription, cfg.catalog_options,
                               cfg.columns, shards=cfg.shards)
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


def run_config(kw: dict[str, Any]) -> MemberConfig:
    """The member's config of ``run``'s parameters. The ``--table`` values
    (names and patterns) go in as given: the first as ``table``, the others
    as ``tables``, so that one plain name is the single-table group."""
    member_id = kw["member_id"] or _kubernetes_pod_name()
    settings = member_settings(kw, member_id=member_id)
    values = (kw["table"],) if isinstance(kw["table"], str) else tuple(kw["table"] or ())
    for value in values:
        if "," in value and value.count(".") > 1:
            raise ConfigError(f"bad --table {value!r}: one table or pattern per --table, "
                              "given once for each (PAIMON_GROUP_TABLE: space-separated)")
    return MemberConfig(
        group=kw["group"],
        warehouse=kw["warehouse"],
        table=values[0] if values else "",
        tables=values[1:],
        # "local" or none at all resolved here, so that a refusal names the flag.
        coordinator=resolve_coordinator(kw["warehouse"], kw["coordinator"]),
        catalog_options=catalog_options(kw["catalog_option"]),
        connect=build_connect_options(kw, settings["session_timeout_s"]),
        **settings,
    )


def member_settings(kw: dict[str, Any], **given: Any) -> dict[str, Any]:
    """The member's settings among ``run``'s parameters, as ``MemberConfig``
    fields (``given`` replaces some)."""
    values = {s.name: kw[param_name(s.flag)] for s in MEMBER_SETTINGS if s.flag}
    return {**values, **given}


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
