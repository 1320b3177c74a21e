"""A group's ``--table`` values: plain names and shell-style patterns over
``database.table``, each bad value refused in one line
(:mod:`paimon_group.config.subscription`)."""

from __future__ import annotations

import doctest

import pytest

from paimon_group.config import subscription
from paimon_group.config.member import MemberConfig
from paimon_group.config.settings import MEMBER_SETTINGS, PENDING_SETTINGS, setting
from paimon_group.config.subscription import TableSubscription, is_pattern
from paimon_group.errors import ConfigError


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


def test_the_refresh_setting_is_a_member_setting() -> None:
    s = setting("tables_refresh_s")
    assert s in MEMBER_SETTINGS and not PENDING_SETTINGS
    assert (s.default, s.unit, s.type) == (30.0, "s", float)
    with pytest.raises(ConfigError, match="--tables-refresh-s must be positive"):
        MemberConfig(group="g", warehouse="/tmp/wh", table="db.t", tables_refresh_s=0)


def test_member_config_takes_tables_and_patterns() -> None:
    one = MemberConfig(group="g", warehouse="/tmp/wh", table="db.t")
    assert one.single_table and one.table == "db.t" and one.tables == ()
    same = MemberConfig(group="g", warehouse="/tmp/wh", tables=("db.t",))
    assert same.single_table and same.table == "db.t"
    many = MemberConfig(group="g", warehouse="/tmp/wh", table="db.a", tables=("db.b", "x.*"))
    assert not many.single_table
    assert many.subscription.plain_names == ("db.a", "db.b")
    assert many.subscription.patterns == ("x.*",)
    pattern = MemberConfig(group="g", warehouse="/tmp/wh", table="shop.*")
    assert not pattern.single_table
    with pytest.raises(ConfigError, match="bad --table 'orders'"):
        MemberConfig(group="g", warehouse="/tmp/wh", table="orders")
    with pytest.raises(ConfigError, match="no table given"):
        MemberConfig(group="g", warehouse="/tmp/wh")
