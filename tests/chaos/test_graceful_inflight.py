"""A handler hanging past the revoke timeout when SIGTERM arrives (scenario 10b).

The member must not wait forever: after ``revoke_timeout_s`` the batch in
flight is abandoned (not committed, logged), the shard is released, the
process exits 0 within its shutdown timeout, and the other member re-reads
the batch: nothing is lost.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.chaos.scenario import Backend, Run, explain, finish, harness

pytestmark = [pytest.mark.chaos, pytest.mark.slow]


def test_handler_hanging_past_revoke_timeout(tmp_path: Path, chaos_backend: Backend) -> None:
    h = harness(tmp_path, chaos_backend)
    run = Run("10b handler hanging > revoke timeout", chaos_backend.name)
    try:
        h.write(range(0, 100))
        h.start("m0", handler="tests.chaos.handlers:hang_when_told")
        h.start("m1")
        h.wait_caught_up({"m0", "m1"})
        (h.out / "hang-m0").touch()
        h.start_writer(first=100, count=200, per_snapshot=20, interval_s=0.3)
        deadline = time.monotonic() + 120
        while not (h.out / "hung-m0").exists():
            assert time.monotonic() < deadline, explain(h)
            time.sleep(0.05)
        run.fault("handler hang + SIGTERM", "m0", h.procs["m0"].pid)
        code = h.terminate("m0", timeout=90)
        assert code == 0, explain(h)
        assert "abandoned" in h.log("m0"), explain(h)
        finish(h, run, {"m1"})
    finally:
        h.cleanup()
