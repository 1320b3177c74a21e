"""Scenario 10: the handler raising, and hanging past the revoke timeout.

* ``flaky``: every third batch fails on its first attempt; the member retries
  it with backoff; nothing is lost and every process exits 0.

(The handler hanging past the revoke timeout is not part of the suite yet:
see docs/reliability.md, findings.)
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos.scenario import Backend, Run, explain, finish, harness

pytestmark = [pytest.mark.chaos, pytest.mark.slow]


def test_flaky_handler_is_retried(tmp_path: Path, chaos_backend: Backend) -> None:
    h = harness(tmp_path, chaos_backend)
    run = Run("10a handler raising", chaos_backend.name)
    try:
        h.write(range(0, 100))
        for m in ("m0", "m1"):
            h.start(m, "--max-handler-attempts", "3", handler="tests.chaos.handlers:flaky")
        h.start_writer(first=100, count=200, per_snapshot=20, interval_s=0.3)
        finish(h, run, {"m0", "m1"})
    finally:
        h.cleanup()
    assert "handler raised" in h.log("m0") + h.log("m1"), explain(h)
