"""Faulty handlers for the chaos scenarios (imported by real ``paimon-group run``).

Both wrap :func:`tests.support.handlers.record` (which records each delivery).

``flaky``
    raises ``RuntimeError`` on the first attempt of every third batch of the
    process; the member retries it (``--max-handler-attempts``).
``hang_when_told``
    records the batch, then, while the file ``$PG_TEST_OUT/hang-<member>``
    exists, sleeps ``$PG_CHAOS_HANG_S`` seconds (default 8) once per batch:
    a handler stuck past the revoke timeout.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from typing import Any

from tests.support.handlers import record

_calls = itertools.count()
_failed: set[tuple[int, int]] = set()
_lock = threading.Lock()


def flaky(batch: Any) -> None:
    key = (batch.shard, batch.snapshot_id)
    with _lock:
        n = next(_calls)
        fail = n % 3 == 0 and key not in _failed
        if fail:
            _failed.add(key)
    if fail:
        raise RuntimeError(f"flaky handler: first attempt at shard {batch.shard} "
                           f"snapshot {batch.snapshot_id} fails")
    record(batch)


def hang_when_told(batch: Any) -> None:
    record(batch)
    flag = os.path.join(os.environ["PG_TEST_OUT"], f"hang-{batch.member_id}")
    if os.path.exists(flag):
        with open(os.path.join(os.environ["PG_TEST_OUT"], f"hung-{batch.member_id}"), "w"):
            pass
        time.sleep(float(os.environ.get("PG_CHAOS_HANG_S", "8")))
