"""Snapshot expiry in the simulation, and the oracle of what it may cost.

Each seed draws (its own draw: the other draws of a seed stay) an
:class:`ExpiryPlan`: expiry ``off``, ``protect`` (the writer expires
snapshots after its commits, keeping the last ``retain``; the consumer files
protect every snapshot from their ``nextSnapshot`` on, as Paimon's
ConsumerManager does) or ``consumers`` (the same with
``consumer.expiration-time``: a consumer file unchanged for that long is
deleted first, so it no longer protects a stalled member); and the members'
``--on-data-loss`` (``fail`` or ``skip``). The writer is
:meth:`tests.sim.table.ReplayWarehouse.expire` (the files of the expired
snapshots deleted as Paimon's ``ExpireSnapshots`` deletes them). Expiry
bites where a member holds something while time passes: after each commit,
while a handler holds a batch before ``to_arrow()``, and soon after a start
(a pending full scan) is pinned.

:class:`LossOracle` says whether a row the group never delivered may be
missing:

* under ``skip``: only if a snapshot that *carried* it (whose delta, or full
  scan, would deliver it to a shard) expired while that shard's committed
  position had not passed that snapshot (the position the store held at
  the expiry's instant; a shard without one yet is at the group's start
  once that is stored, ``groups/<g>/start``, if it reads deltas: every shard
  of the group starts from it): the rows of an expired snapshot are lost
  to the shards that had not read it, nothing else;
* under ``fail``: only if the shard's committed position never passed it
  (nothing is skipped; the member stops with the one data-loss line).

A bucket-unaware table moves rows between files, hence shards, when it
compacts: the full scan of snapshot F carries a row to the shard of the file
holding it at F (:attr:`tests.sim.table.Template.live`), its delta to the
shard of the file it was written in.
"""

from __future__ import annotations

import random
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tests.sim.coordinator import PositionWrite
    from tests.sim.table import Location, ReplayWarehouse

MODES = ("off", "protect", "consumers")
DATA_LOSS_LINE = "their rows are lost to "
"""Part of the one line a member stops with under ``--on-data-loss fail``
(:func:`paimon_group.member.data_loss.data_loss_error`; the Spark source's
query with ``failOnDataLoss``: "lost to the query")."""


@dataclass(frozen=True)
class ExpiryPlan:
    mode: str
    retain: int  # snapshot.num-retained.min = max
    consumer_expiration_s: float | None  # consumer.expiration-time (mode "consumers")
    on_data_loss: str
    bite: float  # how often a held batch or a pinned start gets an expiry under it

    @property
    def on(self) -> bool:
        return self.mode != "off"

    @classmethod
    def draw(cls, seed: int) -> ExpiryPlan:
        rng = random.Random(f"expiry:{seed}")
        mode = rng.choices(MODES, [2, 1, 2])[0]
        retain = rng.choice([1, 1, 2, 3])
        expiration = rng.choice([2.0, 4.0, 8.0]) if mode == "consumers" else None
        return cls(mode, retain, expiration, rng.choice(["fail", "skip"]),
                   rng.choice([0.1, 0.3, 0.5]))


def data_loss_stop(err: BaseException | None) -> bool:
    """Whether a member stopped with the one data-loss line."""
    from paimon_group.errors import SnapshotExpired

    return isinstance(err, SnapshotExpired) and DATA_LOSS_LINE in str(err)


def named_snapshot(err: BaseException) -> int | None:
    """The first lost snapshot a data-loss line names."""
    m = re.search(r"snapshots? (\d+)", str(err))
    return int(m.group(1)) if m else None


Position = tuple[int, int | None]  # (next_snapshot, full_scan)


class LossOracle:
    def __init__(self, wh: ReplayWarehouse, shards: int, writes: Iterable[PositionWrite],
                 starts: Iterable[tuple[float, int, int | None]] = (),
                 moved: Iterable[int] = ()) -> None:
        self.wh = wh
        self.shards = shards
        # Under the file rule, the full scan the group's start last moved to:
        # every shard scans it (re-pinned), so a row its files hold is
        # delivered from it, whatever expired before (issue 52, E1).
        from paimon_group.protocol.sharding import ShardRule

        self.moved_to = max(moved, default=None) if wh.main.rule is ShardRule.FILE else None
        self.log: dict[int, list[tuple[float, Position]]] = defaultdict(list)
        for w in sorted(writes, key=lambda w: w.t):
            self.log[w.shard].append((w.t, (w.next_snapshot, w.full_scan)))
        self.starts = sorted(starts)
        self._ids_of: dict[Location, set[int]] = defaultdict(set)
        for i, locs in wh.main.locs.items():
            for loc in locs:
                self._ids_of[loc].add(i)

    def position_at(self, shard: int, t: float) -> Position | None:
        """The shard's committed position at ``t``; a shard without one is at
        the group's start once it is stored, when that start reads deltas
        (every shard of a group starts from it, whoever pins it and when);
        None: neither yet. A group start that is a full scan is not a
        position: when it expires, the group's shards that had not pinned it
        scan a later snapshot in full, which holds every row it held (a
        skipped start moves forward group-wide, once: issue 37, D2)."""
        found = None
        later = None
        for at, pos in self.log.get(shard, ()):
            if at > t:
                later = pos
                break
            found = pos
        if found is None:
            for at, nxt, full in self.starts:
                if full is not None:
                    continue
                if at <= t:
                    found = (nxt, full)
                elif later is None or at < self._first_at(shard):
                    later = (nxt, full)
                    break
        # Nothing yet at ``t``: where the shard first stood after it bounds
        # where it was (positions only move on). A start decided before
        # ``t`` and pinned after it (the pin waited on the coordinator while
        # its first snapshots expired) is read from there, and the expired
        # snapshots it begins with are skipped with the line (seed 205949).
        return found if found is not None else later

    def _first_at(self, shard: int) -> float:
        entries = self.log.get(shard)
        return entries[0][0] if entries else float("inf")

    def final(self, shard: int) -> Position | None:
        entries = self.log.get(shard)
        return entries[-1][1] if entries else None

    def _sharding(self) -> object:
        from paimon_group.protocol.sharding import Sharding

        return Sharding(self.wh.main.rule, self.shards)  # type: ignore[arg-type]

    def carriers(self, i: int, first: int) -> list[tuple[str, int, int]]:
        """(how, snapshot, shard) of every snapshot that would deliver the
        version of ``i`` written in snapshot ``first``: its delta, and the
        full scan of every later snapshot (while a newer version is not
        written: the caller passes each version's snapshot)."""
        sharding = self._sharding()
        out = [("delta", first, self.wh.shard_of(i, self.shards))]
        for f in range(first, self.wh.committed + 1):
            for loc in self.wh.main.live.get(f, ()):
                if i in self._ids_of[loc]:
                    part, bucket, name = loc
                    out.append(("full", f, sharding.shard_of(part, bucket, name)))  # type: ignore[attr-defined]
        return sorted(set(out), key=lambda c: (c[1], c[0], c[2]))

    @staticmethod
    def _before(how: str, snapshot: int, pos: Position) -> bool:
        """Whether a shard at ``pos`` had still to read ``snapshot``'s delta or full scan."""
        nxt, full = pos
        if how == "delta":
            return nxt <= snapshot if full is None else full < snapshot
        return full is not None and full <= snapshot

    def excuse_skip(self, i: int, first: int) -> str | None:
        """Why the version of ``i`` written in ``first`` may be missing under
        ``skip`` (None: it may not). A row the files of the moved start's
        full scan hold never is: every shard scans it (a shard that finds it
        expired moves the start again, and the oracle judges by that one)."""
        carriers = self.carriers(i, first)
        if self.moved_to is not None and any(
                how == "full" and s == self.moved_to for how, s, _ in carriers):
            return None
        for how, s, shard in carriers:
            t = self.wh.expired_at.get(s)
            if t is None:
                continue
            pos = self.position_at(shard, t)
            if pos is not None and self._before(how, s, pos):
                return f"snapshot {s} ({how}) expired while shard {shard} was at {pos}"
        return None

    def why_not_excused(self, i: int, first: int) -> str:
        """The carriers of a missing row and what each shard had committed when they expired."""
        parts = []
        for how, s, shard in self.carriers(i, first)[:6]:
            t = self.wh.expired_at.get(s)
            if t is None:
                parts.append(f"{how} of {s} (shard {shard}) not expired")
            else:
                parts.append(f"{how} of {s} (shard {shard}) expired when the shard was at "
                             f"{self.position_at(shard, t)}")
        return "; ".join(parts)

    def unread_under_fail(self, i: int, first: int) -> bool:
        """Under ``fail``: whether a shard that carries the row never moved
        past it (it stopped before reading it: not skipped)."""
        for how, s, shard in self.carriers(i, first):
            pos = self.final(shard)
            if pos is None or self._before(how, s, pos):
                return True
        return False
