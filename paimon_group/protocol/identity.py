"""The identity of a Paimon table, stored with the group (a dropped and
re-created table is refused, not read from stale positions).

A table's name says nothing about which table it is: ``DROP TABLE`` and
``CREATE TABLE`` under the same name give a new table whose snapshot ids start
at 1 again, while the group's positions are ids of the old one. A member that
kept them would wait in silence until the new table reached them, and then
skip its first snapshots.

The identity is the creation time of the table's earliest schema
(``schema-0``, written by ``CREATE TABLE`` and never rewritten; ALTER TABLE
adds ``schema-1``, ``schema-2``, ...), as ``"schema-<id>@<time ms>"``. It is
what Paimon's own ``Table.uuid()`` is made of (the full name plus the earliest
schema's creation time) for file-system catalogs; pypaimon exposes no uuid
for them. It is stored in the group record when the group is created
(:class:`~paimon_group.protocol.records.GroupMeta` ``table_id``), checked at every
join, and checked again by a running member every
:data:`~paimon_group.member.TABLE_CHECK_S` seconds.

Example::

    table = ShardedTable.open("/data/wh", "db.orders")
    table_identity(table.table)        # 'schema-0@1763865600123'
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from coordinators.protocol import Coordinator
from paimon_group.errors import AssignorMismatch, ConfigError, TableReplaced, WarehouseMismatch
from paimon_group.store.files import read_text

if TYPE_CHECKING:
    from paimon_group.protocol.records import GroupMeta

__all__ = [
    "check_group_warehouse", "check_shard_bound", "check_table_identity", "table_identity",
]


def table_identity(pypaimon_table: Any) -> str:
    """``"schema-<id>@<creation time ms>"`` of the table's earliest schema, or
    ``""`` when no schema can be read (then nothing is checked).

    Read from the file system afresh (pypaimon's schema manager caches the
    schemas it has read, so the table object's own would keep answering for
    a dropped table). The first schema's file is read directly (one read, two
    requests on an object store, where pypaimon's schema manager makes four)."""
    text = read_text(pypaimon_table.file_io, f"{str(pypaimon_table.table_path).rstrip('/')}"
                                             "/schema/schema-0")
    if text is not None:
        try:
            data = json.loads(text)
            return f"schema-{int(data['id'])}@{int(data['timeMillis'])}"
        except (ValueError, KeyError, TypeError):
            pass  # not the layout we know: ask pypaimon's schema manager
    from pypaimon.schema.schema_manager import SchemaManager

    manager = SchemaManager(pypaimon_table.file_io, str(pypaimon_table.table_path))
    schema = manager.get_schema(0)
    if schema is None:
        schemas = manager.list_all()
        if not schemas:
            return ""
        schema = min(schemas, key=lambda s: int(s.id))
    return f"schema-{int(schema.id)}@{int(schema.time_millis)}"


def check_table_identity(meta: GroupMeta, group: str, current: str) -> None:
    """Raise :class:`TableReplaced` when ``current`` is not the identity the
    group was created on (a record without one, or an unknown current
    identity, is not checked)."""
    if not meta.table_id or not current or meta.table_id == current:
        return
    raise TableReplaced(
        f"table {meta.table} was dropped and re-created after group {group!r} was created "
        f"(table identity {meta.table_id}, now {current}): the group's positions belong to "
        f"the old table, so nothing is read; delete the group (paimon-group delete --group "
        f"{group} ...) and start it again, or use another group name"
    )


JOIN_HINT = "use another group name for this warehouse's table, or another coordinator"
"""What a member whose warehouse is not its group's can do."""


def check_group_warehouse(meta: GroupMeta, group: str, warehouse: str,
                          hint: str = JOIN_HINT) -> None:
    """Raise :class:`WarehouseMismatch` when the group was created on another
    warehouse than ``warehouse`` (both normalised; a record without one, from
    before warehouses were stored, is not checked)."""
    if not meta.warehouse or not warehouse or meta.warehouse == warehouse:
        return
    raise WarehouseMismatch(
        f"group {group!r} belongs to table {meta.table} of warehouse {meta.warehouse}, "
        f"not to warehouse {warehouse}: this coordinator is shared by both warehouses and a "
        f"group name is one group in it; {hint}"
    )


def check_group_assignor(meta: GroupMeta, group: str, assignor: str | None) -> None:
    """Raise :class:`AssignorMismatch` when ``assignor`` (``--assignor``; None:
    not given) is not the one the group was created with."""
    if assignor is None or meta.assignor == assignor:
        return
    raise AssignorMismatch(
        f"group {group!r} was created with --assignor {meta.assignor}; --assignor "
        f"{assignor} contradicts it (leave out --assignor to use the stored one, use "
        "another group name, or delete the group first)"
    )


def check_shard_bound(coordinator: Coordinator, group: str, num_shards: int) -> None:
    """Refuse (one line) a group of more shards than its backend holds.

    The group's records that grow with it (the assignment: every shard and
    member, each shard's load) must fit in one value of the backend; a
    backend with a bound says so as ``Coordinator.max_shards``
    (docs/zookeeper.md, "Values and groups: the size limit")."""
    bound = coordinator.max_shards
    if bound is not None and num_shards > bound:
        raise ConfigError(
            f"group {group!r} has {num_shards} shards, more than the {bound} a group may "
            f"have on the {coordinator.scheme}:// coordinator (its records must fit in one "
            f"value): use --shards {bound} or fewer, or another coordinator"
        )
