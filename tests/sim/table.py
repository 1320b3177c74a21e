"""Real Paimon tables for the simulation, written once per process and replayed.

A pypaimon commit costs tens of milliseconds, more than the rest of a
simulated run. So each worker process writes two small primary-key tables
once (:func:`templates`), with pypaimon's own catalog and writer:

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
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

MAIN_SNAPSHOTS = 8
ALTER_BEFORE = 5  # the column is added right before this snapshot is committed
RECREATED_SNAPSHOTS = 3
BUCKETS = 4
TABLE = "db.t"


@dataclass
class Template:
    root: Path  # a warehouse holding TABLE
    ids: dict[int, list[int]]  # snapshot id -> ids written in it
    bucket: dict[int, int]  # id -> bucket
    extra_from: int | None  # first snapshot whose rows carry ``extra``

    @property
    def table_dir(self) -> Path:
        return self.root / "db.db" / "t"


def _write(warehouse: str, ids: list[int], extra: bool) -> int:
    from tests.support.tables import open_table, rows_table

    table = open_table(warehouse, TABLE)
    data = rows_table(table, ids)
    if extra:
        data = data.append_column(pa.field("extra", pa.int64()),
                                  pa.array([i * 10 for i in ids], pa.int64()))
    builder = table.new_batch_write_builder()
    write, commit = builder.new_write(), builder.new_commit()
    try:
        write.write_arrow(data)
        commit.commit(write.prepare_commit())
    finally:
        write.close()
        commit.close()
    return int(table.snapshot_manager().get_latest_snapshot().id)


def _build(root: Path, *, first_id: int, snapshots: int, alter_before: int | None) -> Template:
    from tests.support.tables import bucket_of, catalog, make_pk_table, open_table

    make_pk_table(root, TABLE, buckets=BUCKETS)
    ids: dict[int, list[int]] = {}
    next_id = first_id
    for n in range(1, snapshots + 1):
        if alter_before is not None and n == alter_before:
            from pypaimon.schema.data_types import AtomicType
            from pypaimon.schema.schema_change import SchemaChange

            catalog(root).alter_table(
                TABLE, [SchemaChange.add_column("extra", AtomicType("BIGINT"))])
        count = 3 + (n * 7) % 5  # 3..7 rows, spread over the buckets
        batch = list(range(next_id, next_id + count))
        next_id += count
        snapshot = _write(str(root), batch, extra=alter_before is not None and n >= alter_before)
        assert snapshot == n, (snapshot, n)
        ids[n] = batch
    table = open_table(root, TABLE)
    bucket = {i: bucket_of(table, i) for batch in ids.values() for i in batch}
    return Template(root, ids, bucket, alter_before)


@functools.cache
def templates() -> tuple[Template, Template]:
    """The two tables of this process (built on first use, ~0.5 s)."""
    base = Path(tempfile.mkdtemp(prefix="pg-sim-templates-", dir=scratch_dir()))
    main = _build(base / "main", first_id=0, snapshots=MAIN_SNAPSHOTS,
                  alter_before=ALTER_BEFORE)
    recreated = _build(base / "recreated", first_id=1000, snapshots=RECREATED_SNAPSHOTS,
                       alter_before=None)
    return main, recreated


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
    current: Template = field(init=False)
    committed: int = 0  # snapshots of ``current`` visible so far
    dropped: bool = False
    written: dict[int, int] = field(default_factory=dict)  # id -> snapshot (main table only)

    def __post_init__(self) -> None:
        self.current = self.main
        (self.root / "db.db").mkdir(parents=True)
        _link_tree(self.main.table_dir, self.table_dir)

    @property
    def table_dir(self) -> Path:
        return self.root / "db.db" / "t"

    @property
    def remaining(self) -> int:
        return len(self.current.ids) - self.committed

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
                self.written[i] = n
        return n

    def drop(self) -> None:
        shutil.rmtree(self.table_dir, ignore_errors=True)
        self.dropped = True

    def recreate(self) -> None:
        """The table created anew under the same name (another identity)."""
        shutil.rmtree(self.table_dir, ignore_errors=True)
        self.current = self.recreated
        self.committed = 0
        self.dropped = False
        _link_tree(self.recreated.table_dir, self.table_dir)

    def bucket_of(self, i: int) -> int:
        return self.main.bucket[i] if i in self.main.bucket else self.recreated.bucket[i]

    def cleanup(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
