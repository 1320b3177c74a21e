"""What a Paimon target holds of each source shard: the sink's marks.

Every commit of :class:`~paimon_group.sink.paimon.PaimonSink` into its target
carries, in its snapshot properties under ``paimon-group.sink.<group>``, for
every group whose marks the target holds (not only the groups it writes, so a
group's marks live as long as any sink writes the target), the **source** they
belong to (the source table's identity,
:func:`paimon_group.protocol.identity.table_identity`, the group's shard count
and sharding rule: :class:`Source`) and the mark of every shard of the group
that has written there since: the epoch of
the owner that wrote last, the source position after the last batch
written (``next_snapshot``: the snapshot the shard reads next), the
group's incarnation in its coordinator then (a group re-created on another
or a wiped coordinator has another one, and its epochs start anew), and the
moves of the group start that position derives from (``start_moves``: a
shard re-pinned at a moved start, ``--on-data-loss skip``, is past everything
it read from the earlier start, though it scans an earlier snapshot than it
may have reached; :func:`paimon_group.protocol.records.position_order`). The marks
are cumulative (each commit carries those of the commit before, with its own
shards' replaced), so the newest snapshot that has them says everything.

A group of several tables (docs/many-tables.md) numbers each table's shards
from 0: its marks are kept per source table, under
``paimon-group.sink.<group>@<database.table>`` (:func:`marks_key`), for
every table but the one whose range of the group's shards starts at 0. That
one's shard numbers are the group's, so its marks stay under
``paimon-group.sink.<group>``, where a group of that table alone keeps them
(:func:`paimon_group.sink.pending.marks_table_of` says which key a batch's
marks are under). A group of one table keeps its marks as before, byte for
byte; a release before this one carries the per-table properties as another
group's.

A group's marks hold for batches of their source only. A batch of another
source (a table dropped and re-created under the same name, a group deleted
and started again with another shard count or sharding rule: its shard
numbers and positions mean other rows) is not judged against them: it is
written, and the group's marks become those of the new source
(:meth:`GroupMarks.for_batch`, :meth:`GroupMarks.written`). A part of the
source unknown on either side (a batch that does not say, marks of format 1,
which recorded none) is not compared.

Pure and I/O free: the sink reads snapshots and commits; this module decides.

A batch of source range ``[first, next)`` written by the owner at ``epoch``
of the group's incarnation ``i``, read from the start of ``m`` moves, against
the shard's mark ``(e, n, j, k)``:

* ``epoch < e`` and ``i == j``: **stale**, a former owner (paused past its
  session, then waking) after a newer owner wrote: refused, never
  committed. Epochs of another incarnation are not compared: a group
  re-created on another or a wiped coordinator starts its epochs anew
  (docs/design.md), and a switch moves every member (one left on the former
  coordinator would be a second group, which no epoch can fence).
* ``m > k``: **write**: the batch is of a start the group moved to after the
  mark's. A re-pin's full scan of ``L`` is written whole, though the mark
  may be past ``L``: under a bucket-unaware table's file rule a compaction
  may have moved into the shard's files rows that no batch of the earlier
  start gave it, and that scan is the only batch that holds them (judged by
  position alone it would be taken as written; docs/reliability.md, "The
  Paimon sink in the simulation"). The mark keeps its position
  (:func:`mark_after`): the deltas past ``L`` the shard read from the
  earlier start, read again after the scan, are found.
* a full scan of ``F`` of a source whose rule moves rows between shards
  (the file rule), unless the mark's last full scan is ``F`` (a replay,
  in this life or the next, of a scan the target holds): **write**, whole,
  for the same reason: the mark says what the shard's stream gave it, and
  a compaction may since have put into the shard's files rows that another
  shard never wrote (it lagged, or stopped on data loss). On an append
  target the rows written before are there again, as for any new life's
  full scan (docs/paimon-sink.md, "A re-created table or group"). Under
  the bucket rules a shard's rows stay in its buckets and
  the position alone says the scan is in.
* ``first < n``: **already written**, up to ``n``: the target holds this
  batch (a replay after a crash between the target's commit and the
  position's) or a longer one of it: the member commits position ``n`` and
  reads on from there, so a longer replay (a catch-up that now ends later)
  is never written twice. An initial full scan of snapshot ``F`` is in if
  ``F < n``: the target holds the shard up to ``F`` or later.
* otherwise: **write** (a full scan of ``F >= n``, say of a group
  re-created without its positions, or a start re-pinned past an expired
  snapshot, is written whole).

Example::

    >>> marks = decode(encode({0: ShardMark(epoch=3, next_snapshot=9, incarnation="a")}))
    >>> judge(marks.get(0), first=5, epoch=3, incarnation="a")
    Verdict(kind='already', next_snapshot=9)
    >>> judge(marks.get(0), first=9, epoch=4, incarnation="a")
    Verdict(kind='write', next_snapshot=None)
    >>> judge(marks.get(0), first=9, epoch=2, incarnation="a")
    Verdict(kind='stale', next_snapshot=None)
    >>> judge(marks.get(0), first=9, epoch=2, incarnation="b")  # re-created: epochs anew
    Verdict(kind='write', next_snapshot=None)
    >>> judge(marks.get(0), first=0, epoch=3, incarnation="a", full_scan=12)
    Verdict(kind='write', next_snapshot=None)
    >>> judge(marks.get(0), first=0, epoch=3, incarnation="a", full_scan=6, start_moves=1)
    Verdict(kind='write', next_snapshot=None)
    >>> judge(marks.get(0), first=0, epoch=1, incarnation="b", full_scan=6)
    Verdict(kind='already', next_snapshot=9)
    >>> judge(marks.get(0), first=0, epoch=1, incarnation="b", full_scan=6, rows_move=True)
    Verdict(kind='write', next_snapshot=None)
    >>> scanned = ShardMark(epoch=3, next_snapshot=9, incarnation="a", scan=6)
    >>> judge(scanned, first=0, epoch=1, incarnation="b", full_scan=6, rows_move=True)
    Verdict(kind='already', next_snapshot=9)
    >>> old = GroupMarks(Source("schema-0@1", 4, "bucket"), marks)
    >>> old.for_batch(Source("schema-0@1", 4, "bucket")).get(0).next_snapshot
    9
    >>> old.for_batch(Source("schema-0@2", 4, "bucket"))  # the table was re-created
    {}
    >>> old.for_batch(Source("schema-0@1", 2, "bucket"))  # another shard count
    {}
    >>> old.written(Source("schema-0@2", 4, "bucket"), {1: ShardMark(1, 3)}).shards
    {1: ShardMark(epoch=1, next_snapshot=3, incarnation='', start_moves=0, scan=None)}
    >>> marks_key("cdc"), marks_key("cdc", "shop.items")  # a group's, a source table's
    ('cdc', 'cdc@shop.items')
    >>> split_key("cdc@shop.items")
    ('cdc', 'shop.items')
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from paimon_group.errors import CorruptValue, IncompatibleVersion
from paimon_group.version import __version__

PROPERTY_PREFIX = "paimon-group.sink."
FORMAT = 2
"""Format 2 records the marks' source; format 1 (no source) is still read."""
NONCE_PROPERTY = "paimon-group.commit-nonce"
"""The property naming a sink commit (looked up when its outcome is unknown);
outside :data:`PROPERTY_PREFIX`, whose names are all groups' (a group may be
named ``commit``)."""
_FORMER_NONCE = re.compile(r"[0-9a-f]{32}")


TABLE_SEPARATOR = "@"
"""Between a group and a source table in a marks key (no group name has it)."""


def marks_key(group: str, table: str = "") -> str:
    """The key ``group``'s marks are kept under: the group's name (a group of
    one table, and the table of a group of several whose shard numbers are
    the group's), or ``<group>@<database.table>`` for the source ``table``
    of a group of several tables (:func:`paimon_group.sink.pending.marks_table_of`)."""
    return f"{group}{TABLE_SEPARATOR}{table}" if table else group


def split_key(key: str) -> tuple[str, str]:
    """The group and the source table ("": the group's own marks) of a marks key."""
    group, _, table = key.partition(TABLE_SEPARATOR)
    return group, table


def property_key(key: str) -> str:
    """The snapshot property holding the marks kept under ``key`` (a group's
    name, or :func:`marks_key`'s of a group and a source table)."""
    return PROPERTY_PREFIX + key


def group_of(key: str, value: str) -> str | None:
    """The marks key (:func:`marks_key`: a group, or a group and a source
    table) whose marks the snapshot property ``key`` holds, or None.
    Snapshots committed before the commit's nonce had a property of its own
    hold it under ``paimon-group.sink.commit``: a hex nonce there is not a
    group's marks."""
    if not key.startswith(PROPERTY_PREFIX):
        return None
    group = key[len(PROPERTY_PREFIX):]
    if group == "commit" and _FORMER_NONCE.fullmatch(value):
        return None
    return group


@dataclass(frozen=True)
class ShardMark:
    """A shard's mark in the target: the epoch that wrote last, the source
    position after the last batch written, the group's incarnation then
    (empty: unknown), the moves of the group start the position derives
    from, and the last full scan of the shard the target holds."""

    epoch: int
    next_snapshot: int
    incarnation: str = ""
    start_moves: int = 0
    scan: int | None = None
    """The snapshot of the last full scan of the shard written into the
    target (or found there), in any life of the group; None: none known."""


@dataclass(frozen=True)
class Verdict:
    """What to do with one batch: ``write`` it, or it is ``already`` in (the
    member commits ``next_snapshot``), or it is ``stale`` (refused)."""

    kind: Literal["write", "already", "stale"]
    next_snapshot: int | None = None


def judge(mark: ShardMark | None, *, first: int, epoch: int, incarnation: str = "",
          full_scan: int | None = None, start_moves: int = 0,
          rows_move: bool = False) -> Verdict:
    """The verdict on a batch starting at source snapshot ``first`` (or an
    initial full scan of snapshot ``full_scan``) written at ``epoch`` of the
    group's ``incarnation``, read from the start of ``start_moves`` moves,
    against its shard's ``mark``; ``rows_move``: the source's sharding rule
    lets a compaction move rows between shards (the file rule)."""
    if mark is None:
        return Verdict("write")
    if epoch < mark.epoch and incarnation == mark.incarnation:
        return Verdict("stale")
    if start_moves > mark.start_moves:
        return Verdict("write")
    if full_scan is not None and rows_move and full_scan != mark.scan:
        return Verdict("write")
    if (first if full_scan is None else full_scan) < mark.next_snapshot:
        return Verdict("already", mark.next_snapshot)
    return Verdict("write")


def mark_after(known: ShardMark | None, *, epoch: int, next_snapshot: int,
               incarnation: str, start_moves: int, full_scan: int | None) -> ShardMark:
    """A shard's mark once its batch (judged ``write`` against ``known``)
    is in the target. It names the batch's full scan, else the one the mark
    named. A full scan behind the mark (a moved start's re-pin, or the file
    rule's of a new life) leaves the mark's position: the shard's deltas up
    to it are in the target too, whatever start they were read from, and a
    delta never moves between shards; the re-pinned shard reads them again,
    and they are found."""
    scan = full_scan if full_scan is not None else None if known is None else known.scan
    if (known is not None and full_scan is not None
            and next_snapshot < known.next_snapshot):
        next_snapshot = known.next_snapshot
    return ShardMark(epoch, next_snapshot, incarnation, start_moves, scan)


def merged(marks: Mapping[int, ShardMark], written: Mapping[int, ShardMark]
           ) -> dict[int, ShardMark]:
    """``marks`` with ``written``'s shards replaced. A shard's position never
    moves back but to a moved start, and its epoch never falls within an
    incarnation: ``judge`` refused anything else. (A mark of fewer moves may
    replace one of more: the batch of an owner that had not learned of the
    move yet, past the mark; its re-pin then writes the moved start again.)"""
    out = dict(marks)
    for shard, mark in written.items():
        known = out.get(shard)
        if known is not None and (
                (mark.epoch < known.epoch and mark.incarnation == known.incarnation)
                or (mark.next_snapshot < known.next_snapshot
                    and mark.start_moves <= known.start_moves)):
            raise ValueError(f"shard {shard}: mark {mark} would move back from {known}")
        out[shard] = mark
    return out


@dataclass(frozen=True)
class Source:
    """What a group's marks were written from: the source table's identity,
    the group's shard count and its sharding rule (each empty or 0: unknown)."""

    table_id: str = ""
    num_shards: int = 0
    sharding: str = ""

    def contradicts(self, other: Source) -> bool:
        """Whether ``other`` is another source: a part known on both sides differs."""
        return any(a and b and a != b for a, b in (
            (self.table_id, other.table_id), (self.num_shards, other.num_shards),
            (self.sharding, other.sharding)))

    @property
    def rows_move(self) -> bool:
        """Whether a compaction may move rows between shards (the file rule)."""
        return self.sharding == "file"

    def completed(self, other: Source) -> Source:
        """This source with its unknown parts taken from ``other``."""
        return Source(self.table_id or other.table_id, self.num_shards or other.num_shards,
                      self.sharding or other.sharding)


@dataclass(frozen=True)
class GroupMarks:
    """A group's marks in the target: their :class:`Source` and each shard's mark."""

    source: Source = Source()
    shards: Mapping[int, ShardMark] = field(default_factory=dict)

    def for_batch(self, source: Source) -> dict[int, ShardMark]:
        """The marks a batch of ``source`` is judged against: none if they
        belong to another source."""
        return {} if self.source.contradicts(source) else dict(self.shards)

    def written(self, source: Source, shards: Mapping[int, ShardMark]) -> GroupMarks:
        """These marks after ``shards`` of a batch of ``source`` were written
        (each judged ``write`` against :meth:`for_batch`): those of another
        source are replaced whole."""
        if self.source.contradicts(source):
            return GroupMarks(source, dict(shards))
        return GroupMarks(self.source.completed(source), merged(self.shards, shards))


def encode(marks: Mapping[int, ShardMark], source: Source = Source()) -> str:
    """The property value of ``marks`` of ``source`` (compact JSON, shards in order)."""
    return json.dumps({"v": FORMAT, "source": {
        "table_id": source.table_id, "num_shards": source.num_shards,
        "sharding": source.sharding}, "shards": {
        str(s): [m.epoch, m.next_snapshot, m.incarnation, m.start_moves]
        + ([] if m.scan is None else [m.scan])
        for s, m in sorted(marks.items())}}, separators=(",", ":"))


def decode(value: str) -> dict[int, ShardMark]:
    """The shards' marks of a property value (whatever their source); one
    line naming what is wrong otherwise."""
    return dict(decode_group(value).shards)


def decode_group(value: str) -> GroupMarks:
    """The group's marks of a property value, of format 1 (no source: its
    source is unknown, and contradicts none) or :data:`FORMAT`; one line
    naming what is wrong otherwise."""
    try:
        data = json.loads(value)
        if isinstance(data.get("v"), int) and data["v"] > FORMAT:
            raise IncompatibleVersion(
                f"the sink's marks in the target have format {data['v']}; this is "
                f"paimon-group {__version__}, which reads format {FORMAT}: upgrade it to the "
                "version that wrote them or later")
        if data.get("v") not in (1, FORMAT) or isinstance(data.get("v"), bool):
            raise ValueError(f"format {data.get('v')!r}")
        source = Source()
        if data["v"] >= 2:
            known = data["source"]
            source = Source(str(known.get("table_id") or ""), int(known.get("num_shards") or 0),
                            str(known.get("sharding") or ""))
        return GroupMarks(source, {
            int(s): ShardMark(int(m[0]), int(m[1]), str(m[2]) if len(m) > 2 else "",
                              int(m[3]) if len(m) > 3 else 0,
                              int(m[4]) if len(m) > 4 and isinstance(m[4], int) else None)
            for s, m in data["shards"].items()})
    except (ValueError, TypeError, KeyError, AttributeError, IndexError) as err:
        raise CorruptValue(f"the sink's marks in the target do not parse ({err}): "
                           f"{value[:80]!r}") from err
