"""A group on an object-store warehouse: real ``paimon-group run`` processes on a
real S3-compatible server (``tests/support/s3_server.py``), catalog options given
through the environment as a deployment would.

* a clean run (initial scan, follow-ups, graceful stop, catch-up, restart)
  delivers every row exactly once;
* a member SIGKILLed while snapshots are written loses nothing: its shards move
  after the session timeout, duplicates only from batches whose commit was not
  accepted.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.support.checker import check_all, duplicates
from tests.support.group_procs import GroupHarness
from tests.support.s3_server import S3Warehouse

pytestmark = pytest.mark.slow


def _explain(h: GroupHarness) -> str:
    return "\n".join(f"--- {m}\n{h.log(m)[-3000:]}" for m in h.procs)


def _harness(tmp_path: Path, s3: S3Warehouse, coordinator: str) -> GroupHarness:
    return GroupHarness(tmp_path, coordinator, buckets=4, warehouse=s3.uri,
                        catalog_options=s3.options, poll_interval_ms=200)


def test_clean_run_on_s3_delivers_exactly_once(tmp_path: Path, s3_warehouse: S3Warehouse
                                               ) -> None:
    h = _harness(tmp_path, s3_warehouse, f"sqlite://{tmp_path}/coordinator.sqlite")
    try:
        for i in range(2):
            h.write(range(i * 50, (i + 1) * 50))
        for m in ("a", "b"):
            h.start(m)
        # Read the initial plan first (a forming group is assigned once its
        # arrivals pause: member/publish_delay.py), so the next snapshots are deltas.
        h.wait_caught_up({"a", "b"})
        for i in range(2, 5):
            h.write(range(i * 50, (i + 1) * 50))
            time.sleep(0.2)
        h.wait_caught_up({"a", "b"})
        assert h.terminate_all() == {"a": 0, "b": 0}, _explain(h)
        for i in range(5, 17):  # > 10 snapshots while the group is stopped: catch-up
            h.write(range(i * 50, (i + 1) * 50))
        for m in ("a", "b"):
            h.start(m)
        final = h.wait_caught_up({"a", "b"})
        assert h.terminate_all() == {"a": 0, "b": 0}, _explain(h)
    finally:
        h.cleanup()
    history = h.history()
    violations = check_all(h.written, history, h.bucket_function(), final["num_shards"])
    assert violations == {k: [] for k in violations}, _explain(h)
    counts = history.delivered_counts()
    assert set(counts) == h.written
    assert duplicates(history) == 0, [i for i, n in counts.items() if n > 1][:20]
    assert {"initial", "delta", "catch-up"} <= {d["kind"] for d in history.deliveries}


@pytest.mark.etcd
def test_sigkill_on_s3_loses_nothing(tmp_path: Path, s3_warehouse: S3Warehouse,
                                     etcd_url: str) -> None:
    h = _harness(tmp_path, s3_warehouse, etcd_url)
    try:
        h.write(range(0, 100))
        for m in ("m0", "m1", "m2"):
            h.start(m)
        h.wait_caught_up({"m0", "m1", "m2"})
        h.start_writer(first=100, count=300, per_snapshot=20, interval_s=0.2)
        time.sleep(1.0)
        h.kill("m2")
        h.wait_writer()
        final = h.wait_caught_up({"m0", "m1"})
        codes = h.terminate_all()
    finally:
        h.cleanup()
    assert codes["m0"] == 0 and codes["m1"] == 0, _explain(h)
    history = h.history()
    violations = check_all(h.written, history, h.bucket_function(), final["num_shards"])
    assert violations == {k: [] for k in violations}, _explain(h)
    assert set(history.delivered_counts()) == h.written


# -- the Arrow read path on an object store ------------------------------------


@pytest.mark.parametrize("kind", ["fixed", "append", "dynamic"])
def test_arrow_reads_on_s3_equal_pypaimon_on_every_path(s3_warehouse: S3Warehouse,
                                                        kind: str) -> None:
    from tests.support.tables import compact, make_kind_table, write_rows
    from tests.test_arrowread import compare_all_paths

    make_kind_table(s3_warehouse.uri, "db.t", kind, buckets=4)
    for i in range(4):
        write_rows(s3_warehouse.uri, "db.t", range(i * 30, i * 30 + 60), v=i)  # updates
    if kind == "fixed":
        compact(s3_warehouse.uri, "db.t")
        write_rows(s3_warehouse.uri, "db.t", range(0, 200, 3), v=9)
    assert compare_all_paths(s3_warehouse.uri) > 0


def test_arrow_read_fetches_each_data_file_in_one_get(s3_warehouse: S3Warehouse) -> None:
    """A full read makes one HEAD and one GET per data file (pyarrow's Parquet
    reader alone makes a ranged GET per column chunk and one for the footer)."""
    from paimon_group.reading.planner import ShardPlanner
    from paimon_group.reading.table import ShardedTable
    from tests.support.tables import make_pk_table, write_rows

    make_pk_table(s3_warehouse.uri, "db.t", buckets=4)
    for i in range(4):
        write_rows(s3_warehouse.uri, "db.t", range(i * 500, (i + 1) * 500))
    table = ShardedTable.open(s3_warehouse.uri, "db.t", s3_warehouse.options)
    planner = ShardPlanner(table, 4)
    step = planner.plan_full(range(4), 4)
    files = sum(len(split.files) for splits in step.splits.values() for split in splits)
    assert files == 16
    server = s3_warehouse.server
    server.reset_counts()
    rows = sum(planner.read_arrow(splits).num_rows for splits in step.splits.values())
    data = server.counts(contains="/bucket-")
    assert rows == 2000
    assert data == {"HEAD": files, "GET": files, "total": 2 * files} or data == {
        "HEAD": files, "GET_RANGE": files, "total": 2 * files}, data


def test_an_idle_member_asks_the_store_once_per_poll(s3_warehouse: S3Warehouse,
                                                     tmp_path: Path) -> None:
    """Caught up, a member's poll is one request (a HEAD for the snapshot after
    the latest it knows); it was six (the LATEST hint read after an exists(),
    and two snapshot checks, one of them a HEAD and a LIST). The table check
    (every 5 s) reads the first schema file only."""
    import asyncio

    from paimon_group import GroupMember, MemberConfig
    from tests.support.tables import make_pk_table, write_rows

    make_pk_table(s3_warehouse.uri, "db.t", buckets=2)
    write_rows(s3_warehouse.uri, "db.t", range(100))
    server = s3_warehouse.server
    polls_s, poll_ms = 4.0, 100

    async def go() -> dict[str, int]:
        cfg = MemberConfig(group="g", warehouse=s3_warehouse.uri, table="db.t",
                           coordinator=f"sqlite://{tmp_path}/c.sqlite",
                           catalog_options=s3_warehouse.options, poll_interval_ms=poll_ms,
                           mirror_interval_s=3600.0)
        got = 0
        caught_up = asyncio.Event()
        async with GroupMember(cfg) as member:
            async def consume() -> None:
                nonlocal got
                async for batch in member.batches():
                    got += batch.to_arrow().num_rows
                    await member.commit(batch)
                    if got >= 100:
                        caught_up.set()

            task = asyncio.create_task(consume())
            await asyncio.wait_for(caught_up.wait(), 60)
            await asyncio.sleep(1.0)
            server.reset_counts()
            await asyncio.sleep(polls_s)
            counts = server.counts()
            task.cancel()
        return counts

    counts = asyncio.run(go())
    polls = polls_s * 1000 / poll_ms
    # One HEAD a poll (fewer when a poll round takes longer than its interval),
    # and one table check or two (a HEAD and a GET each).
    assert counts["total"] <= polls + 6, counts
    assert counts.get("LIST", 0) == 0, counts


def test_the_latest_snapshot_is_found_by_probing_forward(s3_warehouse: S3Warehouse) -> None:
    """After a full read of the LATEST hint, new snapshots are found one request
    each (and one more for the absent next), as Paimon's findLatest probes."""
    from paimon_group.reading.table import ShardedTable
    from tests.support.tables import make_pk_table, write_rows

    make_pk_table(s3_warehouse.uri, "db.t", buckets=2)
    for i in range(3):
        write_rows(s3_warehouse.uri, "db.t", range(i * 10, i * 10 + 10))
    table = ShardedTable.open(s3_warehouse.uri, "db.t", s3_warehouse.options)
    assert table.latest_snapshot_id() == 3  # the full read
    server = s3_warehouse.server
    server.reset_counts()
    assert table.latest_snapshot_id() == 3
    assert server.counts() == {"HEAD": 1, "total": 1}
    write_rows(s3_warehouse.uri, "db.t", range(100, 110))
    write_rows(s3_warehouse.uri, "db.t", range(110, 120))
    server.reset_counts()
    assert table.latest_snapshot_id() == 5
    assert server.counts() == {"HEAD": 3, "total": 3}
    assert table.latest_snapshot_id(fresh=True) == 5


def test_a_new_group_reads_its_tables_metadata_once(tmp_path: Path,
                                                    s3_warehouse: S3Warehouse) -> None:
    """A one-member ``run`` of a new group on S3: every manifest list and manifest
    is read once (the note on shards without rows and the first plan read them
    twice; the leader's head poll and the member's plan, once more)."""
    h = _harness(tmp_path, s3_warehouse, f"sqlite://{tmp_path}/coordinator.sqlite")
    try:
        h.write(range(0, 50))
        h.write(range(50, 100))
        s3_warehouse.server.reset_counts()
        h.start("a")
        # Waited for by the member's own record of its deliveries: a describe
        # (wait_caught_up) would read the table's manifests from this process.
        deadline = time.monotonic() + 120
        while len(h.history().delivered_counts()) < 100:
            assert time.monotonic() < deadline, _explain(h)
            time.sleep(0.2)
        paths = s3_warehouse.server.paths()
        assert h.terminate_all() == {"a": 0}, _explain(h)
    finally:
        h.cleanup()
    gets = {k.split(" ", 1)[1]: n for k, n in paths.items() if k.startswith("GET")}
    manifests = {p: n for p, n in gets.items() if "/manifest/" in p}
    assert manifests and all(n == 1 for n in manifests.values()), manifests


def test_a_splits_files_are_fetched_at_once_not_section_by_section(
        s3_warehouse: S3Warehouse, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bucket of three commits of disjoint keys is one split of three
    sections, decoded one after another: its three files are fetched at once
    as the split starts (one round trip, not three). Every fetch here waits
    until all three have started: fetched section by section, the first
    would wait in vain."""
    import threading

    from paimon_group.arrowread import fetch
    from paimon_group.reading.planner import ShardPlanner
    from paimon_group.reading.table import ShardedTable
    from tests.support.tables import make_pk_table, write_rows

    make_pk_table(s3_warehouse.uri, "db.t", buckets=1)
    for i in range(3):
        write_rows(s3_warehouse.uri, "db.t", range(i * 100, (i + 1) * 100))
    table = ShardedTable.open(s3_warehouse.uri, "db.t", s3_warehouse.options)
    planner = ShardPlanner(table, 1)
    step = planner.plan_full([0], 3)
    [split] = step.splits[0]
    assert len(split.files) == 3
    started = threading.Barrier(3, timeout=10)
    real = fetch.fetch_whole

    def fetch_together(file_io: object, file: object) -> object:
        started.wait()
        return real(file_io, file)

    monkeypatch.setattr(fetch, "fetch_whole", fetch_together)
    assert planner.read_arrow([split]).num_rows == 300
