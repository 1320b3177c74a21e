"""Real :class:`~paimon_group.GroupMember` objects for the large-group benchmarks.

Members run their control loops without reading (as the Spark source drives
them; with ``reading=True``, as ``paimon-group run`` does: each reads its
shards with a handler that drops the rows), several per process, over as
many worker processes (``multiprocessing`` spawn context) as the machine has
cores. The benchmark process drives them
through pipes (:class:`MemberPool`) and observes the group with a
:class:`GroupWatcher` of its own.

Each worker counts the requests its members' coordinators make (``get``,
``get_many``, ``list``, ``create``, ``commit``, ``delete``; not keep-alives or
watch streams) and, on ``measure``, reports them with its process CPU time
(every thread: the event loop, the coordinator clients' threads) over a
window. ``join`` and ``leave`` answer with the CLOCK_MONOTONIC time at which
``start()`` / ``stop()`` was called (comparable across the processes of one
host), before the call returns, so a measurement starts at the event itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import cProfile
import logging
import multiprocessing
import os
import resource
import time
from collections import Counter
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

COUNTED = ("get", "get_many", "list", "create", "commit", "delete")
REPLY_LIMIT_S = 600.0


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _threads() -> int:
    """The process's threads, as the kernel counts them (the coordinator
    clients' native threads too)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    return 0


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _count_requests(calls: Counter[str]) -> None:
    """Wrap every member's coordinator so that its requests are counted."""
    from paimon_group.member.membership import Membership

    real_open = Membership.connect_coordinator

    async def open_counting(self: Membership) -> Any:
        coord = await real_open(self)
        for name in COUNTED:
            real = getattr(coord, name)

            def counting(real: Any = real, name: str = name) -> Any:
                async def call(*args: Any, **kwargs: Any) -> Any:
                    calls[name] += 1
                    return await real(*args, **kwargs)
                return call

            setattr(coord, name, counting())
        return coord

    Membership.connect_coordinator = open_counting  # type: ignore[method-assign]


def _worker(conn: Connection, settings: dict[str, Any]) -> None:
    """Runs members in this process; answers the pool's commands in order."""
    from coordinators.errors import CoordinatorError
    from paimon_group import GroupMember, MemberConfig
    from paimon_group.member.state import MemberState

    calls: Counter[str] = Counter()
    _count_requests(calls)
    # Hundreds of members each warn alike (a table with rows in one shard, a
    # world-writable test chroot): only errors are worth a line here.
    for name in ("paimon_group", "coordinators"):
        logging.getLogger(name).setLevel(logging.ERROR)
    history = settings.get("history_dir")
    reading = bool(settings.get("reading"))
    runs: dict[str, asyncio.Task[None]] = {}

    def member(name: str) -> GroupMember:
        return GroupMember(MemberConfig(
            group=settings["group"], warehouse=settings["warehouse"], table=settings["table"],
            tables=tuple(settings["tables"]), coordinator=settings["url"], member_id=name,
            shards=settings["shards"],
            session_timeout_s=settings["session_timeout_s"], mirror_interval_s=3600.0,
            history_path=f"{history}/history-{name}.jsonl" if history else None,
        ), auto_commit=reading)

    async def start(name: str) -> GroupMember:
        # An overloaded server (1,000 members on a shared machine) may let a
        # session lapse while a member joins; as a supervisor would, start it
        # again rather than lose the worker.
        for attempt in range(3):
            m = member(name)
            try:
                await m.start()
                if reading:
                    runs[name] = asyncio.ensure_future(m.run(lambda batch: None))
                return m
            except CoordinatorError:
                if attempt == 2:
                    raise
                await asyncio.sleep(1.0)
        raise AssertionError("unreachable")

    restarts: list[str] = []

    async def supervise(members: dict[str, GroupMember]) -> None:
        # A member that failed after its start (a rejoin whose new session
        # lapsed again on an overloaded machine) is started again under its
        # name, as a process supervisor (Kubernetes) restarts a pod.
        while True:
            await asyncio.sleep(1.0)
            for name, m in list(members.items()):
                if m.state is MemberState.FAILED and members.get(name) is m:
                    with contextlib.suppress(Exception):
                        await m.stop()
                    restarts.append(name)
                    members[name] = await start(name)

    async def main() -> None:
        members: dict[str, GroupMember] = {}
        profile: cProfile.Profile | None = None
        profile_path = ""
        loop = asyncio.get_running_loop()
        supervisor = asyncio.ensure_future(supervise(members))
        conn.send("ready")  # imported: the pool's clock may start
        while True:
            op, arg = await loop.run_in_executor(None, conn.recv)
            if op == "quit":
                break
            if op == "start":  # several at once, answered when all have started
                for i in range(0, len(arg), 20):
                    started = await asyncio.gather(*(start(n) for n in arg[i:i + 20]))
                    members.update(zip(arg[i:i + 20], started, strict=True))
                conn.send("started")
            elif op == "join":
                members[arg] = member(arg)
                conn.send(time.monotonic())
                await members[arg].start()
            elif op == "leave":
                conn.send(time.monotonic())
                if (task := runs.pop(arg, None)) is not None:
                    task.cancel()
                await members.pop(arg).stop()
            elif op == "measure":
                before, cpu0, t0 = Counter(calls), _cpu_s(), time.monotonic()
                await asyncio.sleep(float(arg))
                conn.send({"cpu_s": _cpu_s() - cpu0, "window_s": time.monotonic() - t0,
                           "calls": dict(calls - before), "threads": _threads(),
                           "rss_mb": _rss_mb()})
            elif op == "calls":
                conn.send(dict(calls))
            elif op == "cpu":
                conn.send(_cpu_s())
            elif op == "restarts":
                conn.send(list(restarts))
            elif op == "profile":  # a path: profile from now; None: write it there
                if arg is not None:
                    profile, profile_path = cProfile.Profile(), arg
                    profile.enable()
                elif profile is not None:
                    profile.disable()
                    profile.dump_stats(profile_path)
                    profile = None
                conn.send("ok")
        supervisor.cancel()
        for task in runs.values():
            task.cancel()
        await asyncio.gather(*runs.values(), return_exceptions=True)
        await asyncio.gather(*(m.stop() for m in members.values()), return_exceptions=True)

    asyncio.run(main())
    conn.send("stopped")


class MemberPool:
    """Worker processes running real members of one group (see the module docstring)."""

    def __init__(self, *, url: str, warehouse: str, table: str, group: str, shards: int | None,
                 session_timeout_s: float = 10.0, processes: int | None = None,
                 history_dir: Path | None = None, tables: tuple[str, ...] = (),
                 reading: bool = False) -> None:
        self.settings = {
            "url": url, "warehouse": warehouse, "table": table, "tables": tables, "group": group,
            "shards": shards, "session_timeout_s": session_timeout_s, "reading": reading,
            "history_dir": str(history_dir) if history_dir else None,
        }
        self.processes = processes or os.cpu_count() or 1
        context = multiprocessing.get_context("spawn")
        self.pipes: list[Connection] = []
        self.procs: list[Any] = []
        self.home: dict[str, int] = {}  # member -> worker index
        self._profiles: list[Path] = []
        for _ in range(self.processes):
            parent, child = context.Pipe()
            proc = context.Process(target=_worker, args=(child, self.settings), daemon=True)
            proc.start()
            self.pipes.append(parent)
            self.procs.append(proc)
        # A worker imports the member's modules (pyarrow, pypaimon, grpc) as
        # it starts: wait for that, so that a start measured from now is the
        # members' start, not the processes'.
        for w, pipe in enumerate(self.pipes):
            if not pipe.poll(REPLY_LIMIT_S) or pipe.recv() != "ready":
                raise RuntimeError(f"worker {w} did not start")

    def _ask(self, worker: int, op: str, arg: Any) -> Any:
        pipe = self.pipes[worker]
        pipe.send((op, arg))
        if not pipe.poll(REPLY_LIMIT_S):
            raise RuntimeError(f"worker {worker} did not answer {op!r}")
        return pipe.recv()

    def start(self, names: list[str]) -> None:
        """Start ``names`` spread evenly over the workers; return once all have started."""
        for w in range(self.processes):
            share = names[w::self.processes]
            self.home.update(dict.fromkeys(share, w))
            self.pipes[w].send(("start", share))
        for w, pipe in enumerate(self.pipes):
            if not pipe.poll(REPLY_LIMIT_S) or pipe.recv() != "started":
                raise RuntimeError(f"worker {w} did not start its members")

    def join(self, name: str) -> float:
        """Start one more member (on the least loaded worker); when start() was called."""
        counts = Counter(self.home.values())
        worker = min(range(self.processes), key=lambda w: counts[w])
        self.home[name] = worker
        called: float = self._ask(worker, "join", name)
        return called

    def leave(self, name: str) -> float:
        """Stop (graceful leave) one member; when stop() was called."""
        called: float = self._ask(self.home.pop(name), "leave", name)
        return called

    def measure(self, window_s: float) -> dict[str, Any]:
        """CPU and requests of every worker over the same window, summed."""
        for pipe in self.pipes:
            pipe.send(("measure", window_s))
        results = [pipe.recv() for pipe in self.pipes]
        calls: Counter[str] = Counter()
        for r in results:
            calls.update(r["calls"])
        return {"window_s": max(r["window_s"] for r in results),
                "cpu_s": sum(r["cpu_s"] for r in results), "calls": dict(calls),
                "threads": [r["threads"] for r in results],
                "rss_mb": [r["rss_mb"] for r in results]}

    def cpu_s(self) -> float:
        """CPU time used so far by every worker (all their threads)."""
        return sum(self._ask(w, "cpu", None) for w in range(self.processes))

    def restarts(self) -> list[str]:
        """The members started again after they failed, in every worker."""
        return [n for w in range(self.processes) for n in self._ask(w, "restarts", None)]

    def requests(self) -> int:
        """Requests made so far by every member of every worker."""
        return sum(sum(self._ask(w, "calls", None).values()) for w in range(self.processes))

    def profile(self, directory: Path | None) -> list[Path]:
        """Profile every worker (cProfile) from now (``directory``), or stop
        and write ``directory/worker-N.prof`` (None); the files written."""
        paths = [] if directory is None else [directory / f"worker-{w}.prof"
                                             for w in range(self.processes)]
        if directory is not None:
            directory.mkdir(parents=True, exist_ok=True)
        for w in range(self.processes):
            self._ask(w, "profile", str(paths[w]) if paths else None)
        if directory is None:
            return self._profiles
        self._profiles = paths
        return paths

    def close(self) -> None:
        for pipe in self.pipes:
            try:
                pipe.send(("quit", None))
            except OSError:
                pass
        for pipe in self.pipes:
            try:
                if pipe.poll(120):
                    pipe.recv()
            except (OSError, EOFError):
                pass
        for proc in self.procs:
            proc.join(30)
            if proc.is_alive():
                proc.kill()


class GroupWatcher:
    """The benchmark's own view of a group: when it is stable.

    Stable: the published assignment names exactly the expected members
    (some with no shard when they outnumber the shards), covers every shard,
    and every shard's owner key is held by its assigned member. Checked at
    every change of the group record or of the owner keys (its own watches);
    the time returned is when the check that found the group stable had
    finished reading (an upper bound of the moment).
    """

    def __init__(self, url: str, group: str, shards: int) -> None:
        self.url, self.group_name, self.shards = url, group, shards
        self.generations: dict[int, float] = {}  # generation -> when first seen

    async def __aenter__(self) -> GroupWatcher:
        from coordinators.registry import open_coordinator
        from paimon_group.protocol.group import GroupClient

        self.coord = open_coordinator(self.url)
        await self.coord.connect()
        self.group = GroupClient(self.coord, self.group_name)
        self.watches = [self.coord.watch(self.group.keys.dir),
                        self.coord.watch(self.group.keys.owners_dir, values=False)]
        return self

    async def __aexit__(self, *exc: object) -> None:
        for w in self.watches:
            await w.close()
        await self.coord.close()

    async def leader(self) -> str | None:
        got = await self.group.leader()
        return got[0] if got else None

    async def check(self, members: set[str]) -> bool:
        assignment, _ = await self.group.read_assignment()
        if assignment is None:
            return False
        self.generations.setdefault(assignment.generation, time.monotonic())
        # Every member named (one may have no shard when they outnumber the shards).
        wanted = {m: s for m, s in assignment.shards.items() if s}
        if (set(assignment.shards) != members
                or sum(len(s) for s in wanted.values()) != self.shards):
            return False
        owners = await self.group.owners()
        return len(owners) == self.shards and all(
            owners.get(s) is not None and owners[s].member_id == m
            for m, shards in wanted.items() for s in shards)

    async def wait_stable(self, members: set[str], limit_s: float) -> float:
        """CLOCK_MONOTONIC when the group was found stable with ``members``."""
        from coordinators.errors import CoordinatorError

        deadline = time.monotonic() + limit_s
        while True:
            try:
                if await self.check(members):
                    return time.monotonic()
            except CoordinatorError:  # a server too busy to answer in time: look again
                await asyncio.sleep(0.5)
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"group not stable with {len(members)} members "
                                   f"after {limit_s:.0f} s")
            waiters = [asyncio.ensure_future(w.wait(min(left, 1.0))) for w in self.watches]
            try:
                await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waiters:
                    w.cancel()
                await asyncio.gather(*waiters, return_exceptions=True)
