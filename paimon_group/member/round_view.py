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
request (``with_meta``) when it may have moved (member/control.py,
``_read_round``): that is how it learns that the leader added a table to the
map (member/table_refresh.py) before it is assigned one of its shards;
and the starts of the bucket-unaware tables whose shards it holds (``starts``),
as a member of a group of one such table reads the group's.

Every round also reads the group's ``forced`` key, which each operator commit
that deletes owner keys writes (protocol/admin.py): a member re-reads its own
owner keys when that key moved (member/ownership.py). One more key in the same
request, in place of a read of every owner key the member holds, once per
session.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from coordinators.protocol import Entry
from paimon_group.protocol.group import GroupClient
from paimon_group.protocol.group_views import leader_of
from paimon_group.protocol.records import Assignment, GroupStart


@dataclass(frozen=True)
class RoundView:
    member_key: Entry | None
    leader: tuple[str, int] | None  # (member id, leader epoch)
    assignment: Assignment | None
    assignment_version: int | None
    # The starts read (``starts``), by table: None for a group of one table,
    # else the table's position in the map.
    starts: Mapping[int | None, GroupStart] = field(default_factory=dict)
    meta: bytes | None = None  # the group record's bytes, read only ``with_meta``
    # The group's ``forced`` key as read: its create version, version and
    # value (None: no operator ever deleted an owner key of the group).
    forced: tuple[int, int, bytes] | None = None

    @property
    def start(self) -> GroupStart | None:
        """The start of a group of one table, if read."""
        return self.starts.get(None)


async def read_round(group: GroupClient, member_id: str, *,
                     with_start: bool = False, with_meta: bool = False,
                     starts: Sequence[int] = ()) -> RoundView:
    """The round's keys in one request; ``with_start``: the start of a group
    of one table, ``starts``: those of the tables at these positions of a
    group of several tables' map (its bucket-unaware tables the member reads)."""
    keys = group.keys
    wanted = (keys.member(member_id), keys.leader, keys.assignment)
    tables: list[int | None] = [None] if with_start else []
    tables += list(starts)
    start_keys = [keys.start_of(t) for t in tables]
    extra = (keys.forced, *start_keys, *((keys.meta,) if with_meta else ()))
    got = await group.coordinator.get_many(wanted + tuple(extra))
    member_key, leader, assignment = (got.get(k) for k in wanted)
    decoded, version = group.assignment_of(assignment)
    found: dict[int | None, GroupStart] = {}
    for table, key in zip(tables, start_keys, strict=True):
        entry = got.get(key)
        if entry is not None:
            found[table] = GroupStart.decode(entry.key, entry.value)
    meta = got.get(keys.meta) if with_meta else None
    forced = got.get(keys.forced)
    return RoundView(member_key=member_key, leader=leader_of(leader), assignment=decoded,
                     assignment_version=version, starts=found,
                     meta=None if meta is None else meta.value,
                     forced=None if forced is None
                     else (forced.create_version, forced.version, forced.value))


async def read_meta_value(group: GroupClient) -> bytes | None:
    """The group record's bytes alone (a round that did not read it, and
    found a new assignment: member/control.py)."""
    entry = await group.coordinator.get(group.keys.meta)
    return None if entry is None else entry.value

