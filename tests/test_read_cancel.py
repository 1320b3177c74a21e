"""A cancelled read loop ends: the cancel is never lost (a hang of the tests
that stop a member after giving up its batch iterator, 1 run in 7-14).

``batches()`` and ``run()`` end by cancelling the read loop and waiting for
it. Each round of the loop waited for the session gate through
``asyncio.wait_for``; on Python 3.11 ``wait_for`` returns the result, and
drops the cancel, when the cancel reaches it just as the awaited gate is
done. The loop then went on reading, and the iterator's close waited for it
for ever (the caller's ``stop()`` came only after that close). Here the cancel
is sent from inside the gate as it returns: that moment, every time.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from coordinators import open_coordinator
from paimon_group import GroupMember, MemberConfig
from paimon_group.member.state import SessionGate
from tests.support.tables import make_pk_table, write_rows


@pytest.mark.asyncio
async def test_a_read_loop_cancelled_as_its_session_gate_opens_ends(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wh = str(tmp_path / "wh")
    make_pk_table(wh, "db.t", buckets=2)
    write_rows(wh, "db.t", range(10))
    url = f"memory://read-cancel-{uuid.uuid4().hex}"
    cfg = MemberConfig(group="g", warehouse=wh, table="db.t", coordinator=url,
                       member_id="a", session_timeout_s=3, poll_interval_ms=50)
    real_wait_live = SessionGate.wait_live
    armed = asyncio.Event()
    sent: list[asyncio.Task[object]] = []

    async def wait_live(self: SessionGate, *, for_commit: bool = False) -> None:
        await real_wait_live(self, for_commit=for_commit)
        if armed.is_set() and not for_commit:
            # The read loop's consumer goes away (batches() closed, run()
            # cancelled): it cancels the read loop, now, as the gate opens.
            armed.clear()
            read = next(t for t in asyncio.all_tasks() if t.get_name() == "pg-read")
            read.cancel()
            sent.append(read)

    monkeypatch.setattr(SessionGate, "wait_live", wait_live)
    # Another connection keeps the in-memory database while the member has none.
    async with open_coordinator(url), GroupMember(cfg) as member:
        batches = member.batches()
        got: set[int] = set()
        following: asyncio.Future[object] | None = None
        try:
            while len(got) < 10:
                batch = await asyncio.wait_for(batches.__anext__(), timeout=30)
                got.update(batch.to_arrow().column("id").to_pylist())
            # Asking for the next batch lets the read loop go on (the last
            # one is committed); the table is idle: it waits for a snapshot.
            following = asyncio.ensure_future(batches.__anext__())
            await asyncio.sleep(0.2)
            armed.set()  # the next round's gate
            for _ in range(200):
                if sent:
                    break
                await asyncio.sleep(0.05)
            assert sent, "the read loop never waited for its session gate again"
            done, _ = await asyncio.wait(sent, timeout=5)
            assert done, "the read loop was cancelled and went on reading"
            # The iterator ends with its read loop.
            with pytest.raises(StopAsyncIteration):
                await asyncio.wait_for(following, timeout=5)
        finally:
            await member.stop()
            await batches.aclose()
            if following is not None and following.done() and not following.cancelled():
                following.exception()  # retrieved (the loop ended after the stop)
