"""A worker in the README's library form, for tests of its signals: one JSON
line on stdout per event (``assigned``/``revoked``/``lost`` with the shards
and the wall time, ``rows`` per batch, ``left`` once ``batches()`` ended).
It writes no signal code: the member's own handlers stop it.

Example::

    python -m tests.support.library_worker WAREHOUSE COORDINATOR MEMBER_ID
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from paimon_group import GroupMember, MemberConfig

SESSION_TIMEOUT_S = 30.0
"""Long, so that a handoff that waited for the session would show."""


def _say(**event: object) -> None:
    print(json.dumps({**event, "t": time.time()}), flush=True)


class Announce:
    def on_assigned(self, shards: list[int]) -> None:
        _say(assigned=sorted(shards))

    def on_revoked(self, shards: list[int]) -> None:
        _say(revoked=sorted(shards))

    def on_lost(self, shards: list[int]) -> None:
        _say(lost=sorted(shards))


async def main(warehouse: str, coordinator: str, member_id: str) -> None:
    config = MemberConfig(group="lib", warehouse=warehouse, table="db.t",
                          coordinator=coordinator, member_id=member_id,
                          session_timeout_s=SESSION_TIMEOUT_S, poll_interval_ms=100)
    async with GroupMember(config, listener=Announce()) as member:
        async for batch in member.batches():
            _say(shard=batch.shard, rows=batch.to_arrow().num_rows)
    _say(left=True)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
