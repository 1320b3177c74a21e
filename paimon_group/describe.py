"""``paimon-group describe``: a group's members, leader, generation, and per shard
its owner, epoch, next snapshot and lag.

Lag in snapshots is ``latest_snapshot + 1 - next_snapshot`` (0 when the shard
has read everything committed so far), or null for a shard that has no
position yet.

Example::

    report = asyncio.run(describe_group(coord, "orders", table))
    print(json.dumps(report))
"""

from __future__ import annotations

import time
from typing import Any

from coordinators.base import Coordinator
from paimon_group.group import GroupClient
from paimon_group.table import ShardedTable


def group_status(members: int, assignment_members: set[str], live: set[str],
                 owners_match: bool) -> str:
    if members == 0:
        return "empty"
    if assignment_members == live and owners_match:
        return "stable"
    return "rebalancing"


async def describe_group(
    coordinator: Coordinator, group: str, table: ShardedTable | None
) -> dict[str, Any]:
    client = GroupClient(coordinator, group)
    state = await client.state()
    latest = table.latest_snapshot_id() if table is not None else None
    num_shards = state.meta.num_shards if state.meta else 0
    owned_by: dict[str, list[int]] = {}
    for shard, view in state.owners.items():
        owned_by.setdefault(view.member_id, []).append(shard)
    shards: list[dict[str, Any]] = []
    for shard in range(num_shards):
        owner = state.owners.get(shard)
        pos = state.positions.get(shard)
        next_snapshot = pos.next_snapshot if pos else None
        lag = None
        if next_snapshot is not None:
            lag = max(0, (latest or 0) + 1 - next_snapshot)
        shards.append(
            {
                "shard": shard,
                "owner": owner.member_id if owner else None,
                "epoch": owner.epoch if owner else None,
                "assigned_to": state.assignment.owner_of(shard) if state.assignment else None,
                "next_snapshot": next_snapshot,
                "lag_snapshots": lag,
                "last_commit": pos.committed_at if pos else None,
                "consumer_id": f"pg-{group}-shard-{shard}",
            }
        )
    live = set(state.members)
    assigned = set(state.assignment.shards) if state.assignment else set()
    owners_match = all(
        s["owner"] is not None and s["owner"] == s["assigned_to"] for s in shards
    )
    members = [
        {
            "member_id": m,
            "host": info.host,
            "pid": info.pid,
            "version": info.version,
            "started_at": info.started_at,
            "owned_shards": sorted(owned_by.get(m, [])),
            "assigned_shards": state.assignment.shards_of(m) if state.assignment else [],
            "session": info.session,
        }
        for m, info in sorted(state.members.items())
    ]
    return {
        "group": group,
        "exists": state.meta is not None,
        "table": state.meta.table if state.meta else None,
        "num_shards": num_shards,
        "state": group_status(len(live), assigned, live, owners_match),
        "generation": state.assignment.generation if state.assignment else 0,
        "leader": state.leader,
        "latest_snapshot": latest,
        "members": members,
        "shards": shards,
        "total_lag_snapshots": sum(s["lag_snapshots"] or 0 for s in shards),
        "described_at": time.time(),
    }
