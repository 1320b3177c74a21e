"""What a Paimon target holds of each source shard: the sink's marks.

Every commit of :class:`~paimon_group.sink.paimon.PaimonSink` into its target
carries, in its snapshot properties under ``paimon-group.sink.<group>``, the
mark of every shard of the group that has ever written there: the epoch of
the owner that wrote last, and the source position after the last batch
written (``next_snapshot``: the snapshot the shard reads next). The marks
are cumulative (each commit carries those of the commit before, with its own
shards' replaced), so the newest snapshot that has them says everything.

Pure and I/O free: the sink reads snapshots and commits; this module decides.

A batch of source range ``[first, next)`` written by the owner at ``epoch``,
against the shard's mark ``(e, n)``:

* ``epoch < e``: **stale**, a former owner (paused past its session, then
  waking) after a newer owner wrote: refused, never committed.
* ``first < n``: **already written**, up to ``n``: the target holds this
  batch (a replay after a crash between the target's commit and the
  position's) or a longer one of it: the member commits position ``n`` and
  reads on from there, so a longer replay (a catch-up that now ends later)
  is never written twice. An initial full scan counts as ``first = 0``: any
  mark means the shard's scan, or later, is in.
* otherwise: **write**.

Example::

    >>> marks = decode(encode({0: ShardMark(epoch=3, next_snapshot=9)}))
    >>> judge(marks.get(0), first=5, epoch=3)
    Verdict(kind='already', next_snapshot=9)
    >>> judge(marks.get(0), first=9, epoch=4)
    Verdict(kind='write', next_snapshot=None)
    >>> judge(marks.get(0), first=9, epoch=2)
    Verdict(kind='stale', next_snapshot=None)
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from paimon_group.errors import CorruptValue

PROPERTY_PREFIX = "paimon-group.sink."
FORMAT = 1


def property_key(group: str) -> str:
    """The snapshot property holding ``group``'s marks."""
    return PROPERTY_PREFIX + group


@dataclass(frozen=True)
class ShardMark:
    """A shard's mark in the target: the epoch that wrote last, and the
    source position after the last batch written."""

    epoch: int
    next_snapshot: int


@dataclass(frozen=True)
class Verdict:
    """What to do with one batch: ``write`` it, or it is ``already`` in (the
    member commits ``next_snapshot``), or it is ``stale`` (refused)."""

    kind: Literal["write", "already", "stale"]
    next_snapshot: int | None = None


def judge(mark: ShardMark | None, *, first: int, epoch: int) -> Verdict:
    """The verdict on a batch starting at source snapshot ``first`` (0 for an
    initial full scan) written at ``epoch``, against its shard's ``mark``."""
    if mark is None:
        return Verdict("write")
    if epoch < mark.epoch:
        return Verdict("stale")
    if first < mark.next_snapshot:
        return Verdict("already", mark.next_snapshot)
    return Verdict("write")


def merged(marks: Mapping[int, ShardMark], written: Mapping[int, ShardMark]
           ) -> dict[int, ShardMark]:
    """``marks`` with ``written``'s shards replaced. A shard's position never
    moves back and its epoch never falls: ``judge`` refused anything else."""
    out = dict(marks)
    for shard, mark in written.items():
        known = out.get(shard)
        if known is not None and (mark.epoch < known.epoch
                                  or mark.next_snapshot < known.next_snapshot):
            raise ValueError(f"shard {shard}: mark {mark} would move back from {known}")
        out[shard] = mark
    return out


def encode(marks: Mapping[int, ShardMark]) -> str:
    """The property value of ``marks`` (compact JSON, shards in order)."""
    return json.dumps({"v": FORMAT, "shards": {
        str(s): [m.epoch, m.next_snapshot] for s, m in sorted(marks.items())}},
        separators=(",", ":"))


def decode(value: str) -> dict[int, ShardMark]:
    """The marks of a property value; one line naming what is wrong otherwise."""
    try:
        data = json.loads(value)
        if data.get("v") != FORMAT:
            raise ValueError(f"format {data.get('v')!r}")
        return {int(s): ShardMark(int(e), int(n)) for s, (e, n) in data["shards"].items()}
    except (ValueError, TypeError, KeyError, AttributeError) as err:
        raise CorruptValue(f"the sink's marks in the target do not parse ({err}): "
                           f"{value[:80]!r}") from err
