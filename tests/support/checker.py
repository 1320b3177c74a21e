"""Checks a group's delivery history against what was written.

Inputs: the ids written, the deliveries recorded by
:func:`tests.support.handlers.record`, and the members' ``--history`` files
(acquire / release / lost / deliver / commit events with CLOCK_MONOTONIC
times ``t``, comparable across the processes of one host).

Each check returns a list of violations (empty = passed), so tests can show
all of them at once and the checker itself is tested with planted faults
(``tests/test_checker.py``).

Time and soundness. An event's ``t`` is taken *after* the coordinator answered,
so it is only an upper bound of when the operation happened; a process paused
between the answer and the record writes a late ``t``. To never report a
violation that did not happen, the checks that compare a commit with another
member's acquisition use a *lower* bound of when the commit was sent: the
previous event of the same process for the same shard and epoch (a member's
read loop handles one shard's acquire, deliveries and commits in sequence, so
that event was recorded before the commit was sent). A violation is reported
only when the ordering is certain.

Example::

    history = History.load(out_dir)
    violations = check_all(written_ids, history, bucket_of, num_shards)
    assert violations == {k: [] for k in violations}
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def read_jsonl(paths: Iterable[Path]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for p in paths:
        for line in p.read_text().splitlines():
            if line.strip():
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    # A process SIGKILLed in the middle of a write leaves half
                    # a line; that event did not complete.
                    continue
    return out


@dataclass
class History:
    deliveries: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.events = sorted(self.events, key=lambda e: e["t"])

    @classmethod
    def load(cls, out_dir: Path) -> History:
        return cls(
            deliveries=read_jsonl(sorted(out_dir.glob("deliveries-*.jsonl"))),
            events=read_jsonl(sorted(out_dir.glob("history-*.jsonl"))),
        )

    def commits(self, outcome: str | None = None) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == "commit"
                and (outcome is None or e["outcome"] == outcome)]

    def delivered_counts(self) -> Counter[int]:
        c: Counter[int] = Counter()
        for d in self.deliveries:
            c.update(d["ids"])
        return c


def _shards_of(e: dict[str, Any]) -> list[int]:
    if "shards" in e:
        return list(e["shards"])
    return [e["shard"]] if "shard" in e else []


def _ended(e: dict[str, Any]) -> list[tuple[int, int | None]]:
    """(shard, epoch) pairs a release or loss ends; epoch None: whatever is open."""
    if "shards" in e:
        epochs = e.get("epochs") or [None] * len(e["shards"])
        return list(zip(e["shards"], epochs, strict=True))
    return [(e["shard"], e.get("epoch"))] if "shard" in e else []


def _proc(e: dict[str, Any]) -> tuple[str, int]:
    return (e["member"], e.get("pid", 0))


@dataclass
class Ownership:
    """One member process's ownership of a shard under one epoch, as it saw it."""

    member: str
    pid: int
    shard: int
    epoch: int
    start: float  # the acquire event's t
    end: float = math.inf  # its own release / lost event's t; inf if it never learned
    commits: list[dict[str, Any]] = field(default_factory=list)  # accepted, with "lower"
    # Ended by a release the coordinator did not confirm (``ok`` false: the
    # release commit failed or its outcome is unknown, the owner key may
    # still be this epoch's, and its deletion is retried).
    unconfirmed: bool = False


def ownerships(history: History) -> list[Ownership]:
    """Ownership intervals, with each accepted commit attached to its interval.

    Every accepted commit gets ``lower``: a lower bound of when it was sent
    (see the module docstring). Accepted commits with no matching acquire are
    attached to a synthetic interval with ``start = -inf`` so that
    :func:`commits_after_ownership_ended` can report them.
    """
    open_: dict[tuple[str, int, int], Ownership] = {}
    out: list[Ownership] = []
    last_seen: dict[tuple[str, int, int, int], float] = {}  # (member, pid, shard, epoch) -> t
    for e in history.events:
        proc = _proc(e)
        kind = e["event"]
        if kind == "acquire":
            own = Ownership(proc[0], proc[1], e["shard"], e["epoch"], e["t"])
            prev = open_.get((*proc, e["shard"]))
            if prev is not None and prev.end == math.inf:
                prev.end = e["t"]
            open_[(*proc, e["shard"])] = own
            out.append(own)
            last_seen[(*proc, e["shard"], e["epoch"])] = e["t"]
        elif kind in ("release", "lost"):
            for s, epoch in _ended(e):
                own_or_none = open_.get((*proc, s))
                if own_or_none is None or (epoch is not None and own_or_none.epoch != epoch):
                    # The end of an earlier ownership (a late rejected commit of
                    # it), recorded after the shard was acquired again.
                    continue
                del open_[(*proc, s)]
                if own_or_none.end == math.inf:
                    own_or_none.end = e["t"]
                    own_or_none.unconfirmed = kind == "release" and e.get("ok") is False
        elif kind in ("deliver", "commit"):
            key = (*proc, e["shard"], e["epoch"])
            lower = last_seen.get(key, -math.inf)
            last_seen[key] = e["t"]
            if kind == "commit" and e["outcome"] == "accepted":
                commit = {**e, "lower": lower}
                match = [o for o in out if (o.member, o.pid, o.shard, o.epoch)
                         == (proc[0], proc[1], e["shard"], e["epoch"])]
                if match:
                    match[-1].commits.append(commit)
                else:
                    orphan = Ownership(proc[0], proc[1], e["shard"], e["epoch"],
                                       -math.inf, -math.inf, [commit])
                    out.append(orphan)
    return out


def lost_rows(written: set[int], history: History) -> list[str]:
    missing = written - set(history.delivered_counts())
    return [f"{len(missing)} rows never delivered, e.g. {sorted(missing)[:10]}"] if missing else []


def wrong_shard(history: History, bucket_of: Callable[[int], int], num_shards: int) -> list[str]:
    bad = []
    for d in history.deliveries:
        for i in d["ids"]:
            if bucket_of(i) % num_shards != d["shard"]:
                bad.append(f"id {i} (bucket {bucket_of(i)}) delivered by shard {d['shard']}")
    return bad[:20]


def _advance(w: dict[str, Any]) -> tuple[int, int]:
    """Where a write is in the order positions advance: a re-pin at a start
    the group moved (issue 37, D2: more ``start_moves``) is past any position
    of the earlier start, whatever snapshot it scans."""
    return (int(w.get("start_moves") or 0), int(w["next_snapshot"]))


def positions_regressed(history: History) -> list[str]:
    """Accepted positions (commits and committing releases) never move back.

    Ordered by (epoch, t): the coordinator's fencing orders all accepted writes
    of epoch e before those of e+1, and one owner's writes are sequential, so
    this order is the coordinator's order even when a record came late.
    """
    writes = [e for e in history.events
              if (e["event"] == "commit" and e["outcome"] == "accepted")
              or (e["event"] == "release" and e.get("ok") and e.get("next_snapshot") is not None)]
    by_shard: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for w in writes:
        by_shard[w["shard"]].append(w)
    bad = []
    for shard, ws in sorted(by_shard.items()):
        last: dict[str, Any] | None = None
        for w in sorted(ws, key=lambda w: (w["epoch"], w["t"])):
            if last is not None and _advance(w) < _advance(last):
                bad.append(f"shard {shard}: position moved back {last['next_snapshot']} -> "
                           f"{w['next_snapshot']} ({w['event']} by {w['member']}, epoch "
                           f"{w['epoch']}, after {last['event']} by {last['member']} epoch "
                           f"{last['epoch']})")
            if last is None or _advance(w) >= _advance(last):
                last = w
    return bad


def epochs_not_increasing(history: History) -> list[str]:
    """Per shard, acquisitions in time order have strictly increasing epochs.

    An acquisition is recorded after the owner key was created *and* the
    shard's position read, so a reply held up (a slow coordinator, a pause)
    records it late, after a newer owner's. Its ``sent`` (when the create was
    sent; histories without it: ``t``) is the lower bound used: a lower epoch
    counts only when it was certainly created after the higher one was
    acquired. An epoch acquired by two processes always counts; one process
    acquiring its own key again (after a release that may not have landed)
    does not.
    """
    acquires: dict[int, list[dict[str, Any]]] = defaultdict(list)
    seen: dict[tuple[int, int], dict[str, Any]] = {}
    bad = []
    for e in history.events:
        if e["event"] != "acquire":
            continue
        shard, epoch = e["shard"], e["epoch"]
        twin = seen.get((shard, epoch))
        if twin is not None and _proc(twin) == _proc(e):
            # The same process adopting its own owner key again (a release
            # whose outcome was unknown left the key ours: finding 4).
            pass
        elif twin is not None:
            bad.append(f"shard {shard}: epoch {epoch} acquired twice ({twin['member']} and "
                       f"{e['member']})")
        else:
            sent = e.get("sent", e["t"])
            higher = [a for a in acquires[shard] if a["epoch"] >= epoch and a["t"] < sent]
            if higher:
                a = higher[-1]
                bad.append(f"shard {shard}: epoch {epoch} ({e['member']}) acquired after epoch "
                           f"{a['epoch']} ({a['member']})")
        seen[(shard, epoch)] = e
        acquires[shard].append(e)
    return bad


def stale_commits_accepted(history: History) -> list[str]:
    """No commit of epoch e accepted after epoch e' > e of its shard was acquired.

    Only certain orderings count: the commit was sent (lower bound) after the
    newer acquisition was recorded.
    """
    acquires: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for e in history.events:
        if e["event"] == "acquire":
            acquires[e["shard"]].append(e)
    bad = []
    for own in ownerships(history):
        for c in own.commits:
            newer = [a for a in acquires[own.shard] if a["epoch"] > c["epoch"]
                     and a["t"] < c["lower"]]
            if newer:
                a = newer[0]
                bad.append(f"shard {own.shard}: commit of stale epoch {c['epoch']} by "
                           f"{c['member']} accepted (next {c['next_snapshot']}) after "
                           f"{a['member']} acquired epoch {a['epoch']}")
    return bad


def commits_after_ownership_ended(history: History) -> list[str]:
    """No commit accepted from a member whose ownership had ended.

    Its ownership ended when it recorded a release or a loss of the shard (or
    it never acquired that epoch at all). Counted only when the commit was
    certainly sent after that record. A release the coordinator did not
    confirm does not end it here: the member commits the batch it had
    abandoned (``revoke_timeout_s``) when its handler returns, by design
    (``member/read_loop.py``: the coordinator decides), and the coordinator
    accepts it only while the owner key is still that epoch's, that is while
    no other member can own the shard (``overlapping_committers`` checks
    that apart). Seen when seed 312929 ran after 650 sinks left registered
    in its worker, which changed its schedule.
    """
    bad = []
    for own in ownerships(history):
        for c in own.commits:
            if own.start == -math.inf:
                bad.append(f"shard {own.shard}: commit by {c['member']} accepted with epoch "
                           f"{c['epoch']}, which it never acquired")
            elif c["lower"] > own.end and not own.unconfirmed:
                bad.append(f"shard {own.shard}: commit by {c['member']} (epoch {c['epoch']}, "
                           f"next {c['next_snapshot']}) accepted after its ownership ended at "
                           f"t={own.end:.3f}")
    return bad


def overlapping_committers(history: History) -> list[str]:
    """No two members both committing a shard while their ownerships overlap.

    For two ownership intervals of different members on the same shard that
    overlap in time, it is a violation when both have an accepted commit that
    certainly lies inside the overlap (sent after it began, recorded before it
    ended).
    """
    by_shard: dict[int, list[Ownership]] = defaultdict(list)
    for own in ownerships(history):
        if own.start != -math.inf:
            by_shard[own.shard].append(own)
    bad = []
    for shard, owns in sorted(by_shard.items()):
        for i, a in enumerate(owns):
            for b in owns[i + 1:]:
                if a.member == b.member:
                    continue
                lo, hi = max(a.start, b.start), min(a.end, b.end)
                if lo >= hi:
                    continue

                def inside(own: Ownership, lo: float = lo, hi: float = hi) -> list[dict[str, Any]]:
                    return [c for c in own.commits if c["lower"] > lo and c["t"] < hi]

                ca, cb = inside(a), inside(b)
                if ca and cb:
                    bad.append(f"shard {shard}: {a.member} (epoch {a.epoch}) and {b.member} "
                               f"(epoch {b.epoch}) both committed between t={lo:.3f} and "
                               f"t={hi:.3f}: next {ca[0]['next_snapshot']} and "
                               f"{cb[0]['next_snapshot']}")
    return bad


def moved_start_scans(history: History) -> set[int]:
    """The snapshots a skipped start of the group moved to (issue 37, D2):
    every shard reads the full scan of such a snapshot, those that had read
    the earlier start too, so their rows come again."""
    return {e["moved_to"] for e in history.events
            if e.get("event") == "skip" and e.get("moved_to") is not None} | \
        {e["full_scan"] for e in history.events
         if e.get("event") == "repin" and e.get("full_scan") is not None}


def repin_windows(history: History) -> dict[int, list[tuple[float, int, int]]]:
    """Per shard, ``(t, full_scan, read_to)`` of each re-pin at a moved start
    (issue 37, D2): from ``t`` on, the shard reads the full scan of
    ``full_scan`` again, and the deltas after it up to ``read_to`` (where it
    had read to), which it had delivered before."""
    out: dict[int, list[tuple[float, int, int]]] = defaultdict(list)
    for e in history.events:
        if e.get("event") == "repin" and e.get("full_scan") is not None:
            for shard, read_to in (e.get("read_to") or {}).items():
                out[int(shard)].append((e["t"], e["full_scan"], read_to or e["full_scan"] + 1))
    return out


def _reread_rows(d: dict[str, Any], rereads: set[int],
                 windows: dict[int, list[tuple[float, int, int]]]) -> list[bool]:
    """For each row of delivery ``d``: whether it is read again on purpose
    (a moved start's full scan, or a delta a re-pinned shard had read).
    A driven member's batch lists its ``pieces`` ([snapshot, kind, rows,
    next], in row order); a member's batch is one piece."""
    pieces = d.get("pieces") or [[d["snapshot"], d.get("kind"), len(d["ids"]),
                                  d["next_snapshot"]]]
    out: list[bool] = []
    for snapshot, kind, rows, nxt in pieces:
        reread = kind == "initial" and snapshot in rereads
        for t, full, read_to in windows.get(d["shard"], ()):
            if t <= d["t"] and ((kind == "initial" and snapshot == full)
                                or (kind != "initial" and full < snapshot and nxt <= read_to)):
                reread = True
        out += [reread] * rows
    return out


def _refused_replays(history: History,
                     accepted: dict[tuple[Any, ...], list[float]]) -> set[int]:
    """The deliveries (by ``id``) of batches a sink answered "already
    written" (``already_written``: its handler raised
    :class:`~paimon_group.errors.AlreadyWritten`, or its sealed output was
    judged so) that read from their owner's committed position.

    Such a batch is no committed batch: none of its rows was written, the
    member commits the sink's mark for it, not its next snapshot, and reads
    on from the mark. It replays a batch whose output the target holds but
    whose position commit failed (a fault): once a sink paces the member the
    replay is a catch-up to the latest snapshot, so it has another next
    snapshot than the batch it replays, and an accepted commit of its next
    snapshot (the step after the mark) would count its rows a second time
    (seed 500088). A refused batch read from behind a position its owner
    had committed is a position moved back: it still counts."""
    out: set[int] = set()
    for d in history.deliveries:
        if not d.get("already_written"):
            continue
        own = (d["member"], d.get("pid", 0), d["shard"], d["epoch"])
        behind = [n for (*key, n), ts in accepted.items()
                  if tuple(key) == own and n > d.get("first", d["snapshot"])
                  and any(t < d["t"] for t in ts)]
        if not behind:
            out.add(id(d))
    return out


def unexplained_duplicates(history: History, *, versions: bool = False) -> list[str]:
    """A row delivered twice must come from a batch whose commit was not accepted.

    (Duplicates are allowed only from batches in flight at a fault: killed,
    paused or cut off before their commit was accepted, and from the full
    scan of a start the group moved to, :func:`moved_start_scans`; and from
    a batch a sink refused as already written, :func:`_refused_replays`.)
    With ``versions`` a row is a version ``(id, v)``: a table whose keys are
    updated delivers each key once per version.
    """
    rereads = moved_start_scans(history)
    # When each (process, shard, epoch, next snapshot) had a commit accepted.
    # Only a commit recorded after a delivery confirms it: the commit that
    # pins a start with a pending full scan has the next snapshot of that
    # full scan's batch, but it was made before the batch was read.
    accepted: dict[tuple[Any, ...], list[float]] = defaultdict(list)
    for c in history.commits("accepted"):
        accepted[(c["member"], c.get("pid", 0), c["shard"], c["epoch"],
                  c["next_snapshot"])].append(c["t"])
    # One owner may deliver the same batch twice: its first commit attempt
    # failed with a transient coordinator error (recorded as no outcome at
    # all) and the read loop re-planned from the committed position. The
    # accepted commit confirms only the LAST delivery of that batch.
    last: dict[tuple[Any, ...], dict[str, Any]] = {}
    refused = _refused_replays(history, accepted)
    for d in sorted(history.deliveries, key=lambda d: d["t"]):
        if id(d) in refused:
            continue
        last[(d["member"], d.get("pid", 0), d["shard"], d["epoch"], d["next_snapshot"])] = d
    committed_ids: Counter[Any] = Counter()
    windows = repin_windows(history)
    for key, d in last.items():
        ids, vs = d["ids"], d.get("vs") or []
        keep = [k for k, reread in enumerate(_reread_rows(d, rereads, windows)) if not reread]
        ids = [ids[k] for k in keep]
        vs = [vs[k] for k in keep] if vs else vs
        if any(t > d["t"] for t in accepted.get(key, ())):
            if versions:
                committed_ids.update(set(zip(ids, vs, strict=True)))
            else:
                committed_ids.update(set(ids))
    dup = [i for i, n in committed_ids.items() if n > 1]
    return [f"{len(dup)} rows delivered by two committed batches, e.g. {sorted(dup)[:10]}"] \
        if dup else []


def duplicates(history: History) -> int:
    return sum(n - 1 for n in history.delivered_counts().values() if n > 1)


def check_all(written: set[int], history: History, bucket_of: Callable[[int], int],
              num_shards: int, *, versions: bool = False) -> dict[str, list[str]]:
    return {
        "lost": lost_rows(written, history),
        "wrong_shard": wrong_shard(history, bucket_of, num_shards),
        "positions_regressed": positions_regressed(history),
        "epochs_not_increasing": epochs_not_increasing(history),
        "stale_commit_accepted": stale_commits_accepted(history),
        "commit_after_ownership_ended": commits_after_ownership_ended(history),
        "overlapping_committers": overlapping_committers(history),
        "unexplained_duplicates": unexplained_duplicates(history, versions=versions),
    }


# -- row versions (tables whose rows carry a version ``v``) --------------------


def delivered_versions(history: History) -> Counter[tuple[int, int]]:
    """How many times each row version ``(id, v)`` was delivered."""
    c: Counter[tuple[int, int]] = Counter()
    for d in history.deliveries:
        c.update(zip(d["ids"], d.get("vs") or [None] * len(d["ids"]), strict=True))
    return c


def versions_not_exactly_once(written: Iterable[tuple[int, int]], history: History
                              ) -> list[str]:
    """Every written version delivered once, nothing else delivered (a clean run)."""
    want = Counter(written)
    got = delivered_versions(history)
    missing = sorted(want - got)
    extra = sorted(got - want)
    bad = []
    if missing:
        bad.append(f"{len(missing)} versions not delivered, e.g. {missing[:10]}")
    if extra:
        bad.append(f"{len(extra)} versions delivered too often or never written, "
                   f"e.g. {extra[:10]}")
    return bad


def versions_lost(written: Iterable[tuple[int, int]], history: History) -> list[str]:
    missing = sorted(set(written) - set(delivered_versions(history)))
    return [f"{len(missing)} versions never delivered, e.g. {missing[:10]}"] if missing else []


def key_order(history: History) -> list[str]:
    """Each key's versions come from one shard, in snapshot order: within a
    batch a key's versions come in increasing ``v``, and the snapshot a
    version was (first) delivered in never decreases with ``v``.

    Replays after a fault deliver a version again, in the same snapshot, so
    they do not count against the order.
    """
    shards: dict[int, set[int]] = defaultdict(set)
    first: dict[tuple[int, int], int] = {}
    bad: list[str] = []
    for d in history.deliveries:
        last: dict[int, int] = {}
        snap = int(d["snapshot"])
        for i, v in zip(d["ids"], d.get("vs") or [], strict=True):
            shards[i].add(d["shard"])
            if v < last.get(i, v):
                bad.append(f"key {i}: version {v} after {last[i]} in one batch "
                           f"(shard {d['shard']}, snapshot {snap})")
            last[i] = v
            if (i, v) not in first or snap < first[(i, v)]:
                first[(i, v)] = snap
    bad += [f"key {i} delivered by shards {sorted(s)}" for i, s in shards.items() if len(s) > 1]
    by_key: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for (i, v), snap in first.items():
        by_key[i].append((v, snap))
    for i, vs in by_key.items():
        snaps = [snap for _v, snap in sorted(vs)]
        if snaps != sorted(snaps):
            bad.append(f"key {i}: versions (v, snapshot) {sorted(vs)} out of snapshot order")
    return bad[:20]


def shards_with_rows(history: History) -> set[int]:
    return {d["shard"] for d in history.deliveries if d["ids"]}


def by_member(history: History) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in history.events:
        out[e["member"]].append(e)
    return out


# -- figures for docs/reliability.md -------------------------------------------


def owned_at(history: History, member: str, t: float, pid: int | None = None) -> set[int]:
    """Shards ``member`` (its process ``pid``, if given) held by its own records at ``t``.

    A SIGKILLed process never records the end of its ownerships: pass its
    ``pid`` so that a restart under the same member id is not mixed up with it.
    """
    return {o.shard for o in ownerships(history)
            if o.member == member and (pid is None or o.pid == pid)
            and o.start <= t < o.end and o.start != -math.inf}


def recovery_time(history: History, member: str, t_fault: float,
                  pid: int | None = None) -> float | None:
    """Seconds from a fault on ``member`` at ``t_fault`` until every shard it held
    then was acquired again (by anyone, with a newer epoch); None if it held none
    or they were never taken over."""
    held = owned_at(history, member, t_fault, pid)
    if not held:
        return None
    worst = 0.0
    for shard in held:
        later = [e["t"] for e in history.events if e["event"] == "acquire"
                 and e["shard"] == shard and e["t"] > t_fault]
        if not later:
            return None
        worst = max(worst, min(later) - t_fault)
    return worst


def rejected_commits(history: History) -> int:
    """Commits the coordinator refused (stale epoch) or the member refused itself."""
    return len([c for c in history.commits() if c["outcome"] in ("rejected", "refused")])
