"""The options of the ``paimon-group`` Spark source, checked before anything is joined.

:class:`SourceOptions` is built from the reader options of
``spark.readStream.format("paimon-group").option(...)``; every bad value
raises :class:`~coordinators.errors.ConfigError` with one line, which Spark
reports when the query is defined (``load()``), before the query starts or
anything is registered in the coordinator. It is plain data (picklable): the
same object travels to the source's driver process and to the executors.

The settings among the options (names, defaults, bounds) are their
declarations (:data:`paimon_group.config.settings.SPARK_SETTINGS`); the other
options name the group, its tables and the coordinator. Exactly one of
``table`` (one name), ``tables`` (comma-separated names and patterns) and
``pattern`` (one pattern) says what the query reads; one plain name is the
single-table source.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from coordinators.credentials import masked_repr
from coordinators.errors import ConfigError
from coordinators.protocol import ConnectOptions, Secret
from coordinators.registry import scheme_of
from paimon_group.config import settings as S
from paimon_group.config.member import (
    SHOWN_URLS,
    SPARK_CATALOG,
    MemberConfig,
    resolve_coordinator,
)
from paimon_group.config.settings import MEMBER_SETTINGS, SPARK_SETTINGS, Setting
from paimon_group.config.subscription import TableSubscription, is_pattern
from paimon_group.protocol.names import validate_group

__all__ = ["CATALOG_PREFIX", "METADATA_COLUMNS", "SourceOptions"]

CATALOG_PREFIX = "catalog."
"""``catalog.<key>`` options are passed to pypaimon's catalog as ``<key>``."""

METADATA_COLUMNS = ("_pg_shard", "_pg_snapshot", "_pg_epoch")
"""Appended with ``metadata_columns=true``: the shard, the snapshot a row was
committed in (the snapshot of the full scan for initial rows) and the epoch
of the ownership that planned it."""

_CONNECTION = {
    "group", "warehouse", "table", "tables", "pattern", "coordinator", "coordinator_username",
    "coordinator_password", "path",
    # TLS and authentication, named as the CLI's --coordinator-* options.
    "coordinator_password_file", "coordinator_ca", "coordinator_cert", "coordinator_key",
    "coordinator_server_name", "coordinator_auth", "allow_plaintext_credentials",
}
"""The options that name the group, its tables and its coordinator."""

_TABLE_OPTIONS = ("table", "tables", "pattern")
"""One of them names what the query reads: one table, a list, or a pattern."""

_KNOWN = _CONNECTION | {s.spark for s in SPARK_SETTINGS if s.spark}


def unknown_options(unknown: list[str]) -> str:
    """The one line for options the source does not know: each named, with the
    closest known one when there is one, then the known options."""
    named = []
    for key in unknown:
        close = difflib.get_close_matches(key, sorted(_KNOWN), n=1, cutoff=0.75)
        named.append(f'"{key}" (did you mean "{close[0]}"?)' if close else f'"{key}"')
    word = "option" if len(named) == 1 else "options"
    return (f"unknown {word} {', '.join(named)} of the paimon-group source; known options: "
            f"{', '.join(sorted(_KNOWN))}, {CATALOG_PREFIX}<pypaimon catalog option>")


def _bool(options: Mapping[str, str], key: str, default: bool) -> bool:
    text = str(options.get(key, str(default))).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no", ""):
        return False
    raise ConfigError(f"option {key}={text!r} must be true or false")


def _password_file(options: Mapping[str, str]) -> str | None:
    path = options.get("coordinator_password_file")
    if not path:
        return None
    try:
        return Path(path).read_text().strip()
    except OSError as err:
        raise ConfigError(
            f"cannot read coordinator password file {path}: {err.strerror}") from None


def _number(options: Mapping[str, str], key: str, default: float | None, *,
            integer: bool = False, allow_zero: bool = False) -> float | None:
    text = options.get(key)
    if text is None or str(text).strip() == "":
        return default
    try:
        value = int(text) if integer else float(text)
    except ValueError:
        kind = "an integer" if integer else "a number"
        raise ConfigError(f"option {key}={text!r} must be {kind}") from None
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(f"option {key}={text!r} must be {'>= 0' if allow_zero else '> 0'}")
    return value


def _setting(options: Mapping[str, str], s: Setting) -> Any:
    """The value of setting ``s`` among ``options``; its default when not given."""
    assert s.spark is not None, s.name
    if s.type is bool:
        return _bool(options, s.spark, s.default)
    if s.type in (int, float):
        return _number(options, s.spark, s.default, integer=s.type is int,
                       allow_zero=s.bound == "non-negative")
    return options.get(s.spark) or s.default


@dataclass(frozen=True)
class SourceOptions:
    """The source's settings; :meth:`parse` checks them (one ConfigError line)."""

    group: str
    warehouse: str
    table: str
    coordinator: str
    member_id: str | None = S.MEMBER_ID.default
    session_timeout_s: float = S.SESSION_TIMEOUT_S.default
    start: str = S.START.default
    shards: int | None = S.SHARDS.default
    assignor: str | None = S.ASSIGNOR.default
    revoke_timeout_s: float = S.REVOKE_TIMEOUT_S.default
    # How long a revocation waits for Spark to complete a planned batch (its
    # next trigger proves it); None: no limit (docs/spark.md, revocation).
    hold_timeout_s: float | None = S.HOLD_TIMEOUT_S.default
    rebalance_delay_s: float = S.REBALANCE_DELAY_S.default
    forming_wait_s: float = S.FORMING_WAIT_S.default
    include_row_kind: bool = S.INCLUDE_ROW_KIND.default
    metadata_columns: bool = S.METADATA_COLUMNS.default
    max_snapshots_per_batch: int | None = S.MAX_SNAPSHOTS_PER_BATCH.default
    max_rows_per_batch: int | None = S.MAX_ROWS_PER_BATCH.default
    ready_timeout_s: float = S.READY_TIMEOUT_S.default
    # A shard whose next snapshot expired unread fails the query (as Spark's
    # Kafka source's failOnDataLoss=true), or is skipped past (false).
    fail_on_data_loss: bool = S.FAIL_ON_DATA_LOSS.default
    tables_refresh_s: float = S.TABLES_REFRESH_S.default
    catalog_options: dict[str, str] = field(default_factory=dict)
    # A query over several tables (options "tables" or "pattern"): its names
    # and patterns, ``table`` then empty; empty for a query of one table.
    tables: tuple[str, ...] = ()
    coordinator_username: str | None = None
    coordinator_password: Secret | None = field(default=None, repr=False)
    coordinator_ca: str | None = None
    coordinator_cert: str | None = None
    coordinator_key: str | None = None
    coordinator_server_name: str | None = None
    coordinator_auth: str | None = None
    allow_plaintext_credentials: bool = False

    def __repr__(self) -> str:
        # The generated repr, with secret-looking catalog options masked and
        # the URLs redacted (the password is a Secret, left out).
        return masked_repr(self, "catalog_options", SHOWN_URLS)

    __str__ = __repr__

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        """Check ``options`` (Spark passes them case-insensitively, as lower case)."""
        opts = {str(k).lower(): str(v) for k, v in options.items()}
        unknown = sorted(k for k in opts if k not in _KNOWN and not k.startswith(CATALOG_PREFIX))
        if unknown:
            raise ConfigError(unknown_options(unknown))
        for required in ("group", "warehouse"):
            if not opts.get(required, "").strip():
                raise ConfigError(
                    f'the paimon-group source needs option "{required}", e.g. '
                    f'.option("{required}", ...)')
        group = validate_group(opts["group"])
        table, tables = _subscription(opts)
        coordinator = resolve_coordinator(opts["warehouse"], opts.get("coordinator"),
                                          option='.option("coordinator", "{}")',
                                          catalog=SPARK_CATALOG)
        scheme_of(coordinator)  # one line for a malformed URL or an unknown scheme
        password = opts.get("coordinator_password") or _password_file(opts)
        parsed = cls(
            group=group,
            warehouse=opts["warehouse"],
            table=table,
            tables=tables,
            coordinator=coordinator,
            catalog_options={k[len(CATALOG_PREFIX):]: v for k, v in opts.items()
                             if k.startswith(CATALOG_PREFIX)},
            coordinator_username=opts.get("coordinator_username") or None,
            coordinator_password=Secret(password) if password else None,
            coordinator_ca=opts.get("coordinator_ca") or None,
            coordinator_cert=opts.get("coordinator_cert") or None,
            coordinator_key=opts.get("coordinator_key") or None,
            coordinator_server_name=opts.get("coordinator_server_name") or None,
            coordinator_auth=opts.get("coordinator_auth") or None,
            allow_plaintext_credentials=_bool(opts, "allow_plaintext_credentials", False),
            **{s.name: _setting(opts, s) for s in SPARK_SETTINGS},
        )
        parsed.member_config()  # the member's own checks (member id, start, ...)
        return parsed

    @property
    def single_table(self) -> bool:
        """Whether the query reads one table named plainly (option "table",
        or one plain name in "tables"): today's source, unchanged."""
        return not self.tables

    @property
    def subscription(self) -> TableSubscription:
        """The tables the query reads (:mod:`paimon_group.config.subscription`)."""
        return TableSubscription.parse(self.tables or (self.table,))

    @property
    def names(self) -> str:
        """The option that names the tables and its value, for lines."""
        if self.single_table:
            return f"table={self.table}"
        return f"tables={','.join(self.tables)}"

    def member_config(self) -> MemberConfig:
        """The settings of the group member the query's driver runs."""
        return MemberConfig(
            group=self.group,
            warehouse=self.warehouse,
            table=self.table,
            tables=self.tables,
            coordinator=self.coordinator,
            catalog_options=dict(self.catalog_options),
            connect=ConnectOptions(
                session_timeout_s=self.session_timeout_s,
                username=self.coordinator_username,
                password=self.coordinator_password,
                tls_ca=self.coordinator_ca,
                tls_cert=self.coordinator_cert,
                tls_key=self.coordinator_key,
                tls_server_name=self.coordinator_server_name,
                auth_scheme=self.coordinator_auth,
                allow_plaintext_credentials=self.allow_plaintext_credentials,
            ),
            **{s.name: getattr(self, s.name) for s in MEMBER_SETTINGS if s.spark},
        )


def _subscription(opts: Mapping[str, str]) -> tuple[str, tuple[str, ...]]:
    """``(table, tables)`` of the options "table", "tables" or "pattern"
    (exactly one of them): one plain name is ``(name, ())``, today's source;
    else ``("", values)``. One line for a bad value."""
    given = [key for key in _TABLE_OPTIONS if opts.get(key, "").strip()]
    if not given:
        raise ConfigError('the paimon-group source needs option "table" (DATABASE.TABLE), '
                          '"tables" (comma-separated names and patterns) or "pattern" '
                          '(e.g. shop.*)')
    if len(given) > 1:
        raise ConfigError(f"options {' and '.join(repr(k) for k in given)} of the paimon-group "
                          'source: give one of "table", "tables" and "pattern"')
    key = given[0]
    text = opts[key].strip()
    if key == "table":
        if "." not in text:
            raise ConfigError(f"option table={text!r} must be DATABASE.TABLE")
        if is_pattern(text):
            raise ConfigError(f"option table={text!r} is a pattern: give it as option "
                              f'"pattern" (one table: DATABASE.TABLE)')
        return text, ()
    values = [v.strip() for v in text.split(",")] if key == "tables" else [text]
    if key == "pattern" and not is_pattern(text):
        raise ConfigError(f"option pattern={text!r} has no *, ? or [: give one table as "
                          'option "table", or a pattern such as shop.*')
    try:
        subscription = TableSubscription.parse(v for v in values if v)
    except ConfigError as err:
        raise ConfigError(str(err).replace("bad --table", f"option {key}: bad value", 1)) from None
    if subscription.is_single:
        return subscription.plain_names[0], ()
    return "", (*subscription.plain_names, *subscription.patterns)
