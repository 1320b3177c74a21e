"""Checks the command line makes before anything is joined or created.

Bad input must give one line and a non-zero exit *before* a member joins a
group or a file appears. So ``paimon-group run`` checks, in this order: the
options (click), the coordinator URL (:func:`check_coordinator_target`; an
etcd or ZooKeeper address where nothing listens is refused there, at once:
:func:`check_not_refused`), the table (opened once: :func:`check_table`; the
tables of a group of several, listed from the catalog opened once:
:func:`check_tables`), the handler (imported), and finally that the
coordinator answers (:func:`probe_coordinator`), saying "connecting to URL
(timeout N s)" first for network coordinators, which may keep a user waiting.

Creating coordinator state is explicit: ``run`` creates the warehouse's
embedded file and its directory (a local warehouse's default,
``WAREHOUSE/.paimon-group/coordinator.sqlite``, or the file of
``--coordinator local``, which for a remote warehouse is
``$XDG_STATE_HOME/paimon-group/warehouses/<scheme>-<bucket>-<hash>/coordinator.sqlite``;
a remote warehouse without ``--coordinator`` is refused before this); an
explicitly given ``sqlite://`` file may be created by ``run`` only inside an
existing directory; the admin commands (``describe``,
``list``, ``reset``, ``delete``, ``members``) create nothing, so a typo in a
path is reported instead of looking like an empty coordinator.

Example::

    check_coordinator_target("sqlite:///no/such/dir/c.sqlite", default_url=None, create=True)
    # ConfigError: directory /no/such/dir of the SQLite coordinator ... does not exist
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from coordinators.errors import ConfigError, CoordinatorUnavailable, PaimonGroupError
from coordinators.protocol import ConnectOptions
from coordinators.registry import network_hosts, open_coordinator, redact_url, scheme_of
from coordinators.urls import host_string
from paimon_group.errors import TableNotFound, UnsupportedTable

if TYPE_CHECKING:
    from paimon_group.config.subscription import TableSubscription
    from paimon_group.reading.discovery import ListedTable, TableListing
    from paimon_group.reading.table import ShardedTable

log = logging.getLogger("paimon_group.cli")

NETWORK_SCHEMES = frozenset({"etcd", "etcds", "zk"})

# A refused connection is known at once, but a server being (re)started refuses
# for a moment: it is retried this long before the command gives up on it.
REFUSED_RETRY_S = 1.0
# The variables that send gRPC (etcd's client) through a proxy.
GRPC_PROXIES = ("grpc_proxy", "https_proxy", "http_proxy", "GRPC_PROXY", "HTTPS_PROXY",
                "HTTP_PROXY")


def check_coordinator_target(url: str, *, default_url: str | None, create: bool) -> None:
    """Refuse a ``sqlite://`` URL whose file (admin) or directory (run) is
    missing, and an etcd or ZooKeeper URL where nothing listens
    (:func:`check_not_refused`).

    ``create``: the command may create the coordinator file (``run``). The
    warehouse's embedded file (``default_url``) may also have its directory
    created.
    """
    if scheme_of(url) != "sqlite":
        check_not_refused(url)  # at once, not after the connect timeout
        return
    from coordinators.sqlite import parse_url

    path = parse_url(url).location
    if os.path.isdir(path):
        raise ConfigError(f"SQLite coordinator path {path} is a directory, not a file")
    if create:
        parent = os.path.dirname(path) or "."
        if url != default_url and not os.path.isdir(parent):
            raise ConfigError(
                f"directory {parent} of the SQLite coordinator {path} does not exist: "
                "create it first (only the warehouse's embedded file is created for you)"
            )
        return
    if not os.path.exists(path):
        raise ConfigError(
            f"no coordinator at {path}: no group has run with this warehouse "
            "(check --warehouse, or give --coordinator)"
        )


def check_table(warehouse: str, identifier: str, catalog_options: dict[str, str],
                columns: Sequence[str] | None, *, shards: int | None = None) -> ShardedTable:
    """Open the table once (a missing table, a bad warehouse), check ``--columns``,
    and ``--shards`` against what the table can fill; the table opened, for the
    member to start with (not opened twice).

    The shard count is checked as for a new group: a group with more shards
    than a non-partitioned fixed-bucket table has buckets can never have been
    created (creation refuses it), so the same refusal holds for an existing
    one, and it comes before the coordinator is touched.
    """
    from paimon_group.config.projection import check_columns
    from paimon_group.protocol.sharding import plan_new_group
    from paimon_group.reading.table import ShardedTable

    table = ShardedTable.open(warehouse, identifier, catalog_options)
    check_columns(table.table.field_names, columns)
    if shards is not None:
        plan_new_group(table, shards)
    return table


def check_tables(warehouse: str, subscription: TableSubscription,
                 catalog_options: dict[str, str], columns: Sequence[str] | None, *,
                 shards: int | None = None) -> TableListing:
    """The checks of :func:`check_table` for a group of several tables (names
    and patterns, docs/many-tables.md), each refusal one line: ``--shards``
    (each table's shard count is its own), the catalog opened once and the
    subscription listed, a plain name missing, no table matched at all, a
    table no group can read shard by shard, and ``--columns`` against every
    table listed. The listing, for what it found (the member lists again)."""
    from paimon_group.reading.discovery import list_subscribed, raise_if_missing
    from paimon_group.reading.table import ShardedTable
    from paimon_group.store.object_store import store_failure

    if shards is not None:
        raise ConfigError(
            f"--shards {shards} is for a group of one table: with several tables "
            f"(--table {subscription}) each table has its own shards (a fixed-bucket "
            "table's bucket count, 4 for others); leave --shards out")
    catalog, location, options = ShardedTable.open_catalog(
        warehouse, catalog_options, for_table=str(subscription))
    shown = redact_url(location)
    try:
        listing = list_subscribed(catalog, subscription)
    except Exception as err:
        failure = None if isinstance(err, PaimonGroupError) else store_failure(
            err, str(subscription), location, options)
        if failure is not None:
            raise failure from err
        raise
    raise_if_missing(listing, shown)
    if not listing.tables:
        raise TableNotFound(f"--table {subscription} matches no table in warehouse {shown}: "
                            "create one first (or check --warehouse and --table)")
    unsupported = [t for t in listing.tables if t.unsupported]
    if unsupported:
        raise _unsupported(unsupported)
    if columns is not None:
        for listed in listing.tables:
            _check_columns_of(catalog, listed.name, columns)
    return listing


def _unsupported(tables: Sequence[ListedTable]) -> UnsupportedTable:
    """The one line refusing ``tables`` (listed, none readable shard by shard):
    one table's reason; several tables' reason once when they share it."""
    if len(tables) == 1:
        return UnsupportedTable(tables[0].unsupported)
    names = ", ".join(t.name for t in tables)
    reasons = list(dict.fromkeys(t.unsupported.replace(f"table {t.name} ", "", 1)
                                 for t in tables))
    why = f"each {reasons[0]}" if len(reasons) == 1 else "; ".join(
        t.unsupported for t in tables)
    return UnsupportedTable(f"tables {names} cannot be read shard by shard: {why}")


def _check_columns_of(catalog: Any, name: str, columns: Sequence[str]) -> None:
    """Refuse ``--columns`` that table ``name`` of ``catalog`` does not have
    (one line naming it); a table dropped since it was listed is passed over."""
    from pypaimon.catalog.catalog_exception import (
        DatabaseNotExistException,
        TableNotExistException,
    )

    try:
        fields = list(catalog.get_table(name).field_names)
    except (TableNotExistException, DatabaseNotExistException, FileNotFoundError):
        return
    missing = [c for c in columns if c not in fields]
    if missing:
        raise ConfigError(f"--columns {missing} are not columns of table {name} (it has "
                          f"{fields}): every table of the group must have them")


def check_history_path(path: str | None) -> None:
    """``--history`` must name a file in an existing directory: a regular file
    or none yet, never a symbolic link (the member opens it with ``O_NOFOLLOW``
    too: a link planted after this check is refused as well)."""
    if path is None:
        return
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise ConfigError(f"--history {path}: directory {parent} does not exist")
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISLNK(mode):
        # Here, not at the top: paimon_group.member is slow to import, and
        # this module's other checks answer before anything heavy is loaded.
        from paimon_group.member.history import symlink_refusal

        raise symlink_refusal(path, "--history")
    if not stat.S_ISREG(mode):
        raise ConfigError(f"--history {path} is not a regular file")


def check_metrics_port(port: int | None) -> None:
    """``--metrics-port`` must be free to bind (checked, then released, before
    the coordinator is touched; the member binds it again when it starts)."""
    if not port:
        return
    import socket

    address = os.environ.get("PAIMON_GROUP_METRICS_HOST") or "0.0.0.0"
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((address, port))
        except OSError as err:
            raise ConfigError(f"--metrics-port {port}: cannot listen on {address}:{port} "
                              f"({err.strerror or err})") from None


async def _probe(url: str, options: ConnectOptions) -> None:
    coordinator = open_coordinator(url, options)
    try:
        await coordinator.connect()
    finally:
        await coordinator.close()


def probe_coordinator(url: str, options: ConnectOptions) -> None:
    """Connect once and close, within ``options.connect_timeout_s``.

    For etcd and ZooKeeper a line "connecting to URL (timeout N s)" comes
    first, so a slow or unreachable server is never silent; the client
    libraries' own retry messages are kept quiet by the logging setup.
    """
    timeout = float(options.connect_timeout_s)
    shown = redact_url(url)
    if scheme_of(url) in NETWORK_SCHEMES:
        log.info("connecting to %s (timeout %g s)", shown, timeout)

    async def bounded() -> None:
        try:
            await asyncio.wait_for(_probe(url, options), timeout)
        except TimeoutError:
            raise CoordinatorUnavailable(
                f"cannot reach coordinator {shown} within {timeout:g} s", retriable=False
            ) from None

    asyncio.run(bounded())


def check_not_refused(url: str, retry_s: float = REFUSED_RETRY_S) -> None:
    """Refuse, in one line naming the URL, an etcd or ZooKeeper coordinator
    whose every server refuses the TCP connection (nothing listens there),
    retried for ``retry_s``: the client libraries would retry it for the whole
    connect timeout. A server that accepts, does not answer (a timeout) or
    cannot be looked up, and etcd through a proxy (:data:`GRPC_PROXIES`), are
    left to the connect and its timeout."""
    import socket
    import time

    hosts = network_hosts(url)
    if not hosts or (scheme_of(url) != "zk" and any(os.environ.get(v) for v in GRPC_PROXIES)):
        return  # etcd through a proxy: a direct connection says nothing
    deadline = time.monotonic() + retry_s
    pause = 0.1
    while True:
        for host, port in hosts:
            try:
                socket.create_connection((host, port), timeout=1.0).close()
                return
            except ConnectionRefusedError:
                continue
            except OSError:
                return  # not a refusal: the connect's own timeout and message
        now = time.monotonic()
        if now >= deadline:
            break
        time.sleep(min(pause, deadline - now))
        pause *= 2
    raise CoordinatorUnavailable(
        f"coordinator {redact_url(url)} refused the connection "
        f"({', '.join(host_string(h) for h in hosts)}: connection refused for {retry_s:g} s): "
        "is it running, at this address and port?", retriable=False)
