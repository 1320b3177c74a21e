"""The Paimon sink for a group of several tables, on real pypaimon tables:
each source table's marks kept apart (two tables' shard 0 do not collide),
a mapping of source tables to targets (:class:`PaimonSinks`), and a group
of one table's marks as before, byte for byte.

The batches are real :class:`~paimon_group.reading.batch.ShardBatch` es of
two source tables, ``db.src_a`` and ``db.src_b`` (2 buckets each, 2 shards
each), as a member of a group reading both delivers them: ``db.src_a``
holds the group's shards 0-1, ``db.src_b`` 2-3 (each batch's ``shard`` is
its table's own, ``group_shard`` the group's). Both tables' snapshots are
numbered alike, so marks that collided would be judged against each other."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from paimon_group.errors import AlreadyWritten, ConfigError, PaimonGroupError
from paimon_group.protocol.identity import table_identity
from paimon_group.reading.batch import ShardBatch
from paimon_group.reading.table import ShardedTable
from paimon_group.sink import PaimonSink, PaimonSinks, ShardMark
from paimon_group.sink.marks import Source, encode
from paimon_group.sink.pending import marks_table_of
from tests.support.tables import _create, make_pk_table, open_table, write_rows

OUT = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("v", pa.int64()),
                 pa.field("src", pa.string())])
FIRST = {"db.src_a": 0, "db.src_b": 2}  # each table's first shard of the group's
IDS = {"db.src_a": 0, "db.src_b": 100}  # each table's ids start here


def _sources(wh: Path) -> None:
    """Both source tables, each with its snapshot 1 (10 rows) and 2 (10
    more), each snapshot with rows in both buckets (both shards)."""
    for table, first in IDS.items():
        make_pk_table(wh, table, buckets=2)
        write_rows(wh, table, range(first, first + 10), v=1)
        write_rows(wh, table, range(first + 10, first + 20), v=2)
        for delta in (False, True):
            assert [b.shard for b in _batches(wh, table, delta=delta)] == [0, 1]


def _target(wh: Path, name: str) -> None:
    _create(wh, name, OUT, primary_keys=[], options={"bucket": "-1"})


def _batches(wh: Path, table: str, *, delta: bool = False, epoch: int = 1,
             group_shards: bool = True) -> list[ShardBatch]:
    """``table``'s batches of its shards 0 and 1: the full scan of snapshot 1,
    or (``delta``) the delta of snapshot 2. ``group_shards``: as a group of
    both tables delivers them (else as a group of ``table`` alone)."""
    sharded = ShardedTable.open(str(wh), table)
    planner = sharded.planner(2)
    step = planner.plan_next([0, 1], 2) if delta else planner.plan_full([0, 1], 1)
    assert step is not None
    first = FIRST[table] if group_shards else 0
    return [ShardBatch(group="g", member_id="m", shard=s, num_shards=2, epoch=epoch,
                       plan=step, planner=planner, table=table, group_shard=first + s,
                       table_id=table_identity(sharded.table))
            for s in (0, 1) if step.splits.get(s)]


def _output(batch: ShardBatch) -> pa.Table:
    rows = batch.to_arrow().select(["id", "v"])
    return rows.append_column("src", pa.array([batch.table] * rows.num_rows, pa.string()))


def _deliver(sink: PaimonSink | PaimonSinks, batch: ShardBatch) -> None:
    """``batch``'s output written as a member's handler writes it, then
    sealed as the member seals it once the handler returned (what either
    raised, raised)."""
    try:
        sink.write(_output(batch), batch)
        for sealed in batch.seal_output():
            sealed.result(60)
    finally:
        batch.close_output()


def _read(wh: Path, name: str) -> list[tuple[int, int, str]]:
    table = open_table(wh, name)
    builder = table.new_read_builder()
    rows = builder.new_read().to_arrow(builder.new_scan().plan().splits())
    return sorted(zip(rows.column("id").to_pylist(), rows.column("v").to_pylist(),
                      rows.column("src").to_pylist(), strict=True))


def _expected(*tables: str) -> list[tuple[int, int, str]]:
    return sorted([(IDS[t] + i, 1 if i < 10 else 2, t) for t in tables for i in range(20)])


def _properties(wh: Path, name: str) -> dict[str, str]:
    latest = open_table(wh, name).snapshot_manager().get_latest_snapshot()
    return {k: v for k, v in (latest.properties or {}).items()
            if k.startswith("paimon-group.sink.")}


def _write_all(sink: PaimonSink | PaimonSinks, wh: Path, *, epoch: int = 1) -> None:
    """Every batch of both tables, the full scans then the deltas."""
    for delta in (False, True):
        for table in FIRST:
            for batch in _batches(wh, table, delta=delta, epoch=epoch):
                _deliver(sink, batch)


def _replays_found(sink: PaimonSink | PaimonSinks, wh: Path) -> int:
    """Every batch of both tables delivered again (a new owner's, epoch 2):
    each is found written; how many."""
    found = 0
    for delta in (False, True):
        for table in FIRST:
            for batch in _batches(wh, table, delta=delta, epoch=2):
                with pytest.raises(AlreadyWritten) as err:
                    _deliver(sink, batch)
                assert err.value.next_snapshot == 3  # the target holds the shard up to 3
                assert batch.sink_holds == err.value.next_snapshot
                found += 1
    return found


def test_two_source_tables_in_one_target_keep_their_marks_apart(tmp_path: Path) -> None:
    """Both tables' shards 0 and 1 write one target: each replay is found
    written against its own table's marks, nothing is written twice, and
    neither table's marks replace the other's (the tables' identities
    differ: marks of one source would be another's "re-created table")."""
    _sources(tmp_path)
    _target(tmp_path, "db.out")
    with PaimonSink(str(tmp_path), "db.out", commit_interval_s=0) as sink:
        _write_all(sink, tmp_path)
        assert _replays_found(sink, tmp_path) == 8
        assert sink.marks("g") == {0: ShardMark(1, 3, scan=1), 1: ShardMark(1, 3, scan=1)}
        assert sink.marks("g", "db.src_b") == sink.marks("g")
        assert sink.marks("g", "db.src_a") == {}  # range 0: the group's own marks
        b = sink.target.group_marks("g@db.src_b").source
        a = sink.target.group_marks("g").source
        assert a.table_id and b.table_id and a.table_id != b.table_id
        assert (a.num_shards, b.num_shards) == (2, 2)
    assert sorted(_properties(tmp_path, "db.out")) == [
        "paimon-group.sink.g", "paimon-group.sink.g@db.src_b"]
    assert _read(tmp_path, "db.out") == _expected("db.src_a", "db.src_b")


def test_a_new_sink_finds_each_table_s_replays_in_the_target(tmp_path: Path) -> None:
    """The marks are in the target, not in the sink: a sink opened after a
    crash (another process) finds every table's batches written."""
    _sources(tmp_path)
    _target(tmp_path, "db.out")
    with PaimonSink(str(tmp_path), "db.out", commit_interval_s=0.05) as sink:
        _write_all(sink, tmp_path)
    with PaimonSink(str(tmp_path), "db.out", commit_interval_s=0.05) as sink:
        assert _replays_found(sink, tmp_path) == 8
    assert _read(tmp_path, "db.out") == _expected("db.src_a", "db.src_b")


def test_a_mapping_writes_each_source_table_into_its_own_target(tmp_path: Path) -> None:
    _sources(tmp_path)
    _target(tmp_path, "db.out_a")
    _target(tmp_path, "db.out_b")
    with PaimonSinks(str(tmp_path), {"db.src_a": "db.out_a", "db.src_b": "db.out_b"},
                     commit_interval_s=0) as sinks:
        assert sorted(sinks.sinks) == ["db.out_a", "db.out_b"]  # opened at once
        _write_all(sinks, tmp_path)
        assert _replays_found(sinks, tmp_path) == 8
        assert sinks.sink_of("db.src_a").marks("g") == {
            0: ShardMark(1, 3, scan=1), 1: ShardMark(1, 3, scan=1)}
        assert sinks.sink_of("db.src_b").marks("g", "db.src_b") == {
            0: ShardMark(1, 3, scan=1), 1: ShardMark(1, 3, scan=1)}
    assert _read(tmp_path, "db.out_a") == _expected("db.src_a")
    assert _read(tmp_path, "db.out_b") == _expected("db.src_b")
    assert list(_properties(tmp_path, "db.out_a")) == ["paimon-group.sink.g"]
    assert list(_properties(tmp_path, "db.out_b")) == ["paimon-group.sink.g@db.src_b"]


def test_a_function_of_the_source_table_opens_each_target_at_its_first_batch(
        tmp_path: Path) -> None:
    _sources(tmp_path)
    _target(tmp_path, "db.out_a")
    _target(tmp_path, "db.out_b")
    with PaimonSinks(str(tmp_path), lambda t: t.replace("src", "out"),
                     commit_interval_s=0) as sinks:
        assert sinks.sinks == {}
        _write_all(sinks, tmp_path)
        assert sorted(sinks.sinks) == ["db.out_a", "db.out_b"]
        assert _replays_found(sinks, tmp_path) == 8
    assert _read(tmp_path, "db.out_a") == _expected("db.src_a")
    assert _read(tmp_path, "db.out_b") == _expected("db.src_b")


def test_two_sources_mapped_to_one_target_share_its_sink(tmp_path: Path) -> None:
    _sources(tmp_path)
    _target(tmp_path, "db.out")
    with PaimonSinks(str(tmp_path), {"db.src_a": "db.out", "db.src_b": "db.out"},
                     commit_interval_s=0) as sinks:
        assert list(sinks.sinks) == ["db.out"]
        _write_all(sinks, tmp_path)
        assert _replays_found(sinks, tmp_path) == 8
    assert _read(tmp_path, "db.out") == _expected("db.src_a", "db.src_b")


def test_a_source_table_without_a_target_is_one_line_and_nothing_is_written(
        tmp_path: Path) -> None:
    _sources(tmp_path)
    _target(tmp_path, "db.out_a")
    batch = _batches(tmp_path, "db.src_b")[0]
    with PaimonSinks(str(tmp_path), {"db.src_a": "db.out_a"}, commit_interval_s=0) as sinks, \
            pytest.raises(ConfigError, match=(
                r"^no target for the source table 'db.src_b': the sink's mapping names "
                r"db.src_a only; add it, or leave the table out of the group's --table$")):
        _deliver(sinks, batch)
    with PaimonSinks(str(tmp_path), lambda t: None, commit_interval_s=0) as sinks, \
            pytest.raises(ConfigError, match=r"^no target for the source table 'db\.src_b': "
                                             r"the sink's function"):
        _deliver(sinks, batch)
    with PaimonSinks(str(tmp_path), {"db.src_a": "db.out_a"}, commit_interval_s=0) as sinks:
        nameless = _batches(tmp_path, "db.src_a")[0]
        nameless.table = ""
        with pytest.raises(ConfigError, match="does not say its source table"):
            _deliver(sinks, nameless)
    assert _read(tmp_path, "db.out_a") == []
    with pytest.raises(ConfigError, match="is not a table name"):
        PaimonSinks(str(tmp_path), {"db.src_a": "out_a"})
    with pytest.raises(ConfigError, match=r"\(one target: PaimonSink\)$"):
        PaimonSinks(str(tmp_path), "db.out_a")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"db\.missing"):  # a target refused at once
        PaimonSinks(str(tmp_path), {"db.src_a": "db.out_a", "db.src_b": "db.missing"})


def test_a_group_of_one_table_keeps_its_marks_byte_for_byte(tmp_path: Path) -> None:
    """A group of one table (its batches' ``shard`` is their ``group_shard``)
    writes its marks under the group's name only, in format 2 as the release
    before wrote them; the same as a batch that does not say its table."""
    _sources(tmp_path)
    _target(tmp_path, "db.out")
    _target(tmp_path, "db.out_plain")
    identity = table_identity(open_table(tmp_path, "db.src_a"))
    with PaimonSink(str(tmp_path), "db.out", commit_interval_s=0) as sink, \
            PaimonSink(str(tmp_path), "db.out_plain", commit_interval_s=0) as plain:
        for delta in (False, True):
            for batch in _batches(tmp_path, "db.src_a", delta=delta, group_shards=False):
                assert (batch.table, batch.group_shard) == ("db.src_a", batch.shard)
                _deliver(sink, batch)
            for batch in _batches(tmp_path, "db.src_a", delta=delta, group_shards=False):
                batch.table = ""
                _deliver(plain, batch)
    value = ('{"v":2,"source":{"table_id":"' + identity + '","num_shards":2,'
             '"sharding":"bucket"},"shards":{"0":[1,3,"",0,1],"1":[1,3,"",0,1]}}')
    assert _properties(tmp_path, "db.out") == {"paimon-group.sink.g": value}
    assert _properties(tmp_path, "db.out_plain") == {"paimon-group.sink.g": value}
    assert value == encode({0: ShardMark(1, 3, scan=1), 1: ShardMark(1, 3, scan=1)},
                           Source(identity, 2, "bucket"))


def test_marks_of_the_release_before_are_read_for_a_group_of_one_table(tmp_path: Path) -> None:
    """Marks a former release committed (format 2, the group's name) hold
    for a group of one table, and for the table of a group of several whose
    shard numbers are the group's; the other tables' are their own."""
    _sources(tmp_path)
    _target(tmp_path, "db.out")
    identity = table_identity(open_table(tmp_path, "db.src_a"))
    former = encode({0: ShardMark(1, 2, scan=1), 1: ShardMark(1, 2, scan=1)},
                    Source(identity, 2, "bucket"))
    table = open_table(tmp_path, "db.out").copy({"snapshot.ignore-empty-commit": "false"})
    commit = table.new_batch_write_builder().new_commit()
    commit.commit([], snapshot_properties={"paimon-group.sink.g": former})
    commit.close()
    with PaimonSink(str(tmp_path), "db.out", commit_interval_s=0) as sink:
        for group_shards in (False, True):
            for batch in _batches(tmp_path, "db.src_a", group_shards=group_shards):
                with pytest.raises(AlreadyWritten):
                    _deliver(sink, batch)
        for batch in _batches(tmp_path, "db.src_b"):  # not judged against db.src_a's
            _deliver(sink, batch)
        assert json.loads(_properties(tmp_path, "db.out")["paimon-group.sink.g"]) == \
            json.loads(former)
    assert _read(tmp_path, "db.out") == [r for r in _expected("db.src_b") if r[1] == 1]


def test_which_marks_a_batch_is_judged_against(tmp_path: Path) -> None:
    """The group's own marks, but for a batch whose shard is not the
    group's: its source table's; one line if it does not say its table."""
    _sources(tmp_path)
    a0, a1 = _batches(tmp_path, "db.src_a")
    b0, b1 = _batches(tmp_path, "db.src_b")
    assert [marks_table_of(b) for b in (a0, a1, b0, b1)] == ["", "", "db.src_b", "db.src_b"]
    assert [marks_table_of(b) for b in _batches(tmp_path, "db.src_b", group_shards=False)] \
        == ["", ""]
    b0.table = ""
    with pytest.raises(PaimonGroupError, match=(
            r"^group g shard 2: the batch is of a table's shard 0 and does not say which "
            r"table \(ShardBatch\(table=\.\.\.\)\): the sink keeps a group's marks per "
            r"source table$")):
        marks_table_of(b0)


def test_a_former_owner_of_one_table_s_shard_is_refused_by_its_own_marks(
        tmp_path: Path) -> None:
    """Epochs are per shard: a newer owner of ``db.src_b``'s shard 0 (the
    group's 2) fences that shard's former owner, not ``db.src_a``'s shard 0."""
    from paimon_group.errors import StaleSinkWrite

    _sources(tmp_path)
    _target(tmp_path, "db.out")
    with PaimonSink(str(tmp_path), "db.out", commit_interval_s=0) as sink:
        for batch in _batches(tmp_path, "db.src_b", epoch=5):
            _deliver(sink, batch)
        for batch in _batches(tmp_path, "db.src_a", epoch=1):
            _deliver(sink, batch)  # epoch 1 < 5, but of another table
        stale = _batches(tmp_path, "db.src_b", delta=True, epoch=4)[0]
        with pytest.raises(StaleSinkWrite, match=r"^group g table db.src_b shard 0: a newer "):
            _deliver(sink, stale)
    assert _read(tmp_path, "db.out") == [
        r for r in _expected("db.src_a", "db.src_b") if r[1] == 1]



def _page_handler(wh: Path, name: str) -> tuple[Any, PaimonSink | PaimonSinks]:
    """docs/paimon-sink.md's ``name`` as written (its warehouse the test's):
    its ``handle`` and the sink it made."""
    from tests.test_docs_paimon_sink import page_files

    namespace: dict[str, Any] = {"__name__": name.removesuffix(".py")}
    exec(page_files()[name].replace("/data/wh", str(wh)), namespace)
    sinks = [v for v in namespace.values() if isinstance(v, PaimonSink | PaimonSinks)]
    assert len(sinks) == 1
    return namespace["handle"], sinks[0]


def _ids(wh: Path, name: str, *columns: str) -> list[tuple[Any, ...]]:
    table = open_table(wh, name)
    builder = table.new_read_builder()
    rows = builder.new_read().to_arrow(builder.new_scan().plan().splits())
    return sorted(zip(*(rows.column(c).to_pylist() for c in columns), strict=True))


@pytest.mark.parametrize("name", ["copy_tables.py", "merge_tables.py"])
def test_the_page_s_handlers_write_each_table_once(tmp_path: Path, name: str) -> None:
    """The handlers of docs/paimon-sink.md, "A group of several tables", as
    written, on a group of two tables (``db.src_a`` and ``db.src_b``, their
    batches named as the page's tables): each batch once, each replay
    (a new owner's) found."""
    copy = name == "copy_tables.py"
    names = {"db.src_a": "shop.orders", "db.src_b": "shop.items" if copy else "shop.returns"}
    _sources(tmp_path)
    fields = [pa.field("id", pa.int64(), nullable=False), pa.field("v", pa.int64()),
              pa.field("payload", pa.string())]
    for target in ["shop.orders_copy", "shop.items_copy"] if copy else ["shop.movements"]:
        extra = [] if copy else [pa.field("source_table", pa.string())]
        _create(tmp_path, target, pa.schema(fields + extra), primary_keys=[],
                options={"bucket": "-1"})
    handle, sink = _page_handler(tmp_path, name)
    with sink:
        for epoch in (1, 2):
            for delta in (False, True):
                for ours, page_name in names.items():
                    for batch in _batches(tmp_path, ours, delta=delta, epoch=epoch):
                        batch.table = page_name
                        try:
                            handle(batch)
                            for sealed in batch.seal_output():
                                sealed.result(60)
                            assert epoch == 1, "a replay was written"
                        except AlreadyWritten:
                            assert epoch == 2
                        finally:
                            batch.close_output()
    if copy:
        assert _ids(tmp_path, "shop.orders_copy", "id") == [(i,) for i in range(20)]
        assert _ids(tmp_path, "shop.items_copy", "id") == [(i,) for i in range(100, 120)]
    else:
        assert _ids(tmp_path, "shop.movements", "id", "source_table") == sorted(
            [(i, "shop.orders") for i in range(20)] + [(i, "shop.returns")
                                                      for i in range(100, 120)])


def test_write_many_commits_each_target_s_items_once(tmp_path: Path) -> None:
    """``PaimonSinks.write_many``: each target's items in one commit of that
    target, the verdicts in the items' order; the same items again are all
    found written."""
    _sources(tmp_path)
    _target(tmp_path, "db.out_a")
    _target(tmp_path, "db.out_b")

    def items() -> list[tuple[pa.Table, ShardBatch]]:
        batches = [b for delta in (False, True) for t in ("db.src_b", "db.src_a")
                   for b in _batches(tmp_path, t, delta=delta)]
        return [(_output(b), b) for b in batches]

    with PaimonSinks(str(tmp_path), {"db.src_a": "db.out_a", "db.src_b": "db.out_b"},
                     commit_interval_s=0) as sinks:
        assert [v.kind for v in sinks.write_many(items())] == ["write"] * 8
        assert {t: s.commits for t, s in sinks.sinks.items()} == {"db.out_a": 1, "db.out_b": 1}
        again = sinks.write_many(items())
        assert [(v.kind, v.next_snapshot) for v in again] == [("already", 3)] * 8
    assert _read(tmp_path, "db.out_a") == _expected("db.src_a")
    assert _read(tmp_path, "db.out_b") == _expected("db.src_b")
