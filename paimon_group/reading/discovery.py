"""The tables of a subscription, as the catalog lists them now, and what
changed since the last listing: new, dropped and re-created tables.

:func:`list_subscribed` lists the databases a subscription could hold a table
of (the databases of its plain names, and those of ``list_databases()`` that
a pattern's database part matches), then each one's tables, and reads the
identity of each subscribed table
(:func:`~paimon_group.protocol.identity.table_identity`: its first schema's
creation time, so a table dropped and re-created under its name is another
table). A table seen for the first time is loaded once more, for its kind and
bucket option; a table listed before under the same identity keeps what was
read then, so a re-check of an unchanged catalog costs one listing per
database and one small read per table.

:func:`table_changes` is pure: the difference between two listings.

A plain name subscribed but absent is in :attr:`TableListing.missing`
(:func:`raise_if_missing` makes it the one-line error of a member that
starts); a pattern that matches nothing is no error (the group waits for
tables).

Example::

    catalog = CatalogFactory.create({"warehouse": "/data/wh"})
    subscription = TableSubscription.parse(["shop.*", "eu.events"])
    before = list_subscribed(catalog, subscription)
    raise_if_missing(before, "/data/wh")
    ...
    after = list_subscribed(catalog, subscription, before)
    changes = table_changes(before, after)   # changes.new, .dropped, .recreated
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from paimon_group.config.subscription import TableSubscription
from paimon_group.errors import TableNotFound, UnsupportedTable
from paimon_group.protocol.identity import IdentityChecks, table_identity
from paimon_group.protocol.sharding import TableKind, table_kind
from paimon_group.store.files import local_directories

__all__ = [
    "ListedTable", "TableChanges", "TableListing", "list_subscribed", "raise_if_missing",
    "table_changes",
]


@dataclass(frozen=True)
class ListedTable:
    """One subscribed table as listed: ``name`` (``database.table``), its
    ``identity``, its ``bucket`` option (``> 0`` fixed, ``-1`` dynamic or
    bucket-unaware, ``-2`` postpone) and its ``kind``; None, with the one-line
    reason in ``unsupported``, for a table no group can read shard by shard.
    Kind and bucket are as they were when the table was first listed."""

    name: str
    identity: str
    bucket: int
    kind: TableKind | None
    unsupported: str = ""


@dataclass(frozen=True)
class TableListing:
    """The subscribed tables found, sorted by name, and the plain names
    subscribed that were not (in the subscription's order)."""

    tables: tuple[ListedTable, ...]
    missing: tuple[str, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.tables)

    def get(self, name: str) -> ListedTable | None:
        """The table listed under ``name`` (None: not listed)."""
        return next((t for t in self.tables if t.name == name), None)


@dataclass(frozen=True)
class TableChanges:
    """From one listing to the next: tables ``new`` (a name not listed
    before), ``dropped`` (listed before, gone now: the old entries) and
    ``recreated`` (the same name under another identity: ``(old, new)``
    pairs). A re-created table is neither new nor dropped here, though its
    old identity is gone for good and the new one starts afresh."""

    new: tuple[ListedTable, ...] = ()
    dropped: tuple[ListedTable, ...] = ()
    recreated: tuple[tuple[ListedTable, ListedTable], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.new or self.dropped or self.recreated)


def table_changes(before: TableListing | None, after: TableListing) -> TableChanges:
    """What changed from ``before`` (None: nothing listed yet, every table is
    new) to ``after``."""
    old = {t.name: t for t in (before.tables if before is not None else ())}
    now = {t.name: t for t in after.tables}
    return TableChanges(
        new=tuple(t for name, t in now.items() if name not in old),
        dropped=tuple(t for name, t in old.items() if name not in now),
        recreated=tuple((old[name], t) for name, t in now.items()
                        if name in old and old[name].identity != t.identity),
    )


def raise_if_missing(listing: TableListing, warehouse: str,
                     check: str = "check --warehouse and --table") -> None:
    """Raise :class:`TableNotFound` (one line) when a plain name subscribed
    was not found, as a member refuses a missing table."""
    if not listing.missing:
        return
    tables = ", ".join(listing.missing)
    noun = "table" if len(listing.missing) == 1 else "tables"
    raise TableNotFound(f"{noun} {tables} not found in warehouse {warehouse}: {check}")


def list_subscribed(catalog: Any, subscription: TableSubscription,
                    previous: TableListing | None = None, *,
                    loaded: dict[str, tuple[str, Any]] | None = None,
                    checks: IdentityChecks | None = None) -> TableListing:
    """The tables of ``catalog`` (a pypaimon catalog) that ``subscription``
    matches, each with its identity; ``previous``, the last listing, spares
    loading again a table whose identity is unchanged, and with ``checks``
    (the lister's, kept from listing to listing) reading it again while its
    first schema is the very file read before (a ``stat`` on a local file
    system). ``loaded``, if given, receives each table that could be read
    loaded, by name, with its identity: a member's start opens them without
    loading them again.

    A table dropped between the listing and the read of its identity is
    left out (as if listed a moment later); a directory with no schema yet
    (a table being created) is too, until a later listing finds its first
    schema. A table replaced while it is loaded is neither listed nor
    missing: it is there, and the next listing reads it whole. Errors of the
    store itself propagate: the caller keeps its last listing and tries
    again."""
    known = {t.name: t for t in (previous.tables if previous is not None else ())}
    found: list[ListedTable] = []
    present: set[str] = set()
    for name in _candidates(catalog, subscription):
        before = known.get(name)
        identity = before.identity if before is not None and checks is not None and \
            _found_in_place(catalog, name, before.identity, checks) else _identity(catalog, name)
        if not identity:
            continue
        present.add(name)
        entry = before if before is not None and before.identity == identity \
            else _load(catalog, name, identity, loaded)
        if entry is not None:
            found.append(entry)
    return TableListing(
        tables=tuple(sorted(found, key=lambda t: t.name)),
        missing=tuple(n for n in subscription.plain_names if n not in present),
    )


def _candidates(catalog: Any, subscription: TableSubscription) -> list[str]:
    """The subscribed names of the tables the catalog lists (directories: a
    name here may have no schema)."""
    databases: Iterable[str] = subscription.named_databases
    if subscription.patterns:
        databases = dict.fromkeys([*databases, *(
            d for d in catalog.list_databases() if subscription.might_hold(d))])
    names: list[str] = []
    for database in databases:
        names += [f"{database}.{t}" for t in _tables_of(catalog, database)
                  if subscription.matches(f"{database}.{t}")]
    return names


def _tables_of(catalog: Any, database: str) -> list[str]:
    """The tables ``database`` lists; none when it does not exist (dropped
    since ``list_databases()``, or a plain name's database never made)."""
    from pypaimon.catalog.catalog_exception import DatabaseNotExistException
    from pypaimon.catalog.filesystem_catalog import FileSystemCatalog

    if isinstance(catalog, FileSystemCatalog):  # its tables: its database's directories
        found = local_directories(catalog.file_io, catalog.get_database_path(database))
        if found is not None:
            return sorted(n for n in found if not n.startswith("."))
    try:
        return list(catalog.list_tables(database))
    except (DatabaseNotExistException, FileNotFoundError):
        return []


def _located(catalog: Any, name: str) -> Any | None:
    """Table ``name``'s files (its file IO and path, what an identity is read
    from) when ``catalog`` places its tables at file system paths; None for
    a catalog that does not (it is asked for the table itself)."""
    from pypaimon.common.identifier import Identifier

    path_of = getattr(catalog, "get_table_path", None)
    file_io = getattr(catalog, "file_io", None)
    if path_of is None or file_io is None:
        return None
    return SimpleNamespace(file_io=file_io, table_path=path_of(Identifier.from_string(name)))


def _identity(catalog: Any, name: str) -> str:
    """The identity of table ``name`` read from its first schema file ("":
    no schema, the table is not there). A catalog that places its tables
    elsewhere than a file system path is asked for the table itself."""
    from pypaimon.catalog.catalog_exception import TableNotExistException

    located = _located(catalog, name)
    if located is not None:
        return table_identity(located)
    try:
        return table_identity(catalog.get_table(name))
    except (TableNotExistException, FileNotFoundError):
        return ""


def _found_in_place(catalog: Any, name: str, identity: str, checks: IdentityChecks) -> bool:
    """Whether table ``name`` is still the one of ``identity`` by ``checks``
    (False: read it); only for a catalog whose tables are file system paths."""
    located = _located(catalog, name)
    return located is not None and checks.in_place(located, identity)


def _load(catalog: Any, name: str, identity: str,
          loaded: dict[str, tuple[str, Any]] | None = None) -> ListedTable | None:
    """Table ``name``'s entry, its kind and bucket read from the table of
    ``identity``; None when it is not that table any more.

    The table is loaded after its identity was read, so it may be another
    table by now (dropped and re-created in between): its identity is read
    again from the loaded table, and an entry is made only when both reads
    agree, so that identity, kind and bucket are of one table. A table in
    flux is left to the next listing."""
    from pypaimon.catalog.catalog_exception import TableNotExistException

    try:
        table = catalog.get_table(name)
    except (TableNotExistException, FileNotFoundError):
        return None
    if table_identity(table) != identity:
        return None
    bucket = int(table.options.bucket())
    try:
        kind: TableKind | None = table_kind(table, name)
    except UnsupportedTable as err:
        return ListedTable(name, identity, bucket, None, unsupported=str(err))
    if loaded is not None:
        loaded[name] = (identity, table)
    return ListedTable(name, identity, bucket, kind)
