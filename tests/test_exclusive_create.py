"""A file created only if its name is free (paimon_group/store/exclusive.py),
on a local file system and on a real S3-compatible server, from one process
and from two processes racing for the same names; and a Paimon sink's commit
in two processes at once, locally and on S3, losing no batch.

Before it, pypaimon's create (ask, then rename over the name) let two
processes both win the same name: 5 of 2,000 synchronised attempts; two sink
processes of 150 batches each lost one batch without an error.

And what the sink refuses, each in one line: HDFS; an S3-compatible store
that ignores ``If-None-Match`` (the suite's server behind a proxy dropping
the header), probed once per process; a pypaimon whose commit the sink
cannot make exclusive, or that commits without the exclusive create. A local
snapshot is synced before its link and its directory after.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import boto3
import pytest
from pypaimon.filesystem.local_file_io import LocalFileIO
from pypaimon.snapshot.renaming_snapshot_commit import RenamingSnapshotCommit
from pypaimon.snapshot.snapshot_commit import SnapshotCommit
from pypaimon.write.file_store_commit import FileStoreCommit

from paimon_group.errors import PaimonGroupError
from paimon_group.reading.table import ShardedTable
from paimon_group.sink import PaimonSink
from paimon_group.sink.target import TargetTable
from paimon_group.store.exclusive import (
    ExclusiveCreateUnsupported,
    create_exclusive,
    exclusive_create_check,
)
from tests.support.group_procs import REPO
from tests.support.header_proxy import HeaderDroppingProxy
from tests.support.s3_server import ACCESS_KEY, REGION, SECRET_KEY, S3Warehouse, catalog_options
from tests.support.tables import _create
from tests.test_paimon_sink import SCHEMA, Batch, _read, _rows

pytestmark = [pytest.mark.slow]


def test_a_free_name_is_created_and_a_taken_one_is_left_as_it_is(tmp_path: Path) -> None:
    fio = LocalFileIO(str(tmp_path))
    target = tmp_path / "snapshot" / "snapshot-1"
    assert create_exclusive(fio, str(target), "first") is True
    assert create_exclusive(fio, str(target), "second") is False
    assert create_exclusive(fio, f"file://{target}", "third") is False
    assert target.read_text() == "first"
    assert sorted(p.name for p in target.parent.iterdir()) == ["snapshot-1"]  # no temporary


def test_a_warehouse_whose_store_cannot_create_exclusively_is_refused_in_one_line() -> None:
    with pytest.raises(ExclusiveCreateUnsupported, match=r"cannot commit safely on a gs:// "):
        exclusive_create_check(object(), "gs://bucket/wh/db.db/t")
    exclusive_create_check(object(), "/data/wh/db.db/t")
    exclusive_create_check(object(), "file:///data/wh/db.db/t")


@pytest.mark.parametrize("scheme", ["hdfs", "viewfs"])
def test_an_hdfs_target_is_refused_when_the_sink_opens(scheme: str) -> None:
    """pypaimon 2.1 reaches HDFS through hdfs-native, or, without it,
    through pyarrow, whose HDFS move deletes an existing destination and
    renames again; both ask whether the snapshot file exists, then rename:
    not exclusive in any path the suite can run. The sink refuses HDFS."""
    path = f"{scheme}://namenode:8020/wh/db.db/t"
    line = (f"a Paimon sink cannot commit safely on a {scheme}:// warehouse: its commits need "
            "a file created only if absent (a local file system, or S3 and S3-compatible "
            "stores that honour If-None-Match)")
    with pytest.raises(ExclusiveCreateUnsupported) as refused:
        TargetTable(SimpleNamespace(file_io=object(), table_path=path), "db.t")
    assert str(refused.value) == line
    with pytest.raises(ExclusiveCreateUnsupported):
        create_exclusive(object(), f"{path}/snapshot/snapshot-1", "{}")


def _fsyncs_and_links(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, ...]]:
    """Every ``os.fsync`` (of the path its descriptor names) and ``os.link``
    from now on, in order; both still done."""
    calls: list[tuple[str, ...]] = []
    fsync, link = os.fsync, os.link

    def recording_fsync(fd: int) -> None:
        calls.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        fsync(fd)

    def recording_link(src: str, dst: str) -> None:
        calls.append(("link", os.path.dirname(src), dst))
        link(src, dst)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    monkeypatch.setattr(os, "link", recording_link)
    return calls


def test_a_local_snapshot_is_synced_before_its_link_and_its_directory_after(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A created snapshot survives a host crash: its text is on disk before
    its name links to it, and the name is on disk (the directory synced)
    before the commit returns; a new directory's own name too."""
    fio = LocalFileIO(str(tmp_path))
    snapshots = tmp_path / "snapshot"
    calls = _fsyncs_and_links(monkeypatch)
    assert create_exclusive(fio, str(snapshots / "snapshot-1"), "first") is True
    temporary = calls[1][1] if len(calls) > 1 else ""
    assert calls == [("fsync", str(tmp_path)),  # snapshot/ was made
                     ("fsync", temporary), ("link", str(snapshots), str(snapshots / "snapshot-1")),
                     ("fsync", str(snapshots))], calls
    assert os.path.basename(temporary).startswith(".snapshot-1.")
    calls.clear()
    assert create_exclusive(fio, str(snapshots / "snapshot-2"), "second") is True
    assert [c[0] for c in calls] == ["fsync", "link", "fsync"], calls
    assert calls[2] == ("fsync", str(snapshots))
    calls.clear()
    assert create_exclusive(fio, str(snapshots / "snapshot-2"), "lost") is False
    assert [c[0] for c in calls] == ["fsync", "link"], calls  # nothing of ours to keep


def _claim(k: int, directory: str, names: int, barrier: Any, out: Any) -> None:
    fio = LocalFileIO(directory)
    won = []
    for i in range(names):
        barrier.wait()
        if create_exclusive(fio, os.path.join(directory, f"snapshot-{i}"), f"process {k}"):
            won.append(i)
    out.put((k, won))


def test_two_processes_racing_for_the_same_names_never_both_win(tmp_path: Path) -> None:
    names = 1500
    # Spawned, not forked: a forked child of a test worker whose earlier tests
    # left gRPC's threads running (an etcd client) can hang in gRPC's locks.
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_claim, args=(k, str(tmp_path), names, barrier, out))
             for k in (0, 1)]
    for p in procs:
        p.start()
    won = dict(out.get(timeout=300) for _ in procs)
    for p in procs:
        p.join(60)
    assert set(won[0]).isdisjoint(won[1])
    assert sorted(won[0] + won[1]) == list(range(names))
    for k, ids in won.items():
        for i in ids:
            assert (tmp_path / f"snapshot-{i}").read_text() == f"process {k}"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_on_s3_a_taken_key_is_refused_by_the_store(s3_warehouse: S3Warehouse) -> None:
    _create(s3_warehouse.uri, "db.log", SCHEMA, primary_keys=[], options={"bucket": "-1"})
    table = ShardedTable.open(s3_warehouse.uri, "db.log", s3_warehouse.options).table
    path = f"{table.table_path}/snapshot/snapshot-7"
    s3_warehouse.server.reset_counts()
    assert create_exclusive(table.file_io, path, "first") is True
    assert create_exclusive(table.file_io, path, "second") is False
    assert table.file_io.read_file_utf8(path) == "first"
    counts = s3_warehouse.server.counts()
    assert counts.get("PUT", 0) == 2, counts  # one conditional upload each, no HEAD first


# Two processes, each a PaimonSink of its own on one target, writing the
# batches of their own shard at once (commit_interval_s=0: a commit per
# batch, both racing for every next snapshot id).
MEMBER = """
import sys
from paimon_group.sink import PaimonSink
from tests.test_paimon_sink import Batch, _rows
from tests.support.tables import register_catalog_options

warehouse, k, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
options = dict(a.split("=", 1) for a in sys.argv[4:])
if options:
    register_catalog_options(warehouse, options)
sink = PaimonSink(warehouse, "db.log", catalog_options=options or None, commit_interval_s=0)
print("ready", flush=True)
sys.stdin.readline()
for step in range(1, steps + 1):
    ids = range(k * 100000 + step * 10, k * 100000 + step * 10 + 10)
    sink.write(_rows(ids, step), Batch(k, 1, step, step))
sink.close()
print("done", sink.commits, flush=True)
"""


def _race_sinks(warehouse: str, steps: int, options: dict[str, str]) -> list[int]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen(
        [sys.executable, "-c", MEMBER, warehouse, str(k), str(steps),
         *(f"{key}={value}" for key, value in options.items())],
        cwd=REPO, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for k in (0, 1)]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    for p in procs:  # both start at once
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    commits = []
    for p in procs:
        out, _ = p.communicate(timeout=600)
        assert p.returncode == 0, out
        commits.append(int(out.split()[-1]))
    return commits


def _ids(warehouse: str, options: dict[str, str] | None = None) -> list[int]:
    table = ShardedTable.open(warehouse, "db.log", options).table
    builder = table.new_read_builder()
    rows = builder.new_read().to_arrow(builder.new_scan().plan().splits())
    return sorted(rows.column("id").to_pylist())


def _expected(steps: int) -> list[int]:
    return sorted(i for k in (0, 1) for step in range(1, steps + 1)
                  for i in range(k * 100000 + step * 10, k * 100000 + step * 10 + 10))


def test_two_sink_processes_on_one_local_target_lose_no_batch(tmp_path: Path) -> None:
    _create(tmp_path, "db.log", SCHEMA, primary_keys=[], options={"bucket": "-1"})
    steps = 200
    commits = _race_sinks(str(tmp_path), steps, {})
    assert _ids(str(tmp_path)) == _expected(steps)
    assert sum(commits) == 2 * steps
    snapshots = tmp_path / "db.db" / "log" / "snapshot"
    assert not [p for p in snapshots.iterdir() if p.name.endswith(".tmp")]


def test_two_sink_processes_on_one_s3_target_lose_no_batch(s3_warehouse: S3Warehouse) -> None:
    _create(s3_warehouse.uri, "db.log", SCHEMA, primary_keys=[], options={"bucket": "-1"})
    steps = 20
    commits = _race_sinks(s3_warehouse.uri, steps, s3_warehouse.options)
    assert _ids(s3_warehouse.uri, s3_warehouse.options) == _expected(steps)
    assert sum(commits) == 2 * steps


def test_an_s3_sink_without_boto3_is_refused_in_one_line(s3_warehouse: S3Warehouse) -> None:
    _create(s3_warehouse.uri, "db.log", SCHEMA, primary_keys=[], options={"bucket": "-1"})
    code = ("import sys; sys.modules['boto3'] = None\n"
            "from paimon_group.sink import PaimonSink\n"
            "from paimon_group.errors import ConfigError\n"
            "options = dict(a.split('=', 1) for a in sys.argv[2:])\n"
            "try:\n"
            "    PaimonSink(sys.argv[1], 'db.log', catalog_options=options)\n"
            "except ConfigError as err:\n"
            "    print(err); sys.exit(2)\n")
    run = subprocess.run([sys.executable, "-c", code, s3_warehouse.uri,
                          *(f"{k}={v}" for k, v in s3_warehouse.options.items())],
                         cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr
    assert run.stdout.strip().splitlines() == [
        "a Paimon sink on S3 commits with a conditional upload (If-None-Match), which needs "
        "boto3: pip install 'paimon-group[s3]'"]


def _keys(warehouse: S3Warehouse) -> list[str]:
    client = boto3.client("s3", endpoint_url=warehouse.server.endpoint, region_name=REGION,
                          aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY)
    listed = client.list_objects_v2(Bucket=warehouse.bucket)
    return sorted(o["Key"] for o in listed.get("Contents", []))


def test_an_s3_store_that_ignores_if_none_match_is_refused_when_the_sink_opens(
        s3_warehouse: S3Warehouse) -> None:
    """A store that accepts ``If-None-Match: *`` and replaces the key anyway
    (here: the suite's S3 server behind a proxy that drops the header) would
    let two commits both take one snapshot id: the sink's first open in the
    process uploads a probe key twice, conditionally, and refuses the store
    when the second upload is not refused."""
    _create(s3_warehouse.uri, "db.log", SCHEMA, primary_keys=[], options={"bucket": "-1"})
    before = _keys(s3_warehouse)
    proxy = HeaderDroppingProxy("127.0.0.1", s3_warehouse.server.port, drop=["If-None-Match"])
    proxy.start()
    try:
        with pytest.raises(ExclusiveCreateUnsupported) as refused:
            PaimonSink(s3_warehouse.uri, "db.log",
                       catalog_options=catalog_options(proxy.endpoint), commit_interval_s=0)
        assert proxy.dropped == 2
    finally:
        proxy.stop()
    assert str(refused.value) == (
        f"the object store {proxy.endpoint} (bucket {s3_warehouse.bucket}) ignores "
        "If-None-Match: a second conditional upload of one key replaced it, so two commits "
        "of a Paimon sink could both take one snapshot id; use a store that refuses it "
        "(AWS S3, MinIO)")
    assert _keys(s3_warehouse) == before  # the probe key is gone


def test_an_s3_store_that_honours_if_none_match_is_probed_once_per_process(
        s3_warehouse: S3Warehouse) -> None:
    _create(s3_warehouse.uri, "db.log", SCHEMA, primary_keys=[], options={"bucket": "-1"})
    before = _keys(s3_warehouse)
    s3_warehouse.server.reset_counts()
    with PaimonSink(s3_warehouse.uri, "db.log", catalog_options=s3_warehouse.options,
                    commit_interval_s=0):
        pass
    probe = s3_warehouse.server.counts(contains="/.exclusive-create-probe-")
    assert probe == {"PUT": 2, "DELETE": 1, "total": 3}, probe
    with PaimonSink(s3_warehouse.uri, "db.log", catalog_options=s3_warehouse.options,
                    commit_interval_s=0) as sink:
        sink.write(_rows(range(10), 1), Batch(0, 1, 1, 1))
    assert s3_warehouse.server.counts(contains="/.exclusive-create-probe-") == probe
    assert [k for k in _keys(s3_warehouse) if k not in before
            and "/snapshot/" in k and "probe" in k] == []


class _OtherSnapshotCommit(SnapshotCommit):  # type: ignore[misc]
    def commit(self, base_snapshot_uuid: Any, snapshot: Any, statistics: Any) -> bool:
        raise AssertionError("not to be called")

    def close(self) -> None:
        pass


def test_a_commit_that_succeeds_without_the_exclusive_create_fails_in_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sink puts its exclusive snapshot commit into pypaimon's commit;
    should a pypaimon commit succeed without calling it (a pypaimon that
    commits by another path), the write fails rather than report a commit
    whose snapshot id another writer may have taken too."""
    _create(tmp_path, "db.log", SCHEMA, primary_keys=[], options={"bucket": "-1"})
    monkeypatch.setattr("paimon_group.sink.target._exclusive_snapshot_commit",
                        RenamingSnapshotCommit)  # pypaimon's own, renaming over
    with PaimonSink(str(tmp_path), "db.log", commit_interval_s=0) as sink, \
            pytest.raises(PaimonGroupError) as failed:
        sink.write(_rows(range(10), 1), Batch(0, 1, 1, 1))
    assert str(failed.value).splitlines() == [
        "the sink's commit of snapshot 1 succeeded without its exclusive create of the "
        "snapshot file (pypaimon committed by another path): another writer may have taken "
        "the same snapshot id"]


@pytest.mark.parametrize("change", ["missing", "other type"])
def test_a_pypaimon_commit_the_sink_cannot_make_exclusive_fails_in_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str) -> None:
    _create(tmp_path, "db.log", SCHEMA, primary_keys=[], options={"bucket": "-1"})
    init = FileStoreCommit.__init__

    def changed_init(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        if change == "missing":
            self.commit_with = self.__dict__.pop("snapshot_commit")
        else:
            self.snapshot_commit = _OtherSnapshotCommit()

    monkeypatch.setattr(FileStoreCommit, "__init__", changed_init)
    with PaimonSink(str(tmp_path), "db.log", commit_interval_s=0) as sink, \
            pytest.raises(PaimonGroupError) as failed:
        sink.write(_rows(range(10), 1), Batch(0, 1, 1, 1))
    found = ("has no snapshot_commit" if change == "missing" else
             "is a tests.test_exclusive_create._OtherSnapshotCommit")
    assert str(failed.value).splitlines() == [
        f"the sink cannot make its commits exclusive with this pypaimon: its store commit "
        f"{found}, not the RenamingSnapshotCommit the sink replaces"]
    assert _read(tmp_path, "db.log") == []
