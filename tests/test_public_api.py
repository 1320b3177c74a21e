"""The public API is the one of the release before the member's parts got one
owner each (``tests/support/public_api.json``): every name, every method's
signature. GroupMember's data attributes are read-only views now (the parts
own that state); its two renamed parts answer to their former names, which
warn until 0.2."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from paimon_group import GroupMember, MemberConfig
from tests.support.public_api import public_api

SNAPSHOT = Path(__file__).parent / "support" / "public_api.json"
# The names added since the snapshot: the read loop's and the host-reads
# part's one name each (their former names, ``reading`` and ``driving``, stay);
# a batch's ``sink_holds`` (set by a sink that already holds its output),
# ``incarnation`` (the group's) and ``start_moves`` (its start's), which a
# sink's marks carry; the output a sink holds for a batch written in parts,
# sealed or dropped by the member once the handler is done; the deletes and
# update-befores a batch read (a sink refuses output that dropped their kind);
# a table loaded without the checks made for a table to read (a sink's target);
# the source table's identity and the sharding rule, which a sink's marks carry;
# the delivering member's sink registry, where a sink registers for describe.
ADDED = {"GroupMember": {"read_loop": "data", "host_reads": "data"},
         "MemberConfig": {"forming_wait_s": "data"},
         "ShardBatch": {"sink_holds": "data", "incarnation": "data", "start_moves": "data",
                        "hold_output": "method(self, sink: 'HeldOutput') -> 'None'",
                        "seal_output": "method(self) -> 'list[concurrent.futures.Future[None]]'",
                        "drop_output": "method(self) -> 'None'",
                        "close_output": "method(self) -> 'None'",
                        "retractions": "data", "output_sealed": "data",
                        "table_id": "data", "sharding": "data", "sinks": "data"},
         "ShardedTable": {"load": "method(warehouse: 'str', table: 'str', catalog_options: "
                                  "'Mapping[str, str] | None' = None, *, check: 'str' = "
                                  "'check --warehouse and --table') -> 'tuple[Any, str]'"}}
# Keyword parameters added since, each with a default (old calls still work);
# GroupMember's ``handle_signals``: SIGTERM and SIGINT stop a member used as
# ``async with`` gracefully (True), or are left alone (False).
ADDED_PARAMETERS = {"ShardBatch": ", incarnation: 'str' = '', start_moves: 'int' = 0, "
                                  "table_id: 'str' = '', sinks: 'SinkRegistry | None' = None",
                    "GroupMember": ", handle_signals: 'bool' = True",
                    "MemberConfig": ", forming_wait_s: 'float' = 1.0"}
# Keyword parameters added to methods since, each with a default: the end of
# ShardedTable.open's not-found line (the Spark source names its options there).
ADDED_METHOD_PARAMETERS = {
    ("ShardedTable", "open"): ", *, check: 'str' = 'check --warehouse and --table'"}


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
    for (name, method), added_text in ADDED_METHOD_PARAMETERS.items():
        members = now[name]["members"]
        assert added_text in members[method]
        members[method] = members[method].replace(added_text, "", 1)
    assert now == before


def _member() -> GroupMember:
    return GroupMember(MemberConfig(group="g", warehouse="/tmp/x", table="db.t",
                                    coordinator="memory://old-names", member_id="a"))


@pytest.mark.parametrize(("old", "new"), [("reading", "read_loop"), ("driving", "host_reads")])
def test_a_part_s_former_name_warns_and_gives_the_part(old: str, new: str) -> None:
    member = _member()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        part = getattr(member, old)
    assert part is getattr(member, new)
    [warning] = caught
    assert warning.category is DeprecationWarning and new in str(warning.message)
    assert warning.filename == __file__  # it points at the caller's line


def test_the_member_s_state_is_read_only_to_its_user() -> None:
    member = _member()
    with pytest.raises(AttributeError):
        member.state = member.state  # type: ignore[misc]


def test_the_host_reads_part_answers_to_its_former_class_name() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from paimon_group.member.driving import Driving  # type: ignore[attr-defined]
    from paimon_group.member.host_reads import HostReads
    assert Driving is HostReads
