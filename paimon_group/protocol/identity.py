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
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from coordinators.protocol import Coordinator
from paimon_group.errors import AssignorMismatch, ConfigError, TableReplaced, WarehouseMismatch
from paimon_group.store.files import file_signature, read_text

if TYPE_CHECKING:
    from paimon_group.protocol.records import GroupMeta

__all__ = [
    "IdentityChecks", "check_group_warehouse", "check_shard_bound", "check_table_identity",
    "identity_signature", "table_identity",
]


def table_identity(pypaimon_table: Any) -> str:
    """``"schema-<id>@<creation time ms>"`` of the table's earliest schema, or
    ``""`` when no schema can be read (then nothing is checked).

    Read from the file system afresh (pypaimon's schema manager caches the
    schemas it has read, so the table object's own would keep answering for
    a dropped table). The first schema's file is read directly (one read, two
    requests on an object store, where pypaimon's schema manager makes four)."""
    text = read_text(pypaimon_table.file_io, _first_schema(pypaimon_table))
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


def _first_schema(pypaimon_table: Any) -> str:
    return f"{str(pypaimon_table.table_path).rstrip('/')}/schema/schema-0"


def identity_signature(pypaimon_table: Any) -> tuple[int, ...] | None:
    """Which file the table's identity is read from, on a local file system
    (:func:`~paimon_group.store.files.file_signature`); None elsewhere, or
    when it is absent."""
    return file_signature(pypaimon_table.file_io, _first_schema(pypaimon_table))


class IdentityChecks:
    """Checks, made often, that tables are the ones expected (the leader's,
    for a group of several tables, every ``TABLE_CHECK_S``).

    ``schema-0`` is written when the table is created and never rewritten,
    so a table whose ``schema-0`` is the very file that was read and found
    to be the expected one (the same :func:`identity_signature`: a local
    file system) is in place without reading it again: one ``stat`` instead
    of an open, a read and a parse. A table dropped has no such file; one
    dropped and re-created under its name has another (read, and found not
    to be the expected one). Where no signature can be had (an object
    store) every check reads the identity. ``identity`` and ``signature``
    are :func:`table_identity` and :func:`identity_signature` (injectable).
    Safe from several threads."""

    def __init__(self, *, identity: Callable[[Any], str] = table_identity,
                 signature: Callable[[Any], tuple[int, ...] | None] = identity_signature
                 ) -> None:
        self._identity, self._signature = identity, signature
        self._found: dict[tuple[str, str], tuple[int, ...]] = {}
        self._lock = threading.Lock()

    def in_place(self, pypaimon_table: Any, expected: str) -> bool:
        """Whether the table is the one of identity ``expected``; raises as
        the store does."""
        key = (str(pypaimon_table.table_path), expected)
        signature = self._signature(pypaimon_table)
        with self._lock:
            if signature is not None and self._found.get(key) == signature:
                return True
            self._found.pop(key, None)
        if self._identity(pypaimon_table) != expected:
            return False
        if signature is not None and self._signature(pypaimon_table) == signature:
            # The file read is the one signed before the read (not replaced
            # in between): remembered as the expected table's.
            with self._lock:
                self._found[key] = signature
        return True


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
