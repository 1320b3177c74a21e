"""A follower's full control round reads its member key, the leader key and
the assignment in one request (issue 24).

After every publication all members of a group run a full round at once; read
one by one, the three keys were three requests per member per round (600 in
the same instant at 200 members, each member's round three round trips long),
and three per member per tick at steady state. (Under the file rule the
group's start is a fourth key of the same request; the operators' ``forced``
mark is read in it too, in place of a periodic read of every owner key held.)
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from paimon_group import GroupMember, MemberConfig
from paimon_group.protocol.sharding import ShardRule
from tests.test_ownership_check import _table, _until


def _config(wh: str, url: str, member: str) -> MemberConfig:
    return MemberConfig(group="g", warehouse=wh, table="db.t", coordinator=url,
                        member_id=member, session_timeout_s=2, poll_interval_ms=50, shards=8)


@pytest.mark.asyncio
@pytest.mark.parametrize("backend", ["etcd", "zookeeper"])
async def test_a_followers_round_reads_its_three_keys_in_one_request(
        tmp_path: Path, backend: str, request: pytest.FixtureRequest) -> None:
    wh = _table(tmp_path)
    if backend == "etcd":
        url = str(request.getfixturevalue("etcd_server").url_with_prefix())
    else:
        url = str(request.getfixturevalue("zk_server").unique_url())
    a, b = GroupMember(_config(wh, url, "a")), GroupMember(_config(wh, url, "b"))
    await a.start()
    await b.start()
    try:
        await _until(lambda: len(a.owned_shards) == 4 and len(b.owned_shards) == 4,
                     "4 shards each")
        follower = b if a.is_leader else a
        assert follower.core.coordinator is not None and follower.core.group is not None
        coord, keys = follower.core.coordinator, follower.core.group.keys
        round_keys = {keys.member(follower.member_id), keys.leader, keys.assignment, keys.forced}
        if follower.sharding is ShardRule.FILE:
            # The group's start too, in the same request (issue 37, D2).
            round_keys.add(keys.start)
        single: list[str] = []
        together: list[set[str]] = []
        real_get, real_get_many = coord.get, coord.get_many

        async def get(key: str) -> Any:
            single.append(key)
            return await real_get(key)

        async def get_many(many: Any) -> Any:
            together.append(set(many))
            return await real_get_many(many)

        coord.get = get  # type: ignore[method-assign]
        coord.get_many = get_many  # type: ignore[method-assign]
        await asyncio.sleep(2.2)  # four ticks (a quarter of the session timeout each)
        assert not follower.is_leader
        assert [k for k in single if k in round_keys] == []
        assert sum(1 for batch in together if batch == round_keys) >= 3, together
    finally:
        await a.stop()
        await b.stop()
