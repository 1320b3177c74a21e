"""Sharding rules for every table kind, on real pypaimon-written tables.

Shows, per kind (fixed, fixed partitioned, dynamic, dynamic partitioned, the
same with ``changelog-producer = input``, bucket-unaware append, append
partitioned): the rule a new group gets; the
initial full scan over all shards equals pypaimon's own batch read, row for
row, and each shard's plan holds only its files; follow-ups (delta and
changelog, catch-up) deliver every written row version once; a key's versions stay in
one shard; rows spread over the shards. Then the bucket rescale, the
postpone and shard-count decisions, and the stored rule's compatibility.
"""

from __future__ import annotations

import collections
import logging
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pypaimon.schema.schema_change import SchemaChange

from coordinators.errors import ConfigError, CorruptValue
from paimon_group.errors import PlanInvariantViolated
from paimon_group.protocol.records import GroupMeta
from paimon_group.protocol.sharding import (
    DEFAULT_SHARDS,
    Sharding,
    ShardRule,
    TableKind,
    file_hash,
    idle_shards_note,
    partition_hash,
    plan_new_group,
)
from paimon_group.reading.planner import BatchKind, ShardPlanner, StepPlan
from paimon_group.reading.table import ShardedTable
from tests.support.tables import (
    catalog,
    make_append_table,
    make_pk_table,
    open_table,
    rows_table,
    write_rows,
)

Row = tuple[int, int]  # (id, v)
Maker = Callable[[str], Any]

KINDS: dict[str, tuple[Maker, TableKind, ShardRule, bool]] = {
    # name: (create db.t in the warehouse, kind, rule of a new group, has keys)
    "fixed": (lambda wh: make_pk_table(wh, "db.t", buckets=4),
              TableKind.FIXED, ShardRule.BUCKET, True),
    "fixed-partitioned": (lambda wh: make_pk_table(wh, "db.t", buckets=2, partitioned=True),
                          TableKind.FIXED, ShardRule.PARTITION_BUCKET, True),
    "dynamic": (lambda wh: make_pk_table(
        wh, "db.t", buckets=-1, options={"dynamic-bucket.target-row-num": "15"}),
        TableKind.DYNAMIC, ShardRule.BUCKET, True),
    "dynamic-partitioned": (lambda wh: make_pk_table(
        wh, "db.t", buckets=-1, partitioned=True,
        options={"dynamic-bucket.target-row-num": "4"}),
        TableKind.DYNAMIC, ShardRule.PARTITION_BUCKET, True),
    "dynamic-partitioned-changelog": (lambda wh: make_pk_table(
        wh, "db.t", buckets=-1, partitioned=True, changelog_producer="input",
        options={"dynamic-bucket.target-row-num": "4"}),
        TableKind.DYNAMIC, ShardRule.PARTITION_BUCKET, True),
    "append": (lambda wh: make_append_table(wh, "db.t", buckets=-1),
               TableKind.UNAWARE, ShardRule.FILE, False),
    "append-partitioned": (lambda wh: make_append_table(wh, "db.t", buckets=-1, partitioned=True),
                           TableKind.UNAWARE, ShardRule.FILE, False),
}


@pytest.fixture
def warehouse(tmp_path: Path) -> str:
    return str(tmp_path / "warehouse")


def rows_of(table: pa.Table) -> list[Row]:
    return list(zip(table.column("id").to_pylist(), table.column("v").to_pylist(), strict=True))


def batch_read(warehouse: str) -> collections.Counter[Row]:
    """pypaimon's own batch read of the latest snapshot."""
    builder = open_table(warehouse, "db.t").new_read_builder()
    return collections.Counter(rows_of(builder.new_read().to_arrow(builder.new_scan().plan()
                                                                     .splits())))


def read_all(planner: ShardPlanner, step: StepPlan) -> dict[int, list[Row]]:
    return {s: rows_of(planner.read_arrow(splits)) for s, splits in step.splits.items()}


# -- each kind, planned and read ---------------------------------------------------------


@pytest.mark.parametrize("name", list(KINDS))
def test_every_kind_is_sharded_exactly_on_every_path(warehouse: str, name: str) -> None:
    make, kind, rule, keyed = KINDS[name]
    make(warehouse)
    written: list[Row] = []

    def write(ids: range, v: int) -> int:
        written.extend((i, v) for i in ids)
        return write_rows(warehouse, "db.t", ids, v=v)

    write(range(0, 60), 0)
    full_at = write(range(30, 90), 1)  # updates 30..59 on keyed tables
    table = ShardedTable.open(warehouse, "db.t")
    assert (table.kind, table.default_rule) == (kind, rule)
    shards, rule_of_group = plan_new_group(table, None)
    assert rule_of_group is rule
    assert shards == (4 if kind is TableKind.FIXED and not table.partitioned else
                      2 if kind is TableKind.FIXED else DEFAULT_SHARDS)
    num_shards = 4
    planner = table.planner(num_shards, rule=rule, catch_up_threshold=3)

    # Initial: all shards together are pypaimon's batch read, row for row.
    full = planner.plan_full(range(num_shards), full_at)
    per_shard = read_all(planner, full)
    union = collections.Counter(r for rows in per_shard.values() for r in rows)
    assert union == batch_read(warehouse)
    if keyed:  # (an append table has 2 files here; spread is shown with many files)
        assert sum(1 for rows in per_shard.values() if rows) >= 3, per_shard.keys()
    # A subset of shards is planned the same as those shards of the whole.
    part = planner.plan_full([1, 3], full_at)
    assert {s: sorted(r) for s, r in read_all(planner, part).items()} == {
        s: sorted(per_shard[s]) for s in (1, 3)}

    # Follow-ups: two deltas, then a catch-up over four snapshots; updates
    # of keys written before the full scan and new keys (new buckets).
    before = len(written)
    for v, ids in enumerate([range(80, 130), range(0, 20), range(120, 200), range(10, 70),
                             range(190, 260), range(40, 45)], start=2):
        write(ids, v)
        if v == 3:
            position, steps = full_at + 1, []
            while (step := planner.plan_next(range(num_shards), position)) is not None:
                steps.append(step)
                position = step.next_snapshot
    while (step := planner.plan_next(range(num_shards), position)) is not None:
        steps.append(step)
        position = step.next_snapshot
    follow_up = BatchKind.CHANGELOG if table.changelog_producer != "none" else BatchKind.DELTA
    assert [s.kind for s in steps] == [follow_up, follow_up, BatchKind.CATCH_UP]
    delivered: collections.Counter[Row] = collections.Counter()
    shard_of_key: dict[int, set[int]] = collections.defaultdict(set)
    versions: dict[int, list[int]] = collections.defaultdict(list)
    for step in steps:
        for shard, rows in read_all(planner, step).items():
            delivered.update(rows)
            for i, v in rows:
                shard_of_key[i].add(shard)
                versions[i].append(v)
    assert delivered == collections.Counter(written[before:])
    for _shard, rows in per_shard.items():
        for i, _v in rows:
            shard_of_key[i].add(_shard)
    if keyed:
        moved = {i: s for i, s in shard_of_key.items() if len(s) > 1}
        assert not moved, f"keys read by several shards: {list(moved.items())[:5]}"
        assert all(v == sorted(v) for v in versions.values())


def test_a_split_of_files_of_several_shards_is_cut_per_shard(warehouse: str) -> None:
    make_append_table(warehouse, "db.t", buckets=-1)
    for v in range(8):
        last = write_rows(warehouse, "db.t", range(v * 10, v * 10 + 10), v=v)
    table = ShardedTable.open(warehouse, "db.t")
    planner = table.planner(3)
    # pypaimon packs the 8 small files into one split; the plan cuts it.
    whole = open_table(warehouse, "db.t").new_read_builder().new_scan().plan().splits()
    assert len(whole) == 1 and len(whole[0].files) == 8
    step = planner.plan_full(range(3), last)
    sharding = Sharding(ShardRule.FILE, 3)
    for shard, splits in step.splits.items():
        for split in splits:
            assert {sharding.shard_of(split.partition, 0, f.file_name) for f in split.files} \
                == {shard}
    # A forged plan with the uncut split is refused.
    with pytest.raises(PlanInvariantViolated, match="file rule"):
        StepPlan(BatchKind.INITIAL, last, last + 1, {0: whole}, num_shards=3, rule=ShardRule.FILE)


# -- the rules themselves ----------------------------------------------------------------


def test_rules_follow_their_formulas() -> None:
    bucket = Sharding(ShardRule.BUCKET, 4)
    assert [bucket.shard_of(("x",), b, "f") for b in range(6)] == [0, 1, 2, 3, 0, 1]
    pb = Sharding(ShardRule.PARTITION_BUCKET, 8)
    # Paimon's Flink assignment: (hash(partition) % n + bucket) % n.
    for part in [("2024-01-01",), ("p3",), (7, "x")]:
        base = partition_hash(part) % 8
        assert [pb.shard_of(part, b, "f") for b in range(3)] == [(base + b) % 8 for b in range(3)]
    # A non-partitioned table: the same as bucket % n.
    assert [pb.shard_of((), b, "f") for b in range(9)] == [b % 8 for b in range(9)]
    # Eight partitions of 2 buckets fill (nearly) all of 8 shards.
    spread = {pb.shard_of((f"p{p}",), b, "") for p in range(8) for b in range(2)}
    assert len(spread) >= 6
    f = Sharding(ShardRule.FILE, 5)
    assert f.shard_of(("p1",), 0, "data-a") == file_hash(("p1",), "data-a") % 5


def test_hashes_are_stable_across_processes() -> None:
    """Not Python's salted hash(): another process computes the same values."""
    code = ("from paimon_group.protocol.sharding import partition_hash, file_hash; "
            "print(partition_hash(('p1', 3)), file_hash(('p1',), 'data-x.parquet'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={"PYTHONHASHSEED": "123", "PATH": ""},
                         cwd=Path(__file__).resolve().parents[1]).stdout.split()
    assert [int(x) for x in out] == [partition_hash(("p1", 3)),
                                     file_hash(("p1",), "data-x.parquet")]


def test_group_meta_keeps_its_rule_and_old_records_keep_bucket() -> None:
    old = b'{"created_at":1.0,"format":1,"num_shards":4,"table":"db.t"}'
    assert GroupMeta.decode("k", old).sharding == "bucket"
    new = GroupMeta(num_shards=8, table="db.t", created_at=1.0, sharding="partition-bucket")
    assert GroupMeta.decode("k", new.encode()).sharding == "partition-bucket"
    with pytest.raises(CorruptValue):
        GroupMeta.decode("k", old.replace(b'"table"', b'"sharding":"nope","table"'))


def test_shuffle_option_off_keeps_bucket_rule(warehouse: str) -> None:
    make_pk_table(warehouse, "db.t", buckets=2, partitioned=True,
                  options={"read.shuffle-bucket-with-partition": "false"})
    assert ShardedTable.open(warehouse, "db.t").default_rule is ShardRule.BUCKET


# -- shard counts ------------------------------------------------------------------------


def test_more_shards_than_a_fixed_table_can_fill_is_refused(warehouse: str) -> None:
    make_pk_table(warehouse, "db.t", buckets=4)
    table = ShardedTable.open(warehouse, "db.t")
    with pytest.raises(ConfigError) as info:
        plan_new_group(table, 8)
    message = str(info.value)
    assert "--shards 8" in message and "4 buckets" in message and "\n" not in message
    assert plan_new_group(table, 4) == (4, ShardRule.BUCKET)
    assert plan_new_group(table, 3) == (3, ShardRule.BUCKET)


def test_more_shards_than_buckets_is_useful_on_partitioned_and_unbucketed_tables(
    warehouse: str,
) -> None:
    make_pk_table(warehouse, "db.t", buckets=2, partitioned=True)
    assert plan_new_group(ShardedTable.open(warehouse, "db.t"), 8) == (
        8, ShardRule.PARTITION_BUCKET)
    make_append_table(warehouse, "db.a", buckets=-1)
    assert plan_new_group(ShardedTable.open(warehouse, "db.a"), 16) == (16, ShardRule.FILE)


def test_a_capped_dynamic_table_refuses_shards_it_can_never_fill(warehouse: str) -> None:
    make_pk_table(warehouse, "db.t", buckets=-1, options={"dynamic-bucket.max-buckets": "3"})
    table = ShardedTable.open(warehouse, "db.t")
    with pytest.raises(ConfigError) as info:
        plan_new_group(table, 4)
    assert "max-buckets" in str(info.value) and "--shards 3 or fewer" in str(info.value)
    assert plan_new_group(table, 3) == (3, ShardRule.BUCKET)


@pytest.mark.parametrize(("name", "rows", "words"), [
    ("dynamic", 20, "1 bucket(s) in all so far, a new bucket every 15 keys"),
    ("append", 20, "1 data file(s) so far"),
])
def test_shards_without_rows_yet_are_named_in_one_line(
    warehouse: str, name: str, rows: int, words: str
) -> None:
    make, _kind, rule, _keyed = KINDS[name]
    make(warehouse)
    table = ShardedTable.open(warehouse, "db.t")
    assert idle_shards_note(table, Sharding(rule, 4)) is None  # empty: nothing to say
    write_rows(warehouse, "db.t", range(10))
    note = idle_shards_note(table, Sharding(rule, 4))
    assert note is not None and "1 of 4 shards have rows" in note and words in note
    assert "\n" not in note
    for v in range(1, 61):  # more buckets or files, until every shard has rows
        write_rows(warehouse, "db.t", range(v * 20, v * 20 + 20), v=v)
        if idle_shards_note(table, Sharding(rule, 4)) is None:
            break
    assert idle_shards_note(table, Sharding(rule, 4)) is None


# -- postpone buckets ----------------------------------------------------------------------


def test_postpone_table_with_a_compaction_changelog_reads_only_real_buckets(
    warehouse: str,
) -> None:
    """pypaimon writes into the pending bucket -2: nothing can be planned (a
    reader sees those rows once a compaction assigns them a bucket, with its
    changelog), and nothing fails."""
    make_pk_table(warehouse, "db.t", buckets=-2, changelog_producer="lookup")
    last = write_rows(warehouse, "db.t", range(20))
    table = ShardedTable.open(warehouse, "db.t")
    assert table.kind is TableKind.POSTPONE
    assert table.default_rule is ShardRule.BUCKET and table.default_shards == DEFAULT_SHARDS
    planner = table.planner(4)
    assert planner.plan_full(range(4), last).is_empty
    step = planner.plan_next(range(4), last)
    assert step is not None and step.is_empty
    assert not open_table(warehouse, "db.t").new_read_builder().new_scan().plan().splits()


# -- a bucket rescale ----------------------------------------------------------------------


def _overwrite(warehouse: str, ids: range, v: int) -> None:
    table = open_table(warehouse, "db.t")
    builder = table.new_batch_write_builder().overwrite()
    write, commit = builder.new_write(), builder.new_commit()
    try:
        write.write_arrow(rows_table(table, ids, v=v))
        commit.commit(write.prepare_commit())
    finally:
        write.close()
        commit.close()


@pytest.mark.parametrize("num_shards", [4, 3])
def test_bucket_rescale_keeps_routing_and_warns_about_the_overwrite(
    warehouse: str, num_shards: int, caplog: pytest.LogCaptureFixture
) -> None:
    make_pk_table(warehouse, "db.t", buckets=4)
    first = write_rows(warehouse, "db.t", range(0, 40), v=1)
    catalog(warehouse).alter_table("db.t", [SchemaChange.set_option("bucket", "8")])
    _overwrite(warehouse, range(0, 50), v=2)  # ALTER + INSERT OVERWRITE: rescaled
    write_rows(warehouse, "db.t", range(30, 60), v=3)
    table = ShardedTable.open(warehouse, "db.t")
    assert table.num_buckets == 8
    planner = table.planner(num_shards, rule=ShardRule.BUCKET)
    position, shard_of_key = first, collections.defaultdict(set)
    delivered: collections.Counter[Row] = collections.Counter()
    with caplog.at_level(logging.WARNING, logger="paimon_group.planner"):
        while (step := planner.plan_next(range(num_shards), position)) is not None:
            for shard, rows in read_all(planner, step).items():  # routing checked by StepPlan
                delivered.update(rows)
                for i, _ in rows:
                    shard_of_key[i].add(shard)
            position = step.next_snapshot
    assert delivered == collections.Counter([(i, 1) for i in range(40)]
                                            + [(i, 3) for i in range(30, 60)])
    assert any("OVERWRITE" in r.getMessage() and "skips it" in r.getMessage()
               for r in caplog.records)
    moved = [i for i, s in shard_of_key.items() if len(s) > 1]
    if num_shards == 4:  # 4 divides both bucket counts: keys keep their shard
        assert moved == []


# -- reading, describe and metrics follow each kind ------------------------------------


def _steps(planner: ShardPlanner, full_at: int) -> list[StepPlan]:
    steps = [planner.plan_full(range(planner.num_shards), full_at)]
    position = full_at + 1
    while (step := planner.plan_next(range(planner.num_shards), position)) is not None:
        steps.append(step)
        position = step.next_snapshot
    return steps


@pytest.mark.parametrize("name", list(KINDS))
def test_every_kind_reads_in_bounded_batches_as_pypaimon_does(warehouse: str, name: str) -> None:
    make, _kind, rule, _keyed = KINDS[name]
    make(warehouse)
    full_at = write_rows(warehouse, "db.t", range(0, 120), v=0)
    for v in range(1, 5):
        write_rows(warehouse, "db.t", range(v * 25, v * 25 + 60), v=v)
    table = ShardedTable.open(warehouse, "db.t")
    planner = ShardPlanner(table, 4, rule=rule, batch_rows=16, catch_up_threshold=2)
    read = 0
    for step in _steps(planner, full_at):
        for shard, splits in step.splits.items():
            ours = planner.read_arrow(splits)
            # Invariant 6: what we read is what pypaimon reads, row for row.
            assert rows_of(ours) == rows_of(planner.pypaimon_read_arrow(splits)), (step, shard)
            batches = list(planner.iter_batches(splits))
            assert all(0 < b.num_rows <= 16 for b in batches)
            assert [r for b in batches for r in rows_of(pa.Table.from_batches([b]))] \
                == rows_of(ours)
            read += ours.num_rows
    assert read >= 120 + 4 * 60 - (4 * 60 if _keyed else 0)


@pytest.mark.parametrize("name", ["dynamic-partitioned", "append-partitioned"])
def test_describe_counts_unread_rows_per_shard_under_the_rule(warehouse: str, name: str) -> None:
    import asyncio

    from coordinators.registry import open_coordinator
    from paimon_group.ops.report import describe_group
    from paimon_group.protocol.admin import GroupAdmin
    from paimon_group.protocol.group import GroupClient

    make, _kind, rule, _keyed = KINDS[name]
    make(warehouse)
    first = write_rows(warehouse, "db.t", range(0, 80), v=0)
    for v in range(1, 4):
        write_rows(warehouse, "db.t", range(v * 30, v * 30 + 50), v=v)
    table = ShardedTable.open(warehouse, "db.t")
    planner = table.planner(4, rule=rule)
    expected = collections.Counter[int]()
    position = first + 1
    while (step := planner.plan_next(range(4), position)) is not None:
        for shard in step.splits:
            expected[shard] += step.estimated_rows(shard)
        position = step.next_snapshot

    async def go() -> dict[str, Any]:
        async with open_coordinator(f"memory://describe-{name}") as coord:
            group = GroupClient(coord, "g")
            await group.ensure_meta(4, "db.t", sharding=rule.value)
            await GroupAdmin(coord, "g").reset_positions({s: first + 1 for s in range(4)}, "test")
            return await describe_group(coord, "g", table)

    report = asyncio.run(go())
    assert report["sharding"] == {"rule": rule.value, "formula": rule.formula}
    assert report["table_kind"] == KINDS[name][1].value
    assert {s["shard"]: s["unread_rows"] for s in report["shards"]} == {
        s: expected[s] for s in range(4)}
    assert sum(expected.values()) == 150


def test_metrics_name_the_rule_and_the_table_kind(warehouse: str) -> None:
    from paimon_group.ops.metrics import serve_metrics
    from tests.test_ops_metrics import HOST, StandInMember, scrape, value

    make_append_table(warehouse, "db.t", buckets=-1)
    write_rows(warehouse, "db.t", range(10))
    member = StandInMember(ShardedTable.open(warehouse, "db.t"), num_shards=4)
    member.sharding = ShardRule.FILE  # type: ignore[attr-defined]
    server = serve_metrics(member, 0, host=HOST)
    try:
        samples = scrape(server)
        assert value(samples, "paimon_group_sharding_info", rule="file",
                     table_kind="unaware") == 1
    finally:
        server.close()


def test_describe_json_text_and_reset_on_an_append_group(warehouse: str, tmp_path: Path) -> None:
    """The CLI on a bucket-unaware table: describe --json and the text view
    show the rule; reset writes positions and consumer files."""
    import asyncio
    import json

    from click.testing import CliRunner

    from coordinators.registry import open_coordinator
    from paimon_group.cli import main
    from paimon_group.protocol.admin import GroupAdmin
    from paimon_group.protocol.group import GroupClient
    from paimon_group.reading.mirror import ConsumerMirror

    make_append_table(warehouse, "db.t", buckets=-1)
    for v in range(4):
        write_rows(warehouse, "db.t", range(v * 10, v * 10 + 10), v=v)
    url = f"sqlite://{tmp_path / 'coordinator.sqlite'}"

    async def create() -> None:
        async with open_coordinator(url) as coord:
            group = GroupClient(coord, "g")
            await group.ensure_meta(4, "db.t", sharding=ShardRule.FILE.value)
            await GroupAdmin(coord, "g").reset_positions(dict.fromkeys(range(4), 5), "test")

    asyncio.run(create())
    common = ["--group", "g", "--warehouse", warehouse, "--table", "db.t", "--coordinator", url]
    runner = CliRunner()
    result = runner.invoke(main, ["describe", *common, "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["sharding"]["rule"] == "file" and report["table_kind"] == "unaware"
    text = runner.invoke(main, ["describe", *common], catch_exceptions=False, terminal_width=200)
    assert "sharding file" in " ".join(text.stdout.split()), text.stdout
    reset = runner.invoke(main, ["reset", *common, "--to-snapshot", "2", "--execute", "--json"],
                          catch_exceptions=False)
    assert reset.exit_code == 0, reset.output
    table = ShardedTable.open(warehouse, "db.t")
    assert ConsumerMirror(table.table.file_io, table.table_path, "g").all() == dict.fromkeys(
        range(4), 2)
    after = json.loads(runner.invoke(main, ["describe", *common, "--json"]).stdout)
    assert [s["next_snapshot"] for s in after["shards"]] == [2, 2, 2, 2]
    assert sum(s["unread_rows"] for s in after["shards"]) == 30


@pytest.mark.asyncio
async def test_a_group_stored_without_a_rule_keeps_bucket_sharding(warehouse: str) -> None:
    """A group created before rules existed (its record has no ``sharding``)
    keeps ``bucket % S`` when its members are upgraded, even on a partitioned
    table where a new group would get the partition-bucket rule; a new group
    on the same table gets that rule."""
    import asyncio
    import uuid

    from coordinators.protocol import Put
    from coordinators.registry import open_coordinator
    from paimon_group import GroupMember, MemberConfig
    from paimon_group.protocol.names import GroupKeys

    make_pk_table(warehouse, "db.t", buckets=2, partitioned=True)
    write_rows(warehouse, "db.t", range(40))
    coord = f"memory://rules-{uuid.uuid4().hex}"
    async with open_coordinator(coord) as c:
        old = b'{"created_at":1.0,"format":1,"num_shards":4,"table":"db.t"}'
        assert await c.commit([], [Put(GroupKeys("old").meta, old)])
        for group, rule in (("old", ShardRule.BUCKET), ("new", ShardRule.PARTITION_BUCKET)):
            config = MemberConfig(group=group, warehouse=warehouse, table="db.t",
                                  coordinator=coord, member_id="m", session_timeout_s=3,
                                  poll_interval_ms=50, shards=4)
            async with GroupMember(config) as member:
                batch = await asyncio.wait_for(member.batches().__anext__(), timeout=30)
                assert member.sharding is rule and batch.sharding == rule.value
