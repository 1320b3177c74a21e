"""One simulated run of a consumer group, from a seed.

:func:`run_seed` builds everything from ``seed`` alone: the table's kind
(:data:`tests.sim.table.KINDS`), a coordinator switch or wipe (every member
leaves or crashes, the group goes on against an empty coordinator and
resumes from the Paimon consumer files), members driven as the Spark source
drives one (:mod:`tests.sim.driver`), the group's shape
(shards, session timeout, start position, members), a schedule of member
joins, graceful leaves, crashes (a process that dies: no goodbye, its
session expires) and restarts (same id or a new one), session pauses, the
writer's commits (a schema change among them) and, for some seeds, a drop or
a drop-and-re-create of the table; and the fault plan of every member's
coordinator (:class:`tests.sim.coordinator.FaultPlan`); the snapshot expiry
and ``--on-data-loss`` of :mod:`tests.sim.expiry`, the torn consumer-file
rewrites of :mod:`tests.sim.tear`, and in one seed in three a handler writing
each batch into a Paimon target through the exactly-once sink
(:mod:`tests.sim.sink`: its members killed before and after the target's
commit). The members are real
:class:`paimon_group.GroupMember` objects driven through the library API
(``run(handler)`` with an async handler, or ``async for batch in
member.batches()``) on real Paimon files (:mod:`tests.sim.table`), against
the simulated coordinator (registered as the ``sim://`` scheme for the run),
on virtual time (:mod:`tests.sim.loop`).

A run has three phases: **chaos** (the schedule and the faults), **settle**
(faults off, the writer done, at least one member running: the group must
deliver and commit everything within :data:`SETTLE_BOUND_S`), **stop** (every
member leaves gracefully, within its shutdown timeout). Then the checks:
the history checker of the chaos suite (``tests/support/checker.py``) over
the members' ``--history`` files and the handler's deliveries, the store's
own log of applied positions (the ground truth: no write through a stale
fence, no two members writing one epoch, never backwards), the schema change
(rows written after it carry the new column), liveness (nothing failed,
nothing hung), for dropped tables: every member stops with one error, and
what expiry may cost (:class:`tests.sim.expiry.LossOracle`: a row is missing
only with a snapshot that expired before its shard read it), and the sink's
target (each source batch's output once: :meth:`tests.sim.sink.SinkWorld.check`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import shutil
import tempfile
import time
import traceback
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from coordinators import registry
from coordinators.protocol import ConnectOptions, Coordinator
from paimon_group import GroupMember, MemberConfig
from paimon_group.errors import (
    BatchExpired,
    HandlerFailed,
    SnapshotExpired,
    TableNotFound,
    TableReplaced,
)
from paimon_group.protocol.records import position_order
from tests.sim.afterlife import Afterlife, AfterPlan
from tests.sim.coordinator import (
    FaultPlan,
    FaultyCoordinator,
    MemberCalls,
    SimCoordinator,
    SimStore,
)
from tests.sim.driver import drive
from tests.sim.expiry import (
    ExpiryPlan,
    LossOracle,
    data_loss_stop,
    named_snapshot,
)
from tests.sim.loop import START, SimClock, SimDeadlock, SimLoop, SimSpin
from tests.sim.sink import SINK_PLANTS, SinkPlan, SinkWorld, writes_all
from tests.sim.table import (
    ALTER_BEFORE,
    KIND_WEIGHTS,
    KINDS,
    PK_KINDS,
    ROW_KIND_KINDS,
    ReplayWarehouse,
    scratch_dir,
    successor,
    templates,
)
from tests.sim.tear import Tears, torn_consumer_writes
from tests.support import checker

CHAOS_S = 24.0  # virtual seconds of schedule and faults
SETTLE_BOUND_S = 60.0  # after the chaos, everything is delivered and committed within this
STOP_BOUND_S = 30.0
DROP_NOTICE_BOUND_S = 20.0  # a member notices a dropped / re-created table within this
RUN_LIMIT_S = 600.0  # virtual; a run longer than this is a hang of the driver itself
GROUP = "g"

# Planted faults, for the tests that show the checks can fail.
PLANTS = ("stale_fence", "drop_delivery", "sink_writes_all", "no_repin", *SINK_PLANTS)
# The plants of the sink run the sink seeds as they are; the others run their
# seeds without the sink, as they were.
SINK_SEED_PLANTS = (None, "sink_writes_all", *SINK_PLANTS)


@dataclass
class SeedResult:
    seed: int
    violations: dict[str, list[str]]
    faults: Counter[str]
    stats: dict[str, Any]
    virtual_s: float = 0.0
    wall_s: float = 0.0
    trace: str = ""  # a digest of the history, to show that a rerun is identical

    @property
    def ok(self) -> bool:
        return not any(self.violations.values())

    def summary(self) -> str:
        bad = {k: v for k, v in self.violations.items() if v}
        return json.dumps({"seed": self.seed, "violations": bad, "stats": self.stats},
                          default=str)


# ----------------------------------------------------------------- the world


@dataclass
class World:
    seed: int
    store: SimStore
    plan: FaultPlan
    calls: dict[str, MemberCalls] = field(default_factory=dict)
    coords: dict[str, list[FaultyCoordinator]] = field(default_factory=dict)


_WORLD: World | None = None


def _open_sim(url: str, options: ConnectOptions | None = None) -> Coordinator:
    """``sim://RUN/MEMBER/INCARNATION``: a faulty connection to the run's store."""
    world = _WORLD
    assert world is not None, "no simulated run is active"
    _, _, path = url.partition("://")
    _run, member, incarnation = path.split("/")
    calls = world.calls.setdefault(member, MemberCalls(member))
    inner = SimCoordinator(world.store, url, options or ConnectOptions())
    coord = FaultyCoordinator(inner, world.plan, calls)
    world.coords.setdefault(f"{member}/{incarnation}", []).append(coord)
    return coord


@contextlib.contextmanager
def _sim_scheme(world: World) -> Any:
    global _WORLD
    _WORLD = world
    # The registry maps a scheme to a factory taking (url, options); tests
    # only, so its table of factories is extended in place for the run.
    registry.BACKENDS["sim"] = f"{__name__}:_open_sim"
    factories = getattr(registry, "_CLASSES", None)
    if factories is not None:
        factories["sim"] = lambda: _open_sim
    try:
        yield
    finally:
        registry.BACKENDS.pop("sim", None)
        if factories is not None:
            factories.pop("sim", None)
        _WORLD = None


# ------------------------------------------------------------- the members


@dataclass
class Incarnation:
    """One "process" of a member id."""

    member_id: str
    number: int  # unique in the run: the checker's pid
    member: GroupMember
    task: asyncio.Task[None] | None = None
    history_path: str = ""
    crashed: bool = False
    stopped: bool = False
    start_error: BaseException | None = None
    started_at: float = 0.0
    driven: bool = False  # by tests.sim.driver, as the Spark source drives a member
    data_loss: BaseException | None = None  # the driven query's data-loss stop


class Run:
    # Members driven as the Spark source drives one, in some seeds (a group
    # of several tables: none, tests/sim/many.py).
    drivers = True

    def __init__(self, seed: int, root: Path, plant: str | None, clock: SimClock) -> None:
        self.seed = seed
        # The run's virtual clock, handed to each member and read by the
        # scenario's own records (nothing process-wide is replaced).
        self.clock = clock
        self.rng = random.Random(f"scenario:{seed}")
        self.root = root
        self.plant = plant
        self.kind = table_kind_of(seed)
        main, recreated = templates(self.kind)
        # The operator's steps after a re-created table, in their own draw
        # (tests/sim/afterlife.py): the table is re-created, a longer one.
        after = AfterPlan.draw(seed, SinkPlan.draw(seed).on and plant in SINK_SEED_PLANTS)
        if after.on:
            recreated = successor(self.kind)
        self.wh = ReplayWarehouse(root / "wh", main, recreated)
        rng = self.rng
        self.timeout_s = rng.choice([1.0, 2.0, 3.0])
        self.shards = rng.choice([2, 4, 4])
        self.start = rng.choice(["latest-full", "latest-full", "earliest", "latest"])
        self.fault_rate = rng.choice([0.0, 0.02, 0.05, 0.05, 0.1, 0.15])
        self.rebalance_delay = 0.0
        if profile() == "heavy":
            # Another profile, from its own draws (the default seeds' runs
            # stay as they are): 10-30 % of the calls faulty, and static
            # membership (shards kept for a vanished member) in half the seeds.
            heavy = random.Random(f"heavy:{seed}")
            self.fault_rate = heavy.choice([0.1, 0.2, 0.3])
            self.rebalance_delay = heavy.choice([0.0, self.timeout_s * 2])
        self.table_fate = rng.choices(["keep", "drop", "recreate"], [8, 1, 1])[0]
        if after.on:
            self.table_fate = "recreate"
        self.store = SimStore()
        # A coordinator switch or wipe, in its own draw (the others stay):
        # every member leaves (``switch``: gracefully, as in a planned move;
        # ``wipe``: all crash, the coordinator comes back empty) and the group
        # goes on against a fresh store, so shards resume from the consumer
        # files. ``eras`` holds each store left behind, with the shards
        # whose consumer file existed then, and the first incarnation after it.
        self.switch = random.Random(f"switch:{seed}").choices(
            [None, "switch", "wipe"], [5, 2, 3])[0]
        self.eras: list[tuple[SimStore, set[int], int]] = []
        self.era_ends: list[float] = []  # the instant of each switch
        # Half the wipes come right after the first start is pinned (while
        # its consumer file is written: tests/sim/tear.py), in its own draw.
        self.wipe_at_pin = self.switch == "wipe" and \
            random.Random(f"switch-pin:{seed}").random() < 0.5
        self.switched_early = False
        # Shards per commit, in its own draw: 2 puts a member's 2-4 shards in
        # several commits (as 32 do a member of more than 32 shards).
        self.shards_per_commit = random.Random(f"commit:{seed}").choice([2, 32])
        self.plan = FaultPlan(seed, self.fault_rate, self.timeout_s)
        self.world = World(seed, self.store, self.plan)
        self.incarnations: list[Incarnation] = []
        self.deliveries: list[dict[str, Any]] = []
        self.stats: Counter[str] = Counter()
        self.violations: dict[str, list[str]] = defaultdict(list)
        self.dropped_at: float | None = None
        self.group_before_drop = False
        self.dropped_delivery = False
        self.member_ids = [f"m{i}" for i in range(5)]
        self._tasks: set[asyncio.Future[Any]] = set()
        # The members' supervisors stopped (tests/sim/afterlife.py: the
        # operator stops them before deleting the group): a restart they had
        # scheduled never comes.
        self.supervisors_stopped = False
        if plant == "stale_fence":
            self.store.plant_stale_accept = True
        # Snapshot expiry and --on-data-loss, in their own draw (tests/sim/expiry.py).
        self.expiry = ExpiryPlan.draw(seed)
        self.store.on_position = self._on_position
        self.tears: Any = None  # tests.sim.tear.Tears, set by run_seed
        # The Paimon sink in the handler, in its own draw (tests/sim/sink.py);
        # the plants of the group's checks run their seeds as they were.
        sink = SinkPlan.draw(seed)
        self.sink = SinkWorld(sink, seed, root, after.on and self.kind in ROW_KIND_KINDS,
                              plant if plant in SINK_PLANTS else None) \
            if sink.on and plant in SINK_SEED_PLANTS else None
        if self.sink is not None:
            # The members die at their sink's commit during the chaos only.
            self.sink.armed = lambda: self.plan.enabled
        self.afterlife = Afterlife(self, after) if after.on and self.sink is not None else None

    # -- members

    def _config(self, member_id: str, number: int) -> MemberConfig:
        hist = str(self.root / f"history-{number}.jsonl")
        return MemberConfig(
            group=GROUP, warehouse=str(self.wh.root), table="db.t",
            coordinator=f"sim://run/{member_id}/{number}", member_id=member_id,
            shards=self.shards, start=self.start, poll_interval_ms=500,
            session_timeout_s=self.timeout_s, revoke_timeout_s=self.timeout_s * 1.5,
            rebalance_delay_s=self.rebalance_delay,
            shutdown_timeout_s=self.timeout_s * 5, max_handler_attempts=5,
            handler_backoff_s=0.1, max_parallel_shards=self.rng.choice([1, 2]),
            mirror_interval_s=1.0, history_path=hist, on_data_loss=self.expiry.on_data_loss)

    # -- the writer, and its expiry

    def _commit(self) -> int | None:
        """The writer's next commit, then Paimon's expiry after it."""
        n = self.wh.commit()
        self._expire("commit")
        return n

    def _expire(self, why: str) -> None:
        if not self.expiry.on:
            return
        gone = self.wh.expire(self.expiry.retain, self.clock.monotonic(),
                              consumer_expiration_s=self.expiry.consumer_expiration_s,
                              pending=None if self.tears is None else self.tears.texts())
        if gone:
            self.stats[f"expired_at_{why}"] += len(gone)

    def _on_position(self, w: Any) -> None:
        """Faults timed by the positions the store applies: the writer
        commits and expires soon after a start (a pending full scan) is
        pinned, or right after a shard read its start while another shard's
        start is not pinned yet (their pins straddle the expiry); and a
        wipe right after a start was pinned, while its consumer file is
        being written."""
        loop = asyncio.get_running_loop()
        if w.full_scan is not None and self.wipe_at_pin and not self.eras \
                and not self.switched_early:
            self.switched_early = True
            self.stats["wipe_at_pin"] += 1
            loop.call_later(random.Random(f"wipe-at:{self.seed}").uniform(0.005, 0.1),
                            lambda: self._background(self._switch_coordinator("wipe")))
        if not self.expiry.on:
            return
        rng = random.Random(f"pin-bite:{self.seed}:{w.shard}:{w.epoch}:{w.full_scan}:"
                            f"{w.next_snapshot}")
        if w.full_scan is not None:
            if rng.random() < self.expiry.bite:
                self.stats["bite_pinned_start"] += 1
                loop.call_later(rng.uniform(0.0, 2.0), self._commit)
            return
        pinned = {x.shard for x in self.store.position_log}
        if len(pinned) < self.shards and rng.random() < self.expiry.bite:
            # Now, and again past the consumer files' write interval (the
            # shard that read its start mirrors its new position only then).
            self.stats["bite_unpinned_start"] += 1
            for delay in (0.0, 1.1, 2.2):
                loop.call_later(delay, self._commit)

    def _record(self, inc: Incarnation, batch: Any) -> tuple[Any, dict[str, Any] | None]:
        """Record ``batch`` as delivered to ``inc``'s handler; its rows and
        the record (None when the plant drops it)."""
        table = batch.to_arrow()
        ids = table.column("id").to_pylist() if table.num_rows else []
        extra = table.column("extra").to_pylist() if "extra" in table.column_names else None
        values = table.column("v").to_pylist() if table.num_rows else []
        if self.plant == "drop_delivery" and not self.dropped_delivery and ids \
                and inc.number > 0:
            self.dropped_delivery = True  # planted: a delivered batch goes unrecorded
            return table, None
        record = {
            "t": self.clock.monotonic(), "member": inc.member_id, "pid": inc.number,
            "shard": batch.shard, "epoch": batch.epoch, "snapshot": batch.snapshot_id,
            "first": batch.first_snapshot, "next_snapshot": batch.next_snapshot,
            "kind": batch.kind.value, "ids": ids, "extra": extra, "vs": values,
        }
        self.deliveries.append(record)
        return table, record

    def _handler_delay(self, inc: Incarnation, batch: Any) -> float:
        rng = random.Random(f"handler:{self.seed}:{inc.number}:{batch.shard}:"
                            f"{batch.snapshot_id}:{batch.epoch}")
        r = rng.random()
        if r < 0.05:
            return rng.uniform(self.timeout_s, self.timeout_s * 3)  # past the revoke timeout
        if r < 0.3:
            return rng.uniform(0.0, 0.5)
        return 0.0

    async def _consume(self, inc: Incarnation, mode: str) -> None:
        member = inc.member
        failures: Counter[tuple[int, int]] = Counter()
        attempts: Counter[tuple[int, int]] = Counter()

        async def handle(batch: Any) -> None:
            """The handler: sometimes slow, sometimes raising (``run`` retries
            it; the body of ``async for`` is the caller's own code: it does
            not raise here)."""
            if inc.crashed:
                await asyncio.Event().wait()  # a dead process does nothing more
            key = (batch.shard, batch.snapshot_id)
            rng = random.Random(f"fail:{self.seed}:{inc.number}:{key}:{failures[key]}")
            if mode == "run" and failures[key] < 2 and rng.random() < 0.03:
                failures[key] += 1
                self.stats["handler_raised"] += 1
                raise RuntimeError("sim: handler raised")
            # Slow on a first attempt only: a retried batch (its files gone
            # with a dropped table, say) fails fast, so the member's table
            # check comes within DROP_NOTICE_BOUND_S.
            delay = self._handler_delay(inc, batch) if attempts[key] == 0 else 0.0
            attempts[key] += 1
            if delay:
                await asyncio.sleep(delay)
            bite = random.Random(f"held-bite:{self.seed}:{inc.number}:{key}:{batch.epoch}")
            if self.expiry.on and self.plan.enabled and attempts[key] == 1 \
                    and bite.random() < self.expiry.bite:
                # The handler waits on its downstream before pulling the rows;
                # meanwhile the writer commits and expires. A chaos fault: off
                # once the faults stop (a bite of up to two session timeouts per
                # batch, in the settle phase, could outlast its bound alone).
                self.stats["bite_held_batch"] += 1
                await asyncio.sleep(bite.uniform(0.2, self.timeout_s * 2))
                self._commit()
            if inc.crashed:
                await asyncio.Event().wait()
            rows, record = self._record(inc, batch)
            if self.sink is not None:
                # Its files only: the member commits them once the handler
                # returned, where the run's crash points are (SimSink). A
                # batch the sink answers "already written" marks its record.
                self.sink.write(inc.number, rows, batch, lambda: self._sink_crash(inc),
                                record)

        if mode == "run":
            await member.run(handle)
            return
        if mode == "driver":
            await self._drive(inc)
            return
        try:
            async for batch in member.batches():
                try:
                    await handle(batch)
                except BatchExpired:
                    # As docs/operations.md says: the body goes on to the
                    # next batch, and the member stops or skips as
                    # --on-data-loss says.
                    self.stats["body_batch_expired"] += 1
                except FileNotFoundError:
                    if not self.table_dropped_under(batch):
                        raise
                    # A group of several tables: the batch's table was
                    # dropped under it; the body goes on with the others.
                    self.stats["body_table_dropped"] += 1
        except FileNotFoundError:
            if self.dropped_at is None:
                raise
            # The body's own read failed: the table's files are gone. The
            # process ends with that error (and the member leaves).
            self.stats["consumer_exited_table_gone"] += 1
            inc.stopped = True
            await member.stop()

    def table_dropped_under(self, batch: Any) -> bool:
        """Whether ``batch``'s table was dropped while it was held (a group
        of one table stops then: never)."""
        return False

    async def _drive(self, inc: Incarnation) -> None:
        def record(d: dict[str, Any]) -> None:
            if inc.crashed:
                return
            d.update(t=self.clock.monotonic(), member=inc.member_id, pid=inc.number)
            self.deliveries.append(d)

        try:
            await drive(inc.member, record, lambda: inc.crashed)
        except SnapshotExpired as err:
            if not data_loss_stop(err):
                raise
            # The query stops with its one data-loss line (failOnDataLoss).
            inc.data_loss = err
            inc.stopped = True
            await inc.member.stop()
        except (FileNotFoundError, TableNotFound, TableReplaced):
            if self.dropped_at is None:
                raise
            self.stats["consumer_exited_table_gone"] += 1
            inc.stopped = True
            await inc.member.stop()

    def member(self, cfg: MemberConfig, *, auto_commit: bool = True) -> GroupMember:
        """A member of this run: on its virtual clock, with its commit size."""
        member = GroupMember(cfg, auto_commit=auto_commit, clock=self.clock)
        member.commits.shards_per_commit = self.shards_per_commit
        return member

    async def start_member(self, member_id: str) -> Incarnation:
        number = len(self.incarnations)
        cfg = self._config(member_id, number)
        # One member in five is driven as the Spark source drives one (its
        # own draw: the other draws of a seed stay).
        driven = random.Random(f"driver:{self.seed}:{number}").random() < 0.2 \
            and self.sink is None and self.drivers
        inc = Incarnation(member_id, number, self.member(cfg, auto_commit=not driven),
                          history_path=cfg.history_path or "",
                          started_at=self.clock.monotonic(),
                          driven=driven)
        self.incarnations.append(inc)
        self.stats["member_starts"] += 1
        try:
            await inc.member.start()
        except (TableNotFound, TableReplaced) as err:
            inc.start_error = err
            inc.stopped = True
            self.stats["start_refused_table"] += 1
            return inc
        except Exception as err:
            # A process that fails to start exits 1 and is restarted by its
            # supervisor (here: the schedule goes on without it).
            inc.start_error = err
            inc.stopped = True
            self.stats["start_failed"] += 1
            self.stats[f"start_failed:{type(err).__name__}"] += 1
            with contextlib.suppress(Exception):
                await inc.member.stop(timeout=1)
            return inc
        if inc.crashed:
            # Killed while it was starting: whatever its start opened since
            # dies with it.
            self.kill(inc)
            return inc
        mode = self.rng.choice(["run", "run", "iterate"])
        if self.sink is not None:
            mode = "run"  # the sink's verdict on a replay is a handler's (tests/sim/sink.py)
        if inc.driven:
            mode = "driver"
            self.stats["driver_starts"] += 1
        inc.task = asyncio.create_task(self._consume(inc, mode), name=f"consume-{number}")
        return inc

    def _sink_crash(self, inc: Incarnation) -> None:
        """The member dies inside its sink's write; its supervisor restarts it."""
        self.crash(inc)
        rng = random.Random(f"sink-restart:{self.seed}:{inc.number}")
        asyncio.get_running_loop().call_later(
            rng.uniform(0.1, self.timeout_s * 2),
            lambda: self._background(self._restart(inc.member_id)))

    def live(self) -> list[Incarnation]:
        return [i for i in self.incarnations if not i.crashed and not i.stopped
                and i.start_error is None]

    def crash(self, inc: Incarnation) -> None:
        inc.crashed = True
        self.stats["crashes"] += 1
        self.kill(inc)

    def kill(self, inc: Incarnation) -> None:
        mirror = inc.member.core.mirror
        if self.tears is not None and mirror is not None:
            self.tears.abandon(mirror.file_io)
        inc.member.history.record = lambda *a, **k: None  # type: ignore[method-assign]
        # A killed process's files are closed by the system: without this a
        # worker running thousands of seeds ran out of descriptors (seed 19902
        # of a 20,000-seed run, two history files left open per seed).
        inc.member.history.close()
        for coord in self.world.coords.get(f"{inc.member_id}/{inc.number}", []):
            coord.crash()
        member = inc.member
        # As a SIGKILL: the supervisor and the session's loops (control,
        # head) end with the process, not only the consuming task.
        tasks = [inc.task, getattr(member, "_supervisor", None), *member.core.tasks]
        for t in tasks:
            if t is not None:
                t.cancel()

    async def stop_member(self, inc: Incarnation) -> None:
        inc.stopped = True
        self.stats["graceful_leaves"] += 1
        if inc.driven:
            # As GroupDriver.stop: a batch still held was abandoned by the
            # query; its shards are released with the committed positions.
            inc.member.mark_idle(range(self.shards))
        await inc.member.stop()
        if inc.task is not None:
            inc.task.cancel()
            with contextlib.suppress(BaseException):
                await inc.task

    def pause(self, inc: Incarnation, duration: float) -> None:
        """Renewals fail for ``duration`` (a stalled process or network)."""
        self.stats["pauses"] += 1
        for coord in self.world.coords.get(f"{inc.member_id}/{inc.number}", []):
            inner = coord.inner
            if isinstance(inner, SimCoordinator):
                now = asyncio.get_running_loop().time()
                inner.suspended_until = max(inner.suspended_until, now + duration)

    # -- phases

    async def chaos(self) -> None:
        rng = self.rng
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        for _ in range(rng.choice([0, 1, 2])):
            self._commit()
        if self.switch is not None:
            # Rows before the group's start, so that a full scan pinned at
            # snapshot F holds rows that no delta from F on has.
            for _ in range(random.Random(f"switch-pre:{self.seed}").choice([0, 2, 3])):
                self._commit()
        events: list[tuple[float, str]] = []
        t = 0.0
        while self.wh.remaining - sum(1 for _, e in events if e == "write") > 0:
            t += rng.uniform(0.2, CHAOS_S / 6)
            events.append((min(t, CHAOS_S), "write"))
        for _ in range(rng.randint(2, 7)):
            events.append((rng.uniform(0, CHAOS_S), rng.choice(
                ["join", "join", "leave", "crash", "crash", "pause", "restart"])))
        if self.table_fate != "keep":
            events.append((rng.uniform(CHAOS_S / 3, CHAOS_S), self.table_fate))
        if self.switch is not None:
            # Half of them early, while the first shards' starts are pinned
            # and their first batches (a full scan) may still be in flight.
            when = random.Random(f"switch-at:{self.seed}")
            at = when.uniform(1.0, 5.0) if when.random() < 0.6 else \
                when.uniform(0.1, 0.9) * CHAOS_S
            events.append((at, self.switch))
        events.sort(key=lambda e: e[0])
        for _ in range(rng.randint(1, 3)):
            await self.start_member(self._free_id() or "m0")
        for at, what in events:
            wait = t0 + at - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            await self._event(what)
        await asyncio.sleep(max(0.0, t0 + CHAOS_S - loop.time()))

    def _free_id(self) -> str | None:
        busy = {i.member_id for i in self.live()}
        free = [m for m in self.member_ids if m not in busy]
        return self.rng.choice(free) if free else None

    async def _event(self, what: str) -> None:
        rng = self.rng
        live = self.live()
        if what in ("switch", "wipe"):
            if not self.switched_early:
                await self._switch_coordinator(what)
        elif what == "write":
            self._commit()
        elif what == "join" and len(live) < 4:
            mid = self._free_id()
            if mid is not None:
                await self.start_member(mid)
        elif what == "leave" and live:
            self._background(self.stop_member(rng.choice(live)))
        elif what == "crash" and live:
            victim = rng.choice(live)
            self.crash(victim)
            if rng.random() < 0.6:  # restarted by its supervisor, same id
                delay = rng.uniform(0.1, self.timeout_s * 2)
                asyncio.get_running_loop().call_later(
                    delay, lambda: self._background(self._restart(victim.member_id)))
        elif what == "restart" and live:
            victim = rng.choice(live)
            self.crash(victim)
            await self._restart(victim.member_id)
        elif what == "pause" and live:
            self.pause(rng.choice(live), rng.uniform(0.3, 3.0) * self.timeout_s)
        elif what in ("drop", "recreate"):
            self.wh.drop() if what == "drop" else self.wh.recreate()
            self.dropped_at = asyncio.get_running_loop().time()
            # A group created only afterwards (every start failed so far) is
            # created on the re-created table: its members have nothing to
            # notice, and run on it.
            self.group_before_drop = self.store.get(f"groups/{GROUP}") is not None
            self.stats[f"table_{what}"] += 1

    async def _switch_coordinator(self, how: str) -> None:
        """Every member leaves (or crashes), the group moves to an empty
        coordinator, and the members that were running start again on it."""
        if self.dropped_at is not None:
            return
        # A member restarted while the others stop (its supervisor does not
        # know of the move) started on the old coordinator: it leaves too,
        # or it would run on against the old store beside the group on the
        # new one (simulation seed 12300: a split across two coordinators,
        # which no fencing can see, since their epochs start anew).
        live: list[Incarnation] = []
        while left := [i for i in self.live() if i not in live]:
            for inc in left:
                live.append(inc)
                if how == "switch":
                    await self.stop_member(inc)
                else:
                    self.crash(inc)
        consumer_dir = self.wh.table_dir / "consumer"
        mirrored = {k for k in range(self.shards)
                    if (consumer_dir / f"consumer-pg-{GROUP}-shard-{k}").exists()}
        self.eras.append((self.store, mirrored, len(self.incarnations)))
        self.era_ends.append(self.clock.monotonic())
        self.store = SimStore()
        self.store.plant_stale_accept = self.eras[0][0].plant_stale_accept
        self.store.on_position = self._on_position
        self.world.store = self.store
        self.stats[f"coordinator_{how}"] += 1
        for member_id in dict.fromkeys(i.member_id for i in live):
            await self.start_member(member_id)

    def _consumer_file(self, shard: int) -> int | None:
        """The shard's consumer file after a switch (a shard that resumed
        from it with nothing new to read writes no position to the fresh
        coordinator: it is where it should be)."""
        if not self.eras:
            return None
        path = self.wh.table_dir / "consumer" / f"consumer-pg-{GROUP}-shard-{shard}"
        try:
            return int(json.loads(path.read_text())["nextSnapshot"])
        except FileNotFoundError:
            # Deleted by consumer.expiration-time while the shard sat there.
            return self.wh.consumers_expired.get(path.name)
        except (OSError, ValueError, KeyError):
            return None

    def _stores(self) -> list[SimStore]:
        return [store for store, _m, _n in self.eras] + [self.store]

    def _background(self, work: Any) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _restart(self, member_id: str) -> None:
        if self.supervisors_stopped or any(i.member_id == member_id for i in self.live()):
            return
        self.stats["restarts"] += 1
        await self.start_member(member_id)

    async def settle(self) -> None:
        """Faults off; everything must be delivered and committed within the bound."""
        self.plan.enabled = False
        loop = asyncio.get_running_loop()
        if self.dropped_at is not None:
            if self.group_before_drop:
                await self._wait_all_stopped_after_drop()
            return
        while self._commit() is not None:
            pass
        if not self.live():
            await self.start_member(self._free_id() or "m0")
        deadline = loop.time() + SETTLE_BOUND_S
        latest = self.wh.committed
        while True:
            missing = self.expected_ids() - {i for d in self.deliveries for i in d["ids"]}
            missing -= set(self.excused(missing))
            positions = self._stored_positions()
            behind = {s: p for s, p in positions.items() if p != (latest + 1, None)}
            behind.update({s: None for s in range(self.shards) if s not in positions
                           and self._consumer_file(s) != latest + 1})
            if self._failed() or self._data_loss_stops():
                # Reported by the liveness check; a group stopped on data
                # loss (--on-data-loss fail) waits for an operator's reset.
                return
            if not missing and not behind:
                self.stats["settled_after_s"] = round(loop.time() - (deadline - SETTLE_BOUND_S),
                                                      3)
                return
            if loop.time() > deadline:
                self.violations["hang"].append(
                    f"not settled {SETTLE_BOUND_S:.0f}s after the faults stopped: "
                    f"{len(missing)} ids undelivered (e.g. {sorted(missing)[:5]}), positions "
                    f"behind {behind} (latest snapshot {latest}); owners "
                    f"{self._owners()}; live {[i.member_id for i in self.live()]}")
                return
            if not self.live():
                await self.start_member(self._free_id() or "m0")
            await asyncio.sleep(0.25)

    def _stored_positions(self) -> dict[int, tuple[int, int | None]]:
        out = {}
        for e in self.store.list(f"groups/{GROUP}/positions/"):
            data = json.loads(e.value)
            out[int(e.key.rsplit("/", 1)[1])] = (int(data["next_snapshot"]),
                                                 data.get("full_scan"))
        return out

    def _owners(self) -> dict[int, str]:
        out = {}
        for e in self.store.list(f"groups/{GROUP}/owners/"):
            out[int(e.key.rsplit("/", 1)[1])] = json.loads(e.value).get("member_id")
        return out

    async def _wait_all_stopped_after_drop(self) -> None:
        assert self.dropped_at is not None
        loop = asyncio.get_running_loop()
        deadline = self.dropped_at + DROP_NOTICE_BOUND_S
        while loop.time() < max(deadline, loop.time() + 0.001):
            running = [i for i in self.live() if i.member.error is None]
            if not running:
                self.stats["stopped_after_table_change_s"] = round(
                    loop.time() - self.dropped_at, 3)
                return
            if loop.time() >= deadline:
                break
            await asyncio.sleep(0.25)
        running = [i for i in self.live() if i.member.error is None]
        if running:
            self.violations["table_change_unnoticed"].append(
                f"members {[i.member_id for i in running]} still running "
                f"{DROP_NOTICE_BOUND_S:.0f}s after the table was {self.table_fate}ed")

    async def stop_all(self) -> None:
        loop = asyncio.get_running_loop()
        for inc in self.live():
            started = loop.time()
            await self.stop_member(inc)
            if loop.time() - started > inc.member.config.shutdown_timeout_s + 1:
                self.violations["stop_hang"].append(
                    f"{inc.member_id} took {loop.time() - started:.1f}s to stop")

    # -- checks

    def history(self) -> checker.History:
        events: list[dict[str, Any]] = []
        for inc in self.incarnations:
            path = Path(inc.history_path)
            if not path.exists():
                continue
            for line in path.read_text().splitlines():
                if line.strip():
                    e = json.loads(line)
                    e["pid"] = inc.number
                    events.append(e)
        return checker.History(deliveries=list(self.deliveries), events=events)

    def check(self) -> None:
        if os.environ.get("PG_SIM_DUMP"):
            self._dump()
        history = self.history()
        v = self.violations
        dropped = self.dropped_at is not None
        written = self.expected_ids() if not dropped else set()
        results = self._check_history(written, history)
        if self.kind.startswith("append"):
            # File rule: a compaction moves rows to the shard of their new file.
            results["wrong_shard"] = self._check_file_shards()
        if self.kind.startswith("append") and any(
                e["event"] == "skip" and e.get("full_scan") for e in history.events):
            # A shard's expired start skipped on its own, beside shards that
            # read it: the rows a compaction moved are lost or read twice.
            for name in ("lost", "unexplained_duplicates"):
                results[name] = [f"{x} [after a shard's expired start was skipped alone (D2)]"
                                 for x in results.get(name, [])]
        for name, found in results.items():
            v[name].extend(found)
        v["truth"].extend(self._check_truth())
        v["schema"].extend(self._check_schema())
        if not dropped:
            v["values"].extend(self._check_values(written))
        if self.sink is not None:
            try:
                for name, found in self.sink.check(self, written).items():
                    v[name].extend(found)
            except Exception as err:
                v["sink_check_error"].append(f"{type(err).__name__}: {err}\n"
                                             f"{traceback.format_exc()}")
            self.stats.update(self.sink.stats)
        if self.afterlife is not None:
            try:
                for name, found in self.afterlife.check().items():
                    v[name].extend(found)
            except Exception as err:
                v["sink_check_error"].append(f"{type(err).__name__}: {err}\n"
                                             f"{traceback.format_exc()}")
            self.stats.update(self.afterlife.stats)
        for inc in self.incarnations:
            task = inc.task
            if task is not None and task.done() and not task.cancelled() \
                    and task.exception() is not None and not inc.crashed \
                    and inc.member.error is None:
                err = task.exception()
                assert err is not None
                v["consumer_died"].append(f"{inc.member_id}#{inc.number}: "
                                          f"{type(err).__name__}: {err}"
                                          f"{_hole_hint(err, self.wh, inc.driven)}")
            if inc.data_loss is not None and not inc.crashed:
                self._check_data_loss_stop(inc, inc.data_loss)
            err = inc.member.error
            if err is None or inc.crashed:
                continue
            if dropped:
                # Stopping is what counts once the table is gone; which error
                # says so is counted (docs/reliability.md).
                self.stats[f"stopped_by:{_stop_reason(err)}"] += 1
                continue
            if data_loss_stop(err):
                self._check_data_loss_stop(inc, err)
                continue
            v["member_failed"].append(f"{inc.member_id}#{inc.number}: {type(err).__name__}: "
                                      f"{err}{_cause_text(err)}"
                                      f"{_hole_hint(err, self.wh, inc.driven)}")
        if dropped and self.group_before_drop:
            for d in self.deliveries:
                if d["t"] > self.dropped_at + DROP_NOTICE_BOUND_S:
                    v["table_change_unnoticed"].append(
                        f"{d['member']} delivered snapshot {d['snapshot']} at "
                        f"t+{d['t'] - self.dropped_at:.1f}s after the table was "
                        f"{self.table_fate}ed")
                    break

    def _dump(self) -> None:
        for k, store in enumerate(self._stores()):
            print(f"store {k}: created {store.group_created_at}")
            for w in store.start_log:
                print(f"  start {w}")
            for w in store.position_log:
                print(f"  pos t={w.t:.3f} shard {w.shard} ep {w.epoch} {w.member} "
                      f"({w.next_snapshot}, {w.full_scan}) moves {w.start_moves}")
        print("eras", [(sorted(m), n) for _s, m, n in self.eras], "ends", self.era_ends)
        print("expired_at", dict(sorted(self.wh.expired_at.items())))
        print("consumers_deleted", self.wh.consumers_deleted)
        print("versions", {i: v for i, v in sorted(self.wh.versions.items())})
        h = self.history()
        for d in sorted(h.deliveries, key=lambda d: d["t"]):
            print(f"  deliv t={d['t']:.3f} {d['member']}#{d.get('pid')} shard {d['shard']} "
                  f"ep {d['epoch']} snap {d['snapshot']} next {d['next_snapshot']} "
                  f"{d['kind']} ids {d['ids']}")
        for inc in self.incarnations:
            task = inc.task
            if task is not None and task.done() and not task.cancelled() and task.exception():
                traceback.print_exception(task.exception())
        for e in h.events:
            if e.get("event") in ("skip", "repin", "commit"):
                print("  event", {k: v for k, v in e.items() if k != "ids"})

    def _check_data_loss_stop(self, inc: Incarnation, err: BaseException) -> None:
        """A member that stopped with the data-loss line: expected under
        ``fail`` when the snapshot it names did expire."""
        first = named_snapshot(err)
        if self.expiry.on_data_loss == "skip":
            self.violations["data_loss_stop_under_skip"].append(
                f"{inc.member_id}#{inc.number} stopped on data loss under --on-data-loss skip: "
                f"{err}")
        elif first not in self.wh.expired_at:
            self.violations["data_loss_unfounded"].append(
                f"{inc.member_id}#{inc.number}: snapshot {first} did not expire: {err}")
        else:
            self.stats["data_loss_stops"] += 1

    def expected_ids(self) -> set[int]:
        """The ids the group must deliver: each shard's rows from where its
        start was first pinned (``latest`` skips what came before; a full
        scan of snapshot F holds every row of the snapshots up to F)."""
        first: dict[int, tuple[int, int | None]] = {}
        for k, (store, mirrored, _n) in enumerate(self.eras):
            if not self.files_left(k, mirrored):
                # Every consumer file of the group expired (consumer.expiration-
                # time) before the group was created again: it is a new group,
                # which starts as configured; what came before is forgotten.
                first = {}
                continue
            # A pin the switch lost with the coordinator (no consumer file
            # yet) did not happen: the shard starts anew, as configured.
            for w in store.position_log:
                if w.shard in mirrored:
                    first.setdefault(w.shard, (w.next_snapshot, w.full_scan))
        for w in self.store.position_log:
            first.setdefault(w.shard, (w.next_snapshot, w.full_scan))
        if self.store.start_log:
            # A shard never pinned in the store starts from the group's start
            # (seed 201398: the member that held it stopped on data loss
            # before pinning it; the start had been pinned for another shard).
            _t, nxt, full = self.store.start_log[0]
            for shard in range(self.shards):
                first.setdefault(shard, (nxt, full))
        for store in self._stores():
            # Pinned before a switch that lost the pin (no consumer file),
            # and never again (the group stopped first, seed 228007): a pin
            # anew starts as configured, no earlier than that one.
            for w in store.position_log:
                first.setdefault(w.shard, (w.next_snapshot, w.full_scan))
        out = set()
        for i, versions in self.wh.versions.items():
            shard = self.wh.shard_of(i, self.shards)
            if shard not in first:
                out.add(i)  # never pinned: nothing was read, so it is lost
                continue
            start, full = first[shard]
            if full is not None or any(snapshot >= start for snapshot, _v in versions):
                out.add(i)
        return out

    def files_left(self, era: int, mirrored: set[int]) -> bool:
        """Whether a consumer file of the group was left when the group was
        created again after switch ``era`` (its record in the next store)."""
        created = self._stores()[era + 1].group_created_at
        if created is None:
            created = float("inf")
        gone = {int(name.rsplit("-", 1)[1]) for t, name in self.wh.consumers_deleted
                if self.era_ends[era] <= t <= created and name.rsplit("-", 1)[1].isdigit()}
        return bool(mirrored - gone)

    def _check_truth(self) -> list[str]:
        """Each store's own log of applied positions (a fresh store after a
        switch starts its epochs and positions anew)."""
        return [bad for store in self._stores() for bad in self._check_log(store)][:20]

    def _check_log(self, store: SimStore) -> list[str]:
        bad = []
        writers: dict[tuple[int, int], str] = {}
        last: dict[int, tuple[int, int, int]] = {}
        log = store.position_log
        if store is self.store and self.afterlife is not None \
                and self.afterlife.log_from is not None:
            # The group deleted and created again (tests/sim/afterlife.py):
            # its positions start anew.
            log = log[:self.afterlife.log_from]
        for w in log:
            if w.fence is None or w.fence != w.owner_create_version or w.fence != w.epoch:
                bad.append(f"shard {w.shard}: position {w.next_snapshot} of epoch {w.epoch} "
                           f"by {w.member} applied with fence {w.fence}, owner key "
                           f"{w.owner_create_version}")
            other = writers.setdefault((w.shard, w.epoch), w.member)
            if other != w.member:
                bad.append(f"shard {w.shard}: epoch {w.epoch} written by {other} and "
                           f"{w.member}")
            # As positions advance (start moves, next snapshot, scan done).
            order = position_order(w.next_snapshot, w.full_scan, w.start_moves)
            if w.shard in last and order < last[w.shard]:
                bad.append(f"shard {w.shard}: stored position moved back {last[w.shard]} -> "
                           f"{order} (epoch {w.epoch}, {w.member})")
            last[w.shard] = max(order, last.get(w.shard, order))
        return bad[:20]

    def _check_schema(self) -> list[str]:
        """Rows written after the column was added are delivered with it."""
        main = self.wh.main
        if main.extra_from is None:
            return []
        bad = []
        for d in self.deliveries:
            for pos, i in enumerate(d["ids"]):
                written_by = d["vs"][pos]  # the write (1..) that wrote this version
                if i not in self.wh.versions or written_by < ALTER_BEFORE:
                    continue
                value = None if d["extra"] is None else d["extra"][pos]
                if value != i * 10:
                    bad.append(f"id {i} (write {written_by}) delivered by "
                               f"{d['member']} with extra={value!r}, not {i * 10}")
        return bad[:10]

    def _check_history(self, written: set[int], history: checker.History
                       ) -> dict[str, list[str]]:
        """The history checks, per coordinator era (epochs, positions and
        commits are the store's own: a fresh store starts them anew, and
        rows may be delivered again after a switch: at least once); the
        lost rows over the whole run."""
        bounds = [n for _s, _m, n in self.eras] + [len(self.incarnations)]
        results: dict[str, list[str]] = defaultdict(list)
        lo = 0
        for hi in bounds:
            era = checker.History(
                deliveries=[d for d in history.deliveries if lo <= d["pid"] < hi],
                events=[e for e in history.events if lo <= e["pid"] < hi])
            found = checker.check_all(set(), era, lambda i: self.wh.shard_of(i, self.shards),
                                      self.shards, versions=True)  # a key: once per version
            for name, items in found.items():
                results[name].extend(items)
            lo = hi
        results["lost"] = self._lost_rows(written, history)
        return results

    # -- what expiry may cost (tests/sim/expiry.py)

    def oracle(self) -> LossOracle:
        """The oracle over the positions of the group as it is now: a group
        created anew after every consumer file of it expired starts afresh."""
        stores = self._stores()
        forgotten = [k for k, (_s, mirrored, _n) in enumerate(self.eras)
                     if not self.files_left(k, mirrored)]
        if forgotten:
            stores = stores[forgotten[-1] + 1:]
        # The full scans a group start moved to (every start of a store after
        # its first that is a full scan: a moved start, issue 37 D2).
        moved = [full for store in stores for _t, _n, full in store.start_log[1:]
                 if full is not None]
        return LossOracle(self.wh, self.shards, [w for store in stores for w in store.position_log],
                          [x for store in stores for x in store.start_log], moved)

    def _data_loss_stops(self) -> list[Incarnation]:
        return [i for i in self.incarnations if not i.crashed and (
            data_loss_stop(i.member.error) or i.data_loss is not None)]

    def excuse(self, oracle: LossOracle, i: int, snapshots: list[int]) -> str | None:
        """Why row ``i`` (its versions written in ``snapshots``) may be
        missing: under skip, a carrier expired before its shard read it;
        under fail, once a member stopped on data loss, its shard never
        moved past it. None: it may not."""
        if self.expiry.on_data_loss == "skip":
            for s in snapshots:
                why = oracle.excuse_skip(i, s)
                if why is not None:
                    return why
        return self._unread(oracle, i, snapshots)

    def _unread(self, oracle: LossOracle, i: int, snapshots: list[int]) -> str | None:
        """A group that stopped (on data loss, or a member failed: reported
        as such) never read what it had not reached; that is not lost."""
        stopped = self._data_loss_stops() or self._failed()
        if stopped and any(oracle.unread_under_fail(i, s) for s in snapshots):
            return "not read: the group stopped before it"
        return None

    def _failed(self) -> list[Incarnation]:
        """Members that failed, or whose consumer died (reported as such):
        what they held was not read on."""
        return [inc for inc in self.incarnations if not inc.crashed and (
            inc.member.error is not None or (
                inc.task is not None and inc.task.done() and not inc.task.cancelled()
                and inc.task.exception() is not None))]

    def excused(self, ids: set[int]) -> dict[int, str]:
        """The ids of ``ids`` that may be missing, with why."""
        if not ids:
            return {}
        oracle = self.oracle()
        out = {}
        for i in ids:
            if i in self.wh.versions:
                why = self.excuse(oracle, i, [s for s, _v in self.wh.versions[i]])
                if why is not None:
                    out[i] = why
        return out

    def _lost_rows(self, written: set[int], history: checker.History) -> list[str]:
        """Rows never delivered, each named with its shard and why it is not
        explained by expiry (``lost``); those explained are counted."""
        missing = written - set(history.delivered_counts())
        if not missing:
            return []
        excused = self.excused(missing)
        for why in excused.values():
            self.stats["rows_lost_to_expiry" if why.startswith("snapshot")
                       else "rows_unread_group_stopped"] += 1
        bad = sorted(missing - set(excused))
        if not bad:
            return []
        oracle = self.oracle()
        out = [f"{len(bad)} rows never delivered, e.g. {bad[:10]}"]
        for i in bad[:8]:
            first = self.wh.versions[i][0][0] if i in self.wh.versions else None
            shard = self.wh.shard_of(i, self.shards)
            why = "no snapshot expired" if not self.wh.expired_at or first is None else \
                oracle.why_not_excused(i, first)
            torn = " [its shard's consumer file was read torn while it marked a pending full " \
                "scan (D3)]" if self.tears and shard in self.tears.torn_full_scans else ""
            out.append(f"id {i} (shard {shard}, written in snapshot {first}) never delivered, "
                       f"final position {oracle.final(shard)}, on-data-loss "
                       f"{self.expiry.on_data_loss}: {why}{torn}")
        return out

    def _check_file_shards(self) -> list[str]:
        """Under the file rule a row is delivered by the shard of a file that
        held it (the one it was written in, or a compaction's output)."""
        bad = []
        for d in self.deliveries:
            for i in d["ids"]:
                if i in self.wh.main.locs and d["shard"] not in self.wh.shards_of(i, self.shards):
                    bad.append(f"id {i} delivered by shard {d['shard']}, held only by shards "
                               f"{sorted(self.wh.shards_of(i, self.shards))}")
        return bad[:10]

    def _check_values(self, expected: set[int]) -> list[str]:
        """Each kind's semantics. Primary key (deduplicate): a key's latest
        version is delivered (a full scan holds the merged value; later
        versions come in deltas). First-row: a full scan delivers a key's
        first version. Append: every row once (``lost`` and the duplicate
        checks)."""
        if self.kind not in PK_KINDS:
            return []
        seen: dict[int, set[int]] = defaultdict(set)
        bad = []
        for d in self.deliveries:
            for pos, i in enumerate(d["ids"]):
                v = d["vs"][pos]
                seen[i].add(v)
                if self.kind == "first-row" and d["kind"] == "initial" \
                        and i in self.wh.versions and v != self.wh.versions[i][0][1]:
                    bad.append(f"first-row key {i}: full scan delivered v={v}, not the first "
                               f"version v={self.wh.versions[i][0][1]}")
        if self.kind == "first-row":
            return bad[:10]
        oracle = self.oracle()
        for i in sorted(expected):
            want = self.wh.versions[i][-1][1]
            if seen[i] and want not in seen[i] and self.excuse(
                    oracle, i, [self.wh.versions[i][-1][0]]) is not None:
                self.stats["versions_lost_to_expiry"] += 1
                continue
            if seen[i] and want not in seen[i]:
                bad.append(f"key {i}: latest version v={want} never delivered (delivered "
                           f"{sorted(seen[i])}; versions {self.wh.versions[i]})")
        return bad[:10]

    def digest(self) -> str:
        import hashlib

        h = hashlib.sha256()
        for d in self.deliveries:
            h.update(json.dumps([d["t"], d["member"], d["shard"], d["epoch"],
                                 sorted(d["ids"])]).encode())
        for w in [w for store in self._stores() for w in store.position_log]:
            h.update(repr((w.shard, w.epoch, w.member, w.next_snapshot, w.t)).encode())
        return h.hexdigest()[:16]


async def _main(run: Run) -> None:
    await run.chaos()
    await run.settle()
    await run.stop_all()
    if run.afterlife is not None:
        await run.afterlife.go()


@contextlib.contextmanager
def _no_repin(on: bool) -> Iterator[None]:
    """Planted (``no_repin``): a shard of an earlier start is taken as of the
    moved start where it stands, not re-pinned at its full scan (issue 52,
    E1's shape: it reads on with follow-ups, which skip the compaction that
    moved rows into its files)."""
    from paimon_group.member import moved_start, read_loop

    real = read_loop.repin_stale

    async def kept(core: Any, commits: Any, held: list[Any]) -> None:
        tables = core.tables
        if tables is None:
            return
        for table, shards in tables.by_table(o.shard for o in held).items():
            start = core.start_of(table.index)
            if not moved_start.moves_group_wide(table) or start is None \
                    or start.full_scan is None:
                continue
            for o in held:
                if (o.shard in shards and o.active and not o.uncertain and o.idle.is_set()
                        and o.next_snapshot is not None and core.owned.get(o.shard) is o
                        and o.start_moves < start.moves):
                    await commits.commit({o.shard: o}, o.next_snapshot,
                                         start_moves=start.moves)

    if on:
        read_loop.repin_stale = kept  # type: ignore[assignment]
    try:
        yield
    finally:
        read_loop.repin_stale = real


def run_seed(seed: int, *, plant: str | None = None, keep: bool = False,
             log_level: int = logging.CRITICAL) -> SeedResult:
    """Run one seed; a pure function of ``seed`` (and ``plant``) under ``PYTHONHASHSEED=0``."""
    if plant is not None and plant not in PLANTS:
        raise ValueError(f"unknown plant {plant!r}: one of {', '.join(PLANTS)}")
    wall = time.perf_counter()
    # Written on real time (a table's identity is its first schema's creation
    # time: the two tables must not share one virtual instant).
    templates(table_kind_of(seed))
    if AfterPlan.draw(seed, SinkPlan.draw(seed).on).on:
        successor(table_kind_of(seed))
    from tests.sim.many import ManyPlan, ManyRun

    many = ManyPlan.draw(seed, plant)
    for kind in many.kinds():
        templates(kind)
    root = Path(tempfile.mkdtemp(prefix=f"pg-sim-{seed}-", dir=scratch_dir()))
    # Set for the run and restored after it: a seed run in the test process
    # would otherwise silence the WARNINGs later tests of that process look for.
    levels = {name: logging.getLogger(name).level
              for name in ("paimon_group", "coordinators", "asyncio")}
    logging.getLogger("paimon_group").setLevel(log_level)
    logging.getLogger("coordinators").setLevel(log_level)
    # A watch closed under a waiter that was being cancelled: noise, not a finding.
    logging.getLogger("asyncio").setLevel(max(log_level, logging.CRITICAL))
    loop = SimLoop()
    run: Run | None = None
    try:
        asyncio.set_event_loop(loop)
        run = ManyRun(seed, root, plant, loop.clock, many) if many.on \
            else Run(seed, root, plant, loop.clock)
        run.tears = Tears(seed, loop.clock, loop)
        with _sim_scheme(run.world), torn_consumer_writes(run.tears), \
                writes_all(plant == "sink_writes_all"), _no_repin(plant == "no_repin"):
            try:
                loop.run_until_complete(asyncio.wait_for(_main(run), RUN_LIMIT_S))
            except SimSpin as err:
                run.violations["busy_loop"].append(str(err))
            except SimDeadlock as err:
                run.violations["hang"].append(f"simulation deadlock: {err}")
            except TimeoutError:
                run.violations["hang"].append(f"run exceeded {RUN_LIMIT_S:.0f}s virtual")
            except Exception as err:
                run.violations["driver_error"].append(
                    f"{type(err).__name__}: {err}\n{traceback.format_exc()}")
            run.check()
            _cancel_all(loop)
        virtual = loop.clock.now - START
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
        asyncio.set_event_loop(None)
        with contextlib.suppress(Exception):
            loop.close()
        if run is not None and run.sink is not None:
            # A seed's sinks close with it (their committer threads end);
            # each registered only with its own seed's members.
            run.sink.close()
            if run.afterlife is not None:
                run.afterlife.close()
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
    assert run is not None
    stats: dict[str, Any] = dict(run.stats)
    stats.update(kind=run.kind, shards=run.shards, timeout_s=run.timeout_s, start=run.start,
                 rebalance_delay_s=run.rebalance_delay, shards_per_commit=run.shards_per_commit,
                 fault_rate=run.fault_rate, table=run.table_fate,
                 incarnations=len(run.incarnations), deliveries=len(run.deliveries),
                 expiry=run.expiry.mode, retain=str(run.expiry.retain),
                 consumer_expiration_s=run.expiry.consumer_expiration_s,
                 on_data_loss=run.expiry.on_data_loss, expired=len(run.wh.expired_at),
                 sink=run.sink.plan.target if run.sink else "none",
                 torn_writes=run.tears.torn if run.tears else 0,
                 torn_reads=run.tears.torn_reads if run.tears else 0,
                 torn_left_empty=run.tears.abandoned if run.tears else 0)
    if plant == "stale_fence":
        stats["planted_hits"] = run.store.planted_hits
    return SeedResult(seed, {k: list(v) for k, v in run.violations.items()},
                      Counter(run.plan.counts), stats, virtual,
                      time.perf_counter() - wall, run.digest())


def _cause_text(err: BaseException) -> str:
    """The chain of causes of a member's error (a FileNotFoundError under a
    HandlerFailed says which file was gone)."""
    parts: list[str] = []
    cause = err.__cause__ or err.__context__
    while cause is not None and len(parts) < 3:
        parts.append(f"{type(cause).__name__}: {cause}")
        cause = cause.__cause__ or cause.__context__
    return "".join(f" <- {p}" for p in parts)


def _hole_hint(err: BaseException, wh: ReplayWarehouse, driven: bool) -> str:
    """What a member's failure looks like (issue 37's holes), to classify
    the seeds that find one: a held batch's data file deleted by expiry
    (D1), a consumer file torn by an in-place rewrite (D3), a manifest list
    of an expired snapshot planned from a remembered text (D4), an expired
    snapshot that stopped a member without the data-loss line."""
    chain: list[BaseException] = []
    e: BaseException | None = err
    while e is not None and len(chain) < 5:
        chain.append(e)
        e = e.__cause__ or e.__context__
    missing = [c for c in chain if isinstance(c, FileNotFoundError)]
    if any("Retry fail after" in str(c) for c in chain):
        return " [a consumer file left empty by a rewrite killed midway, unreadable (D3)]"
    if isinstance(err, SnapshotExpired) and not data_loss_stop(err):
        how = "the Spark source's query" if driven else "the member"
        return f" [expiry: {how} stopped without the data-loss line nor a skip]"
    if not missing or not wh.expired_at:
        return ""
    text = str(missing[0])
    if isinstance(err, HandlerFailed) or ".parquet" in text or ".orc" in text:
        return " [expiry: a data file of a held batch deleted (D1)]"
    if "manifest" in text:
        return " [expiry: a manifest (list) of an expired snapshot read (D4)]"
    return " [expiry: a file of an expired snapshot]"


def _stop_reason(err: BaseException) -> str:
    """How a member stopped once its table was dropped or re-created: one
    error saying so (TableNotFound, TableReplaced), a handler that kept
    failing because the batch's files were gone (HandlerFailed), or another
    error of a read of the vanished table."""
    if isinstance(err, TableNotFound | TableReplaced):
        return type(err).__name__
    if data_loss_stop(err):
        return "data loss (--on-data-loss fail)"  # before the table changed
    if isinstance(err, HandlerFailed) and isinstance(err.__cause__, FileNotFoundError):
        return "HandlerFailed(files gone)"
    return f"other:{type(err).__name__}"


def _cancel_all(loop: asyncio.AbstractEventLoop) -> None:
    tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for t in tasks:
        t.cancel()
    if tasks:
        with contextlib.suppress(BaseException):
            loop.run_until_complete(asyncio.wait(tasks, timeout=5))


PROFILES = ("default", "heavy")


def table_kind_of(seed: int) -> str:
    """The seed's table kind (its own draw: the other draws of a seed stay)."""
    return random.Random(f"kind:{seed}").choices(KINDS, KIND_WEIGHTS)[0]


def profile() -> str:
    """The seeds' profile: ``PG_SIM_PROFILE`` (``default`` or ``heavy``)."""
    name = os.environ.get("PG_SIM_PROFILE", "default")
    if name not in PROFILES:
        raise ValueError(f"PG_SIM_PROFILE={name!r}: one of {', '.join(PROFILES)}")
    return name


def rerun_command(seed: int) -> str:
    flag = "" if profile() == "default" else f" --profile {profile()}"
    return f"PYTHONHASHSEED=0 .venv/bin/python -m tests.sim --seed {seed}{flag} -v"

