"""Unit tests of the table map of a group of several tables
(paimon_group/protocol/table_map.py), of the group record that carries it, and of
the count assignor dealing a map's shards in spread order (docs/many-tables.md)."""

from __future__ import annotations

import dataclasses
import doctest
import json
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinators.errors import ConfigError, CorruptValue
from coordinators.zookeeper.limits import JUTE_MAXBUFFER
from paimon_group.errors import IncompatibleVersion
from paimon_group.protocol import table_map
from paimon_group.protocol.assignor import assign, minimum_moves, moves
from paimon_group.protocol.records import FEATURES, GroupMeta, check_can_follow
from paimon_group.protocol.table_map import (
    MAX_ENCODED_BYTES,
    NotInMap,
    TableMap,
    TableRange,
)
from tests.test_assignor import check_balanced, check_sticky, check_valid, has_duplicates


def tables_of(*sizes: int) -> TableMap:
    tables = TableMap()
    for i, shards in enumerate(sizes):
        tables = tables.append(f"shop.t{i}", f"schema-0@{i}", shards, "bucket")
    return tables


def test_the_module_examples_run() -> None:
    failures, tried = doctest.testmod(table_map, raise_on_error=False)
    assert tried > 0
    assert failures == 0


# --------------------------------------------------------------------------
# Ranges, lookups, append, drop, re-create.
# --------------------------------------------------------------------------


def test_appended_tables_get_contiguous_ranges_in_order() -> None:
    tables = tables_of(8, 4, 1)
    assert [(t.first, t.shards, t.end) for t in tables] == [(0, 8, 8), (8, 4, 12), (12, 1, 13)]
    assert tables.total_shards == 13
    assert TableMap().total_shards == 0
    assert len(tables) == 3


def test_to_group_shard_by_position_or_name() -> None:
    tables = tables_of(8, 4)
    assert tables.to_group_shard(0, 7) == 7
    assert tables.to_group_shard(1, 0) == 8
    assert tables.to_group_shard("shop.t1", 3) == 11
    with pytest.raises(NotInMap, match="4 shards: no shard 4"):
        tables.to_group_shard("shop.t1", 4)
    with pytest.raises(NotInMap, match="no shard -1"):
        tables.to_group_shard(0, -1)
    with pytest.raises(NotInMap, match=r"no table 'shop.nope'"):
        tables.to_group_shard("shop.nope", 0)
    with pytest.raises(NotInMap, match="position 2"):
        tables.to_group_shard(2, 0)


def test_locate_is_the_inverse_of_to_group_shard() -> None:
    tables = tables_of(3, 1, 5)
    for index, table in enumerate(tables):
        for local in range(table.shards):
            k = tables.to_group_shard(index, local)
            assert tables.locate(k) == (table, local)
    for outside in (-1, 9, 100):
        with pytest.raises(NotInMap, match=f"group shard {outside} is outside every"):
            tables.locate(outside)
    with pytest.raises(NotInMap):
        TableMap().locate(0)


def test_append_refuses_a_live_duplicate_and_bad_fields() -> None:
    tables = tables_of(2)
    with pytest.raises(ValueError, match="in the group already"):
        tables.append("shop.t0", "schema-0@9", 2, "bucket")
    with pytest.raises(ValueError, match=r"not 'database.table'"):
        tables.append("orders", "", 2, "bucket")
    with pytest.raises(ValueError, match="0 shards"):
        tables.append("shop.x", "", 0, "bucket")
    with pytest.raises(ValueError, match="unknown sharding rule"):
        tables.append("shop.x", "", 2, "modulo")
    assert tables == tables_of(2)  # append returns a new map; this one is unchanged


def test_drop_keeps_the_range_and_a_recreated_table_gets_a_new_one() -> None:
    tables = tables_of(4, 2)
    dropped = tables.drop("shop.t0", at=50.0)
    assert dropped.ranges[0] == dataclasses.replace(tables.ranges[0], dropped_at=50.0)
    assert dropped.total_shards == 6
    assert [t.name for t in dropped.live()] == ["shop.t1"]
    assert dropped.locate(1) == (dropped.ranges[0], 1)  # still located: its keys stay its
    with pytest.raises(NotInMap):
        dropped.to_group_shard("shop.t0", 0)
    with pytest.raises(NotInMap):
        dropped.drop("shop.t0", at=60.0)
    again = dropped.append("shop.t0", "schema-0@99", 4, "bucket")
    assert [(t.name, t.table_id, t.first, t.live) for t in again] == [
        ("shop.t0", "schema-0@0", 0, False), ("shop.t1", "schema-0@1", 4, True),
        ("shop.t0", "schema-0@99", 6, True)]
    assert again.to_group_shard("shop.t0", 0) == 6
    assert again.index_of("shop.t0") == 2
    # Dropped twice and re-created twice: every range stays, none is reused.
    thrice = again.drop("shop.t0", at=70.0).append("shop.t0", "schema-0@100", 4, "bucket")
    assert [t.first for t in thrice] == [0, 4, 6, 10]
    assert thrice.total_shards == 14


def test_a_map_built_directly_is_checked() -> None:
    a = TableRange("shop.a", "", 0, 4)
    with pytest.raises(ValueError, match="overlaps"):
        TableMap((a, TableRange("shop.b", "", 3, 4)))
    with pytest.raises(ValueError, match="starts at shard 5, not 4"):
        TableMap((a, TableRange("shop.b", "", 5, 4)))
    with pytest.raises(ValueError, match="starts at shard 1, not 0"):
        TableMap((TableRange("shop.a", "", 1, 4),))
    with pytest.raises(ValueError, match="live in two ranges"):
        TableMap((a, TableRange("shop.a", "", 4, 4)))
    TableMap((dataclasses.replace(a, dropped_at=1.0), TableRange("shop.a", "", 4, 4)))


# --------------------------------------------------------------------------
# Spread order.
# --------------------------------------------------------------------------


def test_spread_order_deals_shard_i_of_every_live_table_in_turn() -> None:
    assert tables_of(3, 3).spread_order() == [0, 3, 1, 4, 2, 5]
    assert tables_of(1, 3, 2).spread_order() == [0, 1, 4, 2, 5, 3]
    assert TableMap().spread_order() == []
    dropped = tables_of(2, 2, 2).drop("shop.t1", at=1.0)
    assert dropped.spread_order() == [0, 4, 1, 5]  # the dropped range is not dealt


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 12), max_size=8), st.data())
def test_spread_order_is_every_live_shard_once(sizes: list[int], data: st.DataObject) -> None:
    tables = tables_of(*sizes)
    for name in data.draw(st.sets(st.sampled_from([t.name for t in tables])) if sizes
                          else st.just(set())):
        tables = tables.drop(name, at=1.0)
    order = tables.spread_order()
    live = sorted(k for t in tables.live() for k in range(t.first, t.end))
    assert sorted(order) == live
    # Among the shards of one table, the order is the table's own shard order.
    for t in tables.live():
        assert [k for k in order if t.first <= k < t.end] == list(range(t.first, t.end))


# --------------------------------------------------------------------------
# Encoding.
# --------------------------------------------------------------------------


def test_encode_decode_round_trip_with_dropped_ranges() -> None:
    tables = tables_of(8, 4).drop("shop.t0", at=12.5).append("shop.t0", "schema-0@7", 2, "file")
    encoded = tables.encode()
    assert encoded[0] == {"name": "shop.t0", "table_id": "schema-0@0", "first": 0,
                          "shards": 8, "sharding": "bucket", "dropped_at": 12.5}
    assert "dropped_at" not in encoded[1]
    assert TableMap.decode(json.loads(json.dumps(encoded))) == tables
    assert TableMap.decode([]) == TableMap()
    assert tables.encoded_size() == len(json.dumps(encoded, separators=(",", ":")))


def test_decode_ignores_the_fields_of_a_newer_version() -> None:
    newer = [dict(t, weight=3, labels={"x": 1}) for t in tables_of(2, 2).encode()]
    assert TableMap.decode(newer) == tables_of(2, 2)


@pytest.mark.parametrize(("data", "error"), [
    ({"name": "shop.a"}, "not a JSON list"),
    (["x"], "not a JSON object"),
    ([{"name": "shop.a", "table_id": "", "first": 0}], "without 'shards'"),
    ([{"name": "shop.a", "table_id": "", "first": -1, "shards": 2}], "negative first shard"),
    ([{"name": "shop.a", "table_id": "", "first": 0, "shards": -2}], "-2 shards"),
    ([{"name": "shop.a", "table_id": "", "first": "0", "shards": 2}], "first is not an integer"),
    ([{"name": "shop.a", "table_id": "", "first": True, "shards": 2}], "not an integer"),
    ([{"name": 7, "table_id": "", "first": 0, "shards": 2}], "name is not a string"),
    ([{"name": "shop.a", "table_id": "", "first": 0, "shards": 2, "dropped_at": "x"}],
     "dropped_at is not a number"),
    ([{"name": "shop.a", "table_id": "", "first": 0, "shards": 2, "sharding": "x"}],
     "unknown sharding rule"),
    ([{"name": "shop.a", "table_id": "", "first": 0, "shards": 4},
      {"name": "shop.b", "table_id": "", "first": 2, "shards": 4}], "overlaps"),
    ([{"name": "shop.a", "table_id": "", "first": 0, "shards": 4},
      {"name": "shop.b", "table_id": "", "first": 6, "shards": 4}], "contiguous"),
])
def test_decode_refuses_an_invalid_map(data: object, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        TableMap.decode(data)


def test_the_size_bound_refuses_the_table_that_would_pass_it() -> None:
    # ZooKeeper's limit is the whole request: the map takes at most half of it.
    assert 2 * MAX_ENCODED_BYTES <= JUTE_MAXBUFFER + 1
    # Tables of 8 shards with names and identities of a realistic length.
    entries = [TableRange(f"warehouse_db.orders_{i:05d}", f"schema-0@{1763865600123 + i}",
                          8 * i, 8).encode() for i in range(7000)]
    sizes = [len(json.dumps(e, separators=(",", ":"))) + 1 for e in entries]  # "," or "["
    fit = next(n for n in range(len(sizes)) if sum(sizes[: n + 1]) + 1 > MAX_ENCODED_BYTES)
    assert fit == 4454  # 118 bytes a table with these names: 4,454 tables of 8 shards
    tables = TableMap.decode(entries[:fit])
    assert tables.encoded_size() <= MAX_ENCODED_BYTES
    assert tables.total_shards == 8 * fit
    with pytest.raises(ConfigError, match="over the 524288 a group record holds") as refused:
        tables.append(f"warehouse_db.orders_{fit:05d}", f"schema-0@{fit}", 8, "bucket")
    assert not refused.value.retriable
    assert "\n" not in str(refused.value)


# --------------------------------------------------------------------------
# The group record.
# --------------------------------------------------------------------------

# Encoded by the version before group records could carry a table map.
SINGLE_TABLE = [
    (GroupMeta(num_shards=8, table="shop.orders", created_at=1.5, sharding="partition-bucket",
               incarnation="inc", table_id="schema-0@7", warehouse="file:///wh",
               assignor="load", features=("x",), written_by="0.3.0"),
     b'{"assignor":"load","created_at":1.5,"features":["x"],"format":1,"incarnation":"inc",'
     b'"num_shards":8,"sharding":"partition-bucket","table":"shop.orders",'
     b'"table_id":"schema-0@7","warehouse":"file:///wh","written_by":"0.3.0"}'),
    (GroupMeta(num_shards=4, table="db.t", created_at=2.0, written_by="0.2.0"),
     b'{"assignor":"count","created_at":2.0,"features":[],"format":1,"incarnation":"",'
     b'"num_shards":4,"sharding":"bucket","table":"db.t","table_id":"","warehouse":"",'
     b'"written_by":"0.2.0"}'),
]


@pytest.mark.parametrize(("meta", "stored"), SINGLE_TABLE)
def test_a_single_table_group_record_is_encoded_as_before(meta: GroupMeta,
                                                          stored: bytes) -> None:
    assert meta.encode() == stored
    assert GroupMeta.decode("groups/g", stored) == meta


def test_a_group_record_carries_its_table_map() -> None:
    tables = tables_of(8, 4).drop("shop.t1", at=3.0)
    meta = GroupMeta(num_shards=tables.total_shards, table="shop.*", created_at=1.0,
                     tables=tables)
    stored = json.loads(meta.encode())
    assert stored["tables"] == tables.encode()
    assert GroupMeta.decode("groups/g", meta.encode()) == meta


def test_a_group_record_with_a_bad_table_map_is_corrupt() -> None:
    stored = json.loads(GroupMeta(num_shards=4, table="shop.*", created_at=1.0,
                                  tables=tables_of(4)).encode())
    stored["tables"][0]["first"] = 2
    with pytest.raises(CorruptValue, match=r"groups/g.*starts at shard 2, not 0"):
        GroupMeta.decode("groups/g", json.dumps(stored).encode())


def test_this_version_follows_groups_of_several_tables() -> None:
    assert "tables" in FEATURES
    meta = GroupMeta(num_shards=8, table="shop.*", created_at=1.0, features=("tables",),
                     tables=tables_of(8), written_by="9.9.9")
    check_can_follow(GroupMeta.decode("groups/g", meta.encode()), "g")
    older = dataclasses.replace(meta, features=("tables", "later"))
    with pytest.raises(IncompatibleVersion, match="uses feature later"):
        check_can_follow(older, "g")


def test_a_record_whose_shard_count_is_not_its_map_s_is_corrupt() -> None:
    stored = json.loads(GroupMeta(num_shards=8, table="shop.*", created_at=1.0,
                                  tables=tables_of(8)).encode())
    stored["num_shards"] = 9
    with pytest.raises(CorruptValue, match="not the table map's 8"):
        GroupMeta.decode("groups/g", json.dumps(stored).encode())


# --------------------------------------------------------------------------
# The count assignor in spread order.
# --------------------------------------------------------------------------


def tables_held(tables: TableMap, shards: Sequence[int]) -> set[str]:
    return {tables.locate(k)[0].name for k in shards}


def test_a_fresh_assignment_in_spread_order_gives_every_member_every_table() -> None:
    tables = tables_of(8, 8, 8)
    members = ["a", "b", "c", "d"]
    by_range = assign(tables.total_shards, members)
    assert tables_held(tables, by_range["a"]) == {"shop.t0"}  # ascending: whole tables
    spread = assign(tables.total_shards, members, order=tables.spread_order())
    check_valid(24, members, spread)
    for member in members:
        assert len(spread[member]) == 6
        assert tables_held(tables, spread[member]) == {"shop.t0", "shop.t1", "shop.t2"}
        for table in tables:  # and two shards of each
            assert len([k for k in spread[member] if table.first <= k < table.end]) == 2


def test_a_growing_assignment_in_spread_order_keeps_every_table_spread() -> None:
    tables = tables_of(8, 8, 8)
    order = tables.spread_order()
    first = assign(24, ["a"], order=order)
    second = assign(24, ["a", "b"], first, order=order)
    assert len(moves(first, second)) == minimum_moves(24, ["a", "b"], first) == 12
    for member in ("a", "b"):
        assert tables_held(tables, second[member]) == {"shop.t0", "shop.t1", "shop.t2"}
    third = assign(24, ["a", "b", "c"], second, order=order)
    assert len(moves(second, third)) == minimum_moves(24, ["a", "b", "c"], second) == 8
    for member in ("a", "b", "c"):
        assert tables_held(tables, third[member]) == {"shop.t0", "shop.t1", "shop.t2"}


def test_assign_refuses_a_bad_order() -> None:
    with pytest.raises(ConfigError, match=r"5 is not a shard of 0..3"):
        assign(4, ["a"], order=[0, 5])
    with pytest.raises(ConfigError, match="listed twice"):
        assign(4, ["a"], order=[1, 1])
    # Shards the order leaves out come after it, ascending.
    assert assign(4, ["a", "b"], order=[3]) == {"a": [0, 3], "b": [1, 2]}


POOL = [f"m{i}" for i in range(10)]


@st.composite
def spread_cases(draw: st.DrawFn) -> tuple[TableMap, list[str], dict[str, list[int]] | None]:
    """A map, members, and a previous assignment: dealt in the same spread order
    for some earlier membership, or any at all (departed members, duplicates,
    shards out of range)."""
    tables = tables_of(*draw(st.lists(st.integers(1, 10), min_size=1, max_size=6)))
    members = draw(st.lists(st.sampled_from(POOL), max_size=12))
    earlier = draw(st.lists(st.sampled_from(POOL), max_size=12))
    total = tables.total_shards
    shards = st.lists(st.integers(-2, total + 3), max_size=total + 4)
    previous = draw(st.none()
                    | st.just(assign(total, earlier, order=tables.spread_order()))
                    | st.dictionaries(st.sampled_from(POOL), shards, max_size=8))
    return tables, members, previous


@settings(max_examples=300, deadline=None)
@given(spread_cases())
def test_property_spread_order_keeps_balance_and_minimum_moves(
    case: tuple[TableMap, list[str], dict[str, list[int]] | None],
) -> None:
    tables, members, previous = case
    total = tables.total_shards
    result = assign(total, members, previous, order=tables.spread_order())
    check_valid(total, members, result)
    check_balanced(total, members, result)
    check_sticky(total, members, previous, result)
    # The order changes which shards are dealt, never how many move (a previous
    # with duplicates is counted against its repair: check_sticky).
    if previous is None or not has_duplicates(previous):
        plain = assign(total, members, previous)
        assert len(moves(previous, result)) == len(moves(previous, plain))
    assert assign(total, members, result, order=tables.spread_order()) == result


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 6), st.integers(1, 16), st.integers(1, 12))
def test_property_a_fresh_spread_assignment_gives_each_member_every_table(
    count: int, size: int, members_count: int,
) -> None:
    """Tables of one size: a member given at least as many shards as there are
    tables holds some of each, and no table's shards pile up on a member."""
    tables = tables_of(*[size] * count)
    members = POOL[:members_count] if members_count <= len(POOL) else [
        f"x{i}" for i in range(members_count)]
    result = assign(tables.total_shards, members, order=tables.spread_order())
    for member in members:
        share = len(result[member])
        for table in tables:
            held = len([k for k in result[member] if table.first <= k < table.end])
            assert held <= -(-share // count)
            if share >= count:
                assert held >= 1


def test_tables_appended_at_once_make_the_map_appended_one_by_one() -> None:
    base = TableMap().append("shop.a", "schema-0@1", 4, "bucket").drop("shop.a", 2.0)
    entries = [(f"shop.t{i}", f"schema-0@{i}", 1 + i % 5, "bucket") for i in range(60)]
    one_by_one = base
    for entry in entries:
        one_by_one = one_by_one.append(*entry)
    at_once = base.extend(entries)
    assert at_once == one_by_one and at_once.encoded_size() == one_by_one.encoded_size()
    assert base.extend([]) == base and TableMap().extend([]) == TableMap()
    with pytest.raises(ValueError, match=r"'shop\.t3' is in the group already"):
        base.extend([*entries[:5], entries[3]])


def test_tables_appended_at_once_are_refused_at_the_first_that_would_pass_the_bound() -> None:
    entries = [(f"warehouse_db.orders_{i:05d}", f"schema-0@{1763865600123 + i}", 8, "bucket")
               for i in range(4456)]
    fits = TableMap().extend(entries[:4454])
    assert fits.encoded_size() <= MAX_ENCODED_BYTES
    with pytest.raises(ConfigError) as at_once:
        TableMap().extend(entries)
    with pytest.raises(ConfigError) as one_by_one:
        fits.append(*entries[4454])
    assert str(at_once.value) == str(one_by_one.value)
    assert "warehouse_db.orders_04454" in str(at_once.value)
