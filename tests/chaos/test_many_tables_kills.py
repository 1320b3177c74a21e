"""SIGKILLs in a group of 20 tables of every kind, tables created and dropped meanwhile.

Four member processes (:mod:`tests.chaos.tables_worker`, the library form)
read ``shop.*`` as one group on real etcd and real ZooKeeper. The warehouse
starts with 20 tables: primary key with fixed buckets, partitioned primary
key, append with buckets, bucket-unaware append, primary key with
``changelog-producer`` input and lookup; each table's rows have ids of their
own range (``(index + 1) * 1,000,000`` on), so a row names its table. A
writer keeps committing to the tables while a random member is SIGKILLed
and restarted under its id every few seconds (a dozen times); meanwhile
three tables matching the pattern are created, two are dropped and one is
dropped and created again under its name, of another kind (a new
incarnation: a new range of the group's shards, rows of a new id range).

Afterwards, from the deliveries (each with its table, the table's shard and
the group shard) and the group's table map read from the coordinator:

* nothing lost: every row of every table live at the end was delivered;
* nothing misrouted: a delivery of table ``t`` holds rows of ``t`` only, of
  its subscription only (``other.x`` is never read);
* every row was delivered under its table's shard by that table's rule
  (from pypaimon's own batch plan of the table, split by the rule the map
  stores: the rule and shard count a group of that table alone would have)
  and under the group shard ``first + shard`` of the table's range;
* a dropped table's deliveries are rows written to it, routed so (its
  routing taken just before the drop), and a re-created table's rows are
  delivered under its new range only, its first incarnation's under the old;
* before the stop, the assignment gives every live table's shard to a
  member and none of a dropped table's, which no owner holds;
* the fencing checks of :mod:`tests.support.checker` hold in the group's
  shard numbers.

A lookup table's rows come from the full scan of its first snapshot: later
commits by pypaimon carry no changelog (a lookup changelog is made by the
engine's compaction), so their steps deliver nothing, and only the first
commit's rows are expected.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from paimon_group.protocol.records import Assignment, GroupMeta
from paimon_group.protocol.sharding import Sharding, ShardRule, plan_new_group
from paimon_group.protocol.table_map import TableRange
from paimon_group.reading.table import ShardedTable
from tests.chaos.scenario import COORDINATOR_BACKENDS
from tests.support.checker import (
    History,
    commits_after_ownership_ended,
    epochs_not_increasing,
    overlapping_committers,
    positions_regressed,
    stale_commits_accepted,
    unexplained_duplicates,
)
from tests.support.group_procs import REPO
from tests.support.tables import (
    catalog,
    make_append_table,
    make_kind_table,
    make_pk_table,
    open_table,
    write_rows,
)

pytestmark = [pytest.mark.chaos, pytest.mark.slow]

MEMBERS = ("m0", "m1", "m2", "m3")
KILLS = 12
SESSION_TIMEOUT_S = 5.0
TABLES_REFRESH_S = 1.0
PATTERN = "shop.*"
ROWS_PER_COMMIT = 5
TABLES_PER_ROUND = 5
ROUNDS = 36

MAKERS: dict[str, Callable[[Path, str], Any]] = {
    "pk": lambda wh, name: make_pk_table(wh, name, buckets=3),
    "pk-partitioned": lambda wh, name: make_kind_table(wh, name, "fixed-partitioned", buckets=2),
    "append": lambda wh, name: make_append_table(wh, name, buckets=3),
    "append-unaware": lambda wh, name: make_kind_table(wh, name, "append"),
    "pk-input": lambda wh, name: make_pk_table(wh, name, buckets=2, changelog_producer="input"),
    "pk-lookup": lambda wh, name: make_pk_table(wh, name, buckets=2,
                                                changelog_producer="lookup"),
}
CYCLE = ("pk", "pk-partitioned", "append", "append-unaware", "pk-input",
         "pk", "pk-partitioned", "append", "append-unaware", "pk-lookup")
INITIAL = {f"shop.t{i:02d}": CYCLE[i % len(CYCLE)] for i in range(20)}
# The kind of each table created while the members run (shop.t05, a
# primary-key table, comes back as a bucket-unaware append table).
CREATED = {"shop.n0": "pk", "shop.n1": "append-unaware", "shop.n2": "pk-partitioned",
           "shop.t05": "append-unaware"}
# Round of the writer -> what it does to the tables before its commits.
EVENTS: dict[int, tuple[str, str]] = {
    6: ("create", "shop.n0"), 12: ("drop", "shop.t00"), 16: ("create", "shop.n1"),
    20: ("recreate", "shop.t05"), 24: ("drop", "shop.t03"), 28: ("create", "shop.n2"),
}
UNSUBSCRIBED = "other.x"


@dataclass
class Route:
    """How a table's rows map to its shards: its rule, shard count, and the
    shard of every row by that rule."""

    rule: str
    shards: int
    of: dict[int, int]


@dataclass
class Writer:
    """The tables and every row written to them. Each incarnation of a
    table (a table re-created under its name is a new one) has an index in
    :attr:`order`; the ids of incarnation ``i`` start at ``(i + 1) * 1,000,000``."""

    wh: Path
    rng: random.Random
    order: list[str] = field(default_factory=list)  # the name of each incarnation
    kinds: list[str] = field(default_factory=list)
    written: dict[int, list[int]] = field(default_factory=lambda: defaultdict(list))
    first_commit: dict[int, list[int]] = field(default_factory=dict)
    live: dict[str, int] = field(default_factory=dict)  # name -> its incarnation
    dropped: dict[int, Route] = field(default_factory=dict)
    error: BaseException | None = None
    _thread: threading.Thread | None = None
    _stop: threading.Event = field(default_factory=threading.Event)

    def create(self, name: str, kind: str) -> None:
        MAKERS[kind](self.wh, name)
        self.live[name] = len(self.order)
        self.order.append(name)
        self.kinds.append(kind)

    def write(self, name: str, count: int = ROWS_PER_COMMIT) -> None:
        i = self.live[name]
        first = (i + 1) * 1_000_000 + len(self.written[i])
        ids = list(range(first, first + count))
        write_rows(self.wh, name, ids)
        self.first_commit.setdefault(i, ids)
        self.written[i].extend(ids)

    def drop(self, name: str) -> None:
        table = ShardedTable.open(str(self.wh), name)
        shards, rule = plan_new_group(table, None)
        self.dropped[self.live.pop(name)] = Route(
            rule.value, shards, shards_by_rule(self.wh, name, rule.value, shards))
        catalog(self.wh).drop_table(name)

    def expected(self, i: int) -> set[int]:
        """The rows of live incarnation ``i`` that must be delivered."""
        if self.kinds[i] == "pk-lookup":
            return set(self.first_commit.get(i, ()))
        return set(self.written[i])

    def event(self, r: int) -> None:
        """What round ``r`` does to the tables (:data:`EVENTS`)."""
        what, name = EVENTS.get(r, ("", ""))
        if what in ("drop", "recreate"):
            self.drop(name)
        if what in ("create", "recreate"):
            self.create(name, CREATED[name])
            self.write(name, 12)
        if what == "recreate":
            # Past the old incarnation's snapshots at once: an owner of its
            # range that has not seen the change plans them in the new one.
            for _ in range(15):
                self.write(name, 2)

    def start(self, rounds: int, interval_s: float) -> None:
        """Commit to random live tables, round after round, the tables
        created and dropped at their rounds, until :meth:`join` and at least
        ``rounds`` rounds."""
        def run() -> None:
            try:
                r = 0
                while r < rounds or not self._stop.is_set():
                    self.event(r)
                    for name in self.rng.sample(sorted(self.live),
                                                min(TABLES_PER_ROUND, len(self.live))):
                        self.write(name)
                    r += 1
                    time.sleep(interval_s)
            except BaseException as err:
                self.error = err

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def join(self, timeout: float) -> None:
        assert self._thread is not None
        self._stop.set()
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the writer did not finish"
        if self.error is not None:
            raise self.error


def shards_by_rule(wh: Path, name: str, rule: str, shards: int) -> dict[int, int]:
    """Row id -> shard under ``rule`` over ``shards``, from pypaimon's own
    batch plan of the table's latest snapshot (each split, or each part of a
    split the rule cuts, read alone): independent of the member's planner."""
    sharding = Sharding(ShardRule.parse(rule), shards)
    table = open_table(wh, name)
    builder = table.new_read_builder()
    out: dict[int, int] = {}
    for split in builder.new_scan().plan().splits():
        for shard, part in sharding.split_shards(split).items():
            for key in builder.new_read().to_arrow([part]).column("id").to_pylist():
                assert out.setdefault(int(key), shard) == shard, (name, key)
    return out


class Members:
    """The member processes, each restarted under its id after a kill."""

    def __init__(self, base: Path, wh: Path, coordinator: str, group: str) -> None:
        self.out = base / "out"
        self.out.mkdir()
        self.wh, self.coordinator, self.group = wh, coordinator, group
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.died: list[str] = []
        self.kills: list[str] = []

    def start(self, member: str) -> None:
        command = [
            sys.executable, "-m", "tests.chaos.tables_worker", "--warehouse", str(self.wh),
            "--coordinator", self.coordinator, "--group", self.group, "--member", member,
            "--out", str(self.out), "--table", PATTERN,
            "--session-timeout-s", str(SESSION_TIMEOUT_S),
            "--tables-refresh-s", str(TABLES_REFRESH_S),
        ]
        log = open(self.out / f"{member}.log", "ab")
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        self.procs[member] = subprocess.Popen(command, cwd=REPO, stdout=log,
                                              stderr=subprocess.STDOUT, env=env)
        log.close()

    def holding(self, timeout: float = 60) -> list[str]:
        """The members whose running process acquired shards (waiting
        until there is one): a kill of one of them moves shards."""
        deadline = time.monotonic() + timeout
        while True:
            acquired = {e.get("pid") for e in self.history().events if e["event"] == "acquire"}
            found = sorted(m for m, p in self.procs.items()
                           if p.pid in acquired and p.poll() is None)
            if found:
                return found
            if time.monotonic() > deadline:
                raise AssertionError(f"no member process holds shards\n{self.explain()}")
            time.sleep(0.2)

    def kill(self, member: str) -> None:
        """SIGKILL ``member`` and start it again under its id."""
        self.check_alive()
        proc = self.procs[member]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        self.kills.append(f"{member} (pid {proc.pid})")
        self.start(member)

    def check_alive(self) -> None:
        """A member that exited without being killed is noted (and restarted)."""
        for member, proc in self.procs.items():
            if proc.poll() is not None:
                self.died.append(f"{member} (pid {proc.pid}) exited {proc.returncode}")
                self.start(member)

    def stop(self) -> dict[str, int]:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        return {m: p.wait(timeout=90) for m, p in self.procs.items()}

    def cleanup(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)

    def history(self) -> History:
        return History.load(self.out)

    def explain(self) -> str:
        return "\n".join(f"--- {m}\n{(self.out / f'{m}.log').read_text()[-3000:]}"
                         for m in self.procs)


def delivered(history: History) -> dict[int, set[int]]:
    """The rows delivered, by the incarnation their ids say."""
    out: dict[int, set[int]] = defaultdict(set)
    for d in history.deliveries:
        for i in d["ids"]:
            out[i // 1_000_000 - 1].add(i)
    return out


def wait_delivered(members: Members, writer: Writer, timeout: float) -> None:
    """Until every live table's expected rows were delivered and every
    running member process acquired shards (so it handles SIGTERM)."""
    deadline = time.monotonic() + timeout
    while True:
        history = members.history()
        got = delivered(history)
        missing = {t: len(writer.expected(i) - got.get(i, set()))
                   for t, i in writer.live.items()}
        missing = {t: n for t, n in missing.items() if n}
        acquired = {e.get("pid") for e in history.events if e["event"] == "acquire"}
        running = {p.pid for p in members.procs.values() if p.poll() is None}
        if not missing and running <= acquired:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"rows missing {missing}, processes without shards "
                                 f"{running - acquired}\n{members.explain()}")
        time.sleep(0.5)


def read_group(coordinator: str, group: str) -> tuple[GroupMeta, Assignment | None, set[int]]:
    """The group's record, its assignment and the shards with an owner key."""
    from coordinators.registry import open_coordinator
    from paimon_group.protocol.group import GroupClient

    async def go() -> tuple[GroupMeta | None, Assignment | None, set[int]]:
        async with open_coordinator(coordinator) as coord:
            client = GroupClient(coord, group)
            assignment, _ = await client.read_assignment()
            return await client.read_meta(), assignment, set(await client.owners())

    meta, assignment, owned = asyncio.run(go())
    assert meta is not None and meta.tables is not None
    return meta, assignment, owned


def wait_settled(members: Members, timeout: float) -> GroupMeta:
    """Until the assignment gives every shard of the live tables to a member
    and none of a dropped table's, and no dropped table's shard has an owner."""
    deadline = time.monotonic() + timeout
    while True:
        meta, assignment, owned = read_group(members.coordinator, members.group)
        assert meta.tables is not None
        live = {k for t in meta.tables.live() for k in range(t.first, t.end)}
        gone = {k for t in meta.tables.ranges if not t.live for k in range(t.first, t.end)}
        assigned = {k: m for m, shards in (assignment.shards if assignment else {}).items()
                    for k in shards}
        if set(assigned) == live and set(assigned.values()) <= set(MEMBERS) \
                and not owned & gone:
            return meta
        if time.monotonic() > deadline:
            raise AssertionError(f"assigned {assigned}, owned {sorted(owned)}, live "
                                 f"{sorted(live)}, dropped {sorted(gone)}\n{members.explain()}")
        time.sleep(0.5)


@pytest.mark.parametrize("backend", COORDINATOR_BACKENDS)
def test_kills_over_twenty_tables_created_and_dropped(
        tmp_path: Path, request: pytest.FixtureRequest, backend: str) -> None:
    coordinator = str(request.getfixturevalue(f"{backend}_url"))
    wh = tmp_path / "wh"
    seed = os.environ.get("PG_CHAOS_SEED", "0")
    writer = Writer(wh, random.Random(f"{seed}-writes-{backend}"))
    for name, kind in INITIAL.items():
        writer.create(name, kind)
        writer.write(name, 10)
    make_pk_table(wh, UNSUBSCRIBED, buckets=2)
    write_rows(wh, UNSUBSCRIBED, range(10))
    members = Members(tmp_path, wh, coordinator, f"g{uuid.uuid4().hex[:8]}")
    started = time.monotonic()
    try:
        for m in MEMBERS:
            members.start(m)
        wait_delivered(members, writer, timeout=120)
        writer.start(ROUNDS, interval_s=0.3)
        rng = random.Random(f"{seed}-kills-{backend}")
        for _ in range(KILLS):
            time.sleep(rng.uniform(1.5, 3.0))
            members.kill(rng.choice(members.holding()))
        writer.join(timeout=180)
        members.check_alive()
        wait_delivered(members, writer, timeout=120)
        meta = wait_settled(members, timeout=60)
        codes = members.stop()
    finally:
        members.cleanup()
    print(f"{backend} (seed {seed}): {time.monotonic() - started:.1f} s, killed {members.kills}")
    assert not members.died, (members.died, members.explain())
    assert set(codes.values()) == {0}, (codes, members.explain())
    check(writer, members.history(), meta)


def routes(writer: Writer, meta: GroupMeta) -> dict[int, tuple[TableRange, Route]]:
    """Each incarnation's range of the map (a name's ranges in the order of
    its incarnations) and its rows' shards by the rule the range stores:
    the rule and shard count a group of that table alone would have."""
    assert meta.tables is not None
    ranges: dict[str, list[TableRange]] = defaultdict(list)
    for rng in meta.tables.ranges:
        ranges[rng.name].append(rng)
    out: dict[int, tuple[TableRange, Route]] = {}
    for i, name in enumerate(writer.order):
        rng = ranges[name].pop(0)
        assert rng.live == (writer.live.get(name) == i), (name, i, rng)
        if rng.live:
            shards, rule = plan_new_group(ShardedTable.open(str(writer.wh), name), None)
            route = Route(rule.value, shards,
                          shards_by_rule(writer.wh, name, rule.value, shards))
        else:
            route = writer.dropped[i]
        assert (route.rule, route.shards) == (rng.sharding, rng.shards), (name, i, rng)
        out[i] = (rng, route)
    assert not any(ranges.values()), f"ranges of no table written: {ranges}"
    return out


def misrouted(writer: Writer, history: History, meta: GroupMeta) -> list[str]:
    """Rows delivered as another table's, in another shard than their
    table's rule says, or under a group shard not the table's."""
    assert meta.tables is not None
    by_range = {rng.first: (i, route) for i, (rng, route) in routes(writer, meta).items()}
    bad: list[str] = []
    for d in history.deliveries:
        rng, shard = meta.tables.locate(d["shard"])
        i, route = by_range[rng.first]
        if (rng.name, shard) != (d["table"], d["table_shard"]):
            bad.append(f"group shard {d['shard']} ({rng.name} shard {shard}) delivered as "
                       f"{d['table']} shard {d['table_shard']}")
        for row in d["ids"]:
            if row // 1_000_000 - 1 != i:
                bad.append(f"row {row} of {writer.order[row // 1_000_000 - 1]} delivered "
                           f"as {rng.name} (group shard {d['shard']})")
            elif row not in route.of:
                bad.append(f"row {row} of {rng.name} delivered, never written")
            elif route.of[row] != shard:
                bad.append(f"row {row} of {rng.name} delivered by shard {shard}, its "
                           f"shard is {route.of[row]} ({route.rule})")
    return bad


def check(writer: Writer, history: History, meta: GroupMeta) -> None:
    assert meta.tables is not None
    assert {t.name for t in meta.tables.live()} == set(writer.live)
    got = delivered(history)
    lost = {t: sorted(writer.expected(i) - got.get(i, set()))[:5]
            for t, i in writer.live.items()}
    violations = {
        "misrouted": misrouted(writer, history, meta)[:20],
        "lost": [f"{t}: {ids}" for t, ids in lost.items() if ids],
        "positions_regressed": positions_regressed(history),
        "epochs_not_increasing": epochs_not_increasing(history),
        "stale_commit_accepted": stale_commits_accepted(history),
        "commit_after_ownership_ended": commits_after_ownership_ended(history),
        "overlapping_committers": overlapping_committers(history),
        "unexplained_duplicates": unexplained_duplicates(history),
    }
    assert violations == {k: [] for k in violations}, violations
    assert all(got.get(i) for i in writer.dropped), "a dropped table was never read"
