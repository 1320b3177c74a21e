"""The ``paimon-group`` Spark streaming source: real PySpark (local master), real tables.

One SparkSession for the module. Each query writes through the documented
idempotent sink (:func:`paimon_group.spark.source.sink.write_replacing`:
Parquet partitions (shard, snapshot) replaced as a whole) and records what
every micro-batch held, so a test sees both the sink's final content and
whether a restart re-read anything.
"""

from __future__ import annotations

import asyncio
import os
import re
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from tests.support.requirements import require
from tests.support.tables import make_pk_table, write_rows
from tests.support.waiting import wait_for

pytestmark = pytest.mark.spark

if not os.environ.get("CI"):
    require("pyspark", "pip install '.[spark]' (tests/run.sh does)")

from paimon_group.spark.source.sink import read_sink, write_replacing  # noqa: E402

REPO = Path(__file__).resolve().parents[1]



class Recorder:
    """A foreachBatch function: the documented sink, plus a log of every batch's
    ids and (shard, snapshot) pairs; ``fail_at``: raise in that batch (once)."""

    def __init__(self, sink: Path, fail_at: int | None = None) -> None:
        self.sink = sink
        self.fail_at = fail_at
        self.batches: list[tuple[int, list[int]]] = []
        self.pairs: list[tuple[int, list[tuple[int, int]]]] = []
        # foreachBatch runs on a thread of the query: the test reads the sink
        # between two writes, never while one replaces a partition.
        self.lock = threading.Lock()

    def __call__(self, df: Any, batch_id: int) -> None:
        if batch_id == self.fail_at:
            self.fail_at = None
            raise RuntimeError(f"the sink failed in batch {batch_id}")
        rows = df.select("id", "_pg_shard", "_pg_snapshot").collect()
        ids = sorted(r["id"] for r in rows)
        pairs = sorted({(r["_pg_shard"], r["_pg_snapshot"]) for r in rows})
        with self.lock:
            write_replacing(df, str(self.sink))
            self.batches.append((batch_id, ids))
            self.pairs.append((batch_id, pairs))

    def sink_ids(self, spark: Any) -> list[int]:
        with self.lock:
            return read_sink(spark, str(self.sink), ["id"])


def start_query(spark: Any, warehouse: Path, recorder: Recorder, checkpoint: Path,
                member: str = "q1", trigger: str = "300 milliseconds", **options: str) -> Any:
    reader = (spark.readStream.format("paimon-group")
              .option("group", "g").option("warehouse", str(warehouse))
              .option("table", "db.t").option("member_id", member)
              .option("session_timeout_s", "4").option("metadata_columns", "true"))
    for key, value in options.items():
        reader = reader.option(key, value)
    return (reader.load().writeStream.foreachBatch(recorder)
            .option("checkpointLocation", str(checkpoint))
            .trigger(processingTime=trigger).start())


def rewind_positions(warehouse: Path, group: str, next_snapshot: int) -> dict[int, int]:
    """Put every shard of ``group`` (no owner) back to ``next_snapshot``; the positions now."""
    from coordinators.registry import open_coordinator
    from paimon_group.config.member import default_coordinator_url
    from paimon_group.protocol.admin import GroupAdmin
    from paimon_group.protocol.group import GroupClient

    async def go() -> dict[int, int]:
        async with open_coordinator(default_coordinator_url(str(warehouse))) as coord:
            client = GroupClient(coord, group)
            positions = await client.positions()
            deadline = time.monotonic() + 30
            # The stopped query's member leaves (or its session expires) first.
            while not await GroupAdmin(coord, group).reset_positions(
                    dict.fromkeys(positions, next_snapshot), "test"):
                assert time.monotonic() < deadline, "the stopped query still owns shards"
                await asyncio.sleep(0.2)
            return {s: p.next_snapshot for s, p in (await client.positions()).items()}

    return asyncio.run(go())


def test_single_query_restarted_from_its_checkpoint_loses_nothing_and_rereads_nothing(
    spark: Any, tmp_path: Path
) -> None:
    warehouse, checkpoint = tmp_path / "wh", tmp_path / "ckpt"
    make_pk_table(warehouse, "db.t", buckets=4)
    write_rows(warehouse, "db.t", range(100))
    recorder = Recorder(tmp_path / "sink")
    query = start_query(spark, warehouse, recorder, checkpoint, max_snapshots_per_batch="2")
    try:
        wait_for("the initial rows", lambda: len(recorder.sink_ids(spark)) == 100, query=query)
        for k in range(1, 4):
            write_rows(warehouse, "db.t", range(100 * k, 100 * k + 50))
        wait_for("the follow-ups", lambda: len(recorder.sink_ids(spark)) == 250, query=query)
    finally:
        query.stop()
    first_run = len(recorder.batches)
    # The crash window, made deterministic: Spark's checkpoint has every
    # batch completed, but the coordinator did not get their commits (here:
    # its positions are put back to just after the initial full scan).
    assert rewind_positions(warehouse, "g", 2) == {0: 2, 1: 2, 2: 2, 3: 2}
    write_rows(warehouse, "db.t", range(1000, 1050))  # committed while the query is down
    query = start_query(spark, warehouse, recorder, checkpoint)
    try:
        wait_for("the rows written while down", lambda: len(recorder.sink_ids(spark)) == 300,
                 query=query)
        write_rows(warehouse, "db.t", range(2000, 2050))
        wait_for("rows after the restart", lambda: len(recorder.sink_ids(spark)) == 350,
                 query=query)
    finally:
        query.stop()
    ids = recorder.sink_ids(spark)
    assert sorted(ids) == sorted({*range(100), *range(100, 150), *range(200, 250),
                                  *range(300, 350), *range(1000, 1050), *range(2000, 2050)})
    reread = [i for _, batch in recorder.batches[first_run:] for i in batch if i < 1000]
    assert reread == [], "the restarted query read rows of the first run again"


def delete_group(warehouse: Path, group: str) -> None:
    """Delete ``group`` as `paimon-group delete` does (its keys, its consumer
    files), once the stopped query's member has left."""
    from coordinators.registry import open_coordinator
    from paimon_group.config.member import default_coordinator_url
    from paimon_group.protocol.admin import GroupAdmin
    from paimon_group.reading.mirror import ConsumerMirror
    from tests.support.tables import open_table

    async def go() -> None:
        async with open_coordinator(default_coordinator_url(str(warehouse))) as coord:
            deadline = time.monotonic() + 30
            while not await GroupAdmin(coord, group).delete_all():
                assert time.monotonic() < deadline, "the stopped query is still a member"
                await asyncio.sleep(0.2)
        table = open_table(warehouse, "db.t")
        ConsumerMirror(table.file_io, table.table_path, group).delete_all()

    asyncio.run(go())


def stored_positions(warehouse: Path, group: str) -> dict[int, tuple[int, int | None]]:
    """``{shard: (next snapshot, pending full scan)}`` in the group's coordinator."""
    from coordinators.registry import open_coordinator
    from paimon_group.config.member import default_coordinator_url
    from paimon_group.protocol.group import GroupClient

    async def go() -> dict[int, tuple[int, int | None]]:
        async with open_coordinator(default_coordinator_url(str(warehouse))) as coord:
            positions = await GroupClient(coord, group).positions()
            return {s: (p.next_snapshot, p.full_scan) for s, p in positions.items()}

    return asyncio.run(go())


def test_a_query_restarted_after_its_group_was_recreated_reads_the_new_group_whole(
    spark: Any, tmp_path: Path
) -> None:
    """Issue 43, 1, with Spark's own calls: the query's checkpoint ends at
    snapshot 6 of the deleted group; the group is created again (start
    earliest: a full scan of 1 pinned, then 2-5). Restarted from that
    checkpoint, one snapshot a batch, the query must read all of it; before,
    Spark's ``commit(old end)`` after ``latestOffset(old end)`` wrote 6 over
    the pinned full scan, and it delivered the full scan only (10 of 50 rows)."""
    warehouse, checkpoint = tmp_path / "wh", tmp_path / "ckpt"
    make_pk_table(warehouse, "db.t", buckets=2)
    for k in range(5):
        write_rows(warehouse, "db.t", range(10 * k, 10 * k + 10))
    recorder = Recorder(tmp_path / "sink")
    query = start_query(spark, warehouse, recorder, checkpoint, start="earliest")
    try:
        wait_for("the first run", lambda: len(recorder.sink_ids(spark)) == 50, query=query)
    finally:
        query.stop()
    first_run = len(recorder.batches)
    delete_group(warehouse, "g")
    query = start_query(spark, warehouse, recorder, checkpoint, start="earliest",
                        max_snapshots_per_batch="1")
    try:
        # Every batch's end is committed once Spark completed it: at 6, the
        # last batch of the new group's snapshots is in the recorder.
        wait_for("the new group's end", lambda: len(recorder.batches) > first_run
                 and stored_positions(warehouse, "g") == {0: (6, None), 1: (6, None)},
                 query=query)
        time.sleep(1.0)  # a few triggers more: nothing else arrives
    finally:
        query.stop()
    second = sorted(i for _, batch in recorder.batches[first_run:] for i in batch)
    assert second == list(range(50)), f"the restarted query read {len(second)} of 50 rows"
    assert sorted(recorder.sink_ids(spark)) == list(range(50))


def owners(warehouse: Path, group: str) -> dict[int, str | None]:
    """``{shard: its owner}`` (the coordinator's owner keys)."""
    from coordinators.registry import open_coordinator
    from paimon_group.config.member import default_coordinator_url
    from paimon_group.protocol.group import GroupClient

    async def go() -> dict[int, str | None]:
        async with open_coordinator(default_coordinator_url(str(warehouse))) as coord:
            return {s: o.member_id for s, o in (await GroupClient(coord, group).owners()).items()}

    return asyncio.run(go())


def batch_ids_of_pairs(*recorders: Recorder) -> dict[tuple[int, int], list[tuple[int, int]]]:
    """Every (shard, snapshot) delivered: ``[(recorder index, batch id), ...]``."""
    out: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for index, recorder in enumerate(recorders):
        for batch_id, pairs in recorder.pairs:
            for pair in pairs:
                out.setdefault(pair, []).append((index, batch_id))
    return out


def test_a_shard_that_left_the_query_and_came_back_is_read_under_one_batch_id_only(
    spark: Any, tmp_path: Path
) -> None:
    """Issue 43, 2: batch 1 of the query (both shards, snapshot 2) fails in
    its sink; another member ("b", which plans nothing: a query whose
    trigger has not come) holds every shard at the position before it. The
    query restarts from its checkpoint: Spark re-runs batch 1 (both shards,
    whoever owns them), the query gets one shard back and plans batch 2 with
    it alone; then b leaves, and the other shard comes back at b's position,
    before batch 1. Before, the query started it there: (shard, 2) was
    delivered in batch 1 and again in batch 3."""
    from paimon_group.spark.source import PaimonGroupStreamReader, SourceOptions

    warehouse, checkpoint = tmp_path / "wh", tmp_path / "ckpt"
    make_pk_table(warehouse, "db.t", buckets=2)
    write_rows(warehouse, "db.t", range(10))
    recorder = Recorder(tmp_path / "sink", fail_at=1)
    query = start_query(spark, warehouse, recorder, checkpoint, start="earliest")
    wait_for("batch 0", lambda: recorder.pairs, query=query)
    write_rows(warehouse, "db.t", range(10, 20))  # snapshot 2: batch 1 fails in the sink
    with pytest.raises(Exception, match="the sink failed in batch 1"):
        query.awaitTermination(120)
    b = PaimonGroupStreamReader(SourceOptions.parse({
        "group": "g", "warehouse": str(warehouse), "table": "db.t", "member_id": "b",
        "session_timeout_s": "4", "ready_timeout_s": "30"}))
    try:
        b.initialOffset()
        wait_for("b holds both shards", lambda: len(b.driver.member.owned_shards) == 2)
        assert stored_positions(warehouse, "g") == {0: (2, None), 1: (2, None)}
        query = start_query(spark, warehouse, recorder, checkpoint, start="earliest")
        wait_for("the re-run of batch 1", lambda: any(i == 1 for i, _ in recorder.pairs)
                 and len(b.driver.member.owned_shards) == 1, query=query)
        write_rows(warehouse, "db.t", range(20, 30))  # snapshot 3: the query's shard only
        wait_for("batch 2", lambda: any(i == 2 for i, _ in recorder.pairs), query=query)
    finally:
        b.stop()  # the other shard comes back to the query at b's position (2)
    try:
        wait_for("every row", lambda: sorted(recorder.sink_ids(spark)) == list(range(30))
                 and {n for n, _ in stored_positions(warehouse, "g").values()} == {4},
                 query=query)
        time.sleep(1.0)  # a few triggers more
    finally:
        query.stop()
    delivered = batch_ids_of_pairs(recorder)
    twice = {pair: ids for pair, ids in delivered.items() if len(set(ids)) > 1}
    assert twice == {}, f"delivered under two batch ids of one query: {twice}"
    assert sorted(delivered) == [(s, n) for s in (0, 1) for n in (1, 2, 3)]


@pytest.mark.slow
def test_a_rebalance_between_two_queries_never_reads_a_completed_batch_again(
    spark: Any, tmp_path: Path
) -> None:
    """Issue 43, 3: query A (trigger 30 s, revoke_timeout_s 1) completes a
    batch (snapshot 2 of the 4 shards) at one trigger; query B joins the
    group before A's next trigger. Spark tells A that the batch is done only
    at that trigger; before, A's revocation gave up after revoke_timeout_s
    and released B's shards at the position before the batch, and B read
    snapshot 2 of them again."""
    warehouse = tmp_path / "wh"
    make_pk_table(warehouse, "db.t", buckets=4)
    write_rows(warehouse, "db.t", range(40))
    a, b = Recorder(tmp_path / "sink-a"), Recorder(tmp_path / "sink-b")
    interval = 30.0
    qa = start_query(spark, warehouse, a, tmp_path / "ckpt-a", trigger="30 seconds",
                     start="earliest", revoke_timeout_s="1")
    qb = None
    try:
        wait_for("A's first batch", lambda: a.pairs, query=qa)
        # Spark fires a processing-time trigger at multiples of its interval:
        # snapshot 2 is there for A's next trigger, B joins right after it.
        time.sleep((interval - time.time() % interval - 3) % interval)
        write_rows(warehouse, "db.t", range(40, 80))
        wait_for("A's batch of snapshot 2", lambda: len(a.pairs) == 2, query=qa)
        qb = start_query(spark, warehouse, b, tmp_path / "ckpt-b", member="q2",
                         start="earliest", revoke_timeout_s="1")
        wait_for("the rebalance", lambda: sorted(owners(warehouse, "g").values())
                 == ["q1", "q1", "q2", "q2"], query=qb)
        write_rows(warehouse, "db.t", range(80, 120))
        wait_for("every row", lambda: set(a.sink_ids(spark) + b.sink_ids(spark))
                 == set(range(120)), query=qa, timeout=90)
        time.sleep(1.0)
    finally:
        qa.stop()
        if qb is not None:
            qb.stop()
    delivered = batch_ids_of_pairs(a, b)
    twice = {pair: ids for pair, ids in delivered.items() if len(ids) > 1}
    assert twice == {}, f"read again by the group: {twice}"
    assert sorted(delivered) == [(s, n) for s in range(4) for n in (1, 2, 3)]
    assert sorted(a.sink_ids(spark) + b.sink_ids(spark)) == list(range(120))
    assert any(pairs for _, pairs in b.pairs), "B never read anything"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"group": None}, 'the paimon-group source needs option "group"'),
        ({"coordinator": "zookeper://zk-0:2181/pg"}, "unknown coordinator scheme 'zookeper'"),
        ({"coordinator": "etcd-0:2379"}, "malformed coordinator URL"),
        ({"table": "db.missing"}, "table db.missing not found in warehouse"),
        ({"max_rows_per_batch": "many"}, "option max_rows_per_batch='many' must be an integer"),
    ],
)
def test_bad_options_fail_the_query_at_load_with_one_clear_line(
    spark: Any, tmp_path: Path, options: dict[str, str | None], message: str
) -> None:
    warehouse = tmp_path / "wh"
    make_pk_table(warehouse, "db.t", buckets=2)
    settings: dict[str, str | None] = {"group": "g", "warehouse": str(warehouse),
                                       "table": "db.t", **options}
    reader = spark.readStream.format("paimon-group")
    for key, value in settings.items():
        if value is not None:
            reader = reader.option(key, value)
    with pytest.raises(Exception) as caught:
        reader.load()
    assert message in str(caught.value)
    # Nothing was joined or created: the embedded coordinator was never opened.
    assert not (warehouse / ".paimon-group").exists()


def first_example(warehouse: Path, out: Path, checkpoint: Path) -> str:
    """docs/spark.md's first source example (``# orders_query.py``), its paths
    replaced by the test's."""
    text = (REPO / "docs" / "spark.md").read_text()
    blocks = re.findall(r"```python\n(# orders_query\.py.*?)```", text, flags=re.S)
    assert len(blocks) == 1, "docs/spark.md: one # orders_query.py block"
    return (blocks[0].replace('"/data/wh"', repr(str(warehouse)))
            .replace('"/data/out/orders"', repr(str(out)))
            .replace('"/ckpt/q1"', repr(str(checkpoint))))


def test_the_docs_first_source_example_runs_as_written(spark: Any, tmp_path: Path) -> None:
    """The example writes into the Paimon table db.orders_copy (an append
    table with the source's columns here) through PaimonBatchSink."""
    from tests.support.tables import _create, open_table, table_schema

    warehouse, out = tmp_path / "wh", tmp_path / "out"
    make_pk_table(warehouse, "db.orders", buckets=2)
    write_rows(warehouse, "db.orders", range(30))
    _create(warehouse, "db.orders_copy", table_schema(), primary_keys=[], options={})

    def copied() -> list[int]:
        table = open_table(warehouse, "db.orders_copy")
        builder = table.new_read_builder()
        rows = builder.new_read().to_arrow(builder.new_scan().plan().splits())
        return sorted(rows.column("id").to_pylist())
    names: dict[str, Any] = {}
    # The example ends in awaitTermination: it runs on a thread, and the
    # test stops its query (getOrCreate gives it the module's session).
    thread = threading.Thread(
        target=exec, args=(first_example(warehouse, out, tmp_path / "ckpt"), names), daemon=True)
    thread.start()
    query = wait_for("the example's query", lambda: names.get("query"), timeout=180)
    try:
        wait_for("the rows in the example's target", lambda: len(copied()) >= 30, query=query)
    finally:
        query.stop()
        thread.join(60)
    assert copied() == list(range(30))


@pytest.mark.parametrize(
    ("change", "line"),
    [
        (('.option("table", "db.orders")', '.option("tabel", "db.orders")'),
         'unknown option "tabel" (did you mean "table"?) of the paimon-group source; known '
         'options: allow_plaintext_credentials, '),
        (('.option("table", "db.orders")', '.option("table", "db.missing")'),
         'table db.missing not found in warehouse {warehouse}: check the options "warehouse" '
         'and "table" of the paimon-group source'),
    ],
    ids=["misspelled", "missing-table"],
)
def test_a_misspelled_option_or_a_missing_table_is_one_line_naming_the_option(
    spark: Any, tmp_path: Path, change: tuple[str, str], line: str
) -> None:
    warehouse = tmp_path / "wh"
    make_pk_table(warehouse, "db.orders", buckets=2)
    example = first_example(warehouse, tmp_path / "out", tmp_path / "ckpt")
    assert change[0] in example
    with pytest.raises(SystemExit) as caught:  # the example's sys.exit(f"error: {line}")
        exec(example.replace(*change), {})
    printed = str(caught.value.code)
    assert "\n" not in printed
    assert printed.startswith("error: " + line.format(warehouse=warehouse)), printed
    assert not (warehouse / ".paimon-group").exists()


def test_available_now_reads_what_is_there_then_ends(spark: Any, tmp_path: Path) -> None:
    warehouse = tmp_path / "wh"
    make_pk_table(warehouse, "db.t", buckets=2)
    write_rows(warehouse, "db.t", range(40))
    write_rows(warehouse, "db.t", range(40, 60))
    recorder = Recorder(tmp_path / "sink")
    reader = (spark.readStream.format("paimon-group").option("group", "once")
              .option("warehouse", str(warehouse)).option("table", "db.t")
              .option("start", "earliest").option("metadata_columns", "true")
              .option("include_row_kind", "true")
              .option("max_snapshots_per_batch", "1"))
    query = (reader.load().writeStream.foreachBatch(recorder)
             .option("checkpointLocation", str(tmp_path / "ckpt"))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(180)
    assert query.exception() is None
    assert sorted(recorder.sink_ids(spark)) == list(range(60))
    assert len(recorder.batches) == 2  # one snapshot per batch: the cap applies
    kinds = read_sink(spark, str(recorder.sink), ["_row_kind", "_pg_snapshot"])
    assert sorted(set(kinds)) == [("+I", 1), ("+I", 2)]


def test_available_now_on_an_s3_warehouse(spark: Any, tmp_path: Path,
                                          s3_warehouse: Any) -> None:
    """The source on an object-store warehouse: catalog options as ``catalog.*``
    options, the coordinator chosen explicitly (a remote warehouse has no default)."""
    write_table = s3_warehouse.uri
    make_pk_table(write_table, "db.t", buckets=2)
    write_rows(write_table, "db.t", range(30))
    write_rows(write_table, "db.t", range(30, 50))
    recorder = Recorder(tmp_path / "sink")
    reader = (spark.readStream.format("paimon-group").option("group", "s3")
              .option("warehouse", s3_warehouse.uri).option("table", "db.t")
              .option("coordinator", f"sqlite://{tmp_path}/c.sqlite")
              .option("start", "earliest").option("metadata_columns", "true"))
    for key, value in s3_warehouse.options.items():
        reader = reader.option(f"catalog.{key}", value)
    query = (reader.load().writeStream.foreachBatch(recorder)
             .option("checkpointLocation", str(tmp_path / "ckpt"))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(180)
    assert query.exception() is None
    assert sorted(recorder.sink_ids(spark)) == list(range(50))


def test_a_row_field_made_not_null_keeps_the_old_files_nulls_in_the_query(
    spark: Any, tmp_path: Path
) -> None:
    """Issue 37, D6, in the source: a file written while ``o.q`` was nullable,
    then ``o.q`` made NOT NULL. Spark is told every nested field is nullable
    (the old file's nulls reach it as nulls, as the engine reads them), and
    a query reads the old rows' nulls and the new rows' values."""
    from pypaimon.schema.schema_change import SchemaChange

    from tests.support.tables import _create, catalog, open_table, write_table

    warehouse = tmp_path / "wh"
    inner = pa.struct([pa.field("p", pa.int32()), pa.field("q", pa.string())])
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("o", inner)])
    _create(warehouse, "db.t", schema, primary_keys=["id"],
            options={"bucket": "2", "alter-column-null-to-not-null.disabled": "false"})
    old = [{"p": i, "q": None if i % 2 else f"v{i}"} for i in range(6)]
    write_table(open_table(warehouse, "db.t"), pa.table({"id": range(6), "o": old}, schema))
    catalog(warehouse).alter_table("db.t", [SchemaChange.update_column_nullability(["o", "q"],
                                                                                   False)])
    table = open_table(warehouse, "db.t")
    new_type = pa.struct([pa.field("p", pa.int32()), pa.field("q", pa.string(), False)])
    new = [{"p": i, "q": f"v{i}"} for i in range(6, 9)]
    write_table(table, pa.table({"id": range(6, 9), "o": pa.array(new, new_type)},
                                pa.schema([schema.field("id"), pa.field("o", new_type)])))
    seen: list[tuple[int, Any]] = []

    def collect(df: Any, batch_id: int) -> None:
        seen.extend((r["id"], r["o"]["q"]) for r in df.select("id", "o").collect())

    query = (spark.readStream.format("paimon-group").option("group", "nested")
             .option("warehouse", str(warehouse)).option("table", "db.t")
             .option("start", "latest-full").load()
             .writeStream.foreachBatch(collect)
             .option("checkpointLocation", str(tmp_path / "ckpt"))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(180)
    assert query.exception() is None
    assert sorted(seen) == [(i, None if i < 6 and i % 2 else f"v{i}") for i in range(9)]
