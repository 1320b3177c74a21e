"""The simulated coordinator backend, and the fault-injecting wrapper of any backend.

:class:`SimStore` is one coordinator server of one simulated run: a
linearizable key-value store with the semantics of the embedded backend
(``coordinators/sqlite.py``): one global revision counter (create versions
only grow, the fencing epoch), ephemeral keys bound to a session, sessions
that the server ends ``timeout`` after their last renewal (reaped at the next
operation or renewal, as SQLite's writers do), checks evaluated atomically
with the writes, and level-triggered watches of a directory. It is pure
asyncio (no thread, no I/O), so under :class:`tests.sim.loop.SimLoop` every
operation takes no virtual time and its order is decided by the seed alone.

:class:`SimCoordinator` is one client connection (one session) to it, with a
keep-alive task renewing the session every quarter of the timeout; the local
deadline moves to the send time of the last acknowledged renewal plus the
timeout, as every real backend's does (invariant 3).

:class:`FaultyCoordinator` wraps a :class:`~coordinators.protocol.Coordinator`
(every method of the protocol: ``connect``, ``close``, ``get``, ``list``,
``create``, ``commit``, ``delete``, ``watch``) and, per call, asks a
:class:`FaultPlan` what goes wrong. The plan is a pure function of
``(seed, member, call index)``. Requests travel through a FIFO pipe per
connection (a session's requests are applied in the order they were sent,
as ZooKeeper guarantees and as the embedded backend's single executor
does; the group protocol relies on it, see ``GroupClient._lowers``); a
request may be held in the pipe, applied late, or not at all. The faults:

==================  ==========================================================
``unavailable``     not applied; raises ``CoordinatorUnavailable``
``locked``          not applied; raises ``CoordinatorUnavailable`` (SQLite's
                    "database is locked")
``suspended``       not applied; raises ``SessionSuspended`` (ZooKeeper while
                    its connection is down)
``applied_raised``  applied, then raises ``CoordinatorUnavailable`` (a reply
                    lost after the write landed)
``timeout_late``    raises ``CoordinatorUnavailable`` after a client timeout
                    while the request is still in the pipe; it is applied
                    later, before anything sent after it (an etcd Txn timeout)
``delay_request``   the request is held in the pipe (and all behind it)
``delay_reply``     applied at once, the reply comes late
``session_suspend`` from this call on, renewals fail for a while: SUSPENDED,
                    and LOST when the server's timeout runs out meanwhile
``session_expire``  the server ends the session now (a coordinator whose clock
                    ran ahead, or that was paused); the client learns it at its
                    next renewal
``watch_spurious``  a watch wakes up with nothing changed (allowed by the
                    protocol)
``watch_late``      a watch reports a change late
==================  ==========================================================

A watch never misses a change (the protocol does not allow it).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import random
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from coordinators.errors import (
    CoordinatorError,
    CoordinatorUnavailable,
    SessionLost,
    SessionSuspended,
)
from coordinators.protocol import (
    Check,
    ConnectOptions,
    Coordinator,
    Entry,
    Op,
    Put,
    Session,
    SessionState,
    Watch,
    validate_dir,
    validate_key,
)


def dir_of(key: str) -> str:
    head, sep, _ = key.rpartition("/")
    return head + sep


@dataclass
class _Row:
    value: bytes
    version: int
    create_version: int
    session: str | None


@dataclass
class PositionWrite:
    """A position as it was applied by the store (the ground truth of the run)."""

    shard: int
    epoch: int
    member: str
    next_snapshot: int
    full_scan: int | None
    fence: int | None  # the create version the commit checked on the owner key
    owner_create_version: int | None  # the owner key's create version when applied
    t: float
    start_moves: int = 0  # the moves of the group start the position derives from


class SimStore:
    """One simulated coordinator server (see the module docstring)."""

    def __init__(self) -> None:
        self.kv: dict[str, _Row] = {}
        self.revision = 0
        self.sessions: dict[str, float] = {}  # session id -> expiry (virtual monotonic)
        self.dir_revision: dict[str, int] = {}
        self._changed = asyncio.Event()
        self.position_log: list[PositionWrite] = []
        self._session_seq = 0
        # A planted fault, for the test that the checks can fail: accept one
        # commit whose fence is stale (see tests/sim/test_sim.py).
        self.plant_stale_accept = False
        self.planted_hits = 0
        # Called with each position write as it is applied (the run's
        # expiry under a start just pinned, tests.sim.expiry).
        self.on_position: Callable[[PositionWrite], None] | None = None
        # The group's start as created: (instant, next_snapshot, full_scan).
        self.start_log: list[tuple[float, int, int | None]] = []
        self.group_created_at: float | None = None

    # -- sessions

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    def open_session(self, timeout_s: float) -> str:
        self._session_seq += 1
        sid = f"s{self._session_seq}"
        self.sessions[sid] = self.now() + timeout_s
        return sid

    def renew(self, sid: str, timeout_s: float) -> bool:
        self.reap()
        if sid not in self.sessions:
            return False
        self.sessions[sid] = self.now() + timeout_s
        return True

    def end_session(self, sid: str) -> None:
        if self.sessions.pop(sid, None) is None:
            return
        doomed = [k for k, row in self.kv.items() if row.session == sid]
        if doomed:
            rev = self._next_revision()
            for key in doomed:
                del self.kv[key]
                self._touch(key, rev)

    def reap(self) -> None:
        now = self.now()
        for sid, expiry in sorted(self.sessions.items()):
            if expiry < now:
                self.end_session(sid)

    # -- data

    def _next_revision(self) -> int:
        self.revision += 1
        return self.revision

    def _touch(self, key: str, rev: int) -> None:
        self.dir_revision[dir_of(key)] = rev
        self._changed.set()
        self._changed = asyncio.Event()

    def _entry(self, key: str, row: _Row) -> Entry:
        return Entry(key, row.value, row.version, row.create_version, row.session is not None)

    def get(self, key: str) -> Entry | None:
        row = self.kv.get(key)
        return None if row is None else self._entry(key, row)

    def list(self, prefix: str) -> list[Entry]:
        return [self._entry(k, r) for k, r in sorted(self.kv.items()) if dir_of(k) == prefix]

    def create(self, key: str, value: bytes, session: str | None) -> Entry | str | None:
        self.reap()
        if key in self.kv:
            return None
        if session is not None and session not in self.sessions:
            return "lost"
        rev = self._next_revision()
        row = _Row(value, rev, rev, session)
        self.kv[key] = row
        self._touch(key, rev)
        if key.count("/") == 1 and self.group_created_at is None:  # groups/<g>
            self.group_created_at = self.now()
        if key.endswith("/start") and key.count("/") == 2:  # groups/<g>/start
            data = json.loads(value)
            self.start_log.append((self.now(), int(data["next_snapshot"]), data.get("full_scan")))
        return self._entry(key, row)

    def _holds(self, check: Check) -> bool:
        row = self.kv.get(check.key)
        if check.absent:
            return row is None
        if row is None:
            return False
        if check.create_version is not None:
            return row.create_version == check.create_version
        return row.version == check.version

    def commit(self, checks: Sequence[Check], ops: Sequence[Op]) -> bool:
        self.reap()
        if not all(self._holds(c) for c in checks):
            if not (self.plant_stale_accept and self.planted_hits == 0
                    and any("/positions/" in op.key for op in ops if isinstance(op, Put))):
                return False
            self.planted_hits += 1  # the planted fault: a stale fence accepted once
        fences = {c.key: c.create_version for c in checks if c.create_version is not None}
        rev = self._next_revision() if ops else 0
        for op in ops:
            if isinstance(op, Put):
                if "/positions/" in op.key:
                    self._log_position(op, fences)
                if op.key.endswith("/start") and op.key.count("/") == 2:  # a moved start
                    data = json.loads(op.value)
                    self.start_log.append((self.now(), int(data["next_snapshot"]),
                                           data.get("full_scan")))
                old = self.kv.get(op.key)
                if old is None:
                    self.kv[op.key] = _Row(bytes(op.value), rev, rev, None)
                else:
                    old.value, old.version = bytes(op.value), rev
                self._touch(op.key, rev)
            elif self.kv.pop(op.key, None) is not None:
                self._touch(op.key, rev)
        return True

    def _log_position(self, op: Put, fences: dict[str, int | None]) -> None:
        data = json.loads(op.value)
        shard = int(op.key.rsplit("/", 1)[1])
        owner_key = op.key.replace("/positions/", "/owners/")
        owner = self.kv.get(owner_key)
        self.position_log.append(PositionWrite(
            shard=shard, epoch=int(data["epoch"]), member=str(data["member_id"]),
            next_snapshot=int(data["next_snapshot"]), full_scan=data.get("full_scan"),
            fence=fences.get(owner_key),
            owner_create_version=None if owner is None else owner.create_version,
            t=self.now(), start_moves=int(data.get("start_moves") or 0)))
        if self.on_position is not None:
            self.on_position(self.position_log[-1])

    def delete(self, key: str) -> bool:
        self.reap()
        if self.kv.pop(key, None) is None:
            return False
        self._touch(key, self._next_revision())
        return True

    async def changed(self, timeout: float | None) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout)


class SimSession(Session):
    def __init__(self, sid: str, timeout_s: float, sent_at: float,
                 clock: Callable[[], float]) -> None:
        super().__init__(timeout_s, sent_at=sent_at)
        self._id = sid
        self._clock = clock  # the loop's virtual clock, the deadline's too

    def is_live(self, margin_s: float = 0.0, *, now: float | None = None) -> bool:
        return super().is_live(margin_s, now=self._clock() if now is None else now)

    @property
    def id(self) -> str:
        return self._id

    def mark(self, state: SessionState) -> None:
        self._set_state(state)


class SimCoordinator(Coordinator):
    """One connection to a :class:`SimStore`, holding one session."""

    scheme = "sim"

    def __init__(self, store: SimStore, url: str, options: ConnectOptions) -> None:
        self.store = store
        self._url = url
        self._timeout_s = float(options.session_timeout_s)
        self._session: SimSession | None = None
        self._keepalive: asyncio.Task[None] | None = None
        self._closed = False
        self.suspended_until = -1.0  # renewals fail before this instant

    @property
    def session(self) -> SimSession:
        if self._session is None:
            raise CoordinatorError(f"{self!r} is not connected")
        return self._session

    @property
    def url(self) -> str:
        return self._url

    async def connect(self) -> None:
        loop = asyncio.get_running_loop()
        sent_at = loop.time()
        sid = self.store.open_session(self._timeout_s)
        self._session = SimSession(sid, self._timeout_s, sent_at, loop.time)
        self._keepalive = asyncio.create_task(self._renew_loop(), name=f"sim-keepalive-{sid}")

    async def _renew_loop(self) -> None:
        session = self.session
        loop = asyncio.get_running_loop()
        while not self._closed:
            await asyncio.sleep(self._timeout_s / 4)
            sent_at = loop.time()
            if sent_at < self.suspended_until:
                session.mark(SessionState.SUSPENDED)
                continue
            if not self.store.renew(session.id, self._timeout_s):
                session.mark(SessionState.LOST)
                return
            session.confirmed(sent_at)
            session.mark(SessionState.CONNECTED)

    def crash(self) -> None:
        """The process died: no more renewals (requests in flight still land)."""
        if self._keepalive is not None:
            self._keepalive.cancel()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._keepalive is not None:
            self._keepalive.cancel()
        if self._session is not None:
            self.store.end_session(self._session.id)
            self._session.mark(SessionState.LOST)

    def end_store_session(self) -> None:
        """End this coordinator's session in the store (its keys go, as on an
        expiry), without telling the coordinator; nothing without a session."""
        if self._session is not None:
            self.store.end_session(self._session.id)

    def _check_open(self) -> None:
        if self._closed:
            raise CoordinatorError(f"{self!r} is closed")

    async def get(self, key: str) -> Entry | None:
        self._check_open()
        return self.store.get(validate_key(key))

    async def list(self, prefix: str) -> list[Entry]:
        self._check_open()
        return self.store.list(validate_dir(prefix))

    async def create(self, key: str, value: bytes, *, ephemeral: bool = False) -> Entry | None:
        self._check_open()
        validate_key(key)
        session = self.session
        if ephemeral and session.state is SessionState.LOST:
            raise SessionLost(f"session {session.id} is lost")
        result = self.store.create(key, bytes(value), session.id if ephemeral else None)
        if isinstance(result, str):
            session.mark(SessionState.LOST)
            raise SessionLost(f"session {session.id} expired")
        return result

    async def commit(self, checks: Sequence[Check], ops: Sequence[Op]) -> bool:
        self._check_open()
        return self.store.commit(list(checks), list(ops))

    async def delete(self, key: str) -> bool:
        self._check_open()
        return self.store.delete(validate_key(key))

    def watch(self, prefix: str, *, values: bool = True,
              children: Collection[str] | None = None) -> Watch:
        self._check_open()
        return _SimWatch(self.store, validate_dir(prefix))


class _SimWatch(Watch):
    def __init__(self, store: SimStore, prefix: str) -> None:
        self._store = store
        self._prefix = prefix
        self._seen = store.dir_revision.get(prefix, 0)
        self._closed = False

    async def wait(self, timeout: float | None = None) -> bool:
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            if self._closed:
                raise CoordinatorError(f"watch on {self._prefix!r} is closed")
            current = self._store.dir_revision.get(self._prefix, 0)
            if current > self._seen:
                self._seen = current
                return True
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                return False
            await self._store.changed(remaining)

    async def close(self) -> None:
        self._closed = True


# ----------------------------------------------------------------- faults

FAULT_KINDS = (
    "unavailable", "locked", "suspended", "applied_raised", "timeout_late",
    "delay_request", "delay_reply", "session_suspend", "session_expire",
    "watch_spurious", "watch_late",
)
_WRITES = ("create", "commit", "delete")


def unit(*key: object) -> float:
    """A uniform number in [0, 1) that is a pure function of ``key`` (stable
    across processes and hash seeds; cheaper than seeding a ``Random``)."""
    digest = hashlib.blake2b(repr(key).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


@dataclass
class Fault:
    kind: str | None
    delay: float = 0.0


@dataclass
class FaultPlan:
    """What goes wrong at a member's n-th coordinator call: a pure function of
    ``(seed, member, n)`` (``random.Random`` seeded with a string is stable
    across processes and hash seeds)."""

    seed: int
    rate: float  # the chance that a call gets a fault
    timeout_s: float
    enabled: bool = True
    counts: Counter[str] = field(default_factory=Counter)

    def decide(self, member: str, index: int, method: str) -> Fault:
        if not self.enabled or self.rate <= 0:
            return Fault(None)
        if unit(self.seed, member, index) >= self.rate:
            return Fault(None)
        rng = random.Random(f"{self.seed}:{member}:{index}")
        if method == "watch":
            kinds = ["watch_spurious", "watch_late"]
        elif method in _WRITES:
            kinds = ["unavailable", "locked", "applied_raised", "applied_raised",
                     "timeout_late", "timeout_late", "delay_request", "delay_reply",
                     "session_suspend", "session_expire"]
            if method == "create":
                kinds.append("suspended")
        else:  # get, list
            kinds = ["unavailable", "locked", "delay_request", "delay_reply",
                     "session_suspend"]
        kind = rng.choice(kinds)
        if kind == "session_expire" and rng.random() < 0.7:
            kind = "session_suspend"  # expiries are rarer
        # Mostly short delays; sometimes past the session timeout.
        scale = self.timeout_s * (2.5 if rng.random() < 0.2 else 0.4)
        return Fault(kind, delay=rng.random() * scale)


class MemberCalls:
    """Per member: the index of its next coordinator call (across its sessions)."""

    def __init__(self, member: str) -> None:
        self.member = member
        self.next = 0

    def take(self) -> int:
        self.next += 1
        return self.next - 1


class FaultyCoordinator(Coordinator):
    """Wraps every method of a coordinator with the faults of a :class:`FaultPlan`."""

    def __init__(self, inner: Coordinator, plan: FaultPlan, calls: MemberCalls) -> None:
        self.inner = inner
        self.plan = plan
        self.calls = calls
        self.scheme = inner.scheme
        self._queue: asyncio.Queue[tuple[float, Any, asyncio.Future[Any]]] | None = None
        self._pipe: asyncio.Task[None] | None = None
        self._pipe_free_at = 0.0
        self._pending: set[asyncio.Future[Any]] = set()
        self._closed = False

    @property
    def session(self) -> Session:
        return self.inner.session

    @property
    def url(self) -> str:
        return self.inner.url

    def crash(self) -> None:
        crash = getattr(self.inner, "crash", None)
        if crash is not None:
            crash()

    def fault_for(self, method: str) -> Fault:
        fault = self.plan.decide(self.calls.member, self.calls.take(), method)
        if fault.kind is not None:
            self.plan.counts[fault.kind] += 1
        return fault

    # -- the pipe: a connection's requests are applied in the order they were sent

    async def _pipe_loop(self) -> None:
        assert self._queue is not None
        loop = asyncio.get_running_loop()
        while True:
            arrival, thunk, result = await self._queue.get()
            wait = arrival - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            try:
                value = await thunk()
            except BaseException as err:
                if not result.done():
                    result.set_exception(err)
                else:
                    result.exception()  # nobody waits for it any more
            else:
                if not result.done():
                    result.set_result(value)

    def _send(self, thunk: Any, delay: float = 0.0) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        if self._queue is None:
            self._queue = asyncio.Queue()
            self._pipe = loop.create_task(self._pipe_loop(), name="sim-pipe")
        arrival = max(loop.time() + delay, self._pipe_free_at)
        self._pipe_free_at = arrival
        result: asyncio.Future[Any] = loop.create_future()
        # A caller cancelled while its request is in the pipe does not stop
        # it: the request was sent.
        result.add_done_callback(lambda f: None if f.cancelled() else f.exception())
        self._pending.add(result)
        result.add_done_callback(self._pending.discard)
        self._queue.put_nowait((arrival, thunk, result))
        return result

    async def _call(self, method: str, thunk: Any, *, write: bool) -> Any:
        if self._closed:
            # As every real backend does (and SimCoordinator behind us): a
            # call on a closed coordinator fails at once, not retriable. Sent
            # into the pipe, whose task close() cancelled, it was never
            # answered: its caller hung for ever (seed 17462).
            raise CoordinatorError(f"{self!r} is closed")
        fault = self.fault_for(method)
        kind = fault.kind
        if kind in ("unavailable", "locked"):
            await asyncio.sleep(fault.delay / 4)
            word = "database is locked" if kind == "locked" else "no answer"
            raise CoordinatorUnavailable(f"sim: {method} failed, not applied ({word})")
        if kind == "suspended":
            raise SessionSuspended(f"sim: {method} while the connection is down")
        if kind == "session_suspend":
            self._suspend(fault.delay)
        if kind == "session_expire":
            with contextlib.suppress(CoordinatorError):
                self.inner_store_end_session()
        delay = fault.delay if kind in ("delay_request", "timeout_late") else 0.0
        result = self._send(thunk, delay)
        if kind == "timeout_late":
            # The client gives up before the held request lands.
            await asyncio.sleep(fault.delay / 2)
            raise CoordinatorUnavailable(f"sim: {method} timed out (it may still land)")
        value = await asyncio.shield(result)
        if kind == "delay_reply":
            await asyncio.sleep(fault.delay)
        if kind == "applied_raised":
            raise CoordinatorUnavailable(f"sim: {method} applied, then the reply was lost")
        return value

    def _suspend(self, duration: float) -> None:
        inner = self.inner
        if isinstance(inner, SimCoordinator):
            now = asyncio.get_running_loop().time()
            inner.suspended_until = max(inner.suspended_until, now + duration)

    def inner_store_end_session(self) -> None:
        inner = self.inner
        if isinstance(inner, SimCoordinator):
            inner.end_store_session()

    # -- the protocol

    async def connect(self) -> None:
        fault = self.fault_for("connect")
        if fault.kind in ("unavailable", "locked"):
            raise CoordinatorUnavailable("sim: connect failed")
        await self.inner.connect()

    async def close(self) -> None:
        self._closed = True
        await self.inner.close()
        if self._pipe is not None:
            self._pipe.cancel()
        # Requests still in the pipe never get an answer on this connection:
        # their callers learn it as a real client would, with an error whose
        # outcome is unknown (here: never applied).
        for result in list(self._pending):
            if not result.done():
                result.set_exception(CoordinatorUnavailable(
                    "sim: connection closed with the request in flight"))
        self._pending.clear()

    async def get(self, key: str) -> Entry | None:
        result: Entry | None = await self._call("get", lambda: self.inner.get(key), write=False)
        return result

    async def list(self, prefix: str) -> list[Entry]:
        result: list[Entry] = await self._call("list", lambda: self.inner.list(prefix),
                                               write=False)
        return result

    async def create(self, key: str, value: bytes, *, ephemeral: bool = False) -> Entry | None:
        result: Entry | None = await self._call(
            "create", lambda: self.inner.create(key, value, ephemeral=ephemeral), write=True)
        return result

    async def commit(self, checks: Sequence[Check], ops: Sequence[Op]) -> bool:
        checks, ops = list(checks), list(ops)
        result: bool = await self._call("commit", lambda: self.inner.commit(checks, ops),
                                        write=True)
        return result

    async def delete(self, key: str) -> bool:
        result: bool = await self._call("delete", lambda: self.inner.delete(key), write=True)
        return result

    def watch(self, prefix: str, *, values: bool = True,
              children: Collection[str] | None = None) -> Watch:
        return _FaultyWatch(self, self.inner.watch(prefix, values=values, children=children))


class _FaultyWatch(Watch):
    def __init__(self, owner: FaultyCoordinator, inner: Watch) -> None:
        self._owner = owner
        self._inner = inner

    async def wait(self, timeout: float | None = None) -> bool:
        fault = self._owner.fault_for("watch")
        if fault.kind == "watch_spurious":
            await asyncio.sleep(min(fault.delay, timeout or fault.delay) / 4)
            return True
        changed = await self._inner.wait(timeout)
        if changed and fault.kind == "watch_late":
            await asyncio.sleep(fault.delay / 4)
        return changed

    async def close(self) -> None:
        await self._inner.close()

