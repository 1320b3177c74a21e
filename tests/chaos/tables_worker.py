"""A member process of a group of several tables, in the library form.

It reads every ``--table`` (names or patterns) as one group through
:class:`~paimon_group.GroupMember` and appends one JSON line per batch to
``OUT/deliveries-<pid>.jsonl``: the fields of
:func:`tests.support.handlers.record` (``shard`` is the batch's *group*
shard, the number the member's history and the checker's fencing checks
use) and ``table``, ``table_shard`` (the table's own shard). Its history
goes to ``OUT/history-<member>.jsonl``, its log (INFO) to stderr. SIGTERM stops it gracefully (the
member's own handlers).

Example::

    python -m tests.chaos.tables_worker --warehouse W --coordinator URL --group g \\
        --member m0 --out OUT --table 'shop.*' --table other.t
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import threading
import time
from typing import Any

from paimon_group import GroupMember, MemberConfig

_lock = threading.Lock()


def recorder(out: str) -> Any:
    path = os.path.join(out, f"deliveries-{os.getpid()}.jsonl")

    def record(batch: Any) -> None:
        table = batch.to_arrow()
        ids = table.column("id").to_pylist() if table.num_rows else []
        vs = table.column("v").to_pylist() if table.num_rows else []
        line = {
            "t": time.monotonic(),
            "member": batch.member_id,
            "pid": os.getpid(),
            "shard": batch.group_shard,
            "table": batch.table,
            "table_shard": batch.shard,
            "epoch": batch.epoch,
            "snapshot": batch.snapshot_id,
            "next_snapshot": batch.next_snapshot,
            "kind": batch.kind.value,
            "ids": ids,
            "vs": vs,
        }
        with _lock, open(path, "a") as f:
            f.write(json.dumps(line) + "\n")

    return record


async def main(args: argparse.Namespace) -> None:
    config = MemberConfig(
        group=args.group, warehouse=args.warehouse, table=args.table[0],
        tables=tuple(args.table[1:]), coordinator=args.coordinator, member_id=args.member,
        start="earliest", poll_interval_ms=args.poll_interval_ms,
        session_timeout_s=args.session_timeout_s, tables_refresh_s=args.tables_refresh_s,
        revoke_timeout_s=5, shutdown_timeout_s=15, forming_wait_s=0,
        history_path=os.path.join(args.out, f"history-{args.member}.jsonl"))
    async with GroupMember(config) as member:
        await member.run(recorder(args.out))


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.tables_worker")
    for name in ("--warehouse", "--coordinator", "--group", "--member", "--out"):
        parser.add_argument(name, required=True)
    parser.add_argument("--table", action="append", required=True)
    parser.add_argument("--session-timeout-s", type=float, default=5.0)
    parser.add_argument("--tables-refresh-s", type=float, default=1.0)
    parser.add_argument("--poll-interval-ms", type=int, default=200)
    return parser.parse_args(argv)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    asyncio.run(main(parse()))
