"""``paimon-group describe``: one group, or every group, once or ``--watch``-ed."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from typing import TYPE_CHECKING, Any

import click

from coordinators.errors import ConfigError
from coordinators.protocol import ConnectOptions
from coordinators.registry import open_coordinator, redact_url
from paimon_group.cli.context import (
    admin_coordinator,
    echo_json,
    group_table,
    open_map_tables,
    open_table,
)
from paimon_group.cli.errors import friendly_errors
from paimon_group.cli.options import (
    catalog_options,
    coordinator_options,
    json_option,
    optional_group_option,
    stored_table_options,
    wide_option,
)
from paimon_group.protocol.names import GroupKeys, validate_group

if TYPE_CHECKING:
    from paimon_group.ops.lag import SnapshotFacts
    from paimon_group.ops.report import GroupReport
    from paimon_group.reading.table import ShardedTable

DEFAULT_WATCH_INTERVAL_S = 2.0


@click.command()
@optional_group_option
@stored_table_options
@coordinator_options
@json_option("Print one JSON object (with --all-groups: {\"groups\": [...]}).")
@wide_option
@click.option("--watch", type=float, is_flag=False, flag_value=DEFAULT_WATCH_INTERVAL_S,
              default=None, metavar="[SECONDS]",
              help="Refresh in place every SECONDS (default 2) until Ctrl-C; with --json one "
                   "line per refresh.")
@friendly_errors
def describe(**kw: Any) -> None:
    """Members, leader, generation, and per shard its owner, epoch, position and lag."""
    if bool(kw["group"]) == kw["all_groups"]:
        raise ConfigError("give --group NAME or --all-groups")
    if kw["all_groups"] and (kw["table"] or kw["watch"] is not None):
        raise ConfigError("--all-groups reads each group's own table; it takes no --table "
                          "or --watch")
    if kw["group"]:
        validate_group(kw["group"])
    if kw["watch"] is not None and kw["watch"] <= 0:
        raise ConfigError(f"--watch {kw['watch']}: the refresh interval must be positive")
    url, options = admin_coordinator(kw)
    if kw["watch"] is not None:
        watch_describe(url, options, kw, kw["watch"])
        return
    if kw["all_groups"]:
        reports = [r.to_dict() for r in asyncio.run(_describe_all(url, options, kw))]
    else:
        reports = [asyncio.run(_describe(url, options, kw)).to_dict()]
    missing = not kw["all_groups"] and not reports[0].get("exists", True)
    if kw["as_json"]:
        out = {"coordinator": redact_url(url), "groups": reports} if kw["all_groups"] \
            else reports[0]
        click.echo(json.dumps(out, sort_keys=True))
        if missing:
            # As kafka-consumer-groups --describe: a group that does not exist
            # is an error (exit 2), also when its JSON says so for scripts.
            raise SystemExit(2)
        return
    if missing:
        from paimon_group.ops.report import GroupNotFound

        raise GroupNotFound(f"group {kw['group']!r} does not exist in {redact_url(url)}")
    from paimon_group.ops.render import output_console, render_describe

    console = output_console(kw["wide"])
    for i, report in enumerate(reports):
        if i:
            console.print()
        render_describe(report, console)
    if not reports:
        console.print("no groups in this coordinator")


async def _describe_all(url: str, options: ConnectOptions,
                        kw: dict[str, Any]) -> list[GroupReport]:
    """describe of every group; each table opened once (groups may share one).
    A group created on another warehouse (a shared coordinator) is described
    without its table: a table of the same name here is not its table."""
    from paimon_group.config.warehouses import normalised_warehouse
    from paimon_group.ops.report import read_report
    from paimon_group.protocol.group_reads import GroupReads

    here = normalised_warehouse(kw["warehouse"])
    tables: dict[str, ShardedTable] = {}
    reports: list[GroupReport] = []
    async with open_coordinator(url, options) as coord:
        for entry in await coord.list(GroupKeys.all_groups()):
            name = GroupKeys.last_segment(entry.key)
            meta = await GroupReads(coord, name).read_meta()
            table: ShardedTable | None = None
            opened: dict[int, ShardedTable | str] | None = None
            if meta is not None and meta.warehouse in ("", here) and meta.tables is not None:
                opened = await asyncio.to_thread(open_map_tables, kw, meta.tables)
            elif meta is not None and meta.warehouse in ("", here):
                if meta.table not in tables:
                    tables[meta.table] = await asyncio.to_thread(open_table, kw, meta.table)
                table = tables[meta.table]
            report = await read_report(coord, name, table, tables=opened)
            reports.append(report.with_coordinator(redact_url(url)))
    return reports


async def _describe(url: str, options: ConnectOptions, kw: dict[str, Any]) -> GroupReport:
    from paimon_group.ops.report import GroupNotFound, read_report

    async with open_coordinator(url, options) as coord:
        given = kw["table"]
        try:
            kw["table"] = await group_table(coord, kw["group"], kw["table"], kw["warehouse"])
        except GroupNotFound:
            # No group and no --table: its report says so ("exists": false),
            # as with --table; no table to open.
            return (await read_report(coord, kw["group"], None)).with_coordinator(
                redact_url(url))
        opened = await _map_tables(coord, kw)
        table = None if opened is not None else await asyncio.to_thread(open_table, kw)
        report = await read_report(coord, kw["group"], table, tables=opened)
        if opened is not None and given:  # a group of several tables: some of them
            report = report.only_tables(given)
        report = report.with_sinks(await _sink_reports(coord, kw))
    return report.with_coordinator(redact_url(url))


async def _map_tables(coord: Any, kw: dict[str, Any]) -> dict[int, ShardedTable | str] | None:
    """The live tables of a group of several tables, opened (None: a group of
    one table, whose table ``--table`` names)."""
    from paimon_group.protocol.group_reads import GroupReads

    meta = await GroupReads(coord, kw["group"]).read_meta()
    if meta is None or meta.tables is None:
        return None
    return await asyncio.to_thread(open_map_tables, kw, meta.tables)


async def _sink_reports(coord: Any, kw: dict[str, Any]) -> list[Any]:
    """The group's published sinks, each shard's position read from its target
    (the catalog options of ``--warehouse`` for a target in that warehouse)."""
    from paimon_group.ops.report import SinkReport
    from paimon_group.protocol.group_reads import GroupReads
    from paimon_group.protocol.sinks import read

    def positions(warehouse: str, name: str) -> dict[int, int]:
        from paimon_group.config.warehouses import normalised_warehouse
        from paimon_group.sink.target import TargetTable

        same = normalised_warehouse(kw["warehouse"]) == normalised_warehouse(warehouse)
        options = catalog_options(kw.get("catalog_option", ())) if same else None
        target = TargetTable.open(warehouse, name, options)
        return {s: m.next_snapshot for s, m in target.marks(kw["group"]).items()}

    reports = []
    for record in await read(GroupReads(coord, kw["group"])):
        try:
            found = await asyncio.to_thread(positions, record.warehouse, record.table)
            reports.append(SinkReport(record.kind, record.warehouse, record.table, found))
        except Exception as err:  # an unreadable target is shown, not fatal
            reports.append(SinkReport(record.kind, record.warehouse, record.table,
                                      error=f"{type(err).__name__}: {err}"[:120]))
    return reports


# -- --watch ---------------------------------------------------------------------


def watch_describe(url: str, options: ConnectOptions, kw: dict[str, Any],
                   interval_s: float = DEFAULT_WATCH_INTERVAL_S) -> None:
    """Refresh ``describe`` in place until Ctrl-C (with ``--json``: one line per refresh)."""
    if interval_s <= 0:
        raise ConfigError(f"--watch {interval_s}: the refresh interval must be positive")
    from paimon_group.reading.engine_reads import install_engine_reads

    # Here, not in a refresh's thread: a Ctrl-C lands on the loop, and the
    # loop's shutdown waits for its threads; none is then importing pypaimon.
    install_engine_reads()
    try:
        asyncio.run(_watch(url, options, kw, interval_s))
    except KeyboardInterrupt:
        pass
    except BrokenPipeError:
        # The reader went away (``describe --watch --json | head -3``): done.
        # Point stdout at /dev/null so that the interpreter's final flush is quiet.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.close(devnull)


async def _watch(url: str, options: ConnectOptions, kw: dict[str, Any],
                 interval_s: float) -> None:
    """One coordinator session and one :class:`SnapshotFacts` for every refresh:
    only new snapshots' metadata is read each time."""
    from rich.console import Console
    from rich.live import Live

    from paimon_group.ops.lag import SnapshotFacts
    from paimon_group.ops.render import describe_renderable
    from paimon_group.ops.report import GroupNotFound, read_report

    facts: SnapshotFacts | None = None
    table: ShardedTable | None = None
    async with open_coordinator(url, options) as coord:

        async def refresh() -> dict[str, Any]:
            nonlocal facts, table
            # A group of several tables: its map's tables, opened again each
            # time (a table joins or is dropped meanwhile).
            opened = await _map_tables(coord, kw)
            if table is None and opened is None:
                # A group not created yet, without --table: "does not exist"
                # until it is, then its table.
                with contextlib.suppress(GroupNotFound):
                    kw["table"] = await group_table(coord, kw["group"], kw["table"],
                                                    kw["warehouse"])
                    table = await asyncio.to_thread(open_table, kw)
            report = await read_report(coord, kw["group"], table, facts=facts, tables=opened)
            if opened is not None and kw["table"]:  # a group of several tables: some of them
                report = report.only_tables(kw["table"])
            if facts is None and table is not None and report.num_shards:
                facts = SnapshotFacts(table, report.num_shards)
            return report.with_coordinator(redact_url(url)).to_dict()

        if kw.get("as_json"):
            while True:
                echo_json(await refresh())
                await asyncio.sleep(interval_s)
        console = Console()
        if not console.is_terminal:
            # Redirected (``describe --watch > log``): a Live screen would show
            # only its last frame, at Ctrl-C; print every refresh instead.
            while True:
                console.print(describe_renderable(await refresh()))
                await asyncio.sleep(interval_s)
        with Live(describe_renderable(await refresh()), console=console,
                  auto_refresh=False, transient=False) as live:
            while True:
                await asyncio.sleep(interval_s)
                live.update(describe_renderable(await refresh()), refresh=True)
