"""The public API is the one of the release before the member's parts got one
owner each (``tests/support/public_api.json``): every name, every method's
signature. GroupMember's data attributes are read-only views now (the parts
own that state). The names announced to go in 0.2 are gone from the snapshot:
``GroupMember.reading`` and ``.driving`` (the parts' former names; now
``read_loop`` and ``host_reads``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from paimon_group import GroupMember, MemberConfig
from tests.support.public_api import public_api

SNAPSHOT = Path(__file__).parent / "support" / "public_api.json"
# The names added since the snapshot: the read loop's and the host-reads
# part's one name each, and the member's core (a seam for tests and tooling);
# a batch's ``sink_holds`` (set by a sink that already holds its output),
# ``incarnation`` (the group's) and ``start_moves`` (its start's), which a
# sink's marks carry; the output a sink holds for a batch written in parts,
# sealed or dropped by the member once the handler is done; the deletes and
# update-befores a batch read (a sink refuses output that dropped their kind);
# a table loaded without the checks made for a table to read (a sink's target);
# the source table's identity and the sharding rule, which a sink's marks carry;
# a config's start, parsed once (``start_position``);
# the delivering member's sink registry, where a sink registers for describe.
ADDED = {"GroupMember": {"read_loop": "data", "host_reads": "data", "core": "data"},
         "GroupClient": {
             "claim_creation": "method(self) -> 'bool'",
             "end_creation": "method(self) -> 'None'",
             "ensure_tables_meta": "method(self, subscription: 'str', tables: 'TableMap', *, "
                                   "incarnation: 'str' = '', warehouse: 'str' = '', "
                                   "assignor: 'str | None' = None) -> 'GroupMeta'",
             "update_table_map": "method(self, before: 'GroupMeta', tables: 'TableMap', "
                                 "leader_epoch: 'int') -> 'GroupMeta | None'"},
         "ShardedTable": {
             "load": "method(warehouse: 'str', table: 'str', catalog_options: "
                     "'Mapping[str, str] | None' = None, *, check: 'str' = "
                     "'check --warehouse and --table') -> 'tuple[Any, str]'",
             "open_catalog": "method(warehouse: 'str', catalog_options: "
                             "'Mapping[str, str] | None' = None, *, for_table: 'str' = "
                             "'tables') -> 'tuple[Any, str, dict[str, str]]'",
             "in_catalog": "method(cls, catalog: 'Any', location: 'str', table: 'str') -> "
                           "'ShardedTable'"},
         "MemberConfig": {"forming_wait_s": "data", "start_position": "data",
                          "tables": "data", "tables_refresh_s": "data", "table": "data",
                          "subscription": "data", "single_table": "data"},
         "ShardBatch": {"sink_holds": "data", "incarnation": "data", "start_moves": "data",
                        "hold_output": "method(self, sink: 'HeldOutput') -> 'None'",
                        "seal_output": "method(self) -> 'list[concurrent.futures.Future[None]]'",
                        "drop_output": "method(self) -> 'None'",
                        "close_output": "method(self) -> 'None'",
                        "retractions": "data", "output_sealed": "data",
                        "table_id": "data", "sharding": "data", "sinks": "data",
                        "table": "data", "group_shard": "data"},
}
# Keyword parameters added since, each with a default (old calls still work);
# GroupMember's ``handle_signals``: SIGTERM and SIGINT stop a member used as
# ``async with`` gracefully (True), or are left alone (False); its ``clock``:
# the clock its loops, deadlines and lease check read (None: the system's).
ADDED_PARAMETERS = {"ShardBatch": ", incarnation: 'str' = '', start_moves: 'int' = 0, "
                                  "table_id: 'str' = '', sinks: 'SinkRegistry | None' = None, "
                                  "table: 'str' = '', group_shard: 'int | None' = None",
                    "GroupMember": ", handle_signals: 'bool' = True, "
                                   "clock: 'Clock | None' = None",
                    "MemberConfig": ", forming_wait_s: 'float' = 1.0, "
                                    "tables: 'tuple[str, ...]' = (), "
                                    "tables_refresh_s: 'float' = 30.0"}
# Parameters that gained a default since (still taken as before): MemberConfig's
# table may be left out when ``tables`` names them all.
DEFAULTED_PARAMETERS = {"MemberConfig": ("table: 'str' = ''", "table: 'str'")}
# Keyword parameters added to methods since, each with a default: the end of
# ShardedTable.open's not-found line (the Spark source names its options there).
ADDED_METHOD_PARAMETERS = {
    ("ShardedTable", "open"): ", *, check: 'str' = 'check --warehouse and --table'",
    ("GroupClient", "commit_positions"): ", unwritten: 'Collection[int]' = ()"}
# Keyword parameters added to functions since, each with a default: the order
# ``assign`` deals shards in (a group of several tables spreads each table).
ADDED_FUNCTION_PARAMETERS = {"assign": ", *, order: 'Sequence[int] | None' = None"}


def test_the_public_api_is_the_snapshot_with_the_names_added_since() -> None:
    before = json.loads(SNAPSHOT.read_text())
    now = public_api()
    assert sorted(now) == sorted(before)
    for name, added in ADDED.items():
        members = now[name]["members"]
        assert {n: members.pop(n) for n in added} == added
    for name, added_text in ADDED_PARAMETERS.items():
        assert added_text in now[name]["init"]
        now[name]["init"] = now[name]["init"].replace(added_text, "", 1)
    for name, (now_text, before_text) in DEFAULTED_PARAMETERS.items():
        assert now_text in now[name]["init"]
        now[name]["init"] = now[name]["init"].replace(now_text, before_text, 1)
    for (name, method), added_text in ADDED_METHOD_PARAMETERS.items():
        members = now[name]["members"]
        assert added_text in members[method]
        members[method] = members[method].replace(added_text, "", 1)
    for name, added_text in ADDED_FUNCTION_PARAMETERS.items():
        assert added_text in now[name]["function"]
        now[name]["function"] = now[name]["function"].replace(added_text, "", 1)
    assert now == before


def _member() -> GroupMember:
    return GroupMember(MemberConfig(group="g", warehouse="/tmp/x", table="db.t",
                                    coordinator="memory://public-api", member_id="a"))


def test_the_member_s_state_is_read_only_to_its_user() -> None:
    member = _member()
    with pytest.raises(AttributeError):
        member.state = member.state  # type: ignore[assignment]

