"""Every option of ``paimon-group``, declared once.

An option shared by several commands is one decorator here; ``run``'s
settings are generated from their declarations
(:mod:`paimon_group.config.settings`) by :func:`setting_options`, with their
former spellings (:class:`SettingsCommand`). Each option also reads
``PAIMON_GROUP_<OPTION>`` (upper case, ``-`` as ``_``), and ``run``'s options
read a TOML or YAML file given with ``--config`` (below the environment).
Parsing of option values (the coordinator's connect options,
``--catalog-option`` pairs) lives here too.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
from click.core import ParameterSource

from coordinators.credentials import describe_option, is_secret_key
from coordinators.errors import ConfigError
from coordinators.protocol import ConnectOptions, Secret
from paimon_group.config.settings import SETTINGS, Setting, env_name

F = TypeVar("F", bound=Callable[..., Any])


def env(name: str) -> str:
    """The environment variable of option ``name``: ``PAIMON_GROUP_<NAME>``."""
    return env_name(name)


# -- the declared settings ----------------------------------------------------------

FORMER_FLAGS = {former: s for s in SETTINGS for former in s.former_flags}
"""Each former spelling of a setting's flag, and the setting it names now."""


def param_name(flag: str) -> str:
    """The parameter (and ``--config`` key) of a flag: ``--poll-interval-ms`` ->
    ``poll_interval_ms``."""
    return flag.lstrip("-").replace("-", "_")


def _click_type(s: Setting) -> Any:
    if s.choices:
        return click.Choice(s.choices, case_sensitive=False)
    if s.path:
        return click.Path(dir_okay=False)
    if s.bound == "non-negative":
        return click.FloatRange(min=0) if s.type is float else click.IntRange(min=0)
    return s.type


def setting_option(s: Setting) -> Callable[[F], F]:
    """The click option of a declared setting: its flag, environment variable,
    default and help, all from the declaration."""
    assert s.flag is not None, s.name
    kwargs: dict[str, Any] = {"help": s.help, "envvar": s.env}
    if s.type is bool:
        kwargs.update(is_flag=True, default=s.default)
    else:
        kwargs["type"] = _click_type(s)
        if s.default is not None:
            kwargs.update(default=s.default, show_default=s.shown_default or True)
    if s.metavar:
        kwargs["metavar"] = s.metavar
    return click.option(s.flag, param_name(s.flag), **kwargs)


def setting_options(*settings: Setting) -> Callable[[F], F]:
    """The options of ``settings``, in their order (those without a flag skipped)."""
    def decorate(fn: F) -> F:
        for s in reversed([s for s in settings if s.flag]):
            fn = setting_option(s)(fn)
        return fn

    return decorate


def warn_of_former_spelling(former: str, s: Setting) -> None:
    """The one deprecation line of a former flag (or its variable, or key)."""
    click.echo(f"warning: {former} is deprecated: use {s.flag}", err=True)


class SettingsCommand(click.Command):
    """A command whose settings answer to their former flags too: each one
    given (``--rebalance-delay 60``, ``--rebalance-delay=60``) works as the
    current flag, and a former flag's environment variable as the current one
    (below any flag given, which comes later), each with one deprecation line
    on stderr."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        from_env: list[str] = []
        for former, s in FORMER_FLAGS.items():
            value = os.environ.get(env_name(former))
            if value and s.flag and s.env not in os.environ:
                warn_of_former_spelling(env_name(former), s)
                from_env += [s.flag, value]
        return super().parse_args(ctx, [*from_env, *_current_flags(args)])


def _current_flags(args: list[str]) -> list[str]:
    """``args`` with each former flag replaced by its setting's current one."""
    rewritten: list[str] = []
    for i, arg in enumerate(args):
        if arg == "--":
            return [*rewritten, *args[i:]]
        flag, sep, value = arg.partition("=")
        s = FORMER_FLAGS.get(flag)
        if s is not None and s.flag:
            warn_of_former_spelling(flag, s)
            arg = f"{s.flag}{sep}{value}"
        rewritten.append(arg)
    return rewritten


# -- --config -----------------------------------------------------------------


def load_config_file(ctx: click.Context, _param: click.Parameter, path: str | None) -> str | None:
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
        s = FORMER_FLAGS.get("--" + name.replace("_", "-"))
        if s is not None and s.flag:
            warn_of_former_spelling(f"{path}: {key}", s)
            name = param_name(s.flag)
        if name not in known:
            raise click.BadParameter(f"config file {path}: unknown option {key!r}")
        if name == "catalog_option" and isinstance(value, dict):
            value = [f"{k}={v}" for k, v in value.items()]
        elif isinstance(value, str) and _is_multiple(ctx, name):
            value = [value]  # table = "db.orders": one value of a repeatable option
        defaults[name] = value
    ctx.default_map = {**(ctx.default_map or {}), **defaults}
    return path


def _is_multiple(ctx: click.Context, name: str) -> bool:
    """Whether the command's option ``name`` is repeatable (a list of values)."""
    return any(isinstance(p, click.Option) and p.multiple and p.name == name
               for p in ctx.command.params)


def _parse_error(err: Exception) -> str:
    """A parser's complaint without the file's text: PyYAML quotes the offending
    line, which may hold a secret (``s3.secret-key: ...``)."""
    mark = getattr(err, "problem_mark", None)
    if mark is not None:
        problem = getattr(err, "problem", None) or "syntax error"
        return f"{problem} at line {mark.line + 1}, column {mark.column + 1}"
    return str(err).splitlines()[0] if str(err) else type(err).__name__


def config_option(fn: F) -> F:
    """``--config PATH`` (``run``)."""
    return click.option("--config", type=click.Path(dir_okay=False), is_eager=True,
                        expose_value=False, callback=load_config_file,
                        help="TOML or YAML file with option values.")(fn)


# -- the group and output -------------------------------------------------------


def group_option(fn: F) -> F:
    """``--group``, shared by every command that acts on one group."""
    return click.option("--group", required=True, envvar=env("group"),
                        help="The group name.")(fn)


def optional_group_option(fn: F) -> F:
    """``--group`` or ``--all-groups`` (``describe``)."""
    fn = click.option("--all-groups", is_flag=True, default=False,
                      help="Every group of the coordinator, each with the table it was "
                           "created on.")(fn)
    return click.option("--group", envvar=env("group"),
                        help="The group name (or --all-groups).")(fn)


def wide_option(fn: F) -> F:
    """``--wide``, shared by the commands that print tables."""
    return click.option("--wide", is_flag=True, default=False,
                        help="Never cut a cell, even on a narrow terminal (piped output is "
                             "never cut).")(fn)


def json_option(help: str) -> Callable[[F], F]:
    """``--json``: the command's result as JSON (``help`` says what is printed)."""
    def decorate(fn: F) -> F:
        return click.option("--json", "as_json", is_flag=True, help=help)(fn)

    return decorate


# -- the coordinator --------------------------------------------------------------


def coordinator_options(fn: F) -> F:
    """``--coordinator`` and its credentials and TLS files."""
    opts = [
        click.option("--coordinator", envvar=env("coordinator"),
                     help="Coordinator URL: etcd://HOST:PORT[/PREFIX], zk://HOST:PORT[/CHROOT] "
                          "(shared by hosts), sqlite:///PATH, or local: this host's embedded "
                          "file of the warehouse. Default for a local warehouse: "
                          "WAREHOUSE/.paimon-group/coordinator.sqlite; a remote warehouse "
                          "(s3://...) has no default (see docs/operations.md)."),
        click.option("--coordinator-username", envvar=env("coordinator-username"),
                     help="User for etcd auth or ZooKeeper digest/SASL."),
        click.option("--coordinator-password-file", envvar=env("coordinator-password-file"),
                     type=click.Path(dir_okay=False),
                     help="File holding the coordinator password (or set "
                          "PAIMON_GROUP_COORDINATOR_PASSWORD)."),
        click.option("--coordinator-ca", envvar=env("coordinator-ca"),
                     type=click.Path(dir_okay=False), help="CA bundle for TLS."),
        click.option("--coordinator-cert", envvar=env("coordinator-cert"),
                     type=click.Path(dir_okay=False), help="Client certificate for TLS."),
        click.option("--coordinator-key", envvar=env("coordinator-key"),
                     type=click.Path(dir_okay=False), help="Client key for TLS."),
        click.option("--coordinator-server-name", envvar=env("coordinator-server-name"),
                     help="etcd only: the name expected in the server certificate, when it differs "
                          "from the host (ZooKeeper refuses it: name its servers as their "
                          "certificates do)."),
        click.option("--coordinator-auth", envvar=env("coordinator-auth"),
                     type=click.Choice(["digest", "sasl"]),
                     help="ZooKeeper authentication scheme (default digest with a user)."),
        click.option("--allow-plaintext-credentials", is_flag=True, default=False,
                     envvar=env("allow-plaintext-credentials"),
                     help="Accept sending the coordinator password without TLS (etcd:// "
                          "with a password, ZooKeeper digest): trusted networks only."),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


def build_connect_options(kw: dict[str, Any], session_timeout_s: float) -> ConnectOptions:
    """The coordinator's connect options from the parsed coordinator options,
    with the session timeout of the member (or of the command) using them."""
    password: Secret | None = None
    pw_file = kw.get("coordinator_password_file")
    if pw_file:
        try:
            password = Secret(Path(pw_file).read_text().strip())
        except OSError as err:
            raise ConfigError(f"cannot read coordinator password file {pw_file}: "
                              f"{err.strerror}") from err
    elif os.environ.get(env("coordinator-password")):
        password = Secret(os.environ[env("coordinator-password")])
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


# -- the warehouse and the table --------------------------------------------------

_WAREHOUSE_HELP = "The Paimon warehouse (path or URI)."
_OPTIONAL_WAREHOUSE_HELP = ("The Paimon warehouse: locates the embedded coordinator (of a "
                            "local warehouse, or with --coordinator local) and the tables "
                            "(for lag).")


def catalog_option(fn: F) -> F:
    """``--catalog-option KEY=VALUE`` (repeatable)."""
    return click.option("--catalog-option", "catalog_option", multiple=True,
                        envvar=env("catalog-option"), metavar="KEY=VALUE",
                        callback=warn_of_secrets_on_the_command_line,
                        help="Extra catalog option (repeatable): pypaimon's (s3.endpoint ...), "
                             "or paimon-group.s3.timeout-s (object store request timeout, "
                             "default 10 s).")(fn)


def warn_of_secrets_on_the_command_line(ctx: click.Context, param: click.Parameter,
                                        pairs: tuple[str, ...]) -> tuple[str, ...]:
    """One warning line on stderr when secret-looking ``--catalog-option`` keys
    (the keys masked everywhere: ``s3.secret-key``, ``s3.access-key`` ...) are
    given as flags, which any user of the host reads with ``ps``. It names the
    keys, never a value, and the ways that keep them off the command line.
    Nothing is said of pairs from the environment or a ``--config`` file."""
    if not pairs or ctx.get_parameter_source(param.name or "") is not ParameterSource.COMMANDLINE:
        return pairs
    keys = sorted({key for key, sep, _ in (str(p).partition("=") for p in pairs)
                   if sep and is_secret_key(key)})
    if keys:
        click.echo(f"warning: --catalog-option {', '.join(keys)} on the command line can be "
                   "read by other users of this host (ps): give secret catalog options in the "
                   "--config file's [catalog-option] table or in "
                   f"{env('catalog-option')}", err=True)
    return pairs


_SUBSCRIPTION_HELP = (
    "A table, DATABASE.TABLE, or a pattern of them ('shop.*', '*.orders': shell-style "
    "* ? [...] over database.table). Repeatable: the group reads every table named or "
    "matched, and a pattern's new tables join it (--tables-refresh-s). One plain name: a "
    "group of that one table. PAIMON_GROUP_TABLE may hold several, space-separated.")


def _table_options(fn: F, *, table_required: bool, repeatable: bool = False) -> F:
    fn = catalog_option(fn)
    table_help = "The table, DATABASE.TABLE." if table_required else (
        "The table, DATABASE.TABLE. Default: the one the group was created on.")
    if repeatable:
        fn = click.option("--table", required=True, multiple=True, envvar=env("table"),
                          metavar="DATABASE.TABLE", help=_SUBSCRIPTION_HELP)(fn)
    else:
        fn = click.option("--table", required=table_required, envvar=env("table"),
                          help=table_help)(fn)
    return click.option("--warehouse", required=True, envvar=env("warehouse"),
                        help=_WAREHOUSE_HELP)(fn)


def table_options(fn: F) -> F:
    """``--warehouse``, ``--table`` (required) and ``--catalog-option``."""
    return _table_options(fn, table_required=True)


def subscription_options(fn: F) -> F:
    """``--warehouse``, ``--table`` (required, repeatable, names and patterns:
    a tuple of values) and ``--catalog-option`` (``run``)."""
    return _table_options(fn, table_required=True, repeatable=True)


def stored_table_options(fn: F) -> F:
    """The same, ``--table`` optional: commands on an existing group read its table."""
    return _table_options(fn, table_required=False)


def optional_warehouse_options(fn: F) -> F:
    """``--warehouse`` (optional: for the embedded coordinator and for lag) and
    ``--catalog-option``: commands that need no table (``list``, ``members remove``)."""
    fn = catalog_option(fn)
    return click.option("--warehouse", envvar=env("warehouse"),
                        help=_OPTIONAL_WAREHOUSE_HELP)(fn)


def catalog_options(pairs: tuple[str, ...] | list[str]) -> dict[str, str]:
    """``--catalog-option`` pairs as a mapping; a malformed pair is a ConfigError
    that never echoes the value (the key may be ``s3.secret-key``)."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = str(pair).partition("=")
        if not sep or not key:
            raise ConfigError(f"--catalog-option {describe_option(str(pair))} must be KEY=VALUE")
        out[key] = value
    return out
