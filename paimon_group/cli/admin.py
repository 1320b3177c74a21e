"""Administrative commands of ``paimon-group``: ``list``, ``reset``, ``delete``,
``members remove``.

Each one opens its own short coordinator session; the logic lives in
:mod:`paimon_group.ops.admin` and :mod:`paimon_group.ops.reset`.

Exit codes: 0 done; 1 refused (live members: ``GroupBusy``) or failed;
2 bad input (unknown group or member, bad option).

Example::

    paimon-group reset --group orders --warehouse /wh --table db.orders --to-snapshot 42
    paimon-group reset --group orders --warehouse /wh --table db.orders --to-snapshot 42 \\
        --execute
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import click

from coordinators.errors import ConfigError
from coordinators.registry import open_coordinator, redact_url
from paimon_group.cli.context import (
    admin_coordinator,
    echo_json,
    group_table,
    open_chosen_tables,
    open_map_tables,
    open_table,
)
from paimon_group.cli.errors import OneLineErrors, friendly_errors
from paimon_group.cli.options import (
    coordinator_options,
    group_option,
    json_option,
    optional_warehouse_options,
    stored_table_options,
    wide_option,
)
from paimon_group.protocol.names import validate_group

if TYPE_CHECKING:
    from paimon_group.ops.admin import DeletedGroup, MemberRemoved
    from paimon_group.ops.reset import ResetPlan, ResetTarget
    from paimon_group.protocol.admin import GroupAdmin
    from paimon_group.protocol.records import GroupMeta
    from paimon_group.reading.table import ShardedTable

# -- list -------------------------------------------------------------------


@click.command(name="list")
@optional_warehouse_options
@coordinator_options
@json_option("Print one JSON object.")
@wide_option
@friendly_errors
def list_command(**kw: Any) -> None:
    """The groups of a coordinator, with member count, state and max lag.

    The lag shown is the slowest shard's (snapshots and time behind).

    Lag needs the tables: give --warehouse (each group's table is opened
    there); without it the lag columns are empty.
    """
    url, options = admin_coordinator(kw)  # a refused coordinator before the imports
    from paimon_group.config.warehouses import normalised_warehouse
    from paimon_group.ops.admin import list_groups

    def opener(identifier: str) -> ShardedTable | None:
        return open_table(kw, identifier) if kw.get("warehouse") else None

    async def go() -> list[dict[str, Any]]:
        async with open_coordinator(url, options) as coord:
            here = normalised_warehouse(kw["warehouse"]) if kw.get("warehouse") else ""
            return [g.to_dict() for g in await list_groups(coord, opener, warehouse=here)]

    groups = asyncio.run(go())
    if kw["as_json"]:
        echo_json({"coordinator": redact_url(url), "groups": groups})
    else:
        from paimon_group.ops.render import output_console, render_list

        render_list(groups, output_console(kw["wide"]))


# -- reset -------------------------------------------------------------------


@click.command()
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
@json_option("Print the plan as one JSON object.")
@wide_option
@friendly_errors
def reset(**kw: Any) -> None:
    """Move a group's positions; prints the plan, changes nothing without --execute.

    Refused while the group has live members (stop them first). Writes the
    coordinator positions and the Paimon consumer files together.
    """
    from paimon_group.ops.reset import ResetTarget, execute_reset, parse_shards, plan_reset
    from paimon_group.protocol.admin import GroupAdmin

    validate_group(kw["group"])
    target = ResetTarget.from_options(
        to_earliest=kw["to_earliest"], to_latest=kw["to_latest"],
        to_snapshot=kw["to_snapshot"], to_timestamp=kw["to_timestamp"],
        shift_by=kw["shift_by"],
    )
    url, options = admin_coordinator(kw)

    async def go() -> dict[str, Any]:
        async with open_coordinator(url, options) as coord:
            given = kw["table"]
            kw["table"] = await group_table(coord, kw["group"], kw["table"], kw["warehouse"])
            client = GroupAdmin(coord, kw["group"])
            meta = await client.read_meta()
            if meta is not None and meta.tables is not None:
                return (await _reset_tables(client, kw, meta, given, target)).to_dict()
            table = await asyncio.to_thread(open_table, kw)
            plan = await plan_reset(client, table, target, parse_shards(kw["shards"]))
            if kw["execute"]:
                plan = await execute_reset(client, table, plan, force=kw["force"])
            return plan.to_dict()

    plan = asyncio.run(go())
    if kw["as_json"]:
        echo_json(plan)
    else:
        from paimon_group.ops.render import output_console, render_reset_plan

        render_reset_plan(plan, output_console(kw["wide"]))


async def _reset_tables(client: GroupAdmin, kw: dict[str, Any], meta: GroupMeta,
                        pattern: str | None, target: ResetTarget) -> ResetPlan:
    """reset of a group of several tables: the tables ``pattern`` (``--table``)
    matches, or every live one (:mod:`paimon_group.ops.reset_tables`)."""
    from paimon_group.ops.reset import execute_reset_files, parse_shards
    from paimon_group.ops.reset_tables import plan_reset_tables, select_tables, table_files

    assert meta.tables is not None
    chosen = select_tables(meta, client.group, pattern)
    opened = await asyncio.to_thread(open_chosen_tables, kw, meta.tables, chosen)
    plan = await plan_reset_tables(client, opened, target, parse_shards(kw["shards"]))
    if kw["execute"]:
        plan = await execute_reset_files(client, table_files(meta, opened, client.group), plan,
                                         force=kw["force"])
    return plan


# -- delete ------------------------------------------------------------------


@click.command()
@group_option
@stored_table_options
@coordinator_options
@click.option("--orphaned-files", is_flag=True,
              help="Also when this coordinator does not know the group, delete the consumer "
                   "files of that name in the table (left by a delete that failed half way or "
                   "a wiped coordinator). Without it they are kept: they may belong to a live "
                   "group of another coordinator.")
@json_option("Print the result as JSON.")
@friendly_errors
def delete(**kw: Any) -> None:
    """Delete a group: its coordinator state and its Paimon consumer files.

    Refused while members are live. Orphaned consumer files keep snapshots
    from expiring forever, so delete groups you no longer run.
    """
    from paimon_group.ops.admin import delete_group
    from paimon_group.protocol.admin import GroupAdmin

    validate_group(kw["group"])
    url, options = admin_coordinator(kw)

    async def go() -> DeletedGroup:
        async with open_coordinator(url, options) as coord:
            given = kw["table"]
            kw["table"] = await group_table(coord, kw["group"], kw["table"], kw["warehouse"])
            client = GroupAdmin(coord, kw["group"])
            meta = await client.read_meta()
            if meta is not None and meta.tables is not None:
                return await _delete_tables(client, kw, meta, given)
            table = await asyncio.to_thread(open_table, kw)
            return await delete_group(client, table, orphaned_files=kw["orphaned_files"])

    result = asyncio.run(go())
    if kw["as_json"]:
        echo_json(result.to_dict())
    else:
        click.echo(
            f"deleted group {result.group}: {result.deleted_keys} coordinator keys, "
            f"{result.deleted_consumer_files} consumer files"
        )


async def _delete_tables(client: GroupAdmin, kw: dict[str, Any], meta: GroupMeta,
                         given: str | None) -> DeletedGroup:
    """delete of a group of several tables: its keys, and its consumer files
    in each of its live tables (a table not found any more has none left)."""
    from paimon_group.ops.admin import delete_group

    assert meta.tables is not None
    if given:
        raise ConfigError(
            f"group {client.group!r} reads several tables ({meta.table}): delete removes "
            "the whole group, every table's consumer files with it; give no --table "
            "(reset --table moves the positions of some of its tables)")
    opened = await asyncio.to_thread(open_map_tables, kw, meta.tables)
    tables = [t for _, t in sorted(opened.items()) if not isinstance(t, str)]
    return await delete_group(client, None, orphaned_files=kw["orphaned_files"], tables=tables)


# -- members -----------------------------------------------------------------


@click.group(cls=OneLineErrors)
def members() -> None:
    """Operate on the members of a group."""


@members.command(name="remove")
@group_option
@optional_warehouse_options
@coordinator_options
@click.argument("member_id")
@json_option("Print the result as JSON.")
@friendly_errors
def members_remove(**kw: Any) -> None:
    """Force MEMBER_ID out of the group (a static member that will not come back).

    Deletes its member key, its owner keys and its leadership, and records its
    goodbye (so --rebalance-delay-s does not keep its shards waiting), in one
    commit. Safe even if the process is still alive: its commits are fenced
    (rejected) from then on, and the leader hands its shards to the others.
    """
    from paimon_group.ops.admin import remove_member
    from paimon_group.protocol.admin import GroupAdmin

    validate_group(kw["group"])
    url, options = admin_coordinator(kw)

    async def go() -> MemberRemoved:
        async with open_coordinator(url, options) as coord:
            return await remove_member(GroupAdmin(coord, kw["group"]), kw["member_id"])

    result = asyncio.run(go())
    if kw["as_json"]:
        echo_json(result.to_dict())
    elif result.removed_keys:
        click.echo(f"removed member {result.member_id} from group {result.group}: "
                   + ", ".join(result.removed_keys))
    else:
        click.echo(f"member {result.member_id}: {result.note}")
