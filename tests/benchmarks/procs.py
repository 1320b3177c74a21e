"""Real ``paimon-group run`` processes for the handoff and failover benchmarks.

Wraps :class:`tests.support.group_procs.GroupHarness` with what both need: a
writer that keeps committing for as long as the measurement lasts, waits on
the group's state, and the members' ``--history`` events.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

from tests.support.group_procs import GroupHarness
from tests.support.tables import write_rows

SESSION_TIMEOUT_S = 2.0
POLL_INTERVAL_MS = 100


class BenchGroup:
    def __init__(self, base: Path, coordinator: str, *, buckets: int = 16,
                 write_interval_s: float = 0.1,
                 session_timeout_s: float = SESSION_TIMEOUT_S) -> None:
        self.h = GroupHarness(base, coordinator, group="bench", buckets=buckets,
                              session_timeout_s=session_timeout_s,
                              poll_interval_ms=POLL_INTERVAL_MS, start="latest")
        self.buckets = buckets
        self.write_interval_s = write_interval_s
        self._stop = threading.Event()
        self._writer: threading.Thread | None = None
        self.commits: list[tuple[int, float]] = []

    def start_writer(self) -> None:
        """Commit a small snapshot (one row per bucket on average x4) every interval."""
        def run() -> None:
            next_id = 0
            per = self.buckets * 4
            while not self._stop.is_set():
                snapshot = write_rows(self.h.warehouse, self.h.table,
                                      range(next_id, next_id + per))
                self.commits.append((snapshot, time.monotonic()))
                next_id += per
                self._stop.wait(self.write_interval_s)

        self._writer = threading.Thread(target=run, daemon=True)
        self._writer.start()

    def owners(self, describe: dict[str, Any]) -> dict[int, str | None]:
        return {int(s["shard"]): s["owner"] for s in describe["shards"]}

    def wait_stable(self, members: set[str], timeout: float = 120) -> dict[str, Any]:
        def ok(d: dict[str, Any]) -> bool:
            live = {m["member_id"] for m in d["members"]}
            owners = self.owners(d)
            return (d["state"] == "stable" and live == members
                    and len(owners) == self.h.buckets and set(owners.values()) == members)

        result: dict[str, Any] = self.h.wait_for(ok, timeout, f"stable with {sorted(members)}")
        return result

    def events(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for path in sorted(self.h.out.glob("history-*.jsonl")):
            for line in path.read_text().splitlines():
                if line.strip():
                    out.append(json.loads(line))
        out.sort(key=lambda e: e["t"])
        return out

    def close(self) -> None:
        self._stop.set()
        if self._writer is not None:
            self._writer.join(timeout=30)
        try:
            self.h.terminate_all()
        finally:
            self.h.cleanup()


def handoff_pauses(events: list[dict[str, Any]], after: float = 0.0) -> list[float]:
    """For every clean release (``ok``) after ``after``: the time until the next
    acquire of that shard by another member (seconds)."""
    pauses: list[float] = []
    for i, e in enumerate(events):
        if e["event"] != "release" or not e.get("ok") or e["t"] < after:
            continue
        for later in events[i + 1:]:
            if (later["event"] == "acquire" and later["shard"] == e["shard"]
                    and later["member"] != e["member"]):
                pauses.append(later["t"] - e["t"])
                break
    return pauses
