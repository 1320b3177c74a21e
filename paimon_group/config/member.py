"""Configuration of one group member.

Example::

    >>> cfg = MemberConfig(group="orders", warehouse="/tmp/wh", table="db.orders")
    >>> cfg.safety_margin_s
    2.5
"""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path

from coordinators.credentials import masked_repr
from coordinators.errors import ConfigError
from coordinators.protocol import ConnectOptions
from coordinators.urls import has_userinfo, redact_url, refuse_credentials
from paimon_group.config import settings as S
from paimon_group.config.projection import parse_columns
from paimon_group.config.settings import DEFAULT_PARALLEL_SHARDS as DEFAULT_PARALLEL_SHARDS
from paimon_group.config.start import StartPosition, parse_start
from paimon_group.config.subscription import TableSubscription
from paimon_group.config.timing import MemberTiming, default_margin_s
from paimon_group.config.warehouses import (
    LOCAL_COORDINATOR,
    is_remote,
    local_state_file,
    normalised_warehouse,
)
from paimon_group.protocol.assignor import parse_assignor
from paimon_group.protocol.names import validate_group, validate_member_id

CLI_CATALOG = "in a --config file or PAIMON_GROUP_CATALOG_OPTION"
LIBRARY_CATALOG = "in catalog_options"
SPARK_CATALOG = 'as .option("catalog.<key>", ...)'
"""Where each entry point takes catalog options, as its refusals name it."""


def refuse_credentials_in_warehouse(warehouse: str, *, catalog: str = LIBRARY_CATALOG) -> None:
    """Refuse ``s3://KEY:SECRET@bucket/...`` in one line that never echoes it.

    pypaimon keeps such a URI in every object path it builds, and pyarrow's
    errors quote those paths: the secret would be printed by the first error.
    The secret may hold ``/``, ``?``, ``#`` or ``@`` (AWS secret keys often
    hold ``/``): :func:`coordinators.urls.has_userinfo` finds the user
    information wherever it ends. Credentials go in catalog options instead
    (a ``--config`` file or the environment keeps them out of ``ps``);
    ``catalog`` says where the caller's entry point takes them.
    """
    if has_userinfo(warehouse) and not warehouse.lower().startswith("file://"):
        raise ConfigError(
            f"the warehouse URI {redact_url(warehouse)} carries credentials: give them as "
            "catalog options instead (s3.access-key and s3.secret-key, and s3.session-token, "
            f"{catalog})")


def local_coordinator_url(warehouse: str) -> str:
    """The embedded coordinator of ``--coordinator local``: one host's file.

    For a local warehouse: ``<warehouse>/.paimon-group/coordinator.sqlite``
    (beside the databases, hidden, and not ending in ``.db`` so that Paimon
    never mistakes it for a database); it is also the implicit default. For a
    remote warehouse (``s3://`` ...): a file of this host keyed by the
    warehouse URI (:func:`paimon_group.config.warehouses.local_state_file`), so two
    warehouses never share group keys; members on other hosts do not see it.
    """
    if is_remote(warehouse):
        path = local_state_file(warehouse)
    else:
        path = Path(normalised_warehouse(warehouse)) / ".paimon-group" / "coordinator.sqlite"
    return f"sqlite://{path}"


SHOWN_URLS = {"warehouse": redact_url, "coordinator": redact_url}
"""The URL fields of a config's repr, and how each is shown (``masked_repr``)."""


CLI_OPTION = "--coordinator {}"
"""How the command line spells a coordinator choice (``option`` below)."""


def default_coordinator_url(warehouse: str, *, option: str = CLI_OPTION) -> str:
    """The coordinator used when none is given: the embedded file under a
    local warehouse. A remote warehouse has no implicit one (a file on each
    host would split the group): a ConfigError names the choices, in one line.
    ``option`` is how the caller spells a coordinator choice (a format with
    one ``{}``)."""
    if not is_remote(warehouse):
        return local_coordinator_url(warehouse)
    raise ConfigError(
        f"the warehouse {normalised_warehouse(warehouse)} is remote and no coordinator was "
        f"given: give {option.format('etcd://HOST:PORT')} or {option.format('zk://HOST:PORT')} "
        f"to share the group across hosts, or {option.format(LOCAL_COORDINATOR)} to keep it on "
        "this host only (members on other hosts would then form their own group)")


def resolve_coordinator(warehouse: str, coordinator: str | None, *,
                        option: str = CLI_OPTION, catalog: str = CLI_CATALOG) -> str:
    """The coordinator URL of ``coordinator`` as given (None or empty: the
    default; ``local``: :func:`local_coordinator_url`; else the URL itself).
    A warehouse URI or a coordinator URL with credentials is refused first
    (never echoed); ``option`` and ``catalog`` name the entry point's ways."""
    refuse_credentials_in_warehouse(warehouse, catalog=catalog)
    if not coordinator:
        return default_coordinator_url(warehouse, option=option)
    if coordinator.strip().lower() == LOCAL_COORDINATOR:
        return local_coordinator_url(warehouse)
    refuse_credentials(coordinator)
    return coordinator


MEMBER_HOST_CHARS = 16
"""How much of the host name a generated member id keeps: ids must fit a
``describe`` table; the pid and the random part keep them unique."""


def generated_member_id() -> str:
    """``HOST-PID-RANDOM``, the host cut to its first label and 16 characters."""
    first = socket.gethostname().split(".", 1)[0]
    host = "".join(c if c.isalnum() or c in "_-" else "-" for c in first)[:MEMBER_HOST_CHARS]
    return f"{host.strip('-') or 'member'}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


@dataclass
class MemberConfig:
    """Everything a member needs; the CLI builds one from flags, env and file."""

    group: str
    warehouse: str
    # One table (``DATABASE.TABLE``), or a pattern over ``database.table``
    # (docs/many-tables.md); "" when ``tables`` names them all.
    table: str = ""
    # A coordinator URL, or "local" (this host's embedded file); None: the
    # embedded file of a local warehouse (a remote one has no default).
    coordinator: str | None = None
    member_id: str | None = S.MEMBER_ID.default
    shards: int | None = S.SHARDS.default
    # How a new group's leader assigns shards ("count" or "load"); None: the
    # stored one of an existing group, "count" for a new one.
    assignor: str | None = S.ASSIGNOR.default
    start: str = S.START.default
    poll_interval_ms: int = S.POLL_INTERVAL_MS.default
    session_timeout_s: float = S.SESSION_TIMEOUT_S.default
    catalog_options: dict[str, str] = field(default_factory=dict)
    revoke_timeout_s: float = S.REVOKE_TIMEOUT_S.default
    shutdown_timeout_s: float = S.SHUTDOWN_TIMEOUT_S.default
    rebalance_delay_s: float = S.REBALANCE_DELAY_S.default
    include_row_kind: bool = S.INCLUDE_ROW_KIND.default
    # Columns to read (None: all); the others are never decoded.
    columns: tuple[str, ...] | None = S.COLUMNS.default
    max_handler_attempts: int = S.MAX_HANDLER_ATTEMPTS.default
    # Batches of different shards handed to the handler at once (1: one by one).
    max_parallel_shards: int = field(default_factory=lambda: S.MAX_PARALLEL_SHARDS.default)
    handler_backoff_s: float = S.HANDLER_BACKOFF_S.default
    # The member stops processing and committing this long before its local
    # session deadline (invariant 3). Default: a quarter of the timeout
    # (``timing.margin_s`` is the value in force).
    safety_margin_s: float | None = S.SAFETY_MARGIN_S.default
    # How often (at most) a shard's consumer file is rewritten with its newest
    # committed position (None: 1 s on a local warehouse, OBJECT_STORE_MIRROR_
    # INTERVAL_S on an object store, where each write is a 3-request upload).
    mirror_interval_s: float | None = S.MIRROR_INTERVAL_S.default
    connect: ConnectOptions | None = None
    history_path: str | None = S.HISTORY_PATH.default
    # A shard whose next snapshot expired unread: "fail" (stop with the lost
    # range and the reset command) or "skip" (move on to the earliest
    # retained snapshot, loudly). See paimon_group/member/data_loss.py.
    on_data_loss: str = S.ON_DATA_LOSS.default
    # A forming group's burst of arrivals is published once they pause this
    # long (at most 60 s); a lone member is published at once. 0: no wait.
    # (Last: a field added after 0.2 keeps the positional order.)
    forming_wait_s: float = S.FORMING_WAIT_S.default
    # More tables: plain names and patterns, read with ``table`` as one group
    # (docs/many-tables.md). One plain name in all is the single-table group.
    tables: tuple[str, ...] = ()
    # How often a group of several tables lists the catalog again.
    tables_refresh_s: float = S.TABLES_REFRESH_S.default

    def __post_init__(self) -> None:
        validate_group(self.group)
        refuse_credentials_in_warehouse(self.warehouse)
        if self.member_id is None:
            self.member_id = generated_member_id()
        validate_member_id(self.member_id)
        self._check_numbers()
        self._start = parse_start(self.start)
        if self.assignor is not None:
            self.assignor = parse_assignor(self.assignor)
        self.columns = parse_columns(self.columns)
        self._subscription = self._subscribe()
        self.coordinator = resolve_coordinator(self.warehouse, self.coordinator,
                                               option='coordinator="{}"',
                                               catalog=LIBRARY_CATALOG)
        if self.safety_margin_s is None:
            self.safety_margin_s = default_margin_s(self.session_timeout_s)
        if self.safety_margin_s >= self.session_timeout_s:
            raise ConfigError("the safety margin must be below the session timeout")

    def _subscribe(self) -> TableSubscription:
        """The subscription of ``table`` and ``tables`` (one line for a bad value)."""
        if isinstance(self.tables, str):
            self.tables = (self.tables,)
        self.tables = tuple(self.tables)
        values = ((self.table,) if self.table else ()) + self.tables
        if not values:
            raise ConfigError("no table given: give --table DATABASE.TABLE (or a pattern)")
        subscription = TableSubscription.parse(values)
        if subscription.is_single:
            self.table, self.tables = subscription.plain_names[0], ()
        return subscription

    @property
    def subscription(self) -> TableSubscription:
        """The tables this member reads (:mod:`paimon_group.config.subscription`)."""
        return self._subscription

    @property
    def single_table(self) -> bool:
        """Whether the group reads one table named plainly: today's group,
        records and consumer files unchanged (docs/many-tables.md)."""
        return self._subscription.is_single

    def _check_numbers(self) -> None:
        """Refuse numbers no member can run with (one line, before anything is joined)."""
        if self.shards is not None and self.shards < 1:
            raise ConfigError(f"--shards must be at least 1, got {self.shards}")
        if self.session_timeout_s <= 0:
            raise ConfigError("--session-timeout-s must be positive")
        if self.max_parallel_shards < 1:
            raise ConfigError("--max-parallel-shards must be at least 1")
        if self.poll_interval_ms < 1:
            raise ConfigError("--poll-interval-ms must be at least 1")
        if self.max_handler_attempts < 1:
            raise ConfigError(f"--max-handler-attempts must be at least 1, got "
                              f"{self.max_handler_attempts}")
        if self.revoke_timeout_s <= 0:
            raise ConfigError("--revoke-timeout-s must be positive")
        if self.shutdown_timeout_s <= 0:
            raise ConfigError("--shutdown-timeout-s must be positive")
        if self.rebalance_delay_s < 0:
            raise ConfigError("--rebalance-delay-s must not be negative")
        if self.forming_wait_s < 0:
            raise ConfigError("--forming-wait-s must not be negative")
        if self.tables_refresh_s <= 0:
            raise ConfigError("--tables-refresh-s must be positive")
        if self.on_data_loss not in ("fail", "skip"):
            raise ConfigError(f"--on-data-loss must be fail or skip, got {self.on_data_loss!r}")

    def __repr__(self) -> str:
        # The generated repr, with the values of secret-looking catalog
        # options masked (``s3.secret-key`` ...) and the URLs redacted (a
        # password in a query); ConnectOptions masks its own.
        return masked_repr(self, "catalog_options", SHOWN_URLS)

    __str__ = __repr__

    @property
    def id(self) -> str:
        assert self.member_id is not None
        return self.member_id

    @property
    def coordinator_url(self) -> str:
        assert self.coordinator is not None
        return self.coordinator

    @property
    def start_position(self) -> StartPosition:
        """``start``, parsed once (when the config was built)."""
        return self._start

    @property
    def margin(self) -> float:
        """The safety margin in force: ``timing.margin_s``, under its former name."""
        return self.timing.margin_s

    @property
    def timing(self) -> MemberTiming:
        """The timings derived from the session timeout (:mod:`paimon_group.config.timing`),
        the safety margin (``margin_s``) among them."""
        return MemberTiming.of(self.session_timeout_s, self.safety_margin_s)

    def connect_options(self) -> ConnectOptions:
        """The coordinator's options (``connect``), with this config's session
        timeout: the one the member's timings derive from."""
        base = self.connect or ConnectOptions(session_timeout_s=self.session_timeout_s)
        if base.session_timeout_s == self.session_timeout_s:
            return base
        return replace(base, session_timeout_s=self.session_timeout_s)
