"""A member whose handler keeps failing fails as soon as one batch has used
up its ``max_handler_attempts``: no new batch is handed out after that, and
the other shards' retries stop at their next attempt (a real member on the
embedded SQLite coordinator, a real table of 8 buckets)."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from paimon_group import GroupMember, MemberConfig
from paimon_group.errors import HandlerFailed
from tests.support.tables import make_pk_table, write_rows

ATTEMPTS = 5
BACKOFF_S = 0.2   # waits of 0.2, 0.4, 0.8 and 1.6 s between a batch's five calls
PARALLEL = 2


class AlwaysRaises:
    """A handler that raises on every call, noting when each call started and ended."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.calls: list[tuple[int, float]] = []    # (shard, started)
        self.ended: dict[int, list[float]] = {}     # shard -> when each of its calls raised

    def __call__(self, batch: object) -> None:
        shard = int(batch.shard)  # type: ignore[attr-defined]
        with self._lock:
            self.calls.append((shard, time.monotonic()))
        time.sleep(0.02)
        with self._lock:
            self.ended.setdefault(shard, []).append(time.monotonic())
        raise RuntimeError(f"the handler refuses shard {shard}")

    def first_exhausted(self) -> float:
        """When the first batch's last allowed call raised."""
        with self._lock:
            return min(ends[ATTEMPTS - 1] for ends in self.ended.values()
                       if len(ends) >= ATTEMPTS)


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_batch_out_of_attempts_fails_the_member_at_once(tmp_path: Path) -> None:
    wh = str(tmp_path / "wh")
    make_pk_table(wh, "db.t", buckets=8)
    write_rows(wh, "db.t", range(200))
    config = MemberConfig(group="g", warehouse=wh, table="db.t",
                          coordinator=f"sqlite:///{tmp_path / 'coord.db'}", member_id="m",
                          session_timeout_s=5, poll_interval_ms=50,
                          max_handler_attempts=ATTEMPTS, handler_backoff_s=BACKOFF_S,
                          max_parallel_shards=PARALLEL)
    handler = AlwaysRaises()
    async with GroupMember(config) as member:
        with pytest.raises(HandlerFailed, match=f"failed {ATTEMPTS} times on shard"):
            await asyncio.wait_for(member.run(handler), timeout=120)
        failed = time.monotonic()
    exhausted = handler.first_exhausted()
    after = [(shard, t) for shard, t in handler.calls if t > exhausted]
    # At most the other slot's call that began as the first batch gave up;
    # no shard beyond the first two slots' was ever handed to the handler.
    assert len(after) <= PARALLEL - 1, after
    assert len({shard for shard, _ in handler.calls}) <= PARALLEL, handler.calls
    # Failed within one backoff step of the first exhausted batch (the
    # longest wait between two calls is BACKOFF_S * 2 ** (ATTEMPTS - 2)).
    assert failed - exhausted < BACKOFF_S * 2 ** (ATTEMPTS - 2), failed - exhausted
