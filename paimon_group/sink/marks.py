"""What a Paimon target holds of each source shard: the sink's marks.

Every commit of :class:`~paimon_group.sink.paimon.PaimonSink` into its target
carries, in its snapshot properties under ``paimon-group.sink.<group>``, the
mark of every shard of the group that has ever written there: the epoch of
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
  mark's (a re-pin's full scan of ``L`` is written whole, though the mark
  may be past ``L``: under a bucket-unaware table's file rule a compaction
  may have moved into the shard's files rows that no batch of the earlier
  start gave it; judged by position alone, that scan was taken as written
  and those rows were lost: simulation seed 305872).
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
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from paimon_group.errors import CorruptValue, IncompatibleVersion
from paimon_group.version import __version__

PROPERTY_PREFIX = "paimon-group.sink."
FORMAT = 1


def property_key(group: str) -> str:
    """The snapshot property holding ``group``'s marks."""
    return PROPERTY_PREFIX + group


@dataclass(frozen=True)
class ShardMark:
    """A shard's mark in the target: the epoch that wrote last, the source
    position after the last batch written, the group's incarnation then
    (empty: unknown), and the moves of the group start the position derives
    from."""

    epoch: int
    next_snapshot: int
    incarnation: str = ""
    start_moves: int = 0


@dataclass(frozen=True)
class Verdict:
    """What to do with one batch: ``write`` it, or it is ``already`` in (the
    member commits ``next_snapshot``), or it is ``stale`` (refused)."""

    kind: Literal["write", "already", "stale"]
    next_snapshot: int | None = None


def judge(mark: ShardMark | None, *, first: int, epoch: int, incarnation: str = "",
          full_scan: int | None = None, start_moves: int = 0) -> Verdict:
    """The verdict on a batch starting at source snapshot ``first`` (or an
    initial full scan of snapshot ``full_scan``) written at ``epoch`` of the
    group's ``incarnation``, read from the start of ``start_moves`` moves,
    against its shard's ``mark``."""
    if mark is None:
        return Verdict("write")
    if epoch < mark.epoch and incarnation == mark.incarnation:
        return Verdict("stale")
    if start_moves > mark.start_moves:
        return Verdict("write")
    if (first if full_scan is None else full_scan) < mark.next_snapshot:
        return Verdict("already", mark.next_snapshot)
    return Verdict("write")


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


def encode(marks: Mapping[int, ShardMark]) -> str:
    """The property value of ``marks`` (compact JSON, shards in order)."""
    return json.dumps({"v": FORMAT, "shards": {
        str(s): [m.epoch, m.next_snapshot, m.incarnation, m.start_moves]
        for s, m in sorted(marks.items())}}, separators=(",", ":"))


def decode(value: str) -> dict[int, ShardMark]:
    """The marks of a property value; one line naming what is wrong otherwise."""
    try:
        data = json.loads(value)
        if isinstance(data.get("v"), int) and data["v"] > FORMAT:
            raise IncompatibleVersion(
                f"the sink's marks in the target have format {data['v']}; this is "
                f"paimon-group {__version__}, which reads format {FORMAT}: upgrade it to the "
                "version that wrote them or later")
        if data.get("v") != FORMAT:
            raise ValueError(f"format {data.get('v')!r}")
        return {int(s): ShardMark(int(m[0]), int(m[1]), str(m[2]) if len(m) > 2 else "",
                                  int(m[3]) if len(m) > 3 else 0)
                for s, m in data["shards"].items()}
    except (ValueError, TypeError, KeyError, AttributeError, IndexError) as err:
        raise CorruptValue(f"the sink's marks in the target do not parse ({err}): "
                           f"{value[:80]!r}") from err
