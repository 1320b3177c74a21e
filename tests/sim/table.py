"""Real Paimon tables for the simulation, written once per process and replayed.

A pypaimon commit costs tens of milliseconds, more than the rest of a
simulated run. So each worker process writes two small tables of each kind
it runs once (:func:`templates`, one of :data:`KINDS`: fixed-bucket,
partitioned, dynamic-bucket, bucket-unaware append, first-row), with
pypaimon's own catalog and writer, with the kind's updates and compactions
(COMPACT snapshots, replayed like any commit):

* ``main``: 4 buckets, :data:`MAIN_SNAPSHOTS` snapshots of a few rows each;
  before snapshot :data:`ALTER_BEFORE` the column ``extra`` is added
  (``ALTER TABLE ... ADD COLUMN``: a new schema file) and the rows written
  after it carry ``extra = id * 10``;
* ``recreated``: the same table name created anew later (another first
  schema, hence another identity), with ids from 1000.

A run's writer (:class:`ReplayWarehouse`) then *replays* those commits into
the run's own warehouse, in the seed's order and at the seed's instants: the
data files and manifests are hard-linked in at the start (a file no snapshot
names is never read), and a commit is the atomic appearance of its snapshot
file (plus the ``LATEST`` hint), which is what a Paimon commit is on a file
system; the schema change is the appearance of ``schema-1``. A drop removes
the table's directory, as pypaimon's ``drop_table`` does; a re-create links
the second table in under the same name. So the members read real Paimon
files through the real planner and reader, and each commit costs a link.
:meth:`ReplayWarehouse.expire` expires snapshots as Paimon's expiry does
(the files no retained snapshot references deleted with them; what each
template snapshot references is read once: :attr:`Template.refs`).
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

MAIN_SNAPSHOTS = 8  # writes; compactions come on top of them
ALTER_BEFORE = 5  # the column is added right before the 5th write is committed
RECREATED_SNAPSHOTS = 3
BUCKETS = 4
TABLE = "db.t"
COMPACT_AFTER = (3, 6)  # a compaction is committed after these writes (kinds that compact)

KINDS = ("fixed", "fixed-partitioned", "dynamic", "append", "append-partitioned", "first-row")
"""The table kinds a seed runs on (``fixed`` is the one every seed used before)."""
KIND_WEIGHTS = (3, 1, 1, 2, 1, 1)
PK_KINDS = ("fixed", "fixed-partitioned", "dynamic", "first-row")
COMPACTING = ("fixed", "append", "append-partitioned")
"""Kinds whose template holds compactions (``tests.support.tables.compact``
rewrites unpartitioned deduplicate tables: it re-reads the merged rows with
pypaimon, whose batch read of a first-row table is empty, so it cannot
compact one; appends are compacted here)."""

Location = tuple[tuple[object, ...], int, str]  # (partition values, bucket, file name)


@dataclass
class Template:
    root: Path  # a warehouse holding TABLE
    kind: str
    ids: dict[int, list[int]]  # snapshot id -> ids written in it (empty: a compaction)
    values: dict[int, int]  # snapshot id -> the ``v`` its rows carry
    first_loc: dict[int, Location]  # id -> the file it was first written in
    locs: dict[int, set[Location]]  # id -> every file that ever held it (compactions too)
    extra_from: int | None  # first snapshot whose rows carry ``extra``
    rule: object  # the sharding rule a new group on this table gets (ShardRule)
    compactions: tuple[int, ...] = ()
    # snapshot id -> every file it references (relative to the table's
    # directory): manifest lists, manifests, index manifest, live data files
    refs: dict[int, frozenset[str]] = field(default_factory=dict)
    # snapshot id -> the data files live in it
    live: dict[int, frozenset[Location]] = field(default_factory=dict)
    # snapshot id -> the row kind of each id it wrote, where not ``+I``
    # (:func:`successor`: updates ``+U``, deletes ``-D``)
    ops: dict[int, dict[int, str]] = field(default_factory=dict)

    @property
    def table_dir(self) -> Path:
        return self.root / "db.db" / "t"


def _note_files(messages: list[object], locs: dict[int, set[Location]],
                first: dict[int, Location] | None) -> None:
    """Which ids each new data file holds (read back from the file itself)."""
    import pyarrow.parquet as pq

    for m in messages:
        for f in m.new_files:  # type: ignore[attr-defined]
            loc: Location = (tuple(m.partition), int(m.bucket), str(f.file_name))  # type: ignore[attr-defined]
            for i in pq.ParquetFile(f.file_path).read(columns=["id"]).column("id").to_pylist():
                locs.setdefault(int(i), set()).add(loc)
                if first is not None:
                    first.setdefault(int(i), loc)


def _write(warehouse: str, ids: list[int], v: int, extra: bool,
           locs: dict[int, set[Location]], first: dict[int, Location],
           ops: dict[int, str] | None = None) -> int:
    from tests.support.tables import open_table, rows_table

    table = open_table(warehouse, TABLE)
    data = rows_table(table, ids, v=v)
    if ops:
        data = data.set_column(data.schema.get_field_index("op"), "op", pa.array(
            [ops.get(i, "+I") for i in ids], pa.string()))
    if extra:
        data = data.append_column(pa.field("extra", pa.int64()),
                                  pa.array([i * 10 for i in ids], pa.int64()))
    builder = table.new_batch_write_builder()
    write, commit = builder.new_write(), builder.new_commit()
    try:
        write.write_arrow(data)
        messages = write.prepare_commit()
        _note_files(messages, locs, first)
        commit.commit(messages)
    finally:
        write.close()
        commit.close()
    return int(table.snapshot_manager().get_latest_snapshot().id)


def _compact_append(warehouse: str, locs: dict[int, set[Location]]) -> int:
    """Compact a bucket-unaware append table as Paimon's append compaction
    does: the rows of every live file are rewritten into new files (new
    names, hence other shards under the file rule) and the old files are
    deleted, in ONE snapshot of kind COMPACT (pypaimon 2.1 cannot compact)."""
    import dataclasses

    import pyarrow.parquet as pq
    from pypaimon.manifest.schema.manifest_entry import ManifestEntry

    from tests.support.tables import current_entries, open_table

    table = open_table(warehouse, TABLE)
    entries = current_entries(table)
    by_part: dict[tuple[object, ...], list[object]] = {}
    for e in entries:
        by_part.setdefault(tuple(e.partition.values), []).append(e)
    target = pa.schema([f for f in table_arrow_schema(table)])
    parts = []
    for part_entries in by_part.values():
        for e in part_entries:
            parts.append(_conform(pq.ParquetFile(_data_path(table, e)).read(), target))
    merged = pa.concat_tables(parts)
    builder = table.new_batch_write_builder()
    write, commit = builder.new_write(), builder.new_commit()
    try:
        write.write_arrow(merged)
        messages = write.prepare_commit()
        _note_files(messages, locs, None)
        commit_entries: list[object] = []
        for m in messages:
            template = by_part[tuple(m.partition)][0]
            for f in m.new_files:
                commit_entries.append(ManifestEntry(
                    kind=0, partition=template.partition, bucket=m.bucket,  # type: ignore[attr-defined]
                    total_buckets=template.total_buckets,  # type: ignore[attr-defined]
                    file=dataclasses.replace(f, file_source=1)))
        for e in entries:
            commit_entries.append(ManifestEntry(kind=1, partition=e.partition, bucket=e.bucket,
                                                total_buckets=e.total_buckets, file=e.file))
        commit.file_store_commit._try_commit(
            commit_kind="COMPACT", commit_identifier=2**63 - 1,
            commit_entries_plan=lambda _snapshot: commit_entries,
            detect_conflicts=True, changelog_entries=[])
    finally:
        write.close()
        commit.close()
    return int(open_table(warehouse, TABLE).snapshot_manager().get_latest_snapshot().id)


def table_arrow_schema(table: object) -> pa.Schema:
    from pypaimon.schema.data_types import PyarrowFieldParser

    return PyarrowFieldParser.from_paimon_schema(table.table_schema.fields)  # type: ignore[attr-defined]


def _data_path(table: object, entry: object) -> str:
    e = entry
    part = "/".join(f"{k}={v}" for k, v in zip(table.partition_keys,  # type: ignore[attr-defined]
                                               e.partition.values, strict=True))  # type: ignore[attr-defined]
    base = str(table.table_path)  # type: ignore[attr-defined]
    sub = f"{part}/" if part else ""
    return f"{base}/{sub}bucket-{e.bucket}/{e.file.file_name}"  # type: ignore[attr-defined]


def _conform(data: pa.Table, schema: pa.Schema) -> pa.Table:
    """Rows of an older file in the table's current schema (added columns null)."""
    cols = [data.column(f.name).cast(f.type) if f.name in data.column_names
            else pa.nulls(data.num_rows, f.type) for f in schema]
    return pa.table(cols, schema=schema)


def _make(root: Path, kind: str, row_kinds: bool = False) -> None:
    from tests.support.tables import make_kind_table, make_pk_table

    if row_kinds:
        # A primary-key table whose writes carry their row kind (``op``).
        make_pk_table(root, TABLE, buckets=-1 if kind == "dynamic" else BUCKETS,
                      partitioned=kind.endswith("-partitioned"), row_kind_field=True,
                      options={"dynamic-bucket.target-row-num": "8"}
                      if kind == "dynamic" else None)
    elif kind == "first-row":
        make_pk_table(root, TABLE, buckets=BUCKETS, options={"merge-engine": "first-row"})
    else:
        make_kind_table(root, TABLE, kind, buckets=BUCKETS, target_row_num=8)


def _build(root: Path, kind: str, *, first_id: int, snapshots: int,
           alter_before: int | None, row_kinds: bool = False) -> Template:
    from paimon_group.protocol.sharding import choose_rule, table_kind
    from tests.support.tables import compact, open_table

    _make(root, kind, row_kinds)
    ops: dict[int, dict[int, str]] = {}
    deleted: set[int] = set()
    ids: dict[int, list[int]] = {}
    values: dict[int, int] = {}
    locs: dict[int, set[Location]] = {}
    first: dict[int, Location] = {}
    compactions: list[int] = []
    extra_from: int | None = None
    next_id = first_id
    for n in range(1, snapshots + 1):
        if alter_before is not None and n == alter_before:
            from pypaimon.schema.data_types import AtomicType
            from pypaimon.schema.schema_change import SchemaChange

            catalog_of(root).alter_table(
                TABLE, [SchemaChange.add_column("extra", AtomicType("BIGINT"))])
        count = 3 + (n * 7) % 5  # 3..7 rows, spread over the buckets
        batch = list(range(next_id, next_id + count))
        next_id += count
        if kind in PK_KINDS and n >= 3:
            # Updates: two keys written before get a new version (the key
            # keeps its bucket, so its shard).
            batch += [first_id + (n * 5) % (next_id - count - first_id),
                      first_id + (n * 11 + 1) % (next_id - count - first_id)]
            batch = sorted(set(batch))
        changes: dict[int, str] = {}
        if row_kinds and n >= 2:
            # Updates are ``+U`` (of a deleted key: inserted again), and one
            # or two keys written before are deleted (``-D``).
            changes = {i: "+U" for i in batch if i < next_id - count}
            before = [i for i in range(first_id, next_id - count)
                      if i not in batch and i not in deleted]
            for k in (n * 3, n * 7 + 2)[:1 + n % 2]:
                if before:
                    gone = before.pop(k % len(before))
                    changes[gone] = "-D"
                    batch.append(gone)
            batch = sorted(batch)
            deleted = (deleted | {i for i, op in changes.items() if op == "-D"}) \
                - {i for i, op in changes.items() if op != "-D"}
        with_extra = alter_before is not None and n >= alter_before
        snapshot = _write(str(root), batch, n, with_extra, locs, first, changes)
        if changes:
            ops[snapshot] = changes
        if with_extra and extra_from is None:
            extra_from = snapshot
        ids[snapshot] = batch
        values[snapshot] = n
        if alter_before is not None and n in COMPACT_AFTER and kind in COMPACTING:
            if kind in PK_KINDS:
                snapshot = compact(str(root), TABLE)
            else:
                snapshot = _compact_append(str(root), locs)
            ids[snapshot] = []
            compactions.append(snapshot)
    table = open_table(root, TABLE)
    rule = choose_rule(table, table_kind(table, TABLE))
    refs, live = _snapshot_files(table, locs)
    return Template(root, kind, ids, values, first, locs, extra_from, rule, tuple(compactions),
                    refs, live, ops)


def _snapshot_files(table: Any, ids: dict[int, set[Location]]
                    ) -> tuple[dict[int, frozenset[str]], dict[int, frozenset[Location]]]:
    """What each snapshot of ``table`` references, as Paimon's expiry sees it
    (a file no retained snapshot references is deleted with the snapshots);
    the ids of files written by a compaction are added to ``ids``."""
    import pyarrow.parquet as pq
    from pypaimon.manifest.manifest_file_manager import ManifestFileManager
    from pypaimon.manifest.manifest_list_manager import ManifestListManager

    snapshots = table.snapshot_manager()
    lists, files = ManifestListManager(table), ManifestFileManager(table)
    base = str(table.table_path).rstrip("/")
    refs: dict[int, frozenset[str]] = {}
    live: dict[int, frozenset[Location]] = {}
    n = 1
    while (snapshot := snapshots.get_snapshot_by_id(n)) is not None:
        names = {snapshot.base_manifest_list, snapshot.delta_manifest_list,
                 snapshot.changelog_manifest_list, snapshot.index_manifest}
        out = {f"manifest/{name}" for name in names if name}
        manifests = lists.read_all(snapshot)
        out |= {f"manifest/{m.file_name}" for m in manifests}
        locs: set[Location] = set()
        known = {loc for held in ids.values() for loc in held}
        for e in files.read_entries_parallel(manifests, drop_stats=False):
            out.add(_data_path(table, e)[len(base) + 1:])
            loc = (tuple(e.partition.values), int(e.bucket), str(e.file.file_name))
            locs.add(loc)
            if loc not in known:  # a compaction's output
                path = _data_path(table, e)
                for i in pq.ParquetFile(path).read(columns=["id"]).column("id").to_pylist():
                    ids.setdefault(int(i), set()).add(loc)
        refs[n], live[n] = frozenset(out), frozenset(locs)
        n += 1
    return refs, live


def catalog_of(root: Path) -> Any:
    from tests.support.tables import catalog

    return catalog(root)


@contextlib.contextmanager
def _fixed_uuids(key: str) -> Iterator[None]:
    """pypaimon names data files after ``uuid.uuid4()``; under the file rule a
    file's name decides its shard, so the names come from ``key`` here: every
    process builds the same files, and a seed runs the same everywhere."""
    rng = random.Random(key)
    real = uuid.uuid4
    uuid.uuid4 = lambda: uuid.UUID(int=rng.getrandbits(128), version=4)
    try:
        yield
    finally:
        uuid.uuid4 = real


@functools.cache
def templates(kind: str = "fixed") -> tuple[Template, Template]:
    """The two tables of ``kind`` in this process (built on first use, ~0.5 s)."""
    base = Path(tempfile.mkdtemp(prefix="pg-sim-templates-", dir=scratch_dir()))
    with _fixed_uuids(f"template:{kind}"):
        main = _build(base / "main", kind, first_id=0, snapshots=MAIN_SNAPSHOTS,
                      alter_before=ALTER_BEFORE)
        recreated = _build(base / "recreated", kind, first_id=1000,
                           snapshots=RECREATED_SNAPSHOTS, alter_before=None)
    return main, recreated


SUCCESSOR_SNAPSHOTS = 8
ROW_KIND_KINDS = ("fixed", "fixed-partitioned", "dynamic")
"""Kinds whose :func:`successor` carries deletes and updates (``op``)."""


@functools.cache
def successor(kind: str = "fixed") -> Template:
    """A longer re-created table of ``kind`` (ids from 1000, as ``recreated``),
    for the seeds whose operator deletes the group and starts it again on it
    (:mod:`tests.sim.afterlife`): :data:`SUCCESSOR_SNAPSHOTS` writes, and on
    the kinds of :data:`ROW_KIND_KINDS` updates (``+U``) and deletes (``-D``)
    of keys written before."""
    base = Path(tempfile.mkdtemp(prefix="pg-sim-successor-", dir=scratch_dir()))
    with _fixed_uuids(f"successor:{kind}"):
        return _build(base / "successor", kind, first_id=1000, snapshots=SUCCESSOR_SNAPSHOTS,
                      alter_before=None, row_kinds=kind in ROW_KIND_KINDS)


def scratch_dir() -> str | None:
    """A memory-backed directory when there is one (the runs write small files)."""
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None


def _is_hidden_until_commit(rel: Path) -> bool:
    name = rel.name
    return (rel.parts[0] == "snapshot" and (name.startswith("snapshot-")
                                            or name in ("LATEST", "EARLIEST"))) \
        or (rel.parts[0] == "schema" and name != "schema-0")


def _link_tree(src: Path, dst: Path) -> None:
    for dirpath, _dirs, files in os.walk(src):
        rel_dir = Path(dirpath).relative_to(src)
        (dst / rel_dir).mkdir(parents=True, exist_ok=True)
        for f in files:
            rel = rel_dir / f
            if not _is_hidden_until_commit(rel):
                os.link(Path(dirpath) / f, dst / rel)


@dataclass
class ReplayWarehouse:
    """One run's warehouse; :meth:`commit` replays the next snapshot."""

    root: Path
    main: Template
    recreated: Template
    name: str = "t"  # the table's name in database ``db`` (several share one root)
    current: Template = field(init=False)
    committed: int = 0  # snapshots of ``current`` visible so far
    dropped: bool = False
    # id -> [(snapshot, v)] of every version committed so far (main table only)
    versions: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    _shard_cache: dict[tuple[int, int], int] = field(default_factory=dict)
    earliest: int = 1  # the oldest snapshot of ``current`` not expired
    # snapshot id -> the (virtual) instant it expired (main table only)
    expired_at: dict[int, float] = field(default_factory=dict)
    # consumer file name -> (its text when last seen, the virtual instant it changed)
    _consumer_seen: dict[str, tuple[str, float]] = field(default_factory=dict)
    # consumer file name -> its nextSnapshot when consumer expiration deleted it
    consumers_expired: dict[str, int] = field(default_factory=dict)
    consumers_deleted: list[tuple[float, str]] = field(default_factory=list)  # (instant, name)

    def __post_init__(self) -> None:
        self.current = self.main
        (self.root / "db.db").mkdir(parents=True, exist_ok=self.name != "t")
        _link_tree(self.main.table_dir, self.table_dir)

    @property
    def table_dir(self) -> Path:
        return self.root / "db.db" / self.name

    @property
    def remaining(self) -> int:
        return len(self.current.ids) - self.committed

    @property
    def written(self) -> dict[int, int]:
        """id -> the snapshot of its first version (main table only)."""
        return {i: v[0][0] for i, v in self.versions.items()}

    def commit(self) -> int | None:
        """Make the next snapshot visible; its id (None when none is left)."""
        if self.dropped or self.remaining <= 0:
            return None
        n = self.committed + 1
        src, dst = self.current.table_dir, self.table_dir
        if self.current.extra_from == n:
            os.link(src / "schema" / "schema-1", dst / "schema" / "schema-1")
        os.link(src / "snapshot" / f"snapshot-{n}", dst / "snapshot" / f"snapshot-{n}")
        tmp = dst / "snapshot" / ".LATEST.tmp"
        tmp.write_text(str(n))
        os.replace(tmp, dst / "snapshot" / "LATEST")
        self.committed = n
        if self.current is self.main:
            for i in self.main.ids[n]:
                self.versions.setdefault(i, []).append((n, self.main.values[n]))
        return n

    def expire(self, retain: int, now: float, *, consumer_expiration_s: float | None = None,
               pending: dict[str, str] | None = None) -> list[int]:
        """Expire snapshots as Paimon's ``ExpireSnapshots`` does after a commit
        (``snapshot.num-retained.min = max = retain``, no time retention): the
        consumer files older than ``consumer_expiration_s`` are deleted first
        (``consumer.expiration-time``, ConsumerManager.expire); every snapshot
        below ``latest - retain + 1`` and below the least ``nextSnapshot`` of
        the consumer files left goes, with the data files, manifests and
        manifest lists no retained snapshot references, then their snapshot
        files, and the ``EARLIEST`` hint moves. ``pending``: the text a
        consumer file is being rewritten with (:mod:`tests.sim.tear`), read in
        its place while the file is torn (Paimon's reader retries). The ids
        expired (main table only; a re-created table is not expired)."""
        if self.dropped or self.current is not self.main or self.committed == 0:
            return []
        end = self.committed - retain + 1  # exclusive
        least = self.consumer_min(now, consumer_expiration_s, pending or {})
        if least is not None:
            end = min(end, least)
        end = min(end, self.committed)
        if end <= self.earliest:
            return []
        gone = range(self.earliest, end)
        keep = frozenset().union(*(self.main.refs[j] for j in range(end, self.committed + 1)))
        drop = frozenset().union(*(self.main.refs[j] for j in gone)) - keep
        for rel in sorted(drop):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.table_dir / rel)
        for j in gone:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.table_dir / "snapshot" / f"snapshot-{j}")
            self.expired_at[j] = now
        tmp = self.table_dir / "snapshot" / ".EARLIEST.tmp"
        tmp.write_text(str(end))
        os.replace(tmp, self.table_dir / "snapshot" / "EARLIEST")
        self.earliest = end
        return list(gone)

    def consumer_min(self, now: float, expiration_s: float | None,
                     pending: dict[str, str]) -> int | None:
        """The least ``nextSnapshot`` of the table's consumer files, after
        deleting those unchanged for ``expiration_s`` (their modification time
        is the virtual instant a change of its text was first seen)."""
        import json

        directory = self.table_dir / "consumer"
        if not directory.is_dir():
            return None
        least: int | None = None
        for path in sorted(directory.iterdir()):
            if not path.name.startswith("consumer-"):
                continue
            try:
                text = pending.get(str(path)) or path.read_text()
            except FileNotFoundError:
                continue
            # Its text, not its stat: a file's real modification time would
            # make a seed depend on the wall clock.
            seen = self._consumer_seen.get(path.name)
            changed_at = now if seen is None or seen[0] != text else seen[1]
            self._consumer_seen[path.name] = (text, changed_at)
            try:
                value = int(json.loads(text)["nextSnapshot"])
            except (ValueError, KeyError, TypeError):
                continue
            if expiration_s is not None and now - changed_at > expiration_s:
                path.unlink(missing_ok=True)
                self._consumer_seen.pop(path.name, None)
                self.consumers_expired[path.name] = value
                self.consumers_deleted.append((now, path.name))
                continue
            self.consumers_expired.pop(path.name, None)
            least = value if least is None else min(least, value)
        return least

    def drop(self) -> None:
        shutil.rmtree(self.table_dir, ignore_errors=True)
        self.dropped = True

    def recreate(self) -> None:
        """The table created anew under the same name (another identity)."""
        shutil.rmtree(self.table_dir, ignore_errors=True)
        self.current = self.recreated
        self.committed = 0
        self.earliest = 1
        self.dropped = False
        _link_tree(self.recreated.table_dir, self.table_dir)

    def _template_of(self, i: int) -> Template:
        return self.main if i in self.main.first_loc else self.recreated

    def shard_of(self, i: int, shards: int) -> int:
        """The shard of the file id ``i`` was first written in (its shard for
        good, except under the file rule, where a compaction moves it)."""
        key = (i, shards)
        if key not in self._shard_cache:
            from paimon_group.protocol.sharding import Sharding

            t = self._template_of(i)
            part, bucket, name = t.first_loc[i]
            self._shard_cache[key] = Sharding(t.rule, shards).shard_of(  # type: ignore[arg-type]
                part, bucket, name)
        return self._shard_cache[key]

    def shards_of(self, i: int, shards: int) -> set[int]:
        """Every shard a file holding id ``i`` ever belonged to."""
        from paimon_group.protocol.sharding import Sharding

        t = self._template_of(i)
        sharding = Sharding(t.rule, shards)  # type: ignore[arg-type]
        return {sharding.shard_of(p, b, n) for p, b, n in t.locs[i]}

    def cleanup(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
