"""A batch whose files expire while its handler holds it, with real expiry.

Paimon's engine commits into a 4-bucket primary-key table with
``snapshot.num-retained.max = 6`` and ``consumer.expiration-time = 2 s``,
compacting now and then, so its commits expire snapshots and delete the
files compacted away. Two ``paimon-group run`` members read it; the
handler of one of them waits before it calls ``to_arrow()`` (a handler
waiting on its downstream) until the test has seen every file of its held
batches deleted by the engine's expiry. Then the batch is read:
``--on-data-loss fail`` stops the member with the one data-loss line
(shards, lost range, reset command), exit 1, without calling the handler
again; ``skip`` skips with the WARNING, records the skip and goes on.
"""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from tests.engine.engine import Engine
from tests.support.group_procs import GroupHarness
from tests.support.tables import table_schema

pytestmark = [pytest.mark.engine, pytest.mark.slow]

OPTIONS = {"bucket": "4", "snapshot.num-retained.min": "1", "snapshot.num-retained.max": "6",
           "consumer.expiration-time": "2 s"}
HOLDING = "tests.support.handlers:hold_then_record"


def rows(first: int) -> pa.Table:
    ids = list(range(first, first + 8))
    return pa.table({"id": ids, "v": [0] * 8, "payload": ["p"] * 8}, schema=table_schema())


class Writer:
    """The engine committing 8 rows every 0.3 s, with a full compaction every
    fourth commit (each commit expires snapshots and their files)."""

    def __init__(self, engine: Engine, warehouse: str) -> None:
        self.engine, self.warehouse, self.next = engine, warehouse, 1000
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            k = 0
            while not self.stop.is_set():
                k += 1
                self.engine.write(self.warehouse, rows(self.next),
                                  compact_buckets=4 if k % 4 == 0 else 0)
                self.next += 8
                self.stop.wait(0.3)
        except BaseException as err:
            self.error = err

    def __enter__(self) -> Writer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=60)


def held_batches(h: GroupHarness, member: str) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(h.out.glob(f"held-{member}-*.json"))]


def hold_until_expired(h: GroupHarness) -> list[dict[str, Any]]:
    """Until member m1 holds batches and the engine's expiry deleted all their files."""
    deadline = time.monotonic() + 90
    while not held_batches(h, "m1"):
        assert time.monotonic() < deadline, h.log("m1")[-3000:]
        assert h.procs["m1"].poll() is None, h.log("m1")[-3000:]
        time.sleep(0.1)
    time.sleep(1.0)  # the step's other shard, if it has rows
    while True:
        held = held_batches(h, "m1")
        files = [Path(f) for b in held for f in b["files"]]
        if held and not any(f.exists() for f in files):
            return held
        assert time.monotonic() < deadline, held
        time.sleep(0.2)


def start_group(engine: Engine, tmp_path: Path, mode: str) -> GroupHarness:
    h = GroupHarness(tmp_path, f"sqlite://{tmp_path}/coordinator.sqlite", buckets=4,
                     create=False)
    engine.create_table(h.warehouse, table_schema(), primary_keys=["id"], options=OPTIONS)
    engine.write(h.warehouse, rows(0))
    h.start("m0", "--on-data-loss", mode)
    h.start("m1", "--on-data-loss", mode, handler=HOLDING)
    h.wait_caught_up({"m0", "m1"})
    (h.out / "hold-m1").touch()
    return h


LINE = re.compile(r"shards? ([\d, ]+): snapshots? (\d+)(?:\.\.(\d+))? of table db\.t expired "
                  r"before they were read \(earliest retained: (\d+)\)")


def test_fail_stops_the_member_with_the_data_loss_line(engine: Engine, tmp_path: Path) -> None:
    h = start_group(engine, tmp_path, "fail")
    try:
        with Writer(engine, h.warehouse) as writer:
            held = hold_until_expired(h)
            (h.out / "release-m1").touch()
            code = h.procs["m1"].wait(timeout=60)
        assert writer.error is None, writer.error
        log = h.log("m1")
        assert code == 1, log[-3000:]
        errors = [line for line in log.splitlines() if line.startswith("error:")]
        assert len(errors) == 1, log[-3000:]
        match = LINE.search(errors[0])
        assert match, errors[0]
        shards = sorted(int(s) for s in match.group(1).split(", "))
        assert shards == sorted(int(b["shard"]) for b in held), (errors[0], held)
        first, earliest = int(match.group(2)), int(match.group(4))
        assert first == min(int(b["first"]) for b in held) and earliest > first
        assert "stop the group's members and run: paimon-group reset --group g" in errors[0]
        assert "--to-earliest " + " ".join(f"--shard {s}" for s in shards) + " --execute" \
            in errors[0]
        # The handler was never called again for the batch: no retries.
        assert "handler raised" not in log, log[-3000:]
    finally:
        h.cleanup()


def test_skip_skips_with_the_warning_and_goes_on(engine: Engine, tmp_path: Path) -> None:
    h = start_group(engine, tmp_path, "skip")
    try:
        with Writer(engine, h.warehouse) as writer:
            held = hold_until_expired(h)
            (h.out / "hold-m1").unlink()
            (h.out / "release-m1").touch()
            time.sleep(2)
        assert writer.error is None, writer.error
        h.wait_caught_up({"m0", "m1"})
        assert h.terminate_all() == {"m0": 0, "m1": 0}
        log = h.log("m1")
        warnings = [line for line in log.splitlines()
                    if "WARNING" in line and "(--on-data-loss skip)" in line]
        assert warnings, log[-3000:]
        match = LINE.search(warnings[0])
        assert match, warnings[0]
        assert sorted(int(s) for s in match.group(1).split(", ")) == \
            sorted(int(b["shard"]) for b in held)
        assert "handler raised" not in log, log[-3000:]
        events = [json.loads(line)
                  for line in (h.out / "history-m1.jsonl").read_text().splitlines()]
        assert [e for e in events if e["event"] == "skip"], log[-3000:]
        # Rows written after the skip were delivered.
        delivered = set(h.history().delivered_counts())
        assert set(range(writer.next - 8, writer.next)) <= delivered
    finally:
        h.cleanup()
