"""A group of several tables: the member's tables kept to the group's map.

The group record's table map (:class:`~paimon_group.protocol.table_map.TableMap`)
says which tables the group reads, each in its range of the group's shards.
A member opens the tables of the map's live ranges (:func:`open_tables`),
each once, and opens more when the map grows: at every join and whenever a
control round finds the record changed (:func:`follow_map`). A shard of a
range it has not opened yet is not acquired (member/ownership.py), so a
member never holds a shard it cannot route. A range the map marks dropped
is not read any more: the leader's next assignment gives its shards to
nobody, and their owners release them.

The leader keeps the map (:class:`TableWatch`): every ``tables_refresh_s`` it
lists the catalog for the group's subscription and, in one guarded write of
the record (its version and the leader's epoch checked,
:meth:`~paimon_group.protocol.membership.MembershipWrites.update_table_map`),
appends a range for each table found new, marks dropped the range of each
table gone, and for a table dropped and re-created under its name does both
(its old range stays dropped, the new one starts as the group's start says).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Any

from coordinators.registry import redact_url
from paimon_group.errors import TableNotFound
from paimon_group.member.core import MemberCore
from paimon_group.member.head import TABLE_CHECK_S, TablePoll
from paimon_group.member.tables import MemberTable, MemberTables
from paimon_group.protocol.group import GroupClient
from paimon_group.protocol.identity import IdentityChecks, table_identity
from paimon_group.protocol.records import GroupMeta
from paimon_group.protocol.sharding import ShardRule, plan_new_group
from paimon_group.protocol.table_map import TableMap, TableRange
from paimon_group.reading.discovery import TableListing, list_subscribed, raise_if_missing
from paimon_group.reading.mirror import ConsumerMirror, mirror_interval
from paimon_group.reading.table import ShardedTable

log = logging.getLogger("paimon_group.member")

__all__ = ["TableWatch", "TablesPoller", "follow_map", "make_member_table", "open_subscription",
           "open_tables", "planned_map"]


def open_subscription(core: MemberCore) -> None:
    """The start of a member of a group of several tables (on the planning
    thread): the catalog opened and the subscription listed; a plain name
    not found is refused in one line before anything is joined."""
    config = core.config
    catalog, location, _ = ShardedTable.open_catalog(config.warehouse, config.catalog_options)
    loaded: dict[str, tuple[str, Any]] = {}
    listing = list_subscribed(catalog, config.subscription, loaded=loaded)
    raise_if_missing(listing, redact_url(location))
    core.opened_catalog(catalog, location, listing, config.start_position, loaded)


def make_member_table(core: MemberCore, index: int | None, rng: TableRange, meta: GroupMeta,
                      table: ShardedTable) -> MemberTable:
    """One table of the group, its planner and mirror in its own shard numbers
    (the planner of a table of several built at its first use)."""
    config = core.config
    table.clock = core.clock.monotonic
    if index is not None:  # a missing snapshot of a re-created table: TableReplaced
        table.expected_identity = rng.table_id
    new_planner = functools.partial(table.planner, rng.shards,
                                    include_row_kind=config.include_row_kind,
                                    rule=ShardRule.parse(rng.sharding), projection=config.columns)
    mirror = ConsumerMirror(table.table.file_io, table.table_path, core.group_name,
                            mirror_interval(config.mirror_interval_s, table.table.file_io),
                            clock=core.clock.monotonic)
    member_table = MemberTable(index=index, range=rng, group_meta=meta, table=table,
                               new_planner=new_planner, mirror=mirror)
    if index is None:  # the group's one table: its planner checked at the start
        _ = member_table.planner
    return member_table


def planned_map(listing: TableListing, opened: dict[str, ShardedTable],
                before: TableMap | None = None, *, at: float = 0.0) -> TableMap:
    """The map ``before`` (empty: a new group's) brought to ``listing``: a
    range appended for each table new to it (its shard count and rule as a
    group of that table alone would have them), each table gone marked
    dropped at ``at``, a re-created one both. ``opened``: the listed tables,
    opened, by name (a table not opened is left for a later listing)."""
    tables = before if before is not None else TableMap()
    live = {t.name: t for t in tables.live()}
    for name, rng in live.items():
        listed = listing.get(name)
        if listed is None or listed.identity != rng.table_id:
            tables = tables.drop(name, at)
    present = {t.name for t in tables.live()}
    new: list[tuple[str, str, int, str]] = []
    for listed in listing.tables:
        table = opened.get(listed.name)
        if listed.name in present or listed.kind is None or table is None:
            continue
        if table_identity(table.table) != listed.identity:
            continue  # replaced since it was listed: the next listing
        shards, rule = plan_new_group(table, None)
        new.append((listed.name, listed.identity, shards, rule.value))
    return tables.extend(new)


async def open_tables(core: MemberCore, meta: GroupMeta,
                      known: MemberTables | None) -> MemberTables:
    """``known``'s tables and those of ``meta``'s map's live ranges it lacks,
    opened (each once, all in one call to the planning thread); a range the
    map marks dropped is not read any more."""
    assert meta.tables is not None
    have = {t.first: t for t in known} if known is not None else {}
    new: list[tuple[int, TableRange]] = []
    for index, rng in enumerate(meta.tables.ranges):
        mine = have.get(rng.first)
        if mine is not None:
            if not rng.live and mine.gone is None:
                mine.gone = "dropped"
        elif rng.live:
            new.append((index, rng))
    added = await core.in_io(functools.partial(_opened, core, meta, new)) if new else []
    tables = known.with_tables(added) if known is not None else MemberTables(added, single=False)
    tables.rebind(meta)
    return tables


def _opened(core: MemberCore, meta: GroupMeta,
            ranges: list[tuple[int, TableRange]]) -> list[MemberTable]:
    """The tables of ``ranges`` (with their index in the map), opened; a
    table found re-created or dropped meanwhile is marked so (blocking)."""
    added: list[MemberTable] = []
    for index, rng in ranges:
        try:
            table = core.open_table(rng.name, rng.table_id)
        except TableNotFound:
            continue  # dropped since: the leader marks its range, nobody reads it
        member_table = make_member_table(core, index, rng, meta, table)
        identity = table_identity(table.table)
        if identity != rng.table_id:
            member_table.gone = "re-created" if identity else "dropped"
        added.append(member_table)
    return added


async def follow_map(core: MemberCore, meta: GroupMeta) -> None:
    """The group record ``meta`` read by a control round: if it is not the
    one the member follows, open the tables its map added and follow it."""
    session = core.session
    if session is None or meta.tables is None or session.meta == meta:
        return
    tables = await open_tables(core, meta, session.tables)
    current = core.session
    if current is not None:
        core.replace_session(dataclasses.replace(current, meta=meta, tables=tables))
    core.wake.set()


class TablesPoller:
    """The leader's poll of a group of several tables (blocking: run it off
    the event loop), for the group's head (member/head.py): each live table's
    latest snapshot id, so that members ask the store only about tables that
    moved; and every ``TABLE_CHECK_S`` each live table's identity, so that
    members need not check the tables they read themselves (one small read
    per table for the group, where each member read every table it holds:
    on an object store, two requests per table and member every 5 s).

    A table the check did not find in place (dropped, re-created, or the
    store did not answer) is left out of the poll until a check finds it:
    its readers then poll and check it themselves, and stop reading it if
    it is gone. A table that fails to answer its poll is left out too.
    On a local file system a table's check is a ``stat`` of the file its
    identity is read from while that is the file found in place
    (:class:`~paimon_group.protocol.identity.IdentityChecks`)."""

    def __init__(self, core: MemberCore) -> None:
        self._core = core
        self._in_place: set[int] = set()
        self._checked_at: float | None = None
        self._checks = IdentityChecks()

    def poll(self) -> TablePoll:
        tables = [t for t in self._core.tables or () if t.gone is None]
        now = self._core.clock.monotonic()
        if self._checked_at is None or now - self._checked_at >= TABLE_CHECK_S:
            self._in_place = {t.first for t in tables if self._found_in_place(t)}
            self._checked_at = now
        latest: dict[int, int | None] = {}
        for table in tables:
            if table.first not in self._in_place:
                continue
            try:
                latest[table.first] = table.table.latest_snapshot_id()
            except Exception as err:  # its members poll it themselves
                log.debug("table %s not polled for the head: %s", table.name, err)
        return TablePoll(None, tables=latest, tables_checked=True)

    def _found_in_place(self, table: MemberTable) -> bool:
        try:
            return self._checks.in_place(table.table.table, table.range.table_id)
        except Exception as err:  # its members check it themselves
            log.debug("table %s not checked for the head: %s", table.name, err)
            return False


class TableWatch:
    """The leader's listing of the catalog (see the module docstring)."""

    def __init__(self, core: MemberCore) -> None:
        self._core = core
        self._listing: TableListing | None = None
        self._listed_at: float | None = None
        self._checks = IdentityChecks()  # the listed tables' identities, by stat

    def due(self) -> bool:
        now = self._core.clock.monotonic()
        return (self._listed_at is None
                or now - self._listed_at >= self._core.config.tables_refresh_s)

    async def refresh(self, group: GroupClient, leader_epoch: int) -> None:
        """List the catalog (if due) and bring the group's map to it."""
        meta = self._core.meta
        if meta is None or meta.tables is None or not self.due():
            return
        self._listed_at = self._core.clock.monotonic()
        try:
            listing = await self._core.in_io(self._list)
        except Exception as err:  # the store: the last listing stands, listed again later
            self._core.log.warning("tables not listed (%s): the group's tables stay as they "
                                   "are until the next listing", err)
            return
        self._listing = listing
        opened: dict[str, ShardedTable] = {}
        live = {t.name: t.table_id for t in meta.tables.live()}
        for listed in listing.tables:
            if listed.kind is not None and live.get(listed.name) != listed.identity:
                try:
                    opened[listed.name] = await self._core.in_io(
                        functools.partial(self._core.open_table, listed.name))
                except TableNotFound:
                    continue
        planned = planned_map(listing, opened, meta.tables, at=self._core.clock.wall())
        if planned == meta.tables:
            return
        updated = await group.update_table_map(meta, planned, leader_epoch)
        if updated is None:
            self._listed_at = None  # the record changed meanwhile: listed again next round
            return
        self._say(meta.tables, planned)
        await follow_map(self._core, updated)

    def _list(self) -> TableListing:
        return list_subscribed(self._core.catalog(), self._core.config.subscription,
                               self._listing, checks=self._checks)

    def _say(self, before: TableMap, after: TableMap) -> None:
        old = {(t.name, t.first) for t in before.live()}
        for t in after.ranges:
            if t.live and (t.name, t.first) not in old:
                self._core.log.info("table %s joins the group: shards %d..%d", t.name,
                                    t.first, t.end - 1)
        now_live = {(t.name, t.first) for t in after.live()}
        for name, first in sorted(old - now_live):
            how = "re-created" if any(t.name == name and t.live for t in after.ranges) \
                else "dropped"
            self._core.log.warning("table %s was %s: its shards from %d are released and "
                                   "not read any more", name, how, first)
