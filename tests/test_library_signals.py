"""A worker in the README's library form (``async with GroupMember(...)`` /
``async for batch in member.batches()`` under ``asyncio.run``, no signal code:
tests/support/library_worker.py) stops gracefully on SIGTERM and on SIGINT.

Two real worker processes share a group (a real table, the SQLite
coordinator, a 30 s session so that a handoff that waited for the session
would show); one is signalled: the other holds its shards within a second or
so (measured: the survivor's acquisition, from its ``on_assigned``, after the
signal was sent), and the signalled one ends its ``batches()``, leaves, and
exits 0 with no traceback.

In one process (the test's, an in-memory coordinator): the members of one
loop share the handlers and a signal stops each; the handlers found come back
after the last; a handler of the program's own and ``handle_signals=False``
are left alone.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from paimon_group import GroupMember, MemberConfig
from tests.support.tables import make_pk_table, write_rows

SHARDS = [0, 1, 2, 3]
HANDOFF_LIMIT_S = 5.0
"""Generous against the measured ~0.1 s; the session (30 s) is far above it."""


def _default_sigint() -> None:
    # As in a terminal: SIGINT not ignored (a shell's background jobs ignore it).
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Worker:
    def __init__(self, base: Path, wh: Path, coordinator: str, name: str) -> None:
        self.out, self.err = base / f"{name}.out", base / f"{name}.err"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.library_worker", str(wh), coordinator, name],
            stdout=self.out.open("w"), stderr=self.err.open("w"), preexec_fn=_default_sigint)

    def events(self) -> list[dict[str, Any]]:
        lines = self.out.read_text().splitlines()
        return [json.loads(line) for line in lines if line.endswith("}")]

    def held(self, after: float = 0.0) -> set[int]:
        """The shards held now, by the listener's calls (those after ``after``
        only add)."""
        shards: set[int] = set()
        for e in self.events():
            if "assigned" in e:
                shards |= set(e["assigned"])
            for gone in ("revoked", "lost"):
                shards -= set(e.get(gone, []))
        return shards

    def wait_for(self, check: Any, what: str, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            assert self.proc.poll() is None, (what, self.err.read_text()[-3000:])
            assert time.monotonic() < deadline, (what, self.out.read_text(),
                                                 self.err.read_text()[-3000:])
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signalled_library_worker_hands_its_shards_off_and_exits_0(
        tmp_path: Path, sig: signal.Signals) -> None:
    wh = tmp_path / "wh"
    make_pk_table(str(wh), "db.t", buckets=len(SHARDS))
    write_rows(str(wh), "db.t", range(40))
    coordinator = f"sqlite://{tmp_path}/coordinator.sqlite"
    first = Worker(tmp_path, wh, coordinator, "first")
    workers = [first]
    try:
        first.wait_for(lambda: first.held() == set(SHARDS)
                       and sum(e.get("rows", 0) for e in first.events()) == 40, "all rows read")
        second = Worker(tmp_path, wh, coordinator, "second")
        workers.append(second)
        second.wait_for(lambda: len(second.held()) == 2 and len(first.held()) == 2,
                        "the shards split")
        moving = first.held()

        signalled_at = time.time()
        first.proc.send_signal(sig)
        deadline = time.monotonic() + 60
        while second.held() != set(SHARDS) and time.monotonic() < deadline:
            time.sleep(0.02)
        acquired = [e["t"] for e in second.events()
                    if moving <= set(e.get("assigned", [])) and e["t"] > signalled_at]
        handoff = (acquired[0] if acquired else time.time()) - signalled_at
        code = first.proc.wait(timeout=30)
        stderr = first.err.read_text()
        print(f"{sig.name}: shards {sorted(moving)} held by the survivor {handoff:.3f} s "
              f"after the signal; exit {code}")
        assert handoff < HANDOFF_LIMIT_S, (handoff, code, stderr[-2000:])
        assert code == 0, stderr[-3000:]
        assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr[-3000:]
        events = first.events()
        assert "left" in events[-1] and set(events[-2].get("revoked", [])) == moving, events
        second.proc.send_signal(signal.SIGTERM)
        assert second.proc.wait(timeout=30) == 0, second.err.read_text()[-3000:]
    finally:
        for w in workers:
            w.stop()


def _config(wh: Path, coordinator: str, member: str) -> MemberConfig:
    return MemberConfig(group="lib", warehouse=str(wh), table="db.t", coordinator=coordinator,
                        member_id=member, session_timeout_s=30, poll_interval_ms=50)


async def _read_all(member: GroupMember, rows: list[int], all_read: asyncio.Event) -> None:
    async for batch in member.batches():
        rows.extend(batch.to_arrow().column("id").to_pylist())
        if len(rows) >= 40:
            all_read.set()


@pytest.mark.asyncio
async def test_one_signal_stops_every_library_member_of_the_loop(tmp_path: Path) -> None:
    wh = tmp_path / "wh"
    make_pk_table(str(wh), "db.t", buckets=len(SHARDS))
    write_rows(str(wh), "db.t", range(40))
    coordinator = f"memory://lib-{os.getpid()}-{time.monotonic_ns()}"
    before = signal.getsignal(signal.SIGTERM)
    rows: list[int] = []
    all_read = asyncio.Event()
    async with GroupMember(_config(wh, coordinator, "a")) as a, \
            GroupMember(_config(wh, coordinator, "b")) as b:
        assert signal.getsignal(signal.SIGTERM) is not before  # taken: safe to send
        readers = [asyncio.ensure_future(_read_all(m, rows, all_read)) for m in (a, b)]
        await asyncio.wait_for(all_read.wait(), timeout=60)
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.wait_for(asyncio.gather(*readers), timeout=30)  # batches() ended
        assert a.state.value in ("leaving", "stopped") and b.state.value in ("leaving", "stopped")
    assert a.state.value == b.state.value == "stopped"
    assert sorted(rows) == list(range(40))
    assert signal.getsignal(signal.SIGTERM) is before


def _own_handler(signum: int, frame: object) -> None:
    raise AssertionError("not sent")


@pytest.mark.asyncio
@pytest.mark.parametrize("own", [True, False], ids=["own-handler", "handle_signals=False"])
async def test_a_program_s_own_signals_are_left_alone(tmp_path: Path, own: bool) -> None:
    wh = tmp_path / "wh"
    make_pk_table(str(wh), "db.t", buckets=2)
    coordinator = f"memory://lib-{os.getpid()}-{time.monotonic_ns()}"
    previous = signal.signal(signal.SIGTERM, _own_handler if own else signal.SIG_DFL)
    try:
        expected = signal.getsignal(signal.SIGTERM)
        async with GroupMember(_config(wh, coordinator, "a"), handle_signals=own):
            assert signal.getsignal(signal.SIGTERM) is expected
        assert signal.getsignal(signal.SIGTERM) is expected
    finally:
        signal.signal(signal.SIGTERM, previous)


@pytest.mark.asyncio
async def test_a_signal_during_the_join_stops_the_member_once_it_has_joined(
    tmp_path: Path,
) -> None:
    """SIGTERM while ``async with`` is still joining: the join is not torn in
    the middle; the member stops as soon as it returns, its ``batches()``
    ends, it leaves the group holding nothing (a later member reads every
    row it did not), and the handlers found come back."""
    wh = tmp_path / "wh"
    make_pk_table(str(wh), "db.t", buckets=len(SHARDS))
    write_rows(str(wh), "db.t", range(40))
    coordinator = f"memory://lib-{os.getpid()}-{time.monotonic_ns()}"
    before = signal.getsignal(signal.SIGTERM)
    member = GroupMember(_config(wh, coordinator, "a"))
    seen: list[str] = []

    async def signal_while_joining() -> None:
        while member.state.value != "joining":  # noqa: ASYNC110 (no event for it)
            await asyncio.sleep(0)
        seen.append(member.state.value)
        os.kill(os.getpid(), signal.SIGTERM)

    sender = asyncio.ensure_future(signal_while_joining())
    rows: list[int] = []
    async with member:
        assert sender.done() and seen == ["joining"]
        async def read() -> None:
            async for batch in member.batches():
                rows.extend(batch.to_arrow().column("id").to_pylist())
        await asyncio.wait_for(read(), timeout=30)  # ends: the signal's stop
    assert member.state.value == "stopped"
    assert signal.getsignal(signal.SIGTERM) is before
    # It left holding nothing: a new member takes every shard at once.
    async with GroupMember(_config(wh, coordinator, "b"), handle_signals=False) as b:
        got: list[int] = []
        async def read_b() -> None:
            async for batch in b.batches():
                got.extend(batch.to_arrow().column("id").to_pylist())
                if len(set(got) | set(rows)) >= 40:
                    return
        await asyncio.wait_for(read_b(), timeout=30)
    assert set(got) | set(rows) == set(range(40))
