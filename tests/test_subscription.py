"""A group's ``--table`` values: plain names and shell-style patterns over
``database.table``, each bad value refused in one line
(:mod:`paimon_group.config.subscription`)."""

from __future__ import annotations

import doctest

import pytest

from paimon_group.cli import run
from paimon_group.config import subscription
from paimon_group.config.settings import PENDING_SETTINGS, setting
from paimon_group.config.subscription import TableSubscription, is_pattern
from paimon_group.errors import ConfigError
from paimon_group.spark.source.options import _KNOWN


def test_the_module_examples_hold() -> None:
    failures, tried = doctest.testmod(subscription, raise_on_error=False)
    assert tried > 0 and failures == 0


def test_plain_names_and_patterns_are_told_apart_in_order_each_once() -> None:
    sub = TableSubscription.parse(
        ["shop.orders", "shop.*", "eu.items", "shop.orders", "db?.t", "[ab]x.y", "shop.*"])
    assert sub.plain_names == ("shop.orders", "eu.items")
    assert sub.patterns == ("shop.*", "db?.t", "[ab]x.y")
    assert not sub.is_single
    assert str(sub) == "shop.orders, eu.items, shop.*, db?.t, [ab]x.y"
    assert [is_pattern(v) for v in ("a.b", "a.*", "a?.b", "a.[bc]", "a]b.c")] == [
        False, True, True, True, False]


def test_one_plain_name_is_the_single_table_group() -> None:
    assert TableSubscription.parse(["shop.orders"]).is_single
    assert TableSubscription.parse(["shop.orders", "shop.orders"]).is_single
    assert not TableSubscription.parse(["shop.orders", "shop.items"]).is_single
    assert not TableSubscription.parse(["shop.orders*"]).is_single
    assert not TableSubscription.parse(["shop.orders", "x.*"]).is_single


@pytest.mark.parametrize(("value", "reason"), [
    ("", "a table name is empty"),
    ("   ", "a table name is empty"),
    ("orders", "expected DATABASE.TABLE"),
    ("shop.", "expected DATABASE.TABLE"),
    (".orders", "expected DATABASE.TABLE"),
    ("a.b.c", "expected DATABASE.TABLE"),
    ("shop. orders", "expected DATABASE.TABLE"),
    ("*", "a pattern is DATABASE.TABLE too"),
    ("*orders", "a pattern is DATABASE.TABLE too"),
    ("*.*.*", "a pattern is DATABASE.TABLE too"),
    ("shop[.]orders", "dot may not be inside [...]"),
    ("sh[op.x]", "dot may not be inside [...]"),
])
def test_a_bad_value_is_refused_in_one_line(value: str, reason: str) -> None:
    with pytest.raises(ConfigError) as err:
        TableSubscription.parse(["shop.orders", value])
    text = str(err.value)
    assert text.startswith(f"bad --table {value!r}: ") and reason in text
    assert "\n" not in text


def test_no_value_is_refused() -> None:
    with pytest.raises(ConfigError, match="no --table given"):
        TableSubscription.parse([])


def test_brackets_are_sets_inside_one_part() -> None:
    sub = TableSubscription.parse(["[!x]].[]a]b", "s[ab].t"])
    assert sub.patterns == ("[!x]].[]a]b", "s[ab].t")
    assert sub.matches("a].ab") and sub.matches("a].]b") and not sub.matches("x].ab")
    assert sub.matches("sa.t") and sub.matches("sb.t") and not sub.matches("sc.t")


def test_matching_is_fnmatchcase_over_database_dot_table() -> None:
    sub = TableSubscription.parse(["shop.*", "eu_?.events", "ops.orders"])
    assert sub.matches("shop.orders") and sub.matches("shop.x")
    assert sub.matches("eu_1.events") and not sub.matches("eu_12.events")
    assert sub.matches("ops.orders") and not sub.matches("ops.order")
    assert not sub.matches("Shop.orders"), "case as the catalog spells it"
    assert not sub.matches("shopx.orders"), "a pattern's dot meets the name's"
    every = TableSubscription.parse(["*.*"])
    assert every.matches("a.b") and every.matches("shop.orders")


def test_the_databases_a_listing_looks_into() -> None:
    sub = TableSubscription.parse(["ops.orders", "s*.x", "ops.items", "eu.y"])
    assert sub.named_databases == ("ops", "eu")
    assert [d for d in ("ops", "eu", "shop", "stock", "us") if sub.might_hold(d)] == [
        "ops", "eu", "shop", "stock"]
    assert TableSubscription.parse(["*.*"]).might_hold("anything")


def test_the_refresh_setting_is_declared_but_no_entry_point_takes_it_yet() -> None:
    s = setting("tables_refresh_s")
    assert s in PENDING_SETTINGS
    assert (s.default, s.unit, s.type, s.flag, s.spark) == (30.0, "s", float, None, None)
    flags = {opt for p in run.params for opt in p.opts}
    assert "--tables-refresh-s" not in flags and "tables_refresh_s" not in _KNOWN
