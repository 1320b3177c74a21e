"""(6) Coordinator scale: 200 simulated members and 2,048 shards in one
process against a real etcd (no table): time to a stable assignment after a
join and after a leave, and etcd requests per second at steady state.

Each simulated member is what ``GroupMember``'s control loop does, without
reading: its own etcd session (lease + keep-alive thread), the same three
watches (group dir, members, owners), and on every wake-up (or every
``session_timeout / 4``) the same reconcile (a wake-up by owner changes alone,
or by member changes on a follower, only retries pending acquisitions, as in
``GroupMember``): become leader if there is none;
as leader, compute :func:`paimon_group.protocol.assignor.assign` and publish it
(guarded by the leader epoch); release shards no longer ours (fenced); create
the owner keys of shards newly ours. Requests are counted by wrapping every
coordinator, and on the server from etcd's ``grpc_server_msg_received_total``
(which also counts lease keep-alives and watch requests).

Stable = the published assignment names exactly the live members, and every
member holds the owner key of exactly its assigned shards.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import urllib.request
from collections import Counter
from typing import Any

from coordinators.base import ConnectOptions, Coordinator
from coordinators.errors import CoordinatorError
from coordinators.registry import open_coordinator
from paimon_group.protocol.assignor import assign
from paimon_group.protocol.group import GroupClient
from paimon_group.protocol.records import Assignment, MemberInfo
from tests.benchmarks.common import Context, Figure

TITLE = "coordinator"
SESSION_TIMEOUT_S = 10.0
CALLS: Counter[str] = Counter()
WAKES: Counter[str] = Counter()


class CountingCoordinator:
    """Delegates to a coordinator, counting every request by method."""

    def __init__(self, inner: Coordinator) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def get(self, key: str) -> Any:
        CALLS["get"] += 1
        return await self.inner.get(key)

    async def list(self, prefix: str) -> Any:
        CALLS["list"] += 1
        return await self.inner.list(prefix)

    async def create(self, key: str, value: bytes, *, ephemeral: bool = False) -> Any:
        CALLS["create"] += 1
        return await self.inner.create(key, value, ephemeral=ephemeral)

    async def commit(self, checks: Any, ops: Any) -> bool:
        CALLS["commit"] += 1
        return await self.inner.commit(checks, ops)

    async def delete(self, key: str) -> bool:
        CALLS["delete"] += 1
        return await self.inner.delete(key)

    def watch(self, prefix: str, *, values: bool = True) -> Any:
        CALLS["watch"] += 1
        return self.inner.watch(prefix, values=values)


class SimMember:
    def __init__(self, url: str, group: str, member_id: str, num_shards: int) -> None:
        self.url, self.group_name, self.member_id = url, group, member_id
        self.num_shards = num_shards
        self.owned: dict[int, int] = {}  # shard -> epoch
        self.assignment: Assignment | None = None
        self.leader_epoch: int | None = None
        self.coord: Coordinator | None = None
        self.group: GroupClient | None = None
        self.task: asyncio.Task[None] | None = None
        self.wake = asyncio.Event()
        self.watches: list[Any] = []
        self.full_round_at = -1e18

    async def join(self) -> None:
        coord = open_coordinator(self.url, ConnectOptions(session_timeout_s=SESSION_TIMEOUT_S))
        await coord.connect()
        self.coord = coord
        self.group = GroupClient(CountingCoordinator(coord), self.group_name)  # type: ignore[arg-type]
        await self.group.ensure_meta(self.num_shards, "db.sim")
        keys = self.group.keys
        self.watches = [self.group.coordinator.watch(d)
                        for d in (keys.dir, keys.members_dir, keys.owners_dir)]
        await self.group.register(MemberInfo(member_id=self.member_id, host="sim", pid=0,
                                             version="sim", started_at=time.time(),
                                             session=coord.session.id))
        self.task = asyncio.create_task(self.loop())

    async def loop(self) -> None:
        fired: list[str] = ["start"]
        while True:
            with contextlib.suppress(CoordinatorError):
                recent = time.monotonic() - self.full_round_at < SESSION_TIMEOUT_S / 4
                if recent and (fired == ["wake:owners"] or (
                        set(fired) <= {"wake:owners", "wake:members"}
                        and self.leader_epoch is None)):
                    # As GroupMember: an owner change alone, or a member change
                    # on a follower, only retries the acquisitions still
                    # waiting for a previous owner.
                    await self.acquire_pending()
                else:
                    self.full_round_at = time.monotonic()
                    await self.reconcile()
            waiters = [asyncio.ensure_future(w.wait(SESSION_TIMEOUT_S / 4))
                       for w in self.watches]
            waiters.append(asyncio.ensure_future(self.wake.wait()))
            try:
                done, _ = await asyncio.wait(waiters, timeout=SESSION_TIMEOUT_S / 4,
                                             return_when=asyncio.FIRST_COMPLETED)
                names = ("wake:group-dir", "wake:members", "wake:owners", "wake:local")
                fired = [n for n, w in zip(names, waiters, strict=True)
                         if w in done and w.result()]
                fired = fired or ["wake:timeout"]
                for name in fired:
                    WAKES[name] += 1
            finally:
                for w in waiters:
                    w.cancel()
                self.wake.clear()

    async def reconcile(self) -> None:
        group = self.group
        assert group is not None
        leader = await group.leader()
        if leader is None:
            self.leader_epoch = await group.try_lead(self.member_id)
        elif leader != (self.member_id, self.leader_epoch):
            self.leader_epoch = None
        if self.leader_epoch is not None:
            members = sorted(await group.members())
            previous, version = await group.read_assignment()
            wanted = assign(self.num_shards, members, previous.shards if previous else None)
            if previous is None or {k: sorted(v) for k, v in previous.shards.items()} != wanted:
                if await group.publish(wanted, leader=self.member_id,
                                       leader_epoch=self.leader_epoch, previous=previous,
                                       previous_version=version) is None:
                    self.wake.set()
        assignment, _ = await group.read_assignment()
        if assignment is not None:
            self.assignment = assignment
        target = set(self.assignment.shards_of(self.member_id)) if self.assignment else set()
        for shard in [s for s in self.owned if s not in target]:
            await group.release(shard, self.owned.pop(shard))
        await self.acquire_pending()

    async def acquire_pending(self) -> None:
        group = self.group
        assert group is not None
        target = set(self.assignment.shards_of(self.member_id)) if self.assignment else set()
        for shard in sorted(target - set(self.owned)):
            epoch = await group.acquire(shard, self.member_id,
                                        self.assignment.generation if self.assignment else 0)
            if epoch is not None:
                self.owned[shard] = epoch

    async def leave(self) -> None:
        assert self.group is not None and self.coord is not None
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(BaseException):
                await self.task
        await self.group.deregister(self.member_id)
        for shard, epoch in list(self.owned.items()):
            await self.group.release(shard, epoch)
        self.owned.clear()
        if self.leader_epoch is not None:
            await self.group.resign(self.leader_epoch)
        await self.close()

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(BaseException):
                await self.task
        for w in self.watches:
            with contextlib.suppress(Exception):
                await w.close()
        if self.coord is not None:
            with contextlib.suppress(Exception):
                await self.coord.close()


def stable(members: list[SimMember], num_shards: int) -> bool:
    live = {m.member_id for m in members}
    latest = max((m.assignment for m in members if m.assignment is not None),
                 key=lambda a: a.generation, default=None)
    if latest is None or {k for k, v in latest.shards.items()} != live:
        return False
    held = 0
    for m in members:
        if set(m.owned) != set(latest.shards_of(m.member_id)):
            return False
        held += len(m.owned)
    return held == num_shards


async def wait_stable(members: list[SimMember], num_shards: int, timeout: float) -> float:
    began = time.monotonic()
    while not stable(members, num_shards):
        if time.monotonic() - began > timeout:
            latest = max((m.assignment for m in members if m.assignment is not None),
                         key=lambda a: a.generation, default=None)
            behind = [(m.member_id, sorted(set(m.owned) ^ set(latest.shards_of(m.member_id)))
                       if latest else None,
                       m.coord.session.state.value if m.coord else None)
                      for m in members
                      if latest is None or set(m.owned) != set(latest.shards_of(m.member_id))]
            raise TimeoutError(f"not stable after {timeout:.0f} s: generation "
                               f"{latest.generation if latest else None}, "
                               f"{len(behind)} members behind, e.g. {behind[:5]}")
        await asyncio.sleep(0.02)
    return time.monotonic() - began


def server_messages(endpoint: str) -> float:
    with urllib.request.urlopen(f"http://{endpoint}/metrics", timeout=10) as response:
        text = response.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("grpc_server_msg_received_total{"))


async def scenario(url: str, endpoint: str, n: int, num_shards: int, window_s: float
                   ) -> dict[str, Any]:
    group = "sim"
    members = [SimMember(url, group, f"sim-{i:03d}", num_shards) for i in range(n)]
    result: dict[str, Any] = {}
    try:
        began = time.monotonic()
        for i in range(0, n, 20):
            await asyncio.gather(*(m.join() for m in members[i:i + 20]))
        result["bootstrap_s"] = round(await wait_stable(members, num_shards, 600)
                                      + (time.monotonic() - began) * 0, 2)
        result["bootstrap_total_s"] = round(time.monotonic() - began, 2)
        await asyncio.sleep(2.0)

        CALLS.clear()
        WAKES.clear()
        before = server_messages(endpoint)
        await asyncio.sleep(window_s)
        result["steady_client_requests_per_s"] = round(sum(CALLS.values()) / window_s, 1)
        result["steady_by_method_per_s"] = {k: round(v / window_s, 1) for k, v in CALLS.items()}
        result["steady_wakes_per_s"] = {k: round(v / window_s, 1) for k, v in WAKES.items()}
        result["steady_server_messages_per_s"] = round(
            (server_messages(endpoint) - before) / window_s, 1)

        joiner = SimMember(url, group, f"sim-{n:03d}", num_shards)
        CALLS.clear()
        t0 = time.monotonic()
        await joiner.join()
        members.append(joiner)
        result["join_s"] = round(await wait_stable(members, num_shards, 120)
                                 + (time.monotonic() - t0) * 0, 3)
        result["join_total_s"] = round(time.monotonic() - t0, 3)
        result["join_requests"] = sum(CALLS.values())
        await asyncio.sleep(2.0)

        leaver = members[n // 2]
        CALLS.clear()
        t0 = time.monotonic()
        members.remove(leaver)
        await leaver.leave()
        await wait_stable(members, num_shards, 120)
        result["leave_s"] = round(time.monotonic() - t0, 3)
        result["leave_requests"] = sum(CALLS.values())
    finally:
        await asyncio.gather(*(m.close() for m in members), return_exceptions=True)
    return result


def run(ctx: Context) -> list[Figure]:
    n, shards = (50, 512) if ctx.quick else (200, 2048)
    server = ctx.etcd()
    window = 5.0 if ctx.quick else 10.0
    r = asyncio.run(scenario(server.url_with_prefix(), server.endpoint, n, shards, window))
    label = f"{n} members, {shards} shards"
    return [
        Figure(TITLE, f"{label}: join -> stable assignment", r["join_total_s"], "s",
               target="< 5 s", met=r["join_total_s"] < 5.0, details=r),
        Figure(TITLE, f"{label}: leave -> stable assignment", r["leave_s"], "s",
               target="< 5 s", met=r["leave_s"] < 5.0, details=r),
        Figure(TITLE, f"{label}: steady-state requests (client API)",
               r["steady_client_requests_per_s"], "req/s", details=r),
        Figure(TITLE, f"{label}: steady-state messages at etcd (incl. keep-alives, watches)",
               r["steady_server_messages_per_s"], "msg/s", details=r),
        Figure(TITLE, f"{label}: initial start of all members -> stable",
               r["bootstrap_total_s"], "s", details=r),
    ]
