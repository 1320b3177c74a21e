"""Administrative commands of ``paimon-group``: ``list``, ``reset``, ``delete``,
``members remove``, and the ``describe --watch`` loop.

They are registered on :data:`paimon_group.cli.main` when :mod:`paimon_group.cli`
imports this module. Each one opens its own short coordinator session; the
logic lives in :mod:`paimon_group.admin` and :mod:`paimon_group.describe`.

Exit codes: 0 done; 1 refused (live members: ``GroupBusy``) or failed;
2 bad input (unknown group or member, bad option).

Example::

    paimon-group reset --group orders --warehouse /wh --table db.orders --to-snapshot 42
    paimon-group reset --group orders --warehouse /wh --table db.orders --to-snapshot 42 \\
        --execute
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

import click

from coordinators.base import ConnectOptions
from coordinators.errors import ConfigError
from coordinators.registry import open_coordinator, redact_url
from paimon_group.cli import (
    OneLineErrors,
    _catalog_options,
    _env,
    _open_for_admin,
    coordinator_options,
    friendly_errors,
    group_option,
    group_table,
    main,
    stored_table_options,
    wide_option,
)
from paimon_group.names import validate_group
from paimon_group.preflight import check_coordinator_target
from paimon_group.table import ShardedTable

DEFAULT_WATCH_INTERVAL_S = 2.0


def admin_coordinator(kw: dict[str, Any]) -> tuple[str, ConnectOptions]:
    """The coordinator URL and options of an admin command.

    Without ``--coordinator`` the embedded file under ``--warehouse``; that
    file must exist already (an admin command never creates a coordinator: a
    typo in the warehouse path must not look like an empty coordinator).
    """
    if not kw.get("coordinator") and not kw.get("warehouse"):
        raise ConfigError(
            "give --coordinator URL, or --warehouse for the embedded coordinator under it"
        )
    url, options = _open_for_admin(kw)
    check_coordinator_target(url, default_url=None, create=False)
    return url, options


def open_table(kw: dict[str, Any], identifier: str | None = None) -> ShardedTable:
    return ShardedTable.open(
        kw["warehouse"], identifier or kw["table"], _catalog_options(kw.get("catalog_option", ()))
    )


def _echo_json(data: Any) -> None:
    click.echo(json.dumps(data, sort_keys=True, default=str))


def _optional_warehouse(fn: Any) -> Any:
    fn = click.option("--catalog-option", "catalog_option", multiple=True,
                      envvar=_env("catalog-option"), metavar="KEY=VALUE",
                      help="Extra pypaimon catalog option (repeatable).")(fn)
    fn = click.option("--warehouse", envvar=_env("warehouse"),
                      help="The Paimon warehouse: locates the embedded coordinator and the "
                           "tables (for lag).")(fn)
    return fn


# -- describe --watch ----------------------------------------------------------


def watch_describe(url: str, options: ConnectOptions, kw: dict[str, Any],
                   interval_s: float = DEFAULT_WATCH_INTERVAL_S) -> None:
    """Refresh ``describe`` in place until Ctrl-C (with ``--json``: one line per refresh)."""
    if interval_s <= 0:
        raise ConfigError(f"--watch {interval_s}: the refresh interval must be positive")
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
    from rich.console import Console
    from rich.live import Live

    from paimon_group.describe import SnapshotFacts, describe_group
    from paimon_group.render import describe_renderable

    facts: SnapshotFacts | None = None
    async with open_coordinator(url, options) as coord:
        kw["table"] = await group_table(coord, kw["group"], kw["table"])
        table = await asyncio.to_thread(open_table, kw)
        async def refresh() -> dict[str, Any]:
            nonlocal facts
            report = await describe_group(coord, kw["group"], table, facts=facts)
            if facts is None and report["num_shards"]:
                facts = SnapshotFacts(table, report["num_shards"])
            report["coordinator"] = redact_url(url)
            return report

        if kw.get("as_json"):
            while True:
                _echo_json(await refresh())
                await asyncio.sleep(interval_s)
        console = Console()
        with Live(describe_renderable(await refresh()), console=console,
                  auto_refresh=False, transient=False) as live:
            while True:
                await asyncio.sleep(interval_s)
                live.update(describe_renderable(await refresh()), refresh=True)


# -- list -------------------------------------------------------------------


@main.command(name="list")
@_optional_warehouse
@coordinator_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@wide_option
@friendly_errors
def list_command(**kw: Any) -> None:
    """The groups of a coordinator, with member count, state and total lag.

    Lag needs the tables: give --warehouse (each group's table is opened
    there); without it the lag columns are empty.
    """
    from paimon_group.admin import list_groups

    url, options = admin_coordinator(kw)

    def opener(identifier: str) -> ShardedTable | None:
        return open_table(kw, identifier) if kw.get("warehouse") else None

    async def go() -> list[dict[str, Any]]:
        async with open_coordinator(url, options) as coord:
            return await list_groups(coord, opener)

    groups = asyncio.run(go())
    if kw["as_json"]:
        _echo_json({"coordinator": redact_url(url), "groups": groups})
    else:
        from paimon_group.render import output_console, render_list

        render_list(groups, output_console(kw["wide"]))


# -- reset -------------------------------------------------------------------


@main.command()
@group_option
@stored_table_options
@coordinator_options
@click.option("--to-earliest", is_flag=True,
              help="From the earliest retained snapshot (its changes and all later ones "
                   "again; not a full scan).")
@click.option("--to-latest", is_flag=True,
              help="After the latest snapshot: skip everything unread.")
@click.option("--to-snapshot", type=int, metavar="N", help="Next snapshot to read is N.")
@click.option("--to-timestamp", metavar="ISO-8601",
              help="From the first snapshot committed at or after this time (no offset: UTC).")
@click.option("--shift-by", type=int, metavar="N",
              help="Move each shard's position by N snapshots (negative: re-read).")
@click.option("--shard", "shards", type=int, multiple=True, metavar="K",
              help="Only this shard (repeatable). Default: every shard.")
@click.option("--execute", is_flag=True,
              help="Apply the plan. Without it nothing changes.")
@click.option("--force", is_flag=True,
              help="DANGEROUS: reset even while members are live (their owners are fenced; "
                   "a batch in flight may still be delivered from the old position). See "
                   "docs/operations.md.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as one JSON object.")
@wide_option
@friendly_errors
def reset(**kw: Any) -> None:
    """Move a group's positions; prints the plan, changes nothing without --execute.

    Refused while the group has live members (stop them first). Writes the
    coordinator positions and the Paimon consumer files together.
    """
    from paimon_group.admin import ResetTarget, execute_reset, parse_shards, plan_reset
    from paimon_group.group import GroupClient

    validate_group(kw["group"])
    target = ResetTarget.from_options(
        to_earliest=kw["to_earliest"], to_latest=kw["to_latest"],
        to_snapshot=kw["to_snapshot"], to_timestamp=kw["to_timestamp"],
        shift_by=kw["shift_by"],
    )
    url, options = admin_coordinator(kw)

    async def go() -> dict[str, Any]:
        async with open_coordinator(url, options) as coord:
            kw["table"] = await group_table(coord, kw["group"], kw["table"])
            table = await asyncio.to_thread(open_table, kw)
            client = GroupClient(coord, kw["group"])
            plan = await plan_reset(client, table, target, parse_shards(kw["shards"]))
            if kw["execute"]:
                plan = await execute_reset(client, table, plan, force=kw["force"])
            return plan.to_dict()

    plan = asyncio.run(go())
    if kw["as_json"]:
        _echo_json(plan)
    else:
        from paimon_group.render import output_console, render_reset_plan

        render_reset_plan(plan, output_console(kw["wide"]))


# -- delete ------------------------------------------------------------------


@main.command()
@group_option
@stored_table_options
@coordinator_options
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@friendly_errors
def delete(**kw: Any) -> None:
    """Delete a group: its coordinator state and its Paimon consumer files.

    Refused while members are live. Orphaned consumer files keep snapshots
    from expiring forever, so delete groups you no longer run.
    """
    from paimon_group.admin import delete_group
    from paimon_group.group import GroupClient

    validate_group(kw["group"])
    url, options = admin_coordinator(kw)

    async def go() -> dict[str, Any]:
        async with open_coordinator(url, options) as coord:
            kw["table"] = await group_table(coord, kw["group"], kw["table"])
            table = await asyncio.to_thread(open_table, kw)
            return await delete_group(GroupClient(coord, kw["group"]), table)

    result = asyncio.run(go())
    if kw["as_json"]:
        _echo_json(result)
    else:
        click.echo(
            f"deleted group {result['group']}: {result['deleted_keys']} coordinator keys, "
            f"{result['deleted_consumer_files']} consumer files"
        )


# -- members -----------------------------------------------------------------


@main.group(cls=OneLineErrors)
def members() -> None:
    """Operate on the members of a group."""


@members.command(name="remove")
@group_option
@_optional_warehouse
@coordinator_options
@click.argument("member_id")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@friendly_errors
def members_remove(**kw: Any) -> None:
    """Force MEMBER_ID out of the group (a static member that will not come back).

    Deletes its member key, its owner keys and its leadership, and records its
    goodbye (so --rebalance-delay does not keep its shards waiting), in one
    commit. Safe even if the process is still alive: its commits are fenced
    (rejected) from then on, and the leader hands its shards to the others.
    """
    from paimon_group.admin import remove_member
    from paimon_group.group import GroupClient

    validate_group(kw["group"])
    url, options = admin_coordinator(kw)

    async def go() -> dict[str, Any]:
        async with open_coordinator(url, options) as coord:
            return await remove_member(GroupClient(coord, kw["group"]), kw["member_id"])

    result = asyncio.run(go())
    if kw["as_json"]:
        _echo_json(result)
    elif result["removed_keys"]:
        click.echo(f"removed member {result['member_id']} from group {result['group']}: "
                   + ", ".join(result["removed_keys"]))
    else:
        click.echo(f"member {result['member_id']}: {result['note']}")
