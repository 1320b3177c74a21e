"""The Paimon sink under SIGKILLs: real ``paimon-group run`` members write
each source batch into a Paimon target through ``PaimonSink``
(:mod:`tests.chaos.sink_handlers`), a writer commits to the source, and
members are killed (and restarted at once under the same id) at every point
that matters:

``files``
    a handler dies after its batch's data files are written into the
    target, before the target commit;
``commit``
    the sink's committer dies right after the target commit (every batch
    it held is in), before any handler returned;
``written``
    a member dies once its batch is in the target (the commit of what it
    sealed for the batch succeeded), its position not in the coordinator
    (the replay must be found in the target's marks: ``AlreadyWritten``);
``handoff``
    a fourth member joins (and dies right after its first write into the
    target) while an owner is SIGKILLed, or leaves (SIGTERM) while an owner
    is SIGKILLed;
``catch-up``
    a member's handler stalls until the source is more than the catch-up
    threshold ahead, then the member dies right after writing its catch-up
    batch (one step over many snapshots) into the target; the replay, by
    whoever gets the shard, is a longer catch-up (the source moved on).

At least 20 SIGKILLs per case, on the embedded SQLite coordinator and on
etcd, into a primary-key target (``'sequence.field'``) and an append target
(bucket -1, where a batch written twice would show).

The model of "every source batch's output once". The source is a
primary-key table; its commit ``c`` writes new keys and new versions of a
few earlier keys, every row with ``v = c``, so ``(id, v)`` names one row
version, written by one commit. The members start on the first commit
(their full scan of its snapshot) and then read every later commit's changes:
a delta step per snapshot, or a catch-up step reading the union of the gap's
deltas, unmerged (``paimon_group/reading/planner.py``; the chaos suite
checks the same of deliveries, ``versions_lost``). So every written version
is in exactly one source batch's output (the handler writes a batch's rows'
``(id, v)``), and once every member settled (every shard's position past
the source's last snapshot):

* **append target**: its rows, as a multiset of ``(id, v)``, are exactly
  the written versions, each once: a duplicate is a batch written twice, a
  missing version a batch lost, and nothing else may be there;
* **primary-key target**: one row per written key, holding the key's last
  written version (a later source version wins whichever member wrote it).

Also: every replay of a batch in the target was found there (the members
recorded ``already_written``), and no member exited but by our kills or
our stop.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from paimon_group.sink.target import TargetTable
from tests.chaos.scenario import explain, stop_all
from tests.support.group_procs import GroupHarness, live_members
from tests.support.tables import _create, open_table

pytestmark = [pytest.mark.chaos, pytest.mark.slow]

HANDLER = "tests.chaos.sink_handlers:write"
MEMBERS = ("m0", "m1", "m2")
JOINER = "m3"
TARGET = "db.out"
KILLS = 20
POINTS = ("files", "commit", "written", "handoff", "catch-up")
# Source commits while a member stalls: more than the planner's catch-up threshold (10).
CATCH_UP_GAP = 12
WRITER_INTERVAL_S = 0.2
CLAIM_TIMEOUT_S = 30.0


@pytest.mark.parametrize("target", ["primary-key", "append"])
def test_every_source_batch_is_in_the_target_once_across_sigkills(
        tmp_path: Path, coordinator: str, target: str) -> None:
    h = GroupHarness(tmp_path, coordinator, buckets=4, session_timeout_s=2.0)
    _make_target(h.warehouse, target)
    h.env.update(PG_SINK_WAREHOUSE=h.warehouse, PG_SINK_TABLE=TARGET,
                 PG_SINK_INTERVAL_S="0.2")
    writer = _Writer(h)
    chaos = _Chaos(h, writer, random.Random(os.environ.get("PG_CHAOS_SEED", "0")))
    try:
        h.write(range(0, 100))
        for m in MEMBERS:
            chaos.start(m)
        h.wait_caught_up(set(MEMBERS))
        writer.start()
        started = time.monotonic()
        while chaos.kills < KILLS:
            chaos.cycle(POINTS[chaos.cycles % len(POINTS)])
            time.sleep(chaos.rng.uniform(0.3, 1.0))
        chaos.reap_pending(timeout=CLAIM_TIMEOUT_S)
        writer.stop()
        _settle_and_stop(h, chaos)
        _check_target(h, target, chaos)
        print(json.dumps({"target": target, "kills": chaos.kills, "by_point": chaos.by_point,
                          "already_written": _already_written(h),
                          "source_snapshots": writer.commits, "versions": len(h.versions),
                          "chaos_s": round(time.monotonic() - started, 1)}))
    finally:
        writer.stop()
        h.cleanup()


def _make_target(warehouse: str, target: str) -> None:
    fields = [pa.field("id", pa.int64(), nullable=False), pa.field("v", pa.int64())]
    if target == "primary-key":
        _create(warehouse, TARGET, pa.schema([*fields, pa.field("seq", pa.int64())]),
                primary_keys=["id"], options={"bucket": "2", "sequence.field": "seq"})
    else:
        _create(warehouse, TARGET, pa.schema(fields), primary_keys=[],
                options={"bucket": "-1"})


class _Writer:
    """Commits to the source until stopped: 10 new keys a commit and new
    versions of 3 earlier keys (``GroupHarness.write``: ``v`` = the commit)."""

    def __init__(self, h: GroupHarness) -> None:
        self.h = h
        self.commits = 0
        self._stop = threading.Event()
        self._burst = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._error: BaseException | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=60)
        if self._error is not None:
            raise self._error

    def burst(self, commits: int) -> None:
        """Commit ``commits`` snapshots as fast as possible; return after them."""
        target = self.commits + commits
        self._burst.set()
        try:
            while self.commits < target and self._thread.is_alive():
                time.sleep(0.02)
        finally:
            self._burst.clear()

    def _run(self) -> None:
        try:
            nxt = 100
            while not self._stop.is_set():
                old = sorted(self.h.written)
                picked = {old[(self.commits * 7919 + k * 104729) % len(old)] for k in range(3)}
                self.h.write(list(range(nxt, nxt + 10)) + sorted(picked))
                nxt += 10
                self.commits += 1
                if not self._burst.is_set():
                    self._stop.wait(WRITER_INTERVAL_S)
        except BaseException as err:
            self._error = err


class _Chaos:
    """The kill cycles; see the module docstring for the points. A kill
    armed in a member that is still joining is left pending (other cycles
    go on) and reaped once it happened; so is a member leaving."""

    def __init__(self, h: GroupHarness, writer: _Writer, rng: random.Random) -> None:
        self.h = h
        self.writer = writer
        self.rng = rng
        self.kills = 0
        self.cycles = 0
        self.by_point: Counter[str] = Counter()
        self._arms = 0
        self._pending: dict[int, str] = {}  # arm -> point, armed in a joining member
        self._leaving = False

    # -- members -----------------------------------------------------------

    def start(self, member: str) -> subprocess.Popen[bytes]:
        return self.h.start(member, handler=HANDLER)

    def running(self) -> set[str]:
        return {m for m, p in self.h.procs.items() if p.poll() is None}

    def owner(self, among: set[str]) -> str:
        """A running member of ``among`` that owns shards now (any running one if none)."""
        owners = {s["owner"] for s in self.h.describe()["shards"]} & among & self.running()
        return self.rng.choice(sorted(owners or (among & self.running())))

    def registered(self, member: str) -> None:
        """Until ``member``'s running process is in the group."""
        pid = self.h.procs[member].pid
        self.h.wait_for(lambda d: (member, pid) in {(m["member_id"], m["pid"])
                                                    for m in d["members"]},
                        what=f"{member} (pid {pid}) to join")

    def sigkill(self, member: str, point: str) -> None:
        self.h.kill(member)
        self.kills += 1
        self.by_point[point] += 1

    def reaped(self, claim: dict[str, Any], point: str) -> None:
        """The member of ``claim`` killed itself at an armed point: reap it,
        count it, start it again."""
        member = claim["member"]
        code = self.h.procs[member].wait(timeout=30)
        assert code == -9 and self.h.procs[member].pid == claim["pid"], (
            member, code, claim, explain(self.h))
        self.h.exit_codes.setdefault(member, []).append(code)
        self.kills += 1
        self.by_point[point] += 1
        self.start(member)

    # -- arming the handlers ---------------------------------------------------

    def arm(self, point: str, member: str | None = None, *, catch_up: bool = False,
            stall: bool = False) -> int:
        self._arms += 1
        partial = self.h.out / f".arm-{self._arms}.partial"
        partial.write_text(json.dumps({"id": self._arms, "point": point, "member": member,
                                       "catch_up": catch_up, "stall": stall}))
        os.replace(partial, self.h.out / f"arm-{self._arms}.json")
        return self._arms

    def claimed(self, arm: int, timeout: float = CLAIM_TIMEOUT_S) -> dict[str, Any] | None:
        """The claim of ``arm`` by the process that died at it; None (and the
        arm withdrawn) if none reached the point in time."""
        path = self.h.out / f"claimed-{arm}.json"
        deadline = time.monotonic() + timeout
        while not path.exists():
            if time.monotonic() > deadline:
                try:
                    os.unlink(self.h.out / f"arm-{arm}.json")
                    return None
                except FileNotFoundError:
                    deadline += 10  # taken just now: its claim is on its way
            time.sleep(0.02)
        claim: dict[str, Any] = json.loads(path.read_text())
        return claim

    def reap_pending(self, timeout: float = 0.0) -> None:
        """Reap the pending kills that happened (waiting up to ``timeout`` for
        them) and a member that left."""
        for arm, point in list(self._pending.items()):
            claim = self.claimed(arm, timeout) if timeout else None
            path = self.h.out / f"claimed-{arm}.json"
            if claim is None and path.exists():
                claim = json.loads(path.read_text())
            if claim is not None:
                self.reaped(claim, point)
            if claim is not None or timeout:
                del self._pending[arm]
        if self._leaving and (timeout or self.h.procs[JOINER].poll() is not None):
            code = self.h.terminate(JOINER, signalled=True)
            assert code == 0, (code, explain(self.h))
            self._leaving = False

    # -- the cycles ------------------------------------------------------------

    def cycle(self, point: str) -> None:
        self.cycles += 1
        began = time.monotonic()
        self.reap_pending()
        try:
            if point == "handoff":
                self._handoff()
            elif point == "catch-up":
                self._catch_up()
            else:
                claim = self.claimed(self.arm(point))
                if claim is not None:
                    self.reaped(claim, point)
        finally:
            print(f"cycle {self.cycles} {point}: {time.monotonic() - began:.1f} s, "
                  f"kills {self.kills}", file=sys.stderr)

    def _handoff(self) -> None:
        """The joiner starts (armed to die after its first write) while an
        owner is SIGKILLed; or it leaves (SIGTERM) while an owner is."""
        if JOINER not in self.running():
            self._pending[self.arm("written", JOINER)] = "handoff"
            self.start(JOINER)
        else:
            self.registered(JOINER)  # (a process still starting has no SIGTERM handler)
            self.h.signal(JOINER, signal.SIGTERM)
            self._leaving = True
        victim = self.owner(set(MEMBERS))
        self.sigkill(victim, "handoff")
        self.start(victim)

    def _catch_up(self) -> None:
        """An owner's handler stalls while the source moves past the catch-up
        threshold; the owner dies right after its catch-up batch is in the target."""
        running = self.running() - {JOINER}
        self.h.wait_for(lambda d: d["state"] == "stable" and running <= live_members(d),
                        what="a stable group before a catch-up")
        victim = self.owner(set(MEMBERS))
        arm = self.arm("written", victim, catch_up=True, stall=True)
        stalled = self.h.out / f"stalled-{arm}"
        deadline = time.monotonic() + CLAIM_TIMEOUT_S
        while not stalled.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        if stalled.exists():
            self.writer.burst(CATCH_UP_GAP)
        (self.h.out / f"go-{arm}").touch()
        claim = self.claimed(arm)
        if claim is not None:
            # A catch-up: one step over several snapshots (a member whose output
            # goes to a sink reads every unread snapshot in a step, from two on).
            assert claim["kind"] == "catch-up" and claim["next"] - claim["first"] > 1, claim
            self.reaped(claim, "catch-up")


def _settle_and_stop(h: GroupHarness, chaos: _Chaos) -> None:
    """Until every running member is registered and every shard's position
    is past the source's last snapshot; then stop them (exit code 0 each)."""
    running = chaos.running()
    h.wait_caught_up(running, timeout=180)
    pids = {m: h.procs[m].pid for m in running}
    h.wait_for(lambda d: pids.items() <= {(m["member_id"], m["pid"]) for m in d["members"]},
               120, "every running member process to be registered")
    codes = stop_all(h)
    assert {codes[m] for m in running} <= {0}, (codes, explain(h))
    exits = {c for cs in h.exit_codes.values() for c in cs}
    assert exits <= {0, -9}, (h.exit_codes, explain(h))


def _read_target(h: GroupHarness) -> pa.Table:
    table = open_table(h.warehouse, TARGET)
    builder = table.new_read_builder()
    return builder.new_read().to_arrow(builder.new_scan().plan().splits())


def _check_target(h: GroupHarness, target: str, chaos: _Chaos) -> None:
    rows = _read_target(h)
    got = list(zip(rows.column("id").to_pylist(), rows.column("v").to_pylist(), strict=True))
    written = set(h.versions)
    assert len(written) == len(h.versions)  # (id, v) names one version
    if target == "append":
        dups = sorted(r for r, n in Counter(got).items() if n > 1)
        missing = sorted(written - set(got))
        foreign = sorted(set(got) - written)
        assert (dups, missing, foreign) == ([], [], []), (
            f"{len(dups)} rows twice, e.g. {dups[:10]}; {len(missing)} versions missing, "
            f"e.g. {missing[:10]}; {len(foreign)} rows never written, e.g. {foreign[:10]}")
    else:
        last: dict[int, int] = {}
        for i, v in h.versions:
            last[i] = max(v, last.get(i, v))
        state = dict(got)
        assert len(state) == len(got)
        wrong = sorted((i, state.get(i), v) for i, v in last.items() if state.get(i) != v)
        extra = sorted(set(state) - set(last))
        assert (wrong, extra) == ([], []), (
            f"{len(wrong)} keys not at their last version (key, target, last), e.g. "
            f"{wrong[:10]}; keys never written: {extra[:10]}")
    # The marks never run ahead of the coordinator's positions.
    positions = {s["shard"]: s["next_snapshot"] for s in h.describe()["shards"]}
    marks = TargetTable.open(h.warehouse, TARGET).marks(h.group)
    assert marks and all(m.next_snapshot <= positions[s] for s, m in marks.items()), (
        marks, positions)
    assert chaos.by_point["written"] + chaos.by_point["commit"] > 0
    assert _already_written(h) > 0, "no replay was found in the target"


def _already_written(h: GroupHarness) -> int:
    return sum(1 for e in h.history().events if e["event"] == "already_written")
