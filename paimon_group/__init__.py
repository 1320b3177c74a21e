"""paimon-group: coordinated, sharded consumer groups for Apache Paimon tables.

Start N members with a group name and the table's buckets are spread over
them; each shard is read by exactly one live member, its progress is kept in a
coordinator (embedded SQLite file, etcd or ZooKeeper) and written only by
commits fenced with the owner's epoch.

Example::

    from paimon_group import MemberConfig, run_member

    def handle(batch):
        print(batch.shard, batch.snapshot_id, batch.to_arrow().num_rows)

    run_member(MemberConfig(group="orders", warehouse="/data/wh", table="db.orders"), handle)

Public names are imported lazily so that ``import paimon_group`` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from paimon_group.version import __version__ as __version__

_EXPORTS = {
    "GroupMember": "paimon_group.member",
    "MemberState": "paimon_group.member",
    "RebalanceListener": "paimon_group.member",
    "run_member": "paimon_group.process.runner",
    "MemberConfig": "paimon_group.config.member",
    "ShardBatch": "paimon_group.reading.batch",
    "BatchKind": "paimon_group.reading.planner",
    "ShardedTable": "paimon_group.reading.table",
    "GroupClient": "paimon_group.protocol.group",
    "assign": "paimon_group.protocol.assignor",
    "consumer_id": "paimon_group.protocol.names",
    "PaimonGroupError": "paimon_group.errors",
    "ConfigError": "paimon_group.errors",
    "StaleEpoch": "paimon_group.errors",
    "HandlerFailed": "paimon_group.errors",
}

__all__ = [
    "BatchKind",
    "ConfigError",
    "GroupClient",
    "GroupMember",
    "HandlerFailed",
    "MemberConfig",
    "MemberState",
    "PaimonGroupError",
    "RebalanceListener",
    "ShardBatch",
    "ShardedTable",
    "StaleEpoch",
    "assign",
    "consumer_id",
    "run_member",
]

if TYPE_CHECKING:
    from paimon_group.config.member import MemberConfig
    from paimon_group.errors import ConfigError, HandlerFailed, PaimonGroupError, StaleEpoch
    from paimon_group.member import GroupMember, MemberState, RebalanceListener
    from paimon_group.process.runner import run_member
    from paimon_group.protocol.assignor import assign
    from paimon_group.protocol.group import GroupClient
    from paimon_group.protocol.names import consumer_id
    from paimon_group.reading.batch import ShardBatch
    from paimon_group.reading.planner import BatchKind
    from paimon_group.reading.table import ShardedTable


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'paimon_group' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    # The lazy names too (``dir(paimon_group)`` lists ``GroupMember``).
    return sorted({*globals(), *__all__})
