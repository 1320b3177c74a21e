"""Real ``paimon-group run`` processes for group tests, and a snapshot writer.

Example::

    h = GroupHarness(tmp_path, coordinator_url, group="g", buckets=8)
    h.start_writer(count=400, per_snapshot=20, interval_s=0.2)
    h.start("m0"); h.start("m1")
    h.wait_caught_up()
    h.terminate_all()
"""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tests.support.checker import History
from tests.support.tables import (
    bucket_of,
    make_kind_table,
    make_pk_table,
    open_table,
    register_catalog_options,
    write_rows,
)

REPO = Path(__file__).resolve().parents[2]


def live_members(d: dict[str, Any]) -> set[str]:
    """Members with a live session (describe also lists assigned members that are gone)."""
    return {m["member_id"] for m in d["members"] if m.get("session_state") != "gone"}


class GroupHarness:
    def __init__(self, base: Path, coordinator: str, *, group: str = "g", buckets: int = 8,
                 table: str = "db.t", session_timeout_s: float = 2.0,
                 poll_interval_ms: int = 100, start: str = "latest-full",
                 create: bool = True, kind: str = "fixed", target_row_num: int = 40,
                 warehouse: str | None = None,
                 catalog_options: dict[str, str] | None = None) -> None:
        self.base = base
        # A local directory by default; an object-store URI with its catalog
        # options (given to members through the environment, never argv).
        self.warehouse = warehouse or str(base / "wh")
        self.catalog_options = dict(catalog_options or {})
        if self.catalog_options:
            register_catalog_options(self.warehouse, self.catalog_options)
        self.out = base / "out"
        self.out.mkdir(parents=True, exist_ok=True)
        self.coordinator = coordinator
        self.group = group
        self.table = table
        self.buckets = buckets
        self.session_timeout_s = session_timeout_s
        self.poll_interval_ms = poll_interval_ms
        self.start_position = start
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.exit_codes: dict[str, list[int]] = {}
        self.written: set[int] = set()
        # Every written row version (id, v), in commit order.
        self.versions: list[tuple[int, int]] = []
        self.kind = kind
        self._v = 0
        self._writer: threading.Thread | None = None
        self._writer_error: BaseException | None = None
        self.env: dict[str, str] = {**os.environ, "PG_TEST_OUT": str(self.out)}
        if self.catalog_options:
            self.env["PAIMON_GROUP_CATALOG_OPTION"] = " ".join(
                f"{k}={v}" for k, v in self.catalog_options.items())
        if create and kind == "fixed":
            make_pk_table(self.warehouse, table, buckets=buckets)
        elif create:
            make_kind_table(self.warehouse, table, kind, buckets=buckets,
                            target_row_num=target_row_num)
        self._bucket_cache: dict[int, int] = {}

    # -- writing -----------------------------------------------------------

    def write(self, ids: range | list[int]) -> int:
        """One commit of ``ids``, all with the next version ``v`` (0 first)."""
        v = self._v
        snapshot = write_rows(self.warehouse, self.table, list(ids), v=v)
        self._v += 1
        self.written.update(ids)
        self.versions.extend((int(i), v) for i in ids)
        return snapshot

    def start_writer(self, *, first: int, count: int, per_snapshot: int,
                     interval_s: float, updates: int = 0) -> None:
        """Write ``count`` new ids from ``first``, ``per_snapshot`` a commit;
        with ``updates`` each commit also writes a new version of that many
        ids written before (spread over every earlier id)."""
        def run() -> None:
            try:
                done = 0
                for start in range(first, first + count, per_snapshot):
                    new = list(range(start, min(start + per_snapshot, first + count)))
                    old = sorted(self.written)
                    picked = ({old[(done * 7919 + k * 104729) % len(old)]
                               for k in range(updates)} if old and updates else set())
                    self.write(new + sorted(picked - set(new)))
                    done += 1
                    time.sleep(interval_s)
            except BaseException as err:
                self._writer_error = err

        self._writer = threading.Thread(target=run, daemon=True)
        self._writer.start()

    def wait_writer(self) -> None:
        if self._writer is not None:
            self._writer.join(timeout=300)
        if self._writer_error is not None:
            raise self._writer_error

    def bucket_of(self, key: int) -> int:
        if key not in self._bucket_cache:
            self._bucket_cache[key] = bucket_of(open_table(self.warehouse, self.table), key)
        return self._bucket_cache[key]

    def bucket_function(self) -> Any:
        """Key -> bucket, for the checker's ``bucket % shards`` check; on tables
        of the other kinds key -> shard (:meth:`shard_function`)."""
        if self.kind != "fixed":
            return self.shard_function()
        table = open_table(self.warehouse, self.table)
        cache: dict[int, int] = {}

        def f(key: int) -> int:
            if key not in cache:
                cache[key] = bucket_of(table, key)
            return cache[key]

        return f

    def shard_function(self) -> Any:
        """Key -> shard under the group's stored rule, from the files of the
        table's latest snapshot (independent of the planner: pypaimon's own
        batch plan, each split or file read alone). A key found in files of two
        shards is an error here (each key must live in one shard)."""
        from paimon_group.protocol.sharding import Sharding, ShardRule

        d = self.describe()
        sharding = Sharding(ShardRule.parse(d["sharding"]["rule"]), d["num_shards"])
        table = open_table(self.warehouse, self.table)
        builder = table.new_read_builder()
        shards: dict[int, int] = {}
        for split in builder.new_scan().plan().splits():
            for shard, part in sharding.split_shards(split).items():
                for key in builder.new_read().to_arrow([part]).column("id").to_pylist():
                    if shards.setdefault(int(key), shard) != shard:
                        raise AssertionError(f"key {key} in files of shards "
                                             f"{shards[int(key)]} and {shard}")
        return lambda key: shards[int(key)]

    # -- members -------------------------------------------------------------

    def command(self, member: str, *extra: str, handler: str = "tests.support.handlers:record"
                ) -> list[str]:
        return [
            sys.executable, "-m", "paimon_group", "run",
            "--group", self.group, "--warehouse", self.warehouse, "--table", self.table,
            "--handler", handler, "--coordinator", self.coordinator,
            "--member-id", member, "--session-timeout-s", str(self.session_timeout_s),
            "--poll-interval-ms", str(self.poll_interval_ms), "--start", self.start_position,
            "--history", str(self.out / f"history-{member}.jsonl"),
            "--revoke-timeout-s", "5", "--shutdown-timeout-s", "15",
            *extra,
        ]

    def start(self, member: str, *extra: str, handler: str = "tests.support.handlers:record",
              env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        log = open(self.out / f"{member}.log", "ab")
        proc = subprocess.Popen(self.command(member, *extra, handler=handler), cwd=REPO,
                                stdout=log, stderr=subprocess.STDOUT,
                                env={**self.env, **(env or {})})
        self.procs[member] = proc
        return proc

    def signal(self, member: str, sig: int) -> None:
        self.procs[member].send_signal(sig)

    def pause(self, member: str, *, tries: int = 50) -> None:
        """SIGSTOP ``member`` outside a write of its own to the embedded
        coordinator. A process stopped inside one of those (a heartbeat, a
        commit: milliseconds each) keeps the SQLite file's write lock, and
        every other process's writes wait until it resumes or dies
        (docs/operations.md, "Embedded coordinator: a paused process"): not the zombie a
        test means, whose peers go on without it. On etcd and ZooKeeper any
        moment will do."""
        self.signal(member, signal.SIGSTOP)
        from paimon_group.config.member import resolve_coordinator

        path = _sqlite_file(resolve_coordinator(self.warehouse, self.coordinator))
        if path is None:
            return
        for _ in range(tries):
            if not _write_lock_stuck(path):
                return
            self.signal(member, signal.SIGCONT)
            time.sleep(0.02)
            self.signal(member, signal.SIGSTOP)
        raise AssertionError(f"{member} held the coordinator's write lock at {tries} stops")

    def kill(self, member: str) -> None:
        self.signal(member, signal.SIGKILL)
        self.exit_codes.setdefault(member, []).append(self.procs[member].wait(timeout=30))

    def terminate(self, member: str, timeout: float = 60, *, signalled: bool = False) -> int:
        proc = self.procs[member]
        if not signalled and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=timeout)
        self.exit_codes.setdefault(member, []).append(code)
        return code

    def terminate_all(self) -> dict[str, int]:
        """SIGTERM every running member once, then wait for each."""
        running = {m for m, p in self.procs.items() if p.poll() is None}
        for m in running:
            self.procs[m].send_signal(signal.SIGTERM)
        return {m: self.terminate(m, signalled=True) for m in list(self.procs)}

    def cleanup(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                try:
                    p.send_signal(signal.SIGCONT)
                    p.kill()
                    p.wait(timeout=10)
                except (OSError, subprocess.TimeoutExpired):
                    pass

    def log(self, member: str) -> str:
        path = self.out / f"{member}.log"
        return path.read_text() if path.exists() else ""

    def wait_busy(self, member: str, timeout: float = 60) -> None:
        """Until ``member``'s handler is in the middle of a batch."""
        deadline = time.monotonic() + timeout
        while not (self.out / f"busy-{member}").exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{member} never got busy")
            time.sleep(0.01)

    # -- observing -------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        from coordinators.registry import open_coordinator
        from paimon_group.config.member import resolve_coordinator
        from paimon_group.ops.report import describe_group
        from paimon_group.reading.table import ShardedTable

        url = resolve_coordinator(self.warehouse, self.coordinator)

        async def go() -> dict[str, Any]:
            table = ShardedTable.open(self.warehouse, self.table, self.catalog_options)
            async with open_coordinator(url) as coord:
                return await describe_group(coord, self.group, table)

        return asyncio.run(go())

    def wait_for(self, predicate: Any, timeout: float = 120, what: str = "condition") -> Any:
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            last = self.describe()
            if predicate(last):
                return last
            time.sleep(0.3)
        raise AssertionError(f"timed out waiting for {what}; last describe: {last}")

    def wait_caught_up(self, members: set[str] | None = None, timeout: float = 120
                       ) -> dict[str, Any]:
        def ok(d: dict[str, Any]) -> bool:
            live = live_members(d)
            return (
                d["state"] == "stable"
                and (members is None or live == members)
                and all(s["lag_snapshots"] == 0 for s in d["shards"])
            )

        return self.wait_for(ok, timeout, "the group to be stable with lag 0")

    def history(self) -> History:
        return History.load(self.out)


def _sqlite_file(url: str) -> str | None:
    """The file of an embedded coordinator's URL; None for another backend."""
    if not url.startswith("sqlite:"):
        return None
    from coordinators.sqlite.url import parse_url

    target = parse_url(url)
    return target.location if target.kind == "file" else None


def _write_lock_stuck(path: str) -> bool:
    """Whether the SQLite file's write lock stays taken for 0.2 s (a live
    member's write holds it for milliseconds)."""
    conn = sqlite3.connect(path, timeout=0.2, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("ROLLBACK")
        return False
    except sqlite3.OperationalError as err:
        if "locked" in str(err) or "busy" in str(err):
            return True
        raise
    finally:
        conn.close()
