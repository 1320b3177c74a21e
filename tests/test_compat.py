"""The compatibility rule of the group's records (docs/design.md, "Versions and
compatibility"), one record at a time.

* every record main writes is read by the previous release (its own code,
  extracted from its tag or recorded commit, in a process of its own) with
  the same meaning for every field that release knows;
* every record the previous release writes is read by main with the defaults
  that mean what it meant;
* a record of a newer format, and a group using a feature this version
  cannot follow, are refused in one line naming both versions; a member
  that lists a feature in its MemberInfo may have it switched on.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from paimon_group.errors import IncompatibleVersion
from paimon_group.protocol.records import (
    FEATURES,
    Assignment,
    GroupMeta,
    MemberInfo,
    Owner,
    Position,
    RemovedMember,
    check_can_follow,
    unable_to_follow,
)
from paimon_group.version import __version__
from tests.support.releases import extract_release, previous_release

# Records as main writes them, each with every field it has now set.
MAIN_RECORDS: dict[str, Any] = {
    "GroupMeta": GroupMeta(num_shards=4, table="db.t", created_at=1.5, sharding="bucket",
                           incarnation="abc", table_id="tid", warehouse="file:///wh",
                           assignor="count", written_by=__version__),
    "MemberInfo": MemberInfo(member_id="m1", host="h", pid=7, version=__version__,
                             started_at=2.0, session="s1", features=tuple(sorted(FEATURES))),
    "Assignment": Assignment(generation=3, leader="m1", leader_epoch=9,
                             shards={"m1": [0, 2], "m2": [1, 3]}, published_at=4.0,
                             home={"m3": [5]}, away_since={"m3": 3.5}, loads=[10, 20, 30, 40]),
    "Owner": Owner(member_id="m1", generation=3, session="s1"),
    "RemovedMember": RemovedMember(session="s9", removed_at=5.0),
    "Position": Position(next_snapshot=12, epoch=7, member_id="m1", committed_at=6.0,
                         full_scan=11, start_moves=1),
}

# What the previous release reads and writes of each record (run in its own process).
_PREVIOUS = """
import dataclasses, json, sys
from paimon_group import records
out = {"read": {}, "wrote": {}}
for name, value in json.loads(sys.stdin.read()).items():
    out["read"][name] = dataclasses.asdict(getattr(records, name).decode("k", value.encode()))
out["wrote"]["GroupMeta"] = records.GroupMeta(num_shards=4, table="db.t", created_at=1.5,
                                              sharding="bucket", incarnation="abc",
                                              table_id="tid").encode().decode()
out["wrote"]["MemberInfo"] = records.MemberInfo(member_id="m1", host="h", pid=7,
                                                version="0.1.0", started_at=2.0,
                                                session="s1").encode().decode()
out["wrote"]["Position"] = records.Position(next_snapshot=12, epoch=7, member_id="m1",
                                            committed_at=6.0, full_scan=11).encode().decode()
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def previous(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tree = extract_release(previous_release(), tmp_path_factory.mktemp("previous-release"))
    records = {name: r.encode().decode() for name, r in MAIN_RECORDS.items()}
    out = subprocess.run([sys.executable, "-c", _PREVIOUS], cwd=tree, input=json.dumps(records),
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(tree)})
    assert out.returncode == 0, out.stderr
    result: dict[str, Any] = json.loads(out.stdout)
    return result


@pytest.mark.parametrize("name", sorted(MAIN_RECORDS))
def test_the_previous_release_reads_mains_records(previous: dict[str, Any], name: str) -> None:
    read = previous["read"][name]
    ours = dataclasses.asdict(MAIN_RECORDS[name])
    # Every field the previous release knows means the same; the new ones it leaves out.
    assert read == {k: ours[k] for k in read}, (read, ours)


def test_main_reads_the_previous_releases_records(previous: dict[str, Any]) -> None:
    wrote = previous["wrote"]
    meta = GroupMeta.decode("k", wrote["GroupMeta"].encode())
    assert (meta.assignor, meta.warehouse, meta.features, meta.written_by) == (
        "count", "", (), "")
    check_can_follow(meta, "g")  # a group of the previous release uses no feature
    info = MemberInfo.decode("k", wrote["MemberInfo"].encode())
    assert (info.version, info.features) == ("0.1.0", ())
    pos = Position.decode("k", wrote["Position"].encode())
    assert (pos.next_snapshot, pos.full_scan, pos.start_moves) == (12, 11, None)


@pytest.mark.parametrize("cls", [GroupMeta, Position, Assignment, MemberInfo])
def test_a_record_of_a_newer_format_is_refused_in_one_line(cls: Any) -> None:
    data = {**json.loads(MAIN_RECORDS[cls.__name__].encode()), "format": 2,
            "written_by": "0.9.0"}
    with pytest.raises(IncompatibleVersion) as err:
        cls.decode("groups/g/x", json.dumps(data).encode())
    assert str(err.value) == (
        "the record at coordinator key 'groups/g/x' has format 2 (written by paimon-group "
        f"0.9.0); this member is paimon-group {__version__}, which reads format 1: "
        "upgrade it to 0.9.0 or later")


def test_a_feature_is_followed_only_by_the_members_that_list_it() -> None:
    meta = dataclasses.replace(MAIN_RECORDS["GroupMeta"], features=("future-x",),
                               written_by="0.9.0")
    decoded = GroupMeta.decode("k", meta.encode())  # read (describe shows it), not followed
    assert decoded.features == ("future-x",)
    with pytest.raises(IncompatibleVersion, match=(
            r"^group 'g' uses feature future-x \(switched on by paimon-group 0.9.0\), which "
            rf"this member, paimon-group {__version__}, cannot follow: upgrade it to "
            r"paimon-group 0.9.0 or later$")):
        check_can_follow(decoded, "g")
    base = MAIN_RECORDS["MemberInfo"]
    members = [dataclasses.replace(base, member_id="a", features=("future-x",)),
               dataclasses.replace(base, member_id="b"),  # as the previous release registers
               dataclasses.replace(base, member_id="c", features=("future-x", "other"))]
    assert unable_to_follow("future-x", members) == ["b"]
    assert unable_to_follow("future-x", members[::2]) == []


def test_every_record_is_in_the_rule() -> None:
    """docs/design.md lists every record class; a new one must be added there."""
    from paimon_group.protocol import records

    classes = {n for n, v in vars(records).items()
               if isinstance(v, type) and issubclass(v, records._Record)
               and v is not records._Record}
    doc = (Path(__file__).resolve().parents[1] / "docs" / "design.md").read_text()
    section = doc.split("## Versions and compatibility", 1)[1].split("\n## ", 1)[0]
    missing = sorted(c for c in classes if f"`{c}`" not in section)
    assert missing == [], f"records not in docs/design.md's compatibility table: {missing}"


def test_sink_marks_of_a_newer_format_are_refused_in_one_line() -> None:
    from paimon_group.sink.marks import FORMAT, ShardMark, Source, decode, decode_group, encode

    value = encode({0: ShardMark(epoch=3, next_snapshot=9, incarnation="a", start_moves=1)},
                   Source("schema-0@1", 4, "bucket"))
    assert decode(value)[0].next_snapshot == 9
    newer = json.dumps({**json.loads(value), "v": FORMAT + 1})
    with pytest.raises(IncompatibleVersion, match=(
            rf"^the sink's marks in the target have format {FORMAT + 1}; this is paimon-group "
            rf"{__version__}, which reads format {FORMAT}: upgrade it to the version that wrote "
            r"them or later$")):
        decode(newer)
    # A mark with more entries than this version knows (a later one's, added
    # at the end) is read ignoring them, and so is a source's unknown field.
    longer = json.dumps({"v": FORMAT, "source": {"table_id": "t", "later": 1},
                         "shards": {"0": [3, 9, "a", 1, 6, "later"]}})
    assert decode(longer) == {0: ShardMark(3, 9, "a", 1, 6)}
    # Format 1 (no source) is still read: its source is unknown.
    former = decode_group(json.dumps({"v": 1, "shards": {"0": [3, 9, "a", 1]}}))
    assert (former.source, dict(former.shards)) == (Source(), {0: ShardMark(3, 9, "a", 1)})
