"""What a member's full control round reads, in one request.

A full round needs three keys: the member's own key (is our session still in
the group?), the leader key (is there a leader, is it us?) and the published
assignment. Read one by one they were three requests per member per round,
and after every publication all members run a full round at once: in a group
of 200, 600 requests on the coordinator within the same instant, each member's
round three round trips long. :meth:`~coordinators.protocol.Coordinator.get_many`
reads them in one request (on etcd one transaction, so the three values are
of one revision; on ZooKeeper three pipelined reads).

Reading the three together instead of in sequence changes no decision: each
read was already a snapshot that may be stale by the time it is acted on,
and every write acted on is fenced (the leader's publication by its leader
epoch and the assignment's version, an acquisition by the owner key's
absence, a release by its epoch).

A member of a group under the file rule (bucket-unaware tables) reads the
group's start in the same request (``with_start``): that is how it learns
that the start moved (``--on-data-loss skip``), even on an idle table. One
more key in the same request: nothing more on etcd and SQLite (one
transaction), two more reads in the pipeline on ZooKeeper (a key is two
znodes there).

A member of a group of several tables reads the group record in the same
request (``with_meta``): that is how it learns that the leader added a table
to the map (member/table_refresh.py) before it is assigned one of its shards.
"""

from __future__ import annotations

from dataclasses import dataclass

from coordinators.protocol import Entry
from paimon_group.protocol.group import GroupClient
from paimon_group.protocol.group_views import leader_of
from paimon_group.protocol.records import Assignment, GroupMeta, GroupStart, decoded_meta


@dataclass(frozen=True)
class RoundView:
    member_key: Entry | None
    leader: tuple[str, int] | None  # (member id, leader epoch)
    assignment: Assignment | None
    assignment_version: int | None
    start: GroupStart | None = None  # read only ``with_start``
    meta: GroupMeta | None = None  # read only ``with_meta``


async def read_round(group: GroupClient, member_id: str, *,
                     with_start: bool = False, with_meta: bool = False) -> RoundView:
    keys = group.keys
    wanted = (keys.member(member_id), keys.leader, keys.assignment)
    extra = ((keys.start,) if with_start else ()) + ((keys.meta,) if with_meta else ())
    got = await group.coordinator.get_many(wanted + extra)
    member_key, leader, assignment = (got.get(k) for k in wanted)
    decoded, version = group.assignment_of(assignment)
    start = got.get(keys.start) if with_start else None
    meta = got.get(keys.meta) if with_meta else None
    return RoundView(member_key=member_key, leader=leader_of(leader), assignment=decoded,
                     assignment_version=version,
                     start=None if start is None else GroupStart.decode(start.key, start.value),
                     meta=None if meta is None else decoded_meta(meta.key, meta.value))
