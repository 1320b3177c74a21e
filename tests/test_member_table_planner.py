"""A table of a group of several builds its planner at its first use, once,
whichever threads ask for it first (paimon_group/member/tables.py)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

from paimon_group.member.tables import MemberTable
from paimon_group.protocol.records import GroupMeta
from paimon_group.protocol.table_map import TableRange
from paimon_group.reading.mirror import ConsumerMirror
from paimon_group.reading.planner import ShardPlanner
from paimon_group.reading.table import ShardedTable


class SlowFactory:
    """Builds a stand-in planner slowly, counting the builds."""

    def __init__(self) -> None:
        self.builds = 0
        self.lock = threading.Lock()

    def __call__(self) -> ShardPlanner:
        with self.lock:
            self.builds += 1
        time.sleep(0.05)  # long enough for every asker to arrive meanwhile
        return cast(ShardPlanner, object())


def test_the_planner_is_built_at_its_first_use_once() -> None:
    factory = SlowFactory()
    table = MemberTable(
        index=0, range=TableRange(name="db.t", table_id="id", first=0, shards=2,
                                  sharding="bucket"),
        group_meta=cast(GroupMeta, None), table=cast(ShardedTable, None),
        new_planner=factory, mirror=cast(ConsumerMirror, None))
    assert factory.builds == 0  # made, not built
    with ThreadPoolExecutor(8) as pool:
        planners: list[Any] = list(pool.map(lambda _: table.planner, range(8)))
    assert factory.builds == 1
    assert all(p is planners[0] for p in planners)
    assert table.planner is planners[0] and factory.builds == 1
