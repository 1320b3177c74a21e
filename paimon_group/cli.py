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
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from coordinators.base import ConnectOptions, Secret
from coordinators.credentials import describe_option
from coordinators.errors import ConfigError, PaimonGroupError
from coordinators.registry import open_coordinator, redact_url
from paimon_group.config import DEFAULT_PARALLEL_SHARDS, MemberConfig, default_coordinator_url
from paimon_group.errors import HandlerFailed
from paimon_group.names import validate_group

F = TypeVar("F", bound=Callable[..., Any])

ENV_PREFIX = "PAIMON_GROUP_"
LOG_LEVELS = ["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]


def _env(name: str) -> str:
    return ENV_PREFIX + name.upper().replace("-", "_")


def _load_config_file(ctx: click.Context, _param: click.Parameter, path: str | None) -> str | None:
    """Eager ``--config``: its values become the command's defaults (below env)."""
    if not path:
        return path
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as err:
        raise click.BadParameter(f"cannot read config file {path}: {err.strerror}") from err
    try:
        if p.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text) or {}
        else:
            import tomllib

            data = tomllib.loads(text)
    except Exception as err:
        raise click.BadParameter(
            f"cannot parse config file {path}: {_parse_error(err)}") from None
    if not isinstance(data, dict):
        raise click.BadParameter(f"config file {path} must hold a mapping of option names")
    known = {p.name for p in ctx.command.params if p.name}
    defaults: dict[str, Any] = {}
    for key, value in data.items():
        name = str(key).replace("-", "_")
        if name not in known:
            raise click.BadParameter(f"config file {path}: unknown option {key!r}")
        if name == "catalog_option" and isinstance(value, dict):
            value = [f"{k}={v}" for k, v in value.items()]
        defaults[name] = value
    ctx.default_map = {**(ctx.default_map or {}), **defaults}
    return path


def _parse_error(err: Exception) -> str:
    """A parser's complaint without the file's text: PyYAML quotes the offending
    line, which may hold a secret (``s3.secret-key: ...``)."""
    mark = getattr(err, "problem_mark", None)
    if mark is not None:
        problem = getattr(err, "problem", None) or "syntax error"
        return f"{problem} at line {mark.line + 1}, column {mark.column + 1}"
    return str(err).splitlines()[0] if str(err) else type(err).__name__


def group_option(fn: F) -> F:
    """``--group``, shared by every command that acts on one group."""
    return click.option("--group", required=True, envvar=_env("group"),
                        help="The group name.")(fn)


def optional_group_option(fn: F) -> F:
    """``--group`` or ``--all-groups`` (``describe``)."""
    fn = click.option("--all-groups", is_flag=True, default=False,
                      help="Every group of the coordinator, each with the table it was "
                           "created on.")(fn)
    return click.option("--group", envvar=_env("group"),
                        help="The group name (or --all-groups).")(fn)


def wide_option(fn: F) -> F:
    """``--wide``, shared by the commands that print tables."""
    return click.option("--wide", is_flag=True, default=False,
                        help="Never cut a cell, even on a narrow terminal (piped output is "
                             "never cut).")(fn)


def coordinator_options(fn: F) -> F:
    opts = [
        click.option("--coordinator", envvar=_env("coordinator"),
                     help="Coordinator URL: sqlite:///PATH, etcd://HOST:PORT[/PREFIX], "
                          "zk://HOST:PORT[/CHROOT]. Default: the embedded file under the "
                          "warehouse, WAREHOUSE/.paimon-group/coordinator.sqlite."),
        click.option("--coordinator-username", envvar=_env("coordinator-username"),
                     help="User for etcd auth or ZooKeeper digest/SASL."),
        click.option("--coordinator-password-file", envvar=_env("coordinator-password-file"),
                     type=click.Path(dir_okay=False),
                     help="File holding the coordinator password (or set "
                          "PAIMON_GROUP_COORDINATOR_PASSWORD)."),
        click.option("--coordinator-ca", envvar=_env("coordinator-ca"),
                     type=click.Path(dir_okay=False), help="CA bundle for TLS."),
        click.option("--coordinator-cert", envvar=_env("coordinator-cert"),
                     type=click.Path(dir_okay=False), help="Client certificate for TLS."),
        click.option("--coordinator-key", envvar=_env("coordinator-key"),
                     type=click.Path(dir_okay=False), help="Client key for TLS."),
        click.option("--coordinator-server-name", envvar=_env("coordinator-server-name"),
                     help="etcd only: the name expected in the server certificate, when it differs "
                          "from the host (ZooKeeper refuses it: name its servers as their "
                          "certificates do)."),
        click.option("--coordinator-auth", envvar=_env("coordinator-auth"),
                     type=click.Choice(["digest", "sasl"]),
                     help="ZooKeeper authentication scheme (default digest with a user)."),
        click.option("--allow-plaintext-credentials", is_flag=True, default=False,
                     envvar=_env("allow-plaintext-credentials"),
                     help="Accept sending the coordinator password without TLS (etcd:// "
                          "with a password, ZooKeeper digest): trusted networks only."),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


def build_connect_options(kw: dict[str, Any], session_timeout_s: float = 10.0) -> ConnectOptions:
    password: Secret | None = None
    pw_file = kw.get("coordinator_password_file")
    if pw_file:
        try:
            password = Secret(Path(pw_file).read_text().strip())
        except OSError as err:
            raise ConfigError(f"cannot read coordinator password file {pw_file}: "
                              f"{err.strerror}") from err
    elif os.environ.get(_env("coordinator-password")):
        password = Secret(os.environ[_env("coordinator-password")])
    return ConnectOptions(
        session_timeout_s=session_timeout_s,
        username=kw.get("coordinator_username"),
        password=password,
        tls_ca=kw.get("coordinator_ca"),
        tls_cert=kw.get("coordinator_cert"),
        tls_key=kw.get("coordinator_key"),
        tls_server_name=kw.get("coordinator_server_name"),
        auth_scheme=kw.get("coordinator_auth"),
        allow_plaintext_credentials=bool(kw.get("allow_plaintext_credentials")),
    )


def _table_options(fn: F, *, table_required: bool) -> F:
    fn = click.option("--catalog-option", "catalog_option", multiple=True,
                      envvar=_env("catalog-option"), metavar="KEY=VALUE",
                      help="Extra pypaimon catalog option (repeatable).")(fn)
    table_help = "The table, DATABASE.TABLE." if table_required else (
        "The table, DATABASE.TABLE. Default: the one the group was created on.")
    fn = click.option("--table", required=table_required, envvar=_env("table"),
                      help=table_help)(fn)
    fn = click.option("--warehouse", required=True, envvar=_env("warehouse"),
                      help="The Paimon warehouse (path or URI).")(fn)
    return fn


def table_options(fn: F) -> F:
    """``--warehouse``, ``--table`` (required) and ``--catalog-option``."""
    return _table_options(fn, table_required=True)


def stored_table_options(fn: F) -> F:
    """The same, ``--table`` optional: commands on an existing group read its table."""
    return _table_options(fn, table_required=False)


async def group_table(coordinator: Any, group: str, given: str | None) -> str:
    """``--table``, or else the table an existing group was created on."""
    if given:
        return given
    from paimon_group.describe import GroupNotFound
    from paimon_group.group import GroupClient

    meta = await GroupClient(coordinator, group).read_meta()
    if meta is None:
        raise GroupNotFound(f"group {group!r} does not exist in this coordinator "
                            "(so --table cannot be read from it)")
    return meta.table


def _catalog_options(pairs: tuple[str, ...] | list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = str(pair).partition("=")
        if not sep or not key:
            # Never echo a value: the key may be s3.secret-key.
            raise ConfigError(f"--catalog-option {describe_option(str(pair))} must be KEY=VALUE")
        out[key] = value
    return out


def friendly_errors(fn: F) -> F:
    """One line and a non-zero exit for every error we know how to explain."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ConfigError as err:
            click.echo(f"error: {err}", err=True)
            sys.exit(2)
        except HandlerFailed as err:
            click.echo(f"error: {err}", err=True)
            sys.exit(3)
        except PaimonGroupError as err:
            click.echo(f"error: {err}", err=True)
            sys.exit(1)

    return wrapper  # type: ignore[return-value]


def setup_logging(fmt: str, level: str) -> None:
    from paimon_group.logs import configure_logging

    configure_logging(fmt, level)


class OneLineErrors(click.Group):
    """A command group whose usage errors are one line, ``error: ...``, exit 2.

    Click's own format is three lines (usage, hint, error); a bad flag should
    read like every other bad input of this CLI.
    """

    def main(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["standalone_mode"] = False
        try:
            code = super().main(*args, **kwargs)
        except click.ClickException as err:
            hint = ""
            if isinstance(err, click.UsageError) and err.ctx is not None:
                hint = f" (see {err.ctx.command_path} --help)"
            click.echo(f"error: {err.format_message()}{hint}", err=True)
            sys.exit(err.exit_code)
        except click.Abort:
            click.echo("aborted", err=True)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The command list with each summary whole (click cuts them with "...")."""
        rows = []
        for name in self.list_commands(ctx):
            cmd = self.get_command(ctx, name)
            if cmd is not None and not cmd.hidden:
                rows.append((name, cmd.get_short_help_str(limit=200)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


@click.group(cls=OneLineErrors, context_settings={"help_option_names": ["-h", "--help"],
                                                  "max_content_width": 100})
@click.version_option(package_name="paimon-group")
def main() -> None:
    """Coordinated, sharded consumer groups for Apache Paimon tables."""


@main.command()
@click.option("--config", type=click.Path(dir_okay=False), is_eager=True, expose_value=False,
              callback=_load_config_file, help="TOML or YAML file with option values.")
@group_option
@table_options
@click.option("--handler", envvar=_env("handler"), metavar="MODULE:CALLABLE",
              help="Called with each ShardBatch.")
@click.option("--spark-handler", envvar=_env("spark-handler"), metavar="MODULE:CALLABLE",
              help="Called with (DataFrame, ShardBatch) for each batch.")
@coordinator_options
@click.option("--member-id", envvar=_env("member-id"),
              help="Stable member id (static membership). Default: the pod name in "
                   "Kubernetes, else HOST-PID-RANDOM.")
@click.option("--shards", type=int, envvar=_env("shards"),
              help="Shard count of a new group (default: the table's bucket count; 4 for "
                   "tables without a fixed bucket count). See README, table kinds.")
@click.option("--start", default="latest-full", show_default=True, envvar=_env("start"),
              help="Where a shard without a position starts: latest-full, latest, earliest, "
                   "snapshot:N, timestamp:ISO-8601.")
@click.option("--poll-interval-ms", type=int, default=1000, show_default=True,
              envvar=_env("poll-interval-ms"),
              help="How often an idle shard looks for a new snapshot.")
@click.option("--session-timeout-s", type=float, default=10.0, show_default=True,
              envvar=_env("session-timeout-s"),
              help="The coordinator session (lease) timeout: a member that stops "
                   "heartbeating loses its shards after this long; also the connect timeout.")
@click.option("--revoke-timeout-s", type=float, default=10.0, show_default=True,
              envvar=_env("revoke-timeout-s"),
              help="How long a revoked shard's batch in flight may take before it is "
                   "abandoned.")
@click.option("--shutdown-timeout-s", type=float, default=30.0, show_default=True,
              envvar=_env("shutdown-timeout-s"),
              help="Graceful SIGTERM handoff must finish within this.")
@click.option("--rebalance-delay", type=float, default=0.0, show_default=True,
              envvar=_env("rebalance-delay"),
              help="Seconds the leader keeps the shards of a member that vanished without "
                   "a goodbye, waiting for it to come back (static membership).")
@click.option("--max-handler-attempts", type=int, default=5, show_default=True,
              envvar=_env("max-handler-attempts"),
              help="Calls of the handler for one batch (with backoff) before the member "
                   "fails with exit 3; the batch is not committed.")
@click.option("--max-parallel-shards", type=int, default=DEFAULT_PARALLEL_SHARDS,
              show_default="one per CPU, at most 4", envvar=_env("max-parallel-shards"),
              help="Batches of different shards in the handler at once (1: one by one). "
                   "Never two batches of the same shard.")
@click.option("--include-row-kind", is_flag=True, default=False,
              envvar=_env("include-row-kind"), help="Add the _row_kind column.")
@click.option("--columns", envvar=_env("columns"), metavar="A,B,...",
              help="Read only these columns (the others are never decoded).")
@click.option("--metrics-port", type=int, envvar=_env("metrics-port"),
              help="Serve /metrics, /healthz and /readyz on this port.")
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text",
              show_default=True, envvar=_env("log-format"),
              help="Log lines as text or as one JSON object per line.")
@click.option("--log-level", type=click.Choice(LOG_LEVELS, case_sensitive=False),
              default="INFO", show_default=True, envvar=_env("log-level"),
              help="INFO: state changes and a progress line every few seconds; DEBUG: "
                   "one line per batch, and the client libraries' own logs.")
@click.option("--progress-interval-s", type=click.FloatRange(min=0), default=5.0,
              show_default=True, envvar=_env("progress-interval-s"),
              help="Log a progress line (batches, rows, rate, lag) at INFO this often while "
                   "there is work; 0: never. Each batch is logged at DEBUG.")
@click.option("--history", envvar=_env("history"), type=click.Path(dir_okay=False),
              help="Append a JSONL history of deliveries and commits here (for audits).")
@click.option("--spark-master", default="local[*]", show_default=True,
              envvar=_env("spark-master"),
              help="Spark master of the --spark-handler's session.")
@click.option("--spark-remote", envvar=_env("spark-remote"),
              help="Spark Connect address sc://HOST:PORT (instead of --spark-master).")
@friendly_errors
def run(**kw: Any) -> None:
    """Run one member of a group until SIGTERM or SIGINT (then hand off and exit 0)."""
    setup_logging(kw["log_format"], kw["log_level"])
    if bool(kw["handler"]) == bool(kw["spark_handler"]):
        raise ConfigError("give exactly one of --handler or --spark-handler")
    member_id = kw["member_id"] or _kubernetes_pod_name()
    cfg = MemberConfig(
        group=kw["group"],
        warehouse=kw["warehouse"],
        table=kw["table"],
        coordinator=kw["coordinator"],
        member_id=member_id,
        shards=kw["shards"],
        start=kw["start"],
        poll_interval_ms=kw["poll_interval_ms"],
        session_timeout_s=kw["session_timeout_s"],
        catalog_options=_catalog_options(kw["catalog_option"]),
        revoke_timeout_s=kw["revoke_timeout_s"],
        shutdown_timeout_s=kw["shutdown_timeout_s"],
        rebalance_delay_s=kw["rebalance_delay"],
        include_row_kind=kw["include_row_kind"],
        columns=kw["columns"],
        max_handler_attempts=kw["max_handler_attempts"],
        max_parallel_shards=kw["max_parallel_shards"],
        connect=build_connect_options(kw, kw["session_timeout_s"]),
        history_path=kw["history"],
    )
    from paimon_group.preflight import check_coordinator_target
    from paimon_group.start import parse_start

    parse_start(cfg.start)
    # Bad coordinator options (a password over plaintext) fail here, in one
    # line, before the table is opened or anything is joined.
    open_coordinator(cfg.coordinator_url, cfg.connect_options())
    check_coordinator_target(cfg.coordinator_url, create=True,
                             default_url=default_coordinator_url(cfg.warehouse))
    from paimon_group import preflight
    from paimon_group.handlers import load_callable

    preflight.check_table(cfg.warehouse, cfg.table, cfg.catalog_options, cfg.columns)
    from paimon_group.runner import run_until_signalled

    if kw["handler"]:
        handler = load_callable(kw["handler"], what="handler")
    else:
        from paimon_group.spark import spark_handler_from_spec

        handler = spark_handler_from_spec(
            kw["spark_handler"], master=kw["spark_master"], remote=kw["spark_remote"]
        )
    preflight.probe_coordinator(cfg.coordinator_url, cfg.connect_options())
    run_until_signalled(cfg, handler, metrics_port=kw["metrics_port"],
                        progress_interval_s=kw["progress_interval_s"])


def _kubernetes_pod_name() -> str | None:
    """In Kubernetes the pod name (HOSTNAME) is a stable member id for StatefulSets."""
    if os.environ.get("KUBERNETES_SERVICE_HOST") and os.environ.get("HOSTNAME"):
        return os.environ["HOSTNAME"]
    return None


def _open_for_admin(kw: dict[str, Any]) -> tuple[str, ConnectOptions]:
    url = kw.get("coordinator") or default_coordinator_url(kw["warehouse"])
    return url, build_connect_options(kw)


@main.command()
@optional_group_option
@stored_table_options
@coordinator_options
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object (with --all-groups: {\"groups\": [...]}).")
@wide_option
@click.option("--watch", type=float, is_flag=False, flag_value=2.0, default=None,
              metavar="[SECONDS]", help="Refresh in place every SECONDS (default 2) until "
                                        "Ctrl-C; with --json one line per refresh.")
@friendly_errors
def describe(**kw: Any) -> None:
    """Members, leader, generation, and per shard its owner, epoch, position and lag."""
    from paimon_group.cli_admin import admin_coordinator

    if bool(kw["group"]) == kw["all_groups"]:
        raise ConfigError("give --group NAME or --all-groups")
    if kw["all_groups"] and (kw["table"] or kw["watch"] is not None):
        raise ConfigError("--all-groups reads each group's own table; it takes no --table "
                          "or --watch")
    if kw["group"]:
        validate_group(kw["group"])
    url, options = admin_coordinator(kw)
    if kw["watch"] is not None:
        from paimon_group.cli_admin import watch_describe

        watch_describe(url, options, kw, kw["watch"])
        return
    if kw["all_groups"]:
        reports = asyncio.run(_describe_all(url, options, kw))
    else:
        reports = [asyncio.run(_describe(url, options, kw))]
    if kw["as_json"]:
        out = {"coordinator": redact_url(url), "groups": reports} if kw["all_groups"] \
            else reports[0]
        click.echo(json.dumps(out, sort_keys=True))
        return
    from paimon_group.render import output_console, render_describe

    console = output_console(kw["wide"])
    for i, report in enumerate(reports):
        if i:
            console.print()
        render_describe(report, console)
    if not reports:
        console.print("no groups in this coordinator")


async def _describe_all(url: str, options: ConnectOptions,
                        kw: dict[str, Any]) -> list[dict[str, Any]]:
    """describe of every group; each table opened once (groups may share one)."""
    from paimon_group.describe import describe_group
    from paimon_group.names import GroupKeys
    from paimon_group.table import ShardedTable

    tables: dict[str, ShardedTable] = {}
    reports: list[dict[str, Any]] = []
    async with open_coordinator(url, options) as coord:
        for entry in await coord.list(GroupKeys.all_groups()):
            name = GroupKeys.last_segment(entry.key)
            identifier = await group_table(coord, name, None)
            if identifier not in tables:
                tables[identifier] = await asyncio.to_thread(
                    ShardedTable.open, kw["warehouse"], identifier,
                    _catalog_options(kw["catalog_option"]))
            report = await describe_group(coord, name, tables[identifier])
            report["coordinator"] = redact_url(url)
            reports.append(report)
    return reports


async def _describe(url: str, options: ConnectOptions, kw: dict[str, Any]) -> dict[str, Any]:
    from paimon_group.describe import describe_group
    from paimon_group.table import ShardedTable

    async with open_coordinator(url, options) as coord:
        kw["table"] = await group_table(coord, kw["group"], kw["table"])
        table = await asyncio.to_thread(
            ShardedTable.open, kw["warehouse"], kw["table"],
            _catalog_options(kw["catalog_option"]))
        report = await describe_group(coord, kw["group"], table)
    report["coordinator"] = redact_url(url)
    return report


@main.command()
@click.option("--workers", default=3, show_default=True, help="Worker processes.")
@click.option("--seconds", default=40.0, show_default=True, help="How long the demo writes.")
@click.option("--dir", "directory", type=click.Path(file_okay=False),
              help="Where to put the demo warehouse (default: a new temporary directory).")
@friendly_errors
def demo(workers: int, seconds: float, directory: str | None) -> None:
    """A local warehouse, a writer, WORKERS members; one is killed and restarted."""
    from paimon_group.demo import run_demo

    ok = run_demo(workers=workers, seconds=seconds, directory=directory)
    sys.exit(0 if ok else 1)


from paimon_group import cli_admin  # noqa: E402,F401  (registers list/reset/delete/members)

if __name__ == "__main__":  # pragma: no cover
    main()
