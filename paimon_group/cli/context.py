"""What an operations command opens: the coordinator, the group's table.

Each command opens its own short coordinator session. An operations command
never creates coordinator state (only ``run`` does): a typo in a path must
say "no coordinator at ...", not look like an empty coordinator.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

import click

from coordinators.errors import ConfigError
from coordinators.protocol import ConnectOptions, Coordinator
from paimon_group.cli.options import build_connect_options, catalog_options
from paimon_group.config.member import resolve_coordinator
from paimon_group.config.settings import SESSION_TIMEOUT_S

if TYPE_CHECKING:
    from paimon_group.protocol.table_map import TableMap
    from paimon_group.reading.table import ShardedTable

# The group protocol, the table and the operator tools are imported when a
# command runs, not when the command line is built: ``--help`` stays quick.


def admin_coordinator(kw: dict[str, Any]) -> tuple[str, ConnectOptions]:
    """The coordinator URL and options of an operations command.

    Without ``--coordinator`` the embedded file under a local ``--warehouse``
    (a remote one has none: ``--coordinator local`` is this host's file for
    it); an embedded file must exist already.
    """
    if not kw.get("coordinator") and not kw.get("warehouse"):
        raise ConfigError(
            "give --coordinator URL, or --warehouse for its embedded coordinator"
        )
    from paimon_group.config.member import CLI_CATALOG, refuse_credentials_in_warehouse
    from paimon_group.process.preflight import check_coordinator_target

    if kw.get("warehouse"):
        refuse_credentials_in_warehouse(kw["warehouse"], catalog=CLI_CATALOG)
    if (kw.get("coordinator") or "").strip().lower() == "local" and not kw.get("warehouse"):
        raise ConfigError("--coordinator local is the embedded file of a warehouse: "
                          "give --warehouse too")
    url = resolve_coordinator(kw.get("warehouse") or "", kw.get("coordinator"))
    options = build_connect_options(kw, SESSION_TIMEOUT_S.default)
    check_coordinator_target(url, default_url=None, create=False)
    return url, options


async def group_table(coordinator: Coordinator, group: str, given: str | None,
                      warehouse: str | None = None) -> str:
    """``--table``, or else the table an existing group was created on.

    A group created on another warehouse than ``warehouse`` (``--warehouse``)
    is refused (:class:`~paimon_group.errors.WarehouseMismatch`): on a
    coordinator shared by several warehouses, a command on one never acts on
    another's group.
    """
    from paimon_group.ops.report import GroupNotFound
    from paimon_group.protocol.group_reads import GroupReads

    meta = await GroupReads(coordinator, group).read_meta()
    if meta is not None and warehouse:
        from paimon_group.config.warehouses import normalised_warehouse
        from paimon_group.protocol.identity import check_group_warehouse

        check_group_warehouse(meta, group, normalised_warehouse(warehouse),
                              hint=f"give --warehouse {meta.warehouse} to act on it "
                                   "(nothing was read or changed)")
    if given:
        return given
    if meta is None:
        raise GroupNotFound(f"group {group!r} does not exist in this coordinator "
                            "(so --table cannot be read from it)")
    return meta.table


def open_table(kw: dict[str, Any], identifier: str | None = None) -> ShardedTable:
    """The table ``identifier`` (default ``--table``) in ``--warehouse`` (blocking)."""
    from paimon_group.reading.table import ShardedTable

    return ShardedTable.open(
        kw["warehouse"], identifier or kw["table"], catalog_options(kw.get("catalog_option", ()))
    )


def open_map_tables(kw: dict[str, Any], tables: TableMap,
                    only: Collection[int] | None = None) -> dict[int, ShardedTable | str]:
    """The live tables of a group of several tables' map (docs/many-tables.md)
    (``only``: those at these positions), by position in it, opened in one
    catalog of ``--warehouse`` (blocking); a table that cannot be opened
    (dropped since the map was written) is the one line that says why."""
    from paimon_group.reading.table import ShardedTable

    catalog, location, _ = ShardedTable.open_catalog(
        kw["warehouse"], catalog_options(kw.get("catalog_option", ())),
        for_table=", ".join(t.name for t in tables.live()))
    out: dict[int, ShardedTable | str] = {}
    for index, table in enumerate(tables.ranges):
        if table.live and (only is None or index in only):
            try:
                out[index] = ShardedTable.in_catalog(catalog, location, table.name)
            except Exception as err:  # shown on the table's row, the others still read
                out[index] = str(err).splitlines()[0] if str(err) else type(err).__name__
    return out


def open_chosen_tables(kw: dict[str, Any], tables: TableMap,
                       chosen: Collection[int]) -> dict[int, ShardedTable]:
    """The tables at positions ``chosen`` of the map, opened (blocking); one
    that cannot be opened is a one-line ConfigError naming it: a command
    that writes its files needs it."""
    opened = open_map_tables(kw, tables, chosen)
    for index, table in sorted(opened.items()):
        if isinstance(table, str):
            raise ConfigError(f"table {tables.ranges[index].name} of the group: {table}")
    return {i: t for i, t in opened.items() if not isinstance(t, str)}


def echo_json(data: Any) -> None:
    """One JSON document on stdout, keys sorted."""
    click.echo(json.dumps(data, sort_keys=True, default=str))
