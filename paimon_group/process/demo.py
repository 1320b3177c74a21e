"""``paimon-group demo``: a whole group on one machine, with nothing but the package.

It creates a local warehouse and a primary-key table with 8 buckets, starts a
writer process that commits a snapshot of new rows every 300 ms, runs
WORKERS ``paimon-group run`` processes on the embedded coordinator, SIGKILLs
one of them a third of the way in and starts it again with the same member id
a few seconds later, shows live who owns what and the lag, and ends with an
accounting: every written row delivered, and the duplicates (only batches in
flight at the kill may be delivered twice).

The workers' handler is :func:`record`, which appends the ids of each batch
to a JSONL file per process in ``$PAIMON_GROUP_DEMO_DIR``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

DEMO_TABLE = "demo.events"
BUCKETS = 8


# -- the handler the workers run -----------------------------------------


def record(batch: Any) -> None:
    """Append ``{member, shard, epoch, snapshot, ids}`` for ``batch`` to our file."""
    out_dir = os.environ["PAIMON_GROUP_DEMO_DIR"]
    data = batch.to_arrow()
    ids = data.column("id").to_pylist() if data.num_rows else []
    line = {
        "member": batch.member_id,
        "shard": batch.shard,
        "epoch": batch.epoch,
        "snapshot": batch.snapshot_id,
        "kind": batch.kind.value,
        "ids": ids,
    }
    with open(os.path.join(out_dir, f"deliveries-{os.getpid()}.jsonl"), "a") as f:
        f.write(json.dumps(line) + "\n")


# -- the writer --------------------------------------------------------------


CATALOG_OPTIONS_ENV = "PAIMON_GROUP_CATALOG_OPTION"
"""Where the demo's processes (writer, workers) find the catalog options of an
object-store warehouse: the environment, as ``run`` reads them (never argv)."""


def env_catalog_options() -> dict[str, str]:
    """The ``KEY=VALUE`` pairs of :data:`CATALOG_OPTIONS_ENV` (space separated)."""
    pairs = os.environ.get(CATALOG_OPTIONS_ENV, "").split()
    return dict(pair.split("=", 1) for pair in pairs if "=" in pair)


def _catalog(warehouse: str) -> Any:
    from pypaimon import CatalogFactory

    return CatalogFactory.create({**env_catalog_options(), "warehouse": warehouse})


def create_table(warehouse: str) -> None:
    """The demo's table; an existing one (an earlier demo in this warehouse) is
    refused, never dropped: it may hold rows somebody wants."""
    import pyarrow as pa
    from pypaimon import Schema
    from pypaimon.catalog.catalog_exception import (
        DatabaseNotExistException,
        TableNotExistException,
    )

    from coordinators.errors import ConfigError

    cat = _catalog(warehouse)
    try:
        cat.get_table(DEMO_TABLE)
    except (TableNotExistException, DatabaseNotExistException, FileNotFoundError):
        pass
    else:
        raise ConfigError(f"table {DEMO_TABLE} already exists in warehouse {warehouse} (an "
                          "earlier demo?): drop it, or give the demo another --warehouse")
    cat.create_database("demo", True)
    schema = pa.schema([
        pa.field("id", pa.int64(), nullable=False),
        pa.field("payload", pa.string()),
        pa.field("written_at", pa.float64()),
    ])
    cat.create_table(
        DEMO_TABLE,
        Schema.from_pyarrow_schema(schema, primary_keys=["id"], options={"bucket": str(BUCKETS)}),
        True,
    )


def write_loop(warehouse: str, seconds: float, per_snapshot: int, log_path: str) -> None:
    """Commit a snapshot of ``per_snapshot`` new rows every 300 ms for ``seconds``."""
    import pyarrow as pa

    table = _catalog(warehouse).get_table(DEMO_TABLE)
    next_id = 0
    end = time.monotonic() + seconds
    with open(log_path, "a") as log:
        while time.monotonic() < end:
            ids = list(range(next_id, next_id + per_snapshot))
            data = pa.table({
                "id": pa.array(ids, pa.int64()),
                "payload": pa.array([f"event-{i}" for i in ids]),
                "written_at": pa.array([time.time()] * len(ids), pa.float64()),
            }, schema=pa.schema([pa.field("id", pa.int64(), nullable=False),
                                 pa.field("payload", pa.string()),
                                 pa.field("written_at", pa.float64())]))
            builder = table.new_batch_write_builder()
            write, commit = builder.new_write(), builder.new_commit()
            try:
                write.write_arrow(data)
                commit.commit(write.prepare_commit())
            finally:
                write.close()
                commit.close()
            log.write(json.dumps({"first": next_id, "count": per_snapshot}) + "\n")
            log.flush()
            next_id += per_snapshot
            time.sleep(0.3)


# -- the screen ------------------------------------------------------------------

EVENT_LINES = 10
"""Event lines shown at once: with the header, the member table (3 workers) and
the shard line the whole view fits an 80x24 terminal. A demo of 3 workers has
8 events; more are shown as the first ones, a line counting those left out,
and the latest (:func:`event_lines`)."""


def event_lines(events: list[str], room: int = EVENT_LINES) -> list[str]:
    """The events the box shows: all of them while they fit ``room`` lines;
    else the first ones (the demo's setup), one line saying how many are left
    out, and the latest ones."""
    if len(events) <= room:
        return list(events)
    first = (room - 1) // 2
    last = room - 1 - first
    hidden = len(events) - first - last
    return [*events[:first], f"... {hidden} more ...", *events[-last:]]


def demo_view(report: dict[str, Any], statuses: dict[str, str], events: list[str]) -> Any:
    """The demo's screen: one status line, one row per worker, one shard line, events.

    ``statuses`` is what the demo knows of each worker's process ("running",
    "killed", "stopped (exit 0)"); the group's view comes from ``report``
    (describe). Compact on purpose: the full ``describe`` does not fit 24 lines
    next to the events.
    """
    from rich import box
    from rich.console import Group
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    if report:
        head = Text.assemble(
            ("group ", "bold"), "demo", ("  state ", "bold"), str(report.get("state")),
            ("  generation ", "bold"), str(report.get("generation")),
            ("  snapshot ", "bold"), str(report.get("latest_snapshot")),
            ("  max lag ", "bold"), f"{report.get('max_lag_snapshots', 0)} snapshots",
        )
    else:
        head = Text("waiting for the group...", style="dim")
    owned = {m["member_id"]: m.get("owned_shards", []) for m in report.get("members", [])}
    members = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for col in ("worker", "process", "shards"):
        members.add_column(col, no_wrap=True)
    for name, status in statuses.items():
        style = "green" if status == "running" else "red" if status == "killed" else "dim"
        shards = ",".join(str(s) for s in owned.get(name, [])) or "-"
        members.add_row(name, Text(status, style=style), shards)
    owners = " ".join(f"{s['shard']}:{s['owner'] or '-'}" for s in report.get("shards", []))
    shard_line = Text.assemble(("shards ", "bold"), owners or "-")
    # One line per event (cut, never wrapped: a wrapped line would push the
    # box's last lines out), taken as plain text (no rich markup in them).
    shown = Text("\n".join(event_lines(events)), no_wrap=True, overflow="ellipsis")
    return Group(head, members, shard_line, Panel(shown, title="events"))


# -- the orchestration ---------------------------------------------------------


class Demo:
    def __init__(self, workers: int, seconds: float, directory: str | None,
                 warehouse: str | None = None,
                 catalog_options: dict[str, str] | None = None) -> None:
        # A directory of its own (not --dir) is removed at the end: finish().
        self.temporary = directory is None
        self.base = Path(directory or tempfile.mkdtemp(prefix="paimon-group-demo-")).resolve()
        # The table may live elsewhere (an object store); the coordinator,
        # the deliveries and the logs stay in the demo's directory.
        self.warehouse = warehouse or str(self.base / "warehouse")
        self.catalog_options = dict(catalog_options or {})
        self.out = self.base / "deliveries"
        self.workers = workers
        self.seconds = seconds
        self.coordinator = f"sqlite://{self.base / 'coordinator.sqlite'}"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.events: list[str] = []
        self.statuses: dict[str, str] = {}
        self.env = {**os.environ, "PAIMON_GROUP_DEMO_DIR": str(self.out)}
        if self.catalog_options:
            self.env[CATALOG_OPTIONS_ENV] = " ".join(
                f"{k}={v}" for k, v in self.catalog_options.items())
        self.report: dict[str, Any] = {}  # the last describe of the group

    def note(self, text: str) -> None:
        self.events.append(f"{time.strftime('%H:%M:%S')} {text}")

    def start_worker(self, member_id: str) -> None:
        log = open(self.base / f"{member_id}.log", "ab")
        cmd = [
            sys.executable, "-m", "paimon_group", "run",
            "--group", "demo", "--warehouse", self.warehouse, "--table", DEMO_TABLE,
            "--handler", "paimon_group.process.demo:record", "--coordinator", self.coordinator,
            "--member-id", member_id, "--session-timeout-s", "3", "--poll-interval-ms", "200",
            "--start", "earliest",
        ]
        self.procs[member_id] = subprocess.Popen(cmd, stdout=log, stderr=log, env=self.env)
        self.statuses[member_id] = "running"
        self.note(f"started {member_id} (pid {self.procs[member_id].pid})")

    def describe(self) -> dict[str, Any]:
        from coordinators.registry import open_coordinator
        from paimon_group.ops.report import describe_group
        from paimon_group.reading.table import ShardedTable

        async def go() -> dict[str, Any]:
            table = ShardedTable.open(self.warehouse, DEMO_TABLE, self.catalog_options)
            async with open_coordinator(self.coordinator) as coord:
                return await describe_group(coord, "demo", table)

        return asyncio.run(go())

    def run(self) -> bool:
        from rich.console import Console
        from rich.live import Live

        console = Console()
        console.print(f"[bold]paimon-group demo[/bold] in {self.base}")
        self.out.mkdir(parents=True, exist_ok=True)
        with _environment(self.env):
            create_table(self.warehouse)
        writes = self.base / "writes.jsonl"
        writer = subprocess.Popen(
            [sys.executable, "-m", "paimon_group.process.demo", "write", self.warehouse,
             str(self.seconds), "40", str(writes)], env=self.env)
        self.note("writer started: a snapshot of 40 rows every 300 ms")
        names = [f"worker-{i}" for i in range(self.workers)]
        for name in names:
            self.start_worker(name)
        with Live(self.view(), console=console, refresh_per_second=4) as live:
            self.watch(live, writer, victim=names[min(1, len(names) - 1)])
            codes = self.stop_workers(live)
        return self.account(writes, codes, console)

    def view(self) -> Any:
        return demo_view(self.report, self.statuses, self.events)

    def watch(self, live: Any, writer: subprocess.Popen[bytes], victim: str) -> None:
        """Redraw until the writer is done and the group caught up, killing
        ``victim`` a third of the way in and restarting it 6 s later."""
        killed_at: float | None = None
        restarted = False
        started = time.monotonic()
        while True:
            elapsed = time.monotonic() - started
            if killed_at is None and elapsed > self.seconds / 3:
                self.procs[victim].send_signal(signal.SIGKILL)
                self.procs[victim].wait()
                self.statuses[victim] = "killed"
                killed_at = time.monotonic()
                self.note(f"SIGKILL {victim}: its shards move after the session timeout")
            if killed_at is not None and not restarted and time.monotonic() - killed_at > 6:
                self.start_worker(victim)
                restarted = True
            try:
                self.report = self.describe()
            except Exception as err:
                self.note(f"describe: {err}")
            live.update(self.view())
            writer_done = writer.poll() is not None
            # Done when the writer is, the group caught up and stable, and the
            # restarted victim back in it (stopped sooner, it would be stopped
            # while it starts: the demo is to show it rejoin).
            members = {m.get("member_id") for m in self.report.get("members", [])}
            if writer_done and self.report.get("total_lag_snapshots", 1) == 0 and restarted \
                    and self.report.get("state") == "stable" and victim in members:
                return
            if elapsed > self.seconds + 90:
                self.note("timed out waiting for the group to catch up")
                return
            time.sleep(0.5)

    def stop_workers(self, live: Any) -> dict[str, int]:
        """SIGTERM every worker (a graceful handoff) and draw the final frame."""
        self.note("stopping workers with SIGTERM (graceful handoff)")
        live.update(self.view())
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        codes = {name: p.wait(timeout=60) for name, p in self.procs.items()}
        # The final frame: every worker stopped, the group as they left it.
        for name, code in codes.items():
            self.statuses[name] = f"stopped (exit {code})"
        with contextlib.suppress(Exception):
            self.report = self.describe()
        self.note("all workers stopped")
        live.update(self.view(), refresh=True)
        return codes

    def account(self, writes: Path, codes: dict[str, int], console: Any) -> bool:
        written: set[int] = set()
        for line in writes.read_text().splitlines():
            w = json.loads(line)
            written.update(range(w["first"], w["first"] + w["count"]))
        delivered: Counter[int] = Counter()
        for f in self.out.glob("deliveries-*.jsonl"):
            for line in f.read_text().splitlines():
                delivered.update(json.loads(line)["ids"])
        missing = written - set(delivered)
        dupes = sum(c - 1 for c in delivered.values() if c > 1)
        console.print(
            f"\n[bold]accounting[/bold]: rows written {len(written)}, delivered "
            f"{len(set(delivered) & written)}, missing {len(missing)}, duplicates {dupes} "
            "(only batches in flight at the SIGKILL may be delivered twice)"
        )
        console.print(f"worker exit codes after SIGTERM: {codes} (the killed one was restarted)")
        ok = not missing
        console.print("[green]every written row was delivered[/green]" if ok
                      else f"[red]missing rows: {sorted(missing)[:20]}[/red]")
        return ok


    def finish(self, ok: bool, keep: bool) -> None:
        """Remove the demo's temporary directory, or say where it is: kept
        with ``keep``, after a failed or interrupted demo (its logs tell
        why), and always when it is the user's ``--dir``."""
        if self.temporary and ok and not keep:
            shutil.rmtree(self.base, ignore_errors=True)
            print(f"removed the demo's directory {self.base} (--keep keeps it: the workers' "
                  "logs, the coordinator, the deliveries)")
            return
        why = "" if ok else ", with the workers' logs"
        hint = f" (rm -r {self.base} when done)" if self.temporary else ""
        print(f"the demo's directory is kept{why}: {self.base}{hint}")


@contextlib.contextmanager
def _environment(env: dict[str, str]) -> Any:
    """``os.environ`` as ``env`` for a moment (the table is created in this process)."""
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def run_demo(workers: int = 3, seconds: float = 40.0, directory: str | None = None,
             warehouse: str | None = None,
             catalog_options: dict[str, str] | None = None, keep: bool = False) -> bool:
    """The demo; ``warehouse`` (default: a directory of the demo's own) may be an
    object store reached with ``catalog_options``. Without ``directory`` the
    demo works in a new temporary directory, removed at the end of a demo
    that succeeded unless ``keep`` (:meth:`Demo.finish`)."""
    if warehouse is not None:
        from paimon_group.config.member import CLI_CATALOG, refuse_credentials_in_warehouse

        refuse_credentials_in_warehouse(warehouse, catalog=CLI_CATALOG)
    demo = Demo(workers, seconds, directory, warehouse, catalog_options)
    ok = False
    try:
        ok = demo.run()
    finally:
        demo.finish(ok, keep)
    return ok


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "write":
        write_loop(sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
    else:
        print("usage: python -m paimon_group.process.demo write WAREHOUSE SECONDS PER_SNAPSHOT LOG",
              file=sys.stderr)
        sys.exit(2)
