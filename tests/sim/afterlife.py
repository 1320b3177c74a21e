"""The operator's steps after a re-created table, with the Paimon sink (issue 51).

In half the sink seeds (its own draw, ``afterlife:<seed>``; the other seeds
run as before) the run's table is dropped and re-created during the chaos
(the members stop with ``TableReplaced``), and the run goes on as
docs/operations.md tells the operator to: once the members have exited,
``paimon-group delete`` the group (:func:`paimon_group.ops.admin.delete_group`,
on the run's coordinator) and start the members again, on the new table, with
the sink's target kept (its marks of the old table's snapshots still in it).
The re-created table is :func:`tests.sim.table.successor`: eight writes, and
on a primary-key source of :data:`tests.sim.table.ROW_KIND_KINDS` updates
(``+U``) and deletes (``-D``) of keys written before.

What this phase draws (:class:`AfterPlan`):

* the new group's shard count (2, 3 or 4) and start (``latest-full`` or
  ``earliest``);
* **row kinds**: on a source with deletes the members are configured with
  ``include_row_kind``, the handler passes ``_row_kind`` through, and the
  target has a STRING column ``rk`` (the run's own rows fill it: inserts); a
  primary-key target declares ``'rowkind.field' = 'rk'`` (the sink fills it
  from ``_row_kind``: a deleted key disappears), an append target records
  each change's kind there;
* **parts**: the handler writes a batch in several ``write`` calls, one per
  slice of its rows (as ``for rb in batch.iter_batches(): sink.write(rb,
  batch)``);
* a **re-created group with another shard count**: while the writer
  commits, every member of the group dies, the operator deletes the group
  and starts it again with another number of shards (its shards' numbers
  name other rows than the old marks of the same numbers);
* a **second group** (``h``) reading the same source into the same target
  (its output ids offset by :data:`OFFSET`), with the target's snapshots
  expired after each commit (the last 2 or 3 kept); a member of ``g`` killed
  after a target commit is restarted only after a while, so that the
  other group's commits expire the snapshots carrying ``g``'s marks;
* members killed inside the sink's write, before or after the target
  commit, as in :mod:`tests.sim.sink` (a process dies: every member in it).

Members live in processes of one or two members each, which share the
process's sink (one per process, as docs/paimon-sink.md says).

The oracle (:meth:`Afterlife.check`), per group, over the new table's rows:

* a primary-key target holds each key's final state: a key whose last
  change is a delete is absent (``sink_deleted_present``), every other key
  present (``sink_missing``) with its latest version (``sink_value``; not
  on a first-row source);
* an append target holds every row delivered in the group's last life
  (``sink_missing``), each ``(id, v)`` at most once per life of the group
  that delivered it (``sink_duplicate``), with the kind it was delivered with
  (``sink_kind``);
* nothing no handler was delivered (``sink_unreal``);
* every member ran to the end (``sink_member_failed``) and the phase
  settled (``hang``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import random
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from paimon_group import MemberConfig
from paimon_group.errors import AlreadyWritten, StaleSinkWrite
from tests.sim.sink import CommitHooks, SimSink, kind_column
from tests.sim.table import ROW_KIND_KINDS

if TYPE_CHECKING:
    from tests.sim.scenario import Incarnation, Run

OFFSET = {"g": 0, "h": 100_000}
SETTLE_BOUND_S = 60.0
WRITES_S = 12.0  # the writer's commits of the new table come within this


@dataclass(frozen=True)
class AfterPlan:
    on: bool
    start: str
    shards: int
    regroup: int | None  # the shard count the group is re-created with, mid-stream
    regroup_at: float
    parts: bool
    second_group: bool
    retain: int | None  # target snapshots kept after each commit (with a second group)
    crash_rate: float
    # A process's sink commits what its members queued at most once per this
    # many session timeouts (0: each batch at once, in its sealing call).
    interval_timeouts: float = 0.0
    # With batched commits: the chance that a member of a two-member process
    # is paused past its session at a write (its batch is queued after it).
    pause_at_write: float = 0.0

    @classmethod
    def draw(cls, seed: int, sink_on: bool) -> AfterPlan:
        rng = random.Random(f"afterlife:{seed}")
        on = sink_on and rng.random() < 0.5
        start = rng.choice(["latest-full", "earliest"])
        shards = rng.choice([2, 3, 4])
        regroup = rng.choice([None, *[s for s in (2, 3, 4) if s != shards]])
        regroup_at = rng.uniform(2.0, WRITES_S - 2.0)
        parts = rng.random() < 0.5
        second = rng.random() < 1 / 3
        retain = rng.choice([2, 3]) if second else None
        crash_rate = rng.choice([0.05, 0.1, 0.2])
        # Batched commits in a draw of their own (the draws above stay).
        commits = random.Random(f"afterlife-commits:{seed}")
        interval = commits.choice([0.0, 1.0, 2.0, 3.0])
        pause = commits.choice([0.2, 0.4]) if interval else 0.0
        return cls(on, start, shards, regroup, regroup_at, parts, second, retain,
                   crash_rate, interval, pause)


@dataclass
class Proc:
    """A simulated worker process: its members share one sink."""

    number: int
    group: str
    life: int
    shards: int
    sink: SimSink
    incs: list[Incarnation] = field(default_factory=list)
    dead: bool = False
    paused: set[str] = field(default_factory=set)  # members paused at a write


class Afterlife:
    def __init__(self, run: Run, plan: AfterPlan) -> None:
        assert run.sink is not None
        self.run = run
        self.plan = plan
        self.seed = run.seed
        self.sinks = run.sink
        self.row_kinds = run.kind in ROW_KIND_KINDS
        self.procs: list[Proc] = []
        self.deliveries: list[dict[str, Any]] = []
        self.lives: dict[str, int] = {"g": 0}
        self.stats: Counter[str] = Counter()
        self.violations: dict[str, list[str]] = defaultdict(list)
        self.groups = ["g", "h"] if plan.second_group else ["g"]
        self._incarnations = 0
        self._tasks: set[asyncio.Future[Any]] = set()
        self.ran = False
        self._settling = False
        self.log_from: int | None = None  # the run's position log before the phase

    # -- the operator's steps

    async def go(self) -> None:
        run = self.run
        if run.table_fate != "recreate" or not run.group_before_drop:
            self.stats["afterlife_skipped"] += 1
            return
        self.ran = True
        self.stats["afterlife_seeds"] += 1
        # The operator stops the run's processes and their supervisors: a
        # restart of a run's member scheduled before (after a crash in the
        # chaos) never starts it after the delete, in the fresh group.
        run.supervisors_stopped = True
        self.log_from = len(run.store.position_log)
        if not await self._delete_group("g"):
            return
        rng = random.Random(f"afterlife-steps:{self.seed}")
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        commits = sorted(rng.uniform(0.3, WRITES_S) for _ in range(run.wh.remaining))
        for group in self.groups:
            for _ in range(2):
                await self._start_proc(group, self.plan.shards)
        regrouped = self.plan.regroup is None
        for at in commits:
            if not regrouped and at > self.plan.regroup_at:
                regrouped = True
                await self._regroup()
            await asyncio.sleep(max(0.0, t0 + at - loop.time()))
            run.wh.commit()
            self.stats["afterlife_source_commits"] += 1
            live = self._live()
            if live and rng.random() < 0.25:
                victim = rng.choice(live)
                if victim.incs and rng.random() < 0.5:
                    # Paused past its session: its shards go to other members.
                    run.pause(victim.incs[0], rng.uniform(1.2, 3.0) * run.timeout_s)
                    self.stats["afterlife_pauses"] += 1
                else:
                    self.die(victim, rng.uniform(0.1, 2 * run.timeout_s))
        if not regrouped:
            await self._regroup()
        await self._settle()
        await self._stop_all()

    def _background(self, work: Any) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _delete_group(self, group: str) -> bool:
        """``paimon-group delete``, retried while members are live (their
        sessions expire)."""
        from coordinators.protocol import ConnectOptions
        from paimon_group.errors import GroupBusy
        from paimon_group.ops.admin import delete_group
        from paimon_group.ops.report import GroupNotFound
        from paimon_group.protocol.admin import GroupAdmin
        from paimon_group.reading.table import ShardedTable
        from tests.sim.coordinator import SimCoordinator

        table = ShardedTable.open(str(self.run.wh.root), "db.t")
        coord = SimCoordinator(self.run.store, "sim://after/operator/0", ConnectOptions())
        await coord.connect()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        try:
            while True:
                try:
                    await delete_group(GroupAdmin(coord, group), table)
                    self.stats["afterlife_group_deleted"] += 1
                    return True
                except GroupBusy as err:
                    if loop.time() > deadline:
                        self.violations["hang"].append(f"group {group} never deletable: {err}")
                        return False
                    await asyncio.sleep(0.5)
                except GroupNotFound:
                    return True
        finally:
            await coord.close()

    async def _regroup(self) -> None:
        """Every member of ``g`` dies, the operator deletes the group and
        starts it again with another shard count."""
        if self.plan.regroup is None:
            return
        self.lives["g"] += 1  # a restart of the former life's processes is not made
        for proc in [p for p in self._live() if p.group == "g"]:
            self.die(proc, None)
        self.stats["afterlife_regroups"] += 1
        if not await self._delete_group("g"):
            return
        for _ in range(2):
            await self._start_proc("g", self.plan.regroup)

    def _shards(self, group: str) -> int:
        if group == "g" and self.lives["g"] > 0 and self.plan.regroup is not None:
            return self.plan.regroup
        return self.plan.shards

    # -- processes and members

    def _live(self) -> list[Proc]:
        return [p for p in self.procs if not p.dead]

    async def _start_proc(self, group: str, shards: int) -> Proc:
        from tests.sim.scenario import Incarnation
        from tests.sim.sink import TABLE

        number = len(self.procs)
        hooks = _ProcHooks(self, number)
        proc = Proc(number, group, self.lives.get(group, 0), shards,
                    SimSink(self.sinks.warehouse, TABLE, hooks,
                            commit_interval_s=self.plan.interval_timeouts * self.run.timeout_s,
                            plant=self.sinks.plant))
        hooks.proc = proc
        self.procs.append(proc)
        self.stats["afterlife_processes"] += 1
        # Two members in each process of a seed whose members are paused at a
        # write (their shards may go to the process's other member).
        size = random.Random(f"afterlife-proc:{self.seed}:{number}").choice([1, 2]) \
            if not self.plan.pause_at_write else 2
        for k in range(size):
            n = 10_000 + self._incarnations
            self._incarnations += 1
            member_id = f"{group}{number}-{k}"
            run = self.run
            cfg = MemberConfig(
                group=group, warehouse=str(run.wh.root), table="db.t",
                coordinator=f"sim://after/{member_id}/{n}", member_id=member_id,
                shards=shards, start=self.plan.start, poll_interval_ms=500,
                session_timeout_s=run.timeout_s, revoke_timeout_s=run.timeout_s * 1.5,
                shutdown_timeout_s=run.timeout_s * 5, max_handler_attempts=5,
                handler_backoff_s=0.1, max_parallel_shards=2, mirror_interval_s=1.0,
                include_row_kind=self.row_kinds)
            inc = Incarnation(member_id, n, run.member(cfg))
            proc.incs.append(inc)
            try:
                await inc.member.start()
            except Exception as err:
                inc.start_error = err
                inc.stopped = True
                self.stats["afterlife_start_failed"] += 1
                continue
            if proc.dead:
                run.kill(inc)
                continue
            inc.task = asyncio.create_task(inc.member.run(self._handler(proc, inc)),
                                           name=f"after-{member_id}")
        return proc

    def die(self, proc: Proc, restart_after: float | None) -> None:
        """The process dies (every member in it); its supervisor starts it
        again after ``restart_after`` seconds (None: not)."""
        if proc.dead:
            return
        proc.dead = True
        proc.sink.kill()  # its committer and its queue die with it
        self.stats["afterlife_process_deaths"] += 1
        for inc in proc.incs:
            inc.crashed = True
            self.run.kill(inc)
        if restart_after is not None:
            life = proc.life

            async def again() -> None:
                await asyncio.sleep(restart_after)
                if self.lives.get(proc.group, 0) == life:
                    await self._start_proc(proc.group, proc.shards)

            self._background(again())

    def _handler(self, proc: Proc, inc: Incarnation) -> Any:
        async def handle(batch: Any) -> None:
            if proc.dead:
                await asyncio.Event().wait()
            rows = batch.to_arrow()
            kinds = rows.column("_row_kind").to_pylist() if "_row_kind" in rows.column_names \
                else ["+I"] * rows.num_rows
            self.deliveries.append({
                "group": proc.group, "life": proc.life, "member": inc.member_id,
                "shard": batch.shard, "snapshot": batch.snapshot_id, "kind": batch.kind.value,
                "ids": rows.column("id").to_pylist(), "vs": rows.column("v").to_pylist(),
                "kinds": kinds})
            out = self._output(proc.group, rows)
            for row in zip(out.column("id").to_pylist(), out.column("v").to_pylist(),
                           strict=True):
                self.sinks.foreign[row].add((proc.group, proc.life))
            paused = self._maybe_pause(proc, inc)
            for part in self._parts(out, batch, inc):
                self._write(proc, part, batch)
            if paused:
                await self._until_taken_over(proc, batch)

        return handle

    def _maybe_pause(self, proc: Proc, inc: Incarnation) -> bool:
        """With batched commits, a member of a two-member process may be paused
        past its session as it writes (once per member): its batch is queued
        in the process's sink while the other member may become the shard's
        owner and queue its own batch of the shard there (two owners of one
        shard in one commit)."""
        if not self.plan.pause_at_write or self._settling or len(proc.incs) < 2 \
                or inc.member_id in proc.paused:
            return False
        rng = random.Random(f"afterlife-pause:{self.seed}:{inc.number}:{len(proc.paused)}:"
                            f"{self.stats['afterlife_writes']}")
        if rng.random() < self.plan.pause_at_write:
            proc.paused.add(inc.member_id)
            self.run.pause(inc, rng.uniform(1.2, 3.0) * self.run.timeout_s)
            self.stats["afterlife_pauses_at_write"] += 1
            return True
        return False

    async def _until_taken_over(self, proc: Proc, batch: Any) -> None:
        """The paused member's handler, its batch's parts written, waits on
        its downstream until another member of the process writes a batch of
        the same shard into the process's sink (the shard's new owner, once
        the paused member's session expired), or four session timeouts: then
        it returns, and the member seals its batch while the new owner's is
        open or queued in the same sink."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 4 * self.run.timeout_s
        while loop.time() < deadline and not proc.dead:
            if proc.sink.holds_newer(batch.group, batch.shard, batch.epoch):
                self.stats["afterlife_taken_over_at_write"] += 1
                return
            await asyncio.sleep(0.05)

    def _output(self, group: str, rows: pa.Table) -> pa.Table:
        ids = [i + OFFSET[group] for i in rows.column("id").to_pylist()]
        cols: dict[str, pa.Array] = {"id": pa.array(ids, pa.int64()),
                                     "v": rows.column("v").combine_chunks()}
        if "_row_kind" in rows.column_names:
            cols["_row_kind"] = rows.column("_row_kind").combine_chunks()
        if self.sinks.plan.partitioned:
            from tests.sim.sink import PARTS

            cols["p"] = pa.array([i % PARTS for i in ids], pa.int64())
        return pa.table(cols)

    def _parts(self, out: pa.Table, batch: Any, inc: Incarnation) -> list[pa.Table]:
        if not self.plan.parts or out.num_rows < 2:
            return [out]
        rng = random.Random(f"afterlife-parts:{self.seed}:{inc.number}:{batch.shard}:"
                            f"{batch.snapshot_id}")
        n = min(out.num_rows, rng.choice([2, 3]))
        cuts = sorted(rng.sample(range(1, out.num_rows), n - 1))
        bounds = [0, *cuts, out.num_rows]
        self.stats["afterlife_batches_in_parts"] += 1
        return [out.slice(a, b - a) for a, b in itertools.pairwise(bounds)]

    def _write(self, proc: Proc, rows: pa.Table, batch: Any) -> None:
        """One part of ``batch``'s output into the process's sink (its files;
        the member commits them with the batch's other parts once the
        handler returned: the crash points are there, :class:`_ProcHooks`)."""
        try:
            proc.sink.write(rows, batch)
            self.stats["afterlife_writes"] += 1
        except AlreadyWritten:
            self.stats["afterlife_already_written"] += 1
            raise
        except StaleSinkWrite:
            self.stats["afterlife_stale_refused"] += 1
            raise

    def crash_point(self, proc: Proc, writes: list[Any]) -> str | None:
        """Where (if anywhere) ``proc`` dies committing ``writes``: a draw per
        batch, while the writer commits."""
        if self._settling:
            return None
        points = set()
        for p in writes:
            rng = random.Random(f"afterlife-crash:{self.seed}:{proc.number}:{p.shard}:"
                                f"{p.snapshot_id}:{p.epoch}:{p.rows}")
            r = rng.random()
            points.add("before" if r < self.plan.crash_rate / 2 else
                       "after" if r < self.plan.crash_rate else None)
        return "before" if "before" in points else "after" if "after" in points else None

    def restart_after(self, proc: Proc) -> float:
        """How long a process killed at a sink commit stays down: a member of
        g, in a seed with two groups, while the other group commits (its
        marks expire)."""
        if self.plan.retain is not None and proc.group == "g":
            return 4 * self.run.timeout_s + 4.0
        return random.Random(f"afterlife-restart:{self.seed}:{proc.number}").uniform(
            0.1, 2 * self.run.timeout_s)

    def expire_target(self, retain: int) -> None:
        from tests.sim.sink import TABLE
        from tests.support.tables import expire_snapshots, latest_snapshot_id

        latest = latest_snapshot_id(self.sinks.warehouse, TABLE)
        if latest is not None and latest - retain + 1 > 1:
            expire_snapshots(self.sinks.warehouse, TABLE, keep_from=latest - retain + 1)
            self.stats["afterlife_target_expiries"] += 1

    # -- settle and stop

    def _positions(self, group: str) -> dict[int, int]:
        import json

        out = {}
        for e in self.run.store.list(f"groups/{group}/positions/"):
            data = json.loads(e.value)
            if data.get("full_scan") is None:
                out[int(e.key.rsplit("/", 1)[1])] = int(data["next_snapshot"])
        return out

    async def _settle(self) -> None:
        self._settling = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SETTLE_BOUND_S
        latest = self.run.wh.committed
        while True:
            behind = {}
            for group in self.groups:
                positions = self._positions(group)
                for shard in range(self._shards(group)):
                    if positions.get(shard) != latest + 1:
                        behind[f"{group}/{shard}"] = positions.get(shard)
            if any(self._failed()):
                return
            if not behind:
                self.stats["afterlife_settled_after_s"] = round(
                    loop.time() - (deadline - SETTLE_BOUND_S), 3)
                return
            if loop.time() > deadline:
                self.violations["hang"].append(
                    f"the group started again on the re-created table did not settle within "
                    f"{SETTLE_BOUND_S:.0f}s: positions behind {behind} (latest {latest})")
                return
            for group in self.groups:
                life = self.lives.get(group, 0)
                if not [p for p in self._live() if p.group == group and p.life == life]:
                    await self._start_proc(group, self._shards(group))
            await asyncio.sleep(0.25)

    def _failed(self) -> list[str]:
        out = []
        for proc in self.procs:
            for inc in proc.incs:
                if inc.crashed or inc.start_error is not None:
                    continue
                err = inc.member.error
                task = inc.task
                if err is None and task is not None and task.done() and not task.cancelled():
                    err = task.exception()
                if err is not None:
                    out.append(f"{inc.member_id}: {type(err).__name__}: {err}")
        return out

    async def _stop_all(self) -> None:
        for proc in self._live():
            for inc in proc.incs:
                if inc.crashed or inc.start_error is not None:
                    continue
                inc.stopped = True
                with contextlib.suppress(Exception):
                    await inc.member.stop()
                if inc.task is not None:
                    inc.task.cancel()
                    with contextlib.suppress(BaseException):
                        await inc.task
        for task in list(self._tasks):
            task.cancel()

    def close(self) -> None:
        for proc in self.procs:
            proc.sink.close(timeout=5)

    # -- the oracle

    def check(self) -> dict[str, list[str]]:
        found: dict[str, list[str]] = defaultdict(list)
        found.update({k: list(v) for k, v in self.violations.items()})
        if not self.ran:
            return found
        if os.environ.get("PG_SIM_DUMP"):
            self._dump()
        failed = self._failed()
        if failed:
            found["sink_member_failed"].extend(failed[:5])
        out = self.sinks.read()
        column = kind_column(self.sinks.plan)
        kinds_col = column if column in out.column_names else None
        rows = list(zip(out.column("id").to_pylist(), out.column("v").to_pylist(),
                        out.column(kinds_col).to_pylist() if kinds_col
                        else [None] * out.num_rows, strict=True))
        self.stats["afterlife_target_rows"] += len(rows)
        self.stats["afterlife_two_owners_in_a_commit"] += sum(
            p.sink.two_owners_in_a_commit for p in self.procs)
        for group in self.groups:
            off = OFFSET[group]
            mine = [(i - off, v, k) for i, v, k in rows if off + 1000 <= i < off + 100_000]
            if self.sinks.plan.pk:
                self._check_pk(group, mine, found)
            else:
                self._check_append(group, mine, kinds_col is not None, found)
        return found

    def _dump(self) -> None:
        """What the operator's steps delivered, and the new table's changes
        (``PG_SIM_DUMP=1``)."""
        t = self.run.wh.recreated
        print("afterlife: the new table's changes (snapshot: id op v)")
        for n in range(1, self.run.wh.committed + 1):
            print(f"  {n}: " + " ".join(f"{i}{t.ops.get(n, {}).get(i, '+I')}{t.values[n]}"
                                        for i in t.ids.get(n, [])))
        for d in self.deliveries:
            print(f"  deliv {d['group']} life {d['life']} {d['member']} shard {d['shard']} "
                  f"snap {d['snapshot']} {d['kind']} "
                  f"{list(zip(d['ids'], d['vs'], d['kinds'], strict=True))}")

    def _truth(self) -> dict[int, tuple[str, int]]:
        """Each key's last change in the new table as committed: (kind, v)."""
        t = self.run.wh.recreated
        last: dict[int, tuple[str, int]] = {}
        first: dict[int, tuple[str, int]] = {}
        for n in range(1, self.run.wh.committed + 1):
            for i in t.ids.get(n, []):
                change = (t.ops.get(n, {}).get(i, "+I"), t.values[n])
                last[i] = change
                first.setdefault(i, change)
        return first if self.run.kind == "first-row" else last

    def _check_pk(self, group: str, mine: list[tuple[int, int, Any]],
                  found: dict[str, list[str]]) -> None:
        truth = self._truth()
        have: dict[int, set[int]] = defaultdict(set)
        for i, v, _k in mine:
            have[i].add(v)
        deleted = sorted(i for i, (op, _v) in truth.items() if op == "-D" and i in have)
        excused = self._deleted_before_the_start(group, deleted, have)
        self.stats["afterlife_deleted_before_the_start"] += len(excused)
        deleted = [i for i in deleted if i not in excused]
        if deleted:
            found["sink_deleted_present"].append(
                f"group {group}: {len(deleted)} keys deleted from the source are in the "
                f"primary-key target, e.g. {[(i, sorted(have[i])) for i in deleted[:6]]}")
        missing = sorted(i for i, (op, _v) in truth.items() if op != "-D" and i not in have)
        if missing:
            found["sink_missing"].append(
                f"group {group} on the re-created table: {len(missing)} keys not in the "
                f"{self.sinks.plan.target} target, e.g. {missing[:10]}{self._why(group, missing)}")
        if self.run.kind != "first-row":
            bad = [f"key {i}: v={sorted(have[i])}, not {v}" for i, (op, v) in
                   sorted(truth.items()) if op != "-D" and i in have and v not in have[i]]
            if bad:
                found["sink_value"].append(f"group {group}: {bad[:6]}")
        unreal = sorted(set(have) - set(truth))
        if unreal:
            found["sink_unreal"].append(f"group {group}: keys {unreal[:10]} not in the source")

    def _deleted_before_the_start(self, group: str, deleted: list[int],
                                  have: dict[int, set[int]]) -> set[int]:
        """The keys of ``deleted`` (in the target, deleted from the source)
        whose delete no life of ``group`` could write: the group's last life
        starts with a full scan of a snapshot at or after the key's delete
        (a full scan holds no deleted key, and its deltas come after it), and
        each of the key's values in the target was delivered before that
        life (by an earlier life, or for ``g`` by the run's members reading
        the re-created table before they noticed it), whose owner did not
        write the delete before the group was deleted."""
        last = self.lives.get(group, 0)
        starts = [d["snapshot"] for d in self.deliveries
                  if d["group"] == group and d["life"] == last and d["kind"] == "initial"]
        if not starts or not deleted:
            return set()
        start = min(starts)
        before: dict[int, set[int]] = defaultdict(set)
        earlier = [d for d in self.deliveries if d["group"] == group and d["life"] < last]
        if group == "g":
            earlier += [d for d in self.run.deliveries if any(i >= 1000 for i in d["ids"])]
        for d in earlier:
            for i, v in zip(d["ids"], d["vs"], strict=True):
                before[i].add(v)
        t = self.run.wh.recreated
        changed = {i: n for n in range(1, self.run.wh.committed + 1) for i in t.ids.get(n, [])}
        return {i for i in deleted if changed[i] <= start and have[i] <= before[i]}

    def _check_append(self, group: str, mine: list[tuple[int, int, Any]], kinds: bool,
                      found: dict[str, list[str]]) -> None:
        delivered: dict[tuple[int, int], set[int]] = defaultdict(set)
        kind_of: dict[tuple[int, int], str] = {}
        last = self.lives.get(group, 0)
        for d in self.deliveries:
            if d["group"] != group:
                continue
            for i, v, k in zip(d["ids"], d["vs"], d["kinds"], strict=True):
                delivered[(i, v)].add(d["life"])
                if k == "-D" or (i, v) not in kind_of:
                    kind_of[(i, v)] = k
        # Rows of the new table the first run's members delivered (and wrote)
        # before they noticed the re-create: in the target once more.
        early = {(i, v) for d in self.run.deliveries for i, v in zip(d["ids"], d["vs"],
                                                                     strict=True)
                 if i >= 1000} if group == "g" else set()
        count = Counter((i, v) for i, v, _k in mine)
        twice = sorted(r for r, n in count.items()
                       if n > max(1, len(delivered.get(r, ()))) + (r in early))
        if twice:
            found["sink_duplicate"].append(
                f"group {group}: {len(twice)} rows (id, v) twice or more in the append target, "
                f"e.g. {twice[:8]}")
        unreal = sorted(set(count) - set(delivered) - early)
        if unreal:
            found["sink_unreal"].append(f"group {group}: rows {unreal[:8]} never delivered")
        missing = sorted(r for r, lives in delivered.items() if last in lives and r not in count)
        if missing:
            found["sink_missing"].append(
                f"group {group} on the re-created table: {len(missing)} delivered rows not in "
                f"the append target, e.g. {missing[:10]}"
                f"{self._why(group, [i for i, _v in missing])}")
        if kinds:
            wrong = sorted((i, v, k, kind_of[(i, v)]) for i, v, k in mine
                           if (i, v) in kind_of and (k == "-D") != (kind_of[(i, v)] == "-D")
                           and not ((i, v) in early and k == "+I"))
            if wrong:
                found["sink_kind"].append(
                    f"group {group}: {len(wrong)} rows with another kind than delivered "
                    f"(id, v, in the target, delivered), e.g. {wrong[:6]}")

    def _why(self, group: str, ids: list[int]) -> str:
        notes = []
        for i in ids[:3]:
            ds = [f"{d['member']} life {d['life']} shard {d['shard']} snap {d['snapshot']} "
                  f"{d['kind']}" for d in self.deliveries if d["group"] == group
                  and i in d["ids"]]
            notes.append(f"id {i} delivered by {ds[:4]}")
        marks = self.procs[-1].sink.marks(group) if self.procs else {}
        return f"; {'; '.join(notes)}; marks {marks}"


class _ProcHooks(CommitHooks):
    """A process's sink's hooks: its crash points, the target's expiry after
    each commit (with a second group), its statistics."""

    def __init__(self, after: Afterlife, number: int) -> None:
        self.after = after
        self.number = number
        self.proc: Proc | None = None

    def point(self, writes: list[Any]) -> str | None:
        assert self.proc is not None
        return self.after.crash_point(self.proc, writes)

    def die(self, point: str) -> None:
        assert self.proc is not None
        self.after.stats[f"afterlife_crash_{point}_commit"] += 1
        self.after.die(self.proc, self.after.restart_after(self.proc))

    def committed(self, writes: list[Any]) -> None:
        stats = self.after.stats
        stats["afterlife_commits"] += 1
        stats["afterlife_batches_committed"] += len(writes)
        if len(writes) > 1:
            stats["afterlife_commits_of_several_batches"] += 1
        if self.after.plan.retain is not None:
            self.after.expire_target(self.after.plan.retain)

    def judged(self, pending: Any, verdict: Any) -> None:
        kind = getattr(verdict, "kind", None)
        self.after.stats[f"afterlife_commit_{kind or 'error'}"] += 1
