"""Handlers used by multi-process tests (imported by real ``paimon-group run``).

``record`` appends one JSON line per batch to ``$PG_TEST_OUT/deliveries-<pid>.jsonl``:
member, shard, epoch, snapshot, next_snapshot, kind, the ``id`` column, the
``v`` column (``vs``: the version of each row) and the batch's column names.
While it runs, ``$PG_TEST_OUT/busy-<member>`` exists (tests use it to pause a
member in the middle of a batch). ``$PG_TEST_SLEEP_<MEMBER>`` (seconds, member
id upper-cased with ``-`` as ``_``) slows that member's handler down, and so does
a file ``$PG_TEST_OUT/slow-<member>`` holding seconds, for as long as it exists
(a test can slow a running member down).

``hold_then_record`` is ``record`` for a handler that waits on its downstream
before it reads: while ``$PG_TEST_OUT/hold-<member>`` exists, each batch
with rows writes its shard, first snapshot and the paths of its files to
``$PG_TEST_OUT/held-<member>-<shard>.json`` and waits until
``$PG_TEST_OUT/release-<member>`` exists, and only then calls ``to_arrow()``.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any


def record(batch: Any) -> None:
    out = os.environ["PG_TEST_OUT"]
    busy = os.path.join(out, f"busy-{batch.member_id}")
    with open(busy, "w") as f:
        f.write(str(batch.shard))
    try:
        table = batch.to_arrow()
        ids = table.column("id").to_pylist() if table.num_rows else []
        vs = table.column("v").to_pylist() if table.num_rows and "v" in table.column_names \
            else []
        delay = os.environ.get("PG_TEST_SLEEP_" + batch.member_id.upper().replace("-", "_"))
        try:
            with open(os.path.join(out, f"slow-{batch.member_id}")) as f:
                delay = f.read().strip() or delay
        except FileNotFoundError:
            pass
        if delay:
            time.sleep(float(delay))
        line = {
            "t": time.monotonic(),
            "member": batch.member_id,
            "pid": os.getpid(),
            "shard": batch.shard,
            "epoch": batch.epoch,
            "snapshot": batch.snapshot_id,
            "next_snapshot": batch.next_snapshot,
            "kind": batch.kind.value,
            "ids": ids,
            "vs": vs,
            "columns": table.column_names,
        }
        with open(os.path.join(out, f"deliveries-{os.getpid()}.jsonl"), "a") as f:
            f.write(json.dumps(line) + "\n")
    finally:
        try:
            os.unlink(busy)
        except FileNotFoundError:
            pass


def hold_then_record(batch: Any) -> None:
    out = os.environ["PG_TEST_OUT"]
    if os.path.exists(os.path.join(out, f"hold-{batch.member_id}")) and batch.splits:
        held = os.path.join(out, f"held-{batch.member_id}-{batch.shard}.json")
        files = [f.file_path for split in batch.splits for f in split.files]
        with open(held + ".partial", "w") as f:
            json.dump({"shard": batch.shard, "first": batch.first_snapshot, "files": files}, f)
        os.replace(held + ".partial", held)
        release = os.path.join(out, f"release-{batch.member_id}")
        while not os.path.exists(release):
            time.sleep(0.05)
    record(batch)


def fail_always(batch: Any) -> None:
    raise RuntimeError(f"handler refuses shard {batch.shard}")


def boom(batch: Any) -> None:
    raise ValueError("boom")


def record_rows(batch: Any) -> None:
    """Every row of the batch, as a list in the batch's column order, one JSON
    line per batch in ``$PG_TEST_OUT/rows-<pid>.jsonl`` with the member,
    shard, kind, the snapshots the step covers and the column names."""
    table = batch.to_arrow()
    line = {
        "member": batch.member_id,
        "shard": batch.shard,
        "kind": batch.kind.value,
        "first_snapshot": batch.first_snapshot,
        "snapshot": batch.snapshot_id,
        "next_snapshot": batch.next_snapshot,
        "columns": table.column_names,
        "rows": [list(r.values()) for r in table.to_pylist()],
    }
    with open(os.path.join(os.environ["PG_TEST_OUT"], f"rows-{os.getpid()}.jsonl"), "a") as f:
        f.write(json.dumps(line) + "\n")
