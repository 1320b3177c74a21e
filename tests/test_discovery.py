"""The tables of a subscription as a real pypaimon catalog lists them, and
what changed between two listings: new, dropped and re-created tables, and
plain names subscribed but missing (:mod:`paimon_group.reading.discovery`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from paimon_group.config.subscription import TableSubscription
from paimon_group.errors import TableNotFound
from paimon_group.protocol.identity import IdentityChecks, table_identity
from paimon_group.protocol.sharding import TableKind
from paimon_group.reading.discovery import (
    ListedTable,
    TableChanges,
    TableListing,
    list_subscribed,
    raise_if_missing,
    table_changes,
)
from tests.support.tables import catalog, make_append_table, make_pk_table, open_table

TABLES = ("shop.orders", "shop.items", "shop.stock", "ops.orders", "ops.audit")


@pytest.fixture
def warehouse(tmp_path: Path) -> str:
    """Two databases, five tables of several kinds."""
    wh = str(tmp_path / "wh")
    make_pk_table(wh, "shop.orders", buckets=4)
    make_pk_table(wh, "shop.items", buckets=-1)
    make_append_table(wh, "shop.stock", buckets=-1)
    make_pk_table(wh, "ops.orders", buckets=2)
    make_append_table(wh, "ops.audit", buckets=3)
    return wh


def _listing(wh: str, *values: str, previous: TableListing | None = None) -> TableListing:
    return list_subscribed(catalog(wh), TableSubscription.parse(values), previous)


def _drop(wh: str, name: str) -> None:
    catalog(wh).drop_table(name)


def test_a_pattern_lists_the_tables_it_matches_with_their_identity_and_kind(
        warehouse: str) -> None:
    listing = _listing(warehouse, "shop.*")
    assert listing.names == ("shop.items", "shop.orders", "shop.stock")
    assert listing.missing == ()
    orders = listing.get("shop.orders")
    assert orders == ListedTable("shop.orders", table_identity(open_table(
        warehouse, "shop.orders")), 4, TableKind.FIXED)
    items, stock = listing.get("shop.items"), listing.get("shop.stock")
    assert items is not None and (items.bucket, items.kind) == (-1, TableKind.DYNAMIC)
    assert stock is not None and (stock.bucket, stock.kind) == (-1, TableKind.UNAWARE)
    assert all(t.identity == table_identity(open_table(warehouse, t.name))
               and t.identity.startswith("schema-0@") for t in listing.tables)


def test_patterns_across_databases_and_every_table(warehouse: str) -> None:
    assert _listing(warehouse, "*.orders").names == ("ops.orders", "shop.orders")
    assert _listing(warehouse, "*.*").names == tuple(sorted(TABLES))
    assert _listing(warehouse, "?ps.*", "shop.[io]*").names == (
        "ops.audit", "ops.orders", "shop.items", "shop.orders")
    assert _listing(warehouse, "SHOP.*").names == (), "case as the catalog spells it"


def test_plain_names_list_only_those_tables(warehouse: str) -> None:
    listing = _listing(warehouse, "ops.audit", "shop.orders")
    assert listing.names == ("ops.audit", "shop.orders")
    audit = listing.get("ops.audit")
    assert audit is not None and (audit.bucket, audit.kind) == (3, TableKind.FIXED)
    assert _listing(warehouse, "shop.orders", "ops.*").names == (
        "ops.audit", "ops.orders", "shop.orders")


def test_a_missing_plain_name_is_reported_a_pattern_matching_nothing_is_not(
        warehouse: str) -> None:
    listing = _listing(warehouse, "shop.orders", "shop.gone", "nodb.t", "later.*", "x*.y")
    assert listing.names == ("shop.orders",)
    assert listing.missing == ("shop.gone", "nodb.t")
    with pytest.raises(TableNotFound) as err:
        raise_if_missing(listing, warehouse)
    assert str(err.value) == (f"tables shop.gone, nodb.t not found in warehouse {warehouse}: "
                              "check --warehouse and --table")
    with pytest.raises(TableNotFound, match=r"^table nodb\.t not found"):
        raise_if_missing(_listing(warehouse, "nodb.t"), warehouse)
    raise_if_missing(_listing(warehouse, "later.*"), warehouse)  # waits for tables


def test_a_new_table_then_a_dropped_one(warehouse: str) -> None:
    first = _listing(warehouse, "shop.*", "ops.orders")
    assert table_changes(None, first) == TableChanges(new=first.tables)

    make_pk_table(warehouse, "shop.returns", buckets=2)
    make_pk_table(warehouse, "ops.other", buckets=2)  # not subscribed
    second = _listing(warehouse, "shop.*", "ops.orders", previous=first)
    changes = table_changes(first, second)
    assert [t.name for t in changes.new] == ["shop.returns"]
    assert changes.dropped == () and changes.recreated == ()

    _drop(warehouse, "shop.items")
    _drop(warehouse, "ops.orders")
    third = _listing(warehouse, "shop.*", "ops.orders", previous=second)
    assert third.missing == ("ops.orders",)
    changes = table_changes(second, third)
    assert [t.name for t in changes.dropped] == ["ops.orders", "shop.items"]
    assert changes.dropped[1] == second.get("shop.items")
    assert changes.new == () and changes.recreated == ()
    assert not table_changes(third, _listing(warehouse, "shop.*", "ops.orders",
                                             previous=third))


def test_a_dropped_and_recreated_table_is_another_identity(warehouse: str) -> None:
    first = _listing(warehouse, "shop.*")
    old = first.get("shop.orders")
    assert old is not None

    _drop(warehouse, "shop.orders")
    make_append_table(warehouse, "shop.orders", buckets=-1)  # another kind, too
    second = _listing(warehouse, "shop.*", previous=first)
    new = second.get("shop.orders")
    assert new is not None and new.identity != old.identity
    assert new.identity == table_identity(open_table(warehouse, "shop.orders"))
    assert (new.bucket, new.kind) == (-1, TableKind.UNAWARE), "read again, not kept"
    changes = table_changes(first, second)
    assert changes.recreated == ((old, new),)
    assert changes.new == () and changes.dropped == ()
    assert second.get("shop.items") == first.get("shop.items")


def test_an_unchanged_table_is_not_loaded_again(warehouse: str,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    cat = catalog(warehouse)
    sub = TableSubscription.parse(["*.*"])
    first = list_subscribed(cat, sub)
    loaded: list[str] = []
    get_table = cat.get_table

    def counting(name: Any) -> Any:
        loaded.append(str(name))
        return get_table(name)

    monkeypatch.setattr(cat, "get_table", counting)
    again = list_subscribed(cat, sub, first)
    assert again == first and loaded == []
    make_pk_table(warehouse, "ops.more", buckets=2)
    assert list_subscribed(cat, sub, again).names == tuple(sorted((*TABLES, "ops.more")))
    assert loaded == ["ops.more"]


def test_a_directory_without_a_schema_is_not_a_table_yet(warehouse: str) -> None:
    os.makedirs(os.path.join(warehouse, "shop.db", "half"))
    listing = _listing(warehouse, "shop.*", "shop.half")
    assert "shop.half" not in listing.names and listing.missing == ("shop.half",)


def test_an_unsupported_table_is_listed_with_its_reason(warehouse: str) -> None:
    make_pk_table(warehouse, "ops.pending", buckets=-2)  # postpone, no changelog
    listed = _listing(warehouse, "ops.pending").get("ops.pending")
    assert listed is not None and (listed.bucket, listed.kind) == (-2, None)
    assert "postpone buckets" in listed.unsupported and "\n" not in listed.unsupported


def test_a_table_replaced_while_it_is_loaded_waits_for_the_next_listing(
        warehouse: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The identity is read, then the table loaded: a table re-created in
    between is left out rather than listed with another table's kind."""
    cat = catalog(warehouse)
    sub = TableSubscription.parse(["shop.orders"])
    get_table = cat.get_table

    def replaced_first(name: Any) -> Any:
        monkeypatch.setattr(cat, "get_table", get_table)
        cat.drop_table(name)
        make_append_table(warehouse, "shop.orders", buckets=-1)
        return get_table(name)

    monkeypatch.setattr(cat, "get_table", replaced_first)
    in_flux = list_subscribed(cat, sub)
    assert in_flux.names == () and in_flux.missing == (), "there, but not listed yet"
    listed = list_subscribed(cat, sub).get("shop.orders")
    assert listed is not None and listed.kind is TableKind.UNAWARE


def test_a_dropped_database_drops_its_tables(warehouse: str) -> None:
    first = _listing(warehouse, "*.*", "ops.orders")
    catalog(warehouse).drop_database("ops", cascade=True)
    second = _listing(warehouse, "*.*", "ops.orders", previous=first)
    assert second.names == ("shop.items", "shop.orders", "shop.stock")
    assert second.missing == ("ops.orders",)
    assert [t.name for t in table_changes(first, second).dropped] == ["ops.audit", "ops.orders"]


def test_with_identity_checks_an_unchanged_table_is_checked_by_its_schema_file(
        warehouse: str) -> None:
    """A lister's checks read no identity again while a table's first schema
    is the file read before; a dropped, a re-created and a new table are
    listed as without them."""
    read: list[str] = []

    def identity(table: Any) -> str:
        read.append(str(table.table_path).rstrip("/").rsplit("/", 1)[-1])
        return table_identity(table)

    checks = IdentityChecks(identity=identity)
    cat, sub = catalog(warehouse), TableSubscription.parse(["*.*"])
    first = list_subscribed(cat, sub)
    second = list_subscribed(cat, sub, first, checks=checks)
    assert second == first and len(read) == len(TABLES)  # each read once, signed
    read.clear()
    third = list_subscribed(cat, sub, second, checks=checks)
    assert third == first and read == []
    _drop(warehouse, "shop.orders")
    make_append_table(warehouse, "shop.orders", buckets=-1)  # re-created
    _drop(warehouse, "ops.audit")
    make_pk_table(warehouse, "ops.more", buckets=2)
    fourth = list_subscribed(cat, sub, third, checks=checks)
    assert fourth == list_subscribed(cat, sub, third)
    assert read == ["orders"], "only the table whose schema file changed is read"
    changes = table_changes(third, fourth)
    assert [t.name for t in changes.new] == ["ops.more"]
    assert [t.name for t in changes.dropped] == ["ops.audit"]
    assert [old.name for old, _ in changes.recreated] == ["shop.orders"]
