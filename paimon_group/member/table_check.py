"""Is the table read still the one the group was created on?

An idle table and a dropped one look alike to the planner (no new snapshot),
and a re-created one looks like a table whose next snapshot is not there
yet: the read loop checks now and then (``TABLE_CHECK_S``), busy or idle.
A group of one table stops on a table gone (TableNotFound) or replaced
(TableReplaced); a group of several stops reading only that table (one
WARNING), and its leader's listing takes it out of the map.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from paimon_group.member.core import MemberCore
from paimon_group.protocol.identity import check_table_identity, table_identity
from paimon_group.reading.table import ShardedTable

log = logging.getLogger("paimon_group.member")

__all__ = ["check_table", "check_table_in_place", "check_tables_in_place"]


def check_table(core: MemberCore) -> None:
    """Raise TableNotFound if the table is gone, TableReplaced if it was
    dropped and re-created since the group was created. Skipped while the
    group's fresh head says its leader found the table in place moments
    ago (member/head.py: one check per group, not one per member). In a
    group of several tables each is checked, and one found gone stops
    being read (:func:`check_tables_in_place`)."""
    meta, tables = core.meta, core.tables
    if tables is not None and not tables.single:
        check_tables_in_place(core, vouched=core.head.vouches_for_table)
        return
    if core.head.vouches_for(meta.table_id if meta is not None else ""):
        return
    check_table_in_place(core)


def check_table_in_place(core: MemberCore, shards: Iterable[int] = ()) -> None:
    """:func:`check_table`, whatever the head says; in a group of several
    tables, the tables of ``shards`` too, held or not."""
    tables = core.tables
    if tables is not None and not tables.single:
        check_tables_in_place(core, shards)
        return
    cfg = core.config
    current = table_identity(core.table.table) if core.table is not None else ""
    if not current:
        # No first schema to read: the table is gone (TableNotFound) or
        # of a layout read only through the catalog.
        current = table_identity(
            ShardedTable.open(cfg.warehouse, cfg.table, cfg.catalog_options).table)
    if core.meta is not None:
        check_table_identity(core.meta, core.group_name, current)


def check_tables_in_place(core: MemberCore, shards: Iterable[int] = (), *,
                          vouched: Callable[[int], bool] | None = None) -> None:
    """Each table of a group of several whose shards the member holds, and
    those of ``shards``: one dropped or re-created under its name is no
    longer read (its shards stay where they are until the leader marks its
    range dropped and they are revoked), with one WARNING; the group goes on
    with the others (docs/many-tables.md). ``shards`` are those of a batch
    whose files were found gone: a batch still in the handler when the
    session was lost is of a shard no longer held, and its table is checked
    all the same, so that a dropped table's batch is not taken for a file
    the storage lost. ``vouched``: tables to skip (by their first group
    shard), those the group's fresh head says its leader found in place
    moments ago."""
    tables = core.tables
    assert tables is not None
    held = {t.first for s in (*core.owned, *shards) if (t := tables.get(s)) is not None}
    for table in tables:
        if table.gone is not None or table.first not in held:
            continue  # a table none of whose shards is held: its readers check it
        if vouched is not None and vouched(table.first):
            continue
        try:
            table.in_place()  # marks it gone, with one WARNING, if it is not
        except Exception as err:  # the store: checked again next time
            log.debug("table %s not checked: %s", table.name, err)
