"""One member of a consumer group: membership, leadership, ownership, reading.

The member's states and the allowed transitions are in
:mod:`paimon_group.member.state`; every transition goes through
``MemberCore.set_state``, which refuses the others.

What happens in RUNNING, as three cooperating asyncio tasks:

* the **control loop** (level-triggered on coordinator watches): becomes leader
  when there is none; as leader, recomputes the sticky assignment whenever the
  live members change and publishes it guarded by its leader epoch; as any
  member, follows the published assignment: shards no longer ours are
  **revoked** (the batch in flight finishes or, after ``revoke_timeout_s``, is
  abandoned; the position is committed and the owner key deleted in one
  commit), shards newly ours are **acquired** as soon as their owner key is
  absent (the previous owner released it or its session expired). Only moved
  shards pause: the others keep reading.
* the **read loop**: for every group of owned shards at the same position,
  plans the next step once (one read of the snapshot's manifests for all of
  them), hands each shard's batch to the handler, then commits the shard's new
  position with a fenced commit. Shards without rows in a step advance in one
  batched commit.
* the coordinator's own **session keep-alive** (inside the backend).

Safety (the project's invariants): nothing is delivered and nothing is
committed unless the session is CONNECTED and its local monotonic deadline
minus ``safety_margin_s`` has not passed; and every commit is guarded by the
shard's epoch in the coordinator, so a member that was paused, partitioned or
expired can never commit over the new owner (a rejected commit drops the
shard locally and is counted).

Layout: one module per idea. :class:`GroupMember` holds the member's core
(the state every part reads, private to it) and owns its parts, each an
object with a small interface, built with the core, the state it owns and the
sibling parts it calls:

* ``state``: MemberState and its transitions, ShardState and OwnedShard, the
  session gate;
* ``core``: the member's own state, the read-only views of what each part
  owns (the joined session, owned shards, positions, leadership, readiness)
  and services (``set_state``, the planning thread, the listener);
* ``commits`` (``member.commits``): the fenced commit, its read-back; the
  commit lane of a step;
* ``ownership`` (``member.ownership``): acquire, revoke and release, the
  ownership check;
* ``control`` (``member.control``): the control loop: leadership, following
  the assignment (its watches: ``watches``);
* ``membership`` (``member.membership``): join, supervise and rejoin, leave;
* ``read_loop`` (``member.read_loop``): the read loop;
* ``host_reads`` (``member.host_reads``): the hooks for a host that plans and
  reads by itself (the member's read loop never runs);
* ``group_member``: :class:`GroupMember` itself (start, stop, run, batches,
  and the read-only views its user reads).

The static-membership policy is :mod:`paimon_group.protocol.static_membership`; the
process runner is :mod:`paimon_group.process.runner`; the stop signals (SIGTERM and
SIGINT: a graceful leave, for the runner and for ``async with``) are
:mod:`paimon_group.member.signals`.

Example (runnable; needs a Paimon table)::

    import asyncio
    from paimon_group import GroupMember, MemberConfig

    async def main() -> None:
        cfg = MemberConfig(group="orders", warehouse="/tmp/wh", table="db.orders",
                           coordinator="sqlite:///tmp/wh-coord.sqlite")
        async with GroupMember(cfg) as member:
            async for batch in member.batches():
                print(batch.shard, batch.snapshot_id, batch.to_arrow().num_rows)

    asyncio.run(main())
"""

from __future__ import annotations

from paimon_group.config.member import MemberConfig
from paimon_group.member.commits import COMMIT_LINGER_S, CommitLane
from paimon_group.member.core import (
    VERSION,
    Handler,
    MemberStats,
    RebalanceListener,
)
from paimon_group.member.group_member import GroupMember
from paimon_group.member.head import TABLE_CHECK_S
from paimon_group.member.host_reads import ShardPosition
from paimon_group.member.state import MemberState, OwnedShard, ShardState

__all__ = [
    "COMMIT_LINGER_S",
    "TABLE_CHECK_S",
    "VERSION",
    "CommitLane",
    "GroupMember",
    "Handler",
    "MemberConfig",
    "MemberState",
    "MemberStats",
    "OwnedShard",
    "RebalanceListener",
    "ShardPosition",
    "ShardState",
]
