"""Real Paimon tables for tests: create a local filesystem warehouse, write snapshots.

Everything here goes through pypaimon's public catalog and write APIs, except
:func:`compact` and :func:`expire_snapshots`, which reproduce what Paimon's Java
compaction and snapshot expiration do (pypaimon 2.1 has neither) so tests can
see COMPACT snapshots and expired snapshots.

Rows have the columns ``id`` (int64, the primary key / bucket key), ``v``
(int64, a version chosen by the writer so that ``(id, v)`` names one written
row even when ``id`` is updated) and ``payload`` (string). Tables made with
``row_kind_field=True`` also have ``op`` (string, ``+I``/``-U``/``+U``/``-D``),
declared as the table's ``rowkind.field`` so deletes can be written. Tables
made with ``partitioned=True`` also have ``part`` (string, the partition key:
``p<id % PARTITIONS>``, so a key never changes partition; primary-key tables
then have the key ``(part, id)``).

Example::

    from tests.support.tables import make_pk_table, write_rows, bucket_of, open_table

    make_pk_table("/tmp/wh", "db.t", buckets=8)
    snapshot_id = write_rows("/tmp/wh", "db.t", range(100))   # one commit = one snapshot
    table = open_table("/tmp/wh", "db.t")
    assert 0 <= bucket_of(table, 42) < 8

CLI, for multi-process tests that write while members run::

    python -m tests.support.tables create --warehouse W --table db.t --buckets 8
    python -m tests.support.tables write --warehouse W --table db.t \\
        --start 0 --count 100 --per-snapshot 10 --interval-ms 200

``write`` prints one JSON line per committed snapshot:
``{"snapshot": 7, "first_id": 60, "count": 10, "v": 0}``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa
from pypaimon import CatalogFactory, Schema

# Highest level of a merge tree with Paimon's default num-levels; a full
# compaction writes its output there.
_MAX_LEVEL = 5
# ``DataFileMeta.file_source`` of a file written by compaction (0 = APPEND).
_FILE_SOURCE_COMPACT = 1


PARTITIONS = 8
"""Partitions of a partitioned test table: ``part = f"p{id % PARTITIONS}"``."""


def partition_of(key: int) -> str:
    return f"p{int(key) % PARTITIONS}"


def table_schema(*, row_kind_field: bool = False, partitioned: bool = False) -> pa.Schema:
    """The pyarrow schema of the test tables."""
    fields = [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("v", pa.int64()),
        pa.field("payload", pa.string()),
    ]
    if row_kind_field:
        fields.append(pa.field("op", pa.string()))
    if partitioned:
        fields.append(pa.field("part", pa.string(), nullable=False))
    return pa.schema(fields)


_CATALOG_OPTIONS: dict[str, dict[str, str]] = {}


def register_catalog_options(warehouse: str, options: Mapping[str, str]) -> None:
    """Catalog options for every later :func:`catalog` of ``warehouse`` (an object-store
    warehouse's endpoint and keys: see ``tests/support/s3_server.py``)."""
    _CATALOG_OPTIONS[warehouse.rstrip("/")] = dict(options)


def catalog_options_of(warehouse: str | os.PathLike[str]) -> dict[str, str]:
    """The options registered for ``warehouse`` (none for a local directory)."""
    return dict(_CATALOG_OPTIONS.get(os.fspath(warehouse).rstrip("/"), {}))


def catalog(warehouse: str | os.PathLike[str]) -> Any:
    """A pypaimon catalog on a warehouse: a local directory, or an object-store URI
    whose options were registered with :func:`register_catalog_options`."""
    return CatalogFactory.create({**catalog_options_of(warehouse),
                                  "warehouse": os.fspath(warehouse)})


def open_table(warehouse: str | os.PathLike[str], name: str) -> Any:
    """The pypaimon ``FileStoreTable`` ``name`` (``db.table``), freshly loaded."""
    return catalog(warehouse).get_table(name)


def _create(
    warehouse: str | os.PathLike[str],
    name: str,
    schema: pa.Schema,
    *,
    primary_keys: Sequence[str],
    options: Mapping[str, str],
    partition_keys: Sequence[str] = (),
) -> Any:
    cat = catalog(warehouse)
    database = name.split(".", 1)[0]
    cat.create_database(database, True)
    cat.create_table(
        name,
        Schema.from_pyarrow_schema(
            schema,
            partition_keys=list(partition_keys) or None,
            primary_keys=list(primary_keys),
            options=dict(options),
        ),
        False,
    )
    return cat.get_table(name)


def make_pk_table(
    warehouse: str | os.PathLike[str],
    name: str = "db.t",
    *,
    buckets: int = 8,
    changelog_producer: str | None = None,
    row_kind_field: bool = False,
    options: Mapping[str, str] | None = None,
    partitioned: bool = False,
) -> Any:
    """Create a primary-key table (key ``id``) with ``buckets`` fixed buckets.

    ``buckets=-2`` makes a postpone-bucket table, ``-1`` a dynamic-bucket one.
    ``partitioned`` adds the partition key ``part`` (key ``(part, id)``).
    ``changelog_producer`` is ``None`` (Paimon's ``none``), ``"input"``,
    ``"lookup"`` or ``"full-compaction"``.
    """
    opts = {"bucket": str(buckets)}
    if changelog_producer is not None:
        opts["changelog-producer"] = changelog_producer
    if row_kind_field:
        opts["rowkind.field"] = "op"
    opts.update(options or {})
    return _create(
        warehouse,
        name,
        table_schema(row_kind_field=row_kind_field, partitioned=partitioned),
        primary_keys=["part", "id"] if partitioned else ["id"],
        options=opts,
        partition_keys=["part"] if partitioned else (),
    )


def make_append_table(
    warehouse: str | os.PathLike[str],
    name: str = "db.a",
    *,
    buckets: int = 4,
    options: Mapping[str, str] | None = None,
    partitioned: bool = False,
) -> Any:
    """Create an append table; ``buckets > 0`` gives fixed buckets keyed by ``id``.

    ``buckets=-1`` gives a bucket-unaware append table (every file in bucket 0).
    ``partitioned`` adds the partition key ``part``.
    """
    opts = {"bucket": str(buckets)}
    if buckets > 0:
        opts["bucket-key"] = "id"
    opts.update(options or {})
    return _create(
        warehouse, name, table_schema(partitioned=partitioned), primary_keys=[], options=opts,
        partition_keys=["part"] if partitioned else (),
    )


TABLE_KINDS = (
    "fixed", "fixed-partitioned", "dynamic", "dynamic-partitioned", "append",
    "append-partitioned",
)
"""Kinds :func:`make_kind_table` makes (the sharding rule tests' tables)."""


def make_kind_table(
    warehouse: str | os.PathLike[str],
    name: str,
    kind: str,
    *,
    buckets: int = 8,
    target_row_num: int = 40,
) -> Any:
    """A table of one of :data:`TABLE_KINDS`: ``fixed`` is a primary-key table
    with ``buckets`` buckets (``fixed-partitioned``: the same over
    :data:`PARTITIONS` partitions); ``dynamic`` a dynamic-bucket primary-key
    table that opens a new bucket every ``target_row_num`` keys (per
    partition for ``dynamic-partitioned``); ``append`` a bucket-unaware
    append table (``append-partitioned`` over partitions)."""
    partitioned = kind.endswith("-partitioned")
    base = kind.removesuffix("-partitioned")
    if base == "fixed":
        return make_pk_table(warehouse, name, buckets=buckets, partitioned=partitioned)
    if base == "dynamic":
        return make_pk_table(
            warehouse, name, buckets=-1, partitioned=partitioned,
            options={"dynamic-bucket.target-row-num": str(target_row_num)},
        )
    if base == "append":
        return make_append_table(warehouse, name, buckets=-1, partitioned=partitioned)
    raise ValueError(f"unknown table kind {kind!r}: one of {TABLE_KINDS}")


def rows_table(table: Any, ids: Iterable[int], *, v: int = 0, op: str = "+I") -> pa.Table:
    """The arrow rows :func:`write_rows` writes for ``ids``."""
    id_list = [int(i) for i in ids]
    columns: dict[str, Any] = {
        "id": pa.array(id_list, pa.int64()),
        "v": pa.array([v] * len(id_list), pa.int64()),
        "payload": pa.array([f"p{i}-{v}" for i in id_list], pa.string()),
    }
    has_op = "op" in table.field_names
    if has_op:
        columns["op"] = pa.array([op] * len(id_list), pa.string())
    partitioned = "part" in table.field_names
    if partitioned:
        columns["part"] = pa.array([partition_of(i) for i in id_list], pa.string())
    return pa.table(columns, schema=table_schema(row_kind_field=has_op, partitioned=partitioned))


def _committed_snapshot_id(table: Any, commit_user: str) -> int:
    """Id of the newest snapshot committed by ``commit_user`` (we just committed it)."""
    manager = table.snapshot_manager()
    latest = manager.get_latest_snapshot()
    snapshot_id = latest.id if latest is not None else 0
    while snapshot_id >= 1:
        snapshot = manager.get_snapshot_by_id(snapshot_id)
        if snapshot is not None and snapshot.commit_user == commit_user:
            return int(snapshot.id)
        snapshot_id -= 1
    raise RuntimeError(f"commit by {commit_user} produced no snapshot")


def write_rows(
    warehouse: str | os.PathLike[str],
    name: str,
    ids: Iterable[int],
    *,
    v: int = 0,
    op: str = "+I",
) -> int:
    """Write one row per id in ONE commit (one snapshot); return the snapshot id.

    ``op`` is used only by tables made with ``row_kind_field=True``.
    """
    table = open_table(warehouse, name)
    data = rows_table(table, ids, v=v, op=op)
    if data.num_rows == 0:
        raise ValueError("write_rows needs at least one id; use commit_empty for an empty snapshot")
    return write_table(table, data)


def write_table(table: Any, data: pa.Table) -> int:
    """Write ``data`` to the opened ``table`` in ONE commit; return the snapshot id."""
    builder = table.new_batch_write_builder()
    write = builder.new_write()
    commit = builder.new_commit()
    try:
        write.write_arrow(data)
        commit.commit(write.prepare_commit())
    finally:
        write.close()
        commit.close()
    return _committed_snapshot_id(table, builder.commit_user)


def delete_rows(
    warehouse: str | os.PathLike[str], name: str, ids: Iterable[int], *, v: int = 0
) -> int:
    """Write ``-D`` rows for ``ids`` (table needs ``row_kind_field=True``)."""
    return write_rows(warehouse, name, ids, v=v, op="-D")


def commit_empty(warehouse: str | os.PathLike[str], name: str) -> int:
    """Commit an APPEND snapshot with no files; return its id."""
    table = open_table(warehouse, name).copy({"snapshot.ignore-empty-commit": "false"})
    builder = table.new_batch_write_builder()
    commit = builder.new_commit()
    try:
        commit.commit([])
    finally:
        commit.close()
    return _committed_snapshot_id(table, builder.commit_user)


def bucket_of(table: Any, key: int) -> int:
    """The bucket pypaimon's writer puts the row with ``id == key`` in.

    Uses the table's own row key extractor (the one ``write_arrow`` routes
    with), so it is independent of any split or manifest metadata. ``table``
    is a pypaimon table or anything with one in ``.table`` (a ShardedTable).
    """
    if not hasattr(table, "create_row_key_extractor"):
        table = table.table
    extractor = table.create_row_key_extractor()
    values: dict[str, Any] = {name: None for name in table.field_names}
    values["id"] = int(key)
    if "part" in values:
        values["part"] = partition_of(key)
    _partition, bucket = extractor.extract_partition_bucket_row(values)
    return int(bucket)


def current_entries(table: Any) -> list[Any]:
    """Live ADD entries (with stats) of the latest snapshot."""
    from pypaimon.manifest.manifest_file_manager import ManifestFileManager
    from pypaimon.manifest.manifest_list_manager import ManifestListManager

    snapshot = table.snapshot_manager().get_latest_snapshot()
    if snapshot is None:
        return []
    manifests = ManifestListManager(table).read_all(snapshot)
    entries: list[Any] = ManifestFileManager(table).read_entries_parallel(
        manifests, drop_stats=False
    )
    return entries


def compact(
    warehouse: str | os.PathLike[str],
    name: str,
    buckets: Iterable[int] | None = None,
) -> int:
    """Full-compact buckets of a primary-key table into ONE COMPACT snapshot.

    Like Paimon's full compaction: the merged rows of each bucket are
    rewritten into a new file at the top level, and the old files are deleted
    in the same commit (kind COMPACT, no changelog). Returns the snapshot id.

    A bucket-unaware append table (``bucket = -1``) is compacted as Paimon's
    append compaction does: its files are rewritten, rows unchanged, into new
    files (other names, so other shards under the file rule), level 0.

    The rows are merged by pypaimon's reader as a member's reads are: the
    engine reads installed (:func:`install_engine_reads`), whether or not this
    process opened a group table before, and a lookup table's levels followed
    (:func:`follow_lookup_levels`).
    """
    from pypaimon.common.options.core_options import ChangelogProducer
    from pypaimon.manifest.schema.manifest_entry import ManifestEntry

    from paimon_group.arrowread.levels import follow_lookup_levels
    from paimon_group.reading.engine_reads import install_engine_reads

    install_engine_reads()
    table = open_table(warehouse, name)
    unaware = not table.is_primary_key_table and int(table.options.bucket()) == -1
    if not table.is_primary_key_table and not unaware:
        raise ValueError("compact() supports primary-key and bucket-unaware append tables")
    wanted = set(buckets) if buckets is not None else None
    entries = [e for e in current_entries(table) if wanted is None or e.bucket in wanted]
    if not entries:
        raise ValueError(f"nothing to compact in {name}")
    by_bucket: dict[int, list[Any]] = {}
    for entry in entries:
        by_bucket.setdefault(entry.bucket, []).append(entry)

    read_builder = table.new_read_builder()
    splits = [s for s in read_builder.new_scan().plan().splits() if s.bucket in by_bucket]
    merged = follow_lookup_levels(read_builder.new_read()).to_arrow(splits)

    builder = table.new_batch_write_builder()
    write = builder.new_write()
    # A compaction under changelog-producer=input writes no changelog.
    if hasattr(write.file_store_write, "changelog_producer"):
        write.file_store_write.changelog_producer = ChangelogProducer.NONE
    commit = builder.new_commit()
    try:
        if merged.num_rows:
            write.write_arrow(merged)
        messages = write.prepare_commit()
        commit_entries: list[Any] = []
        for message in messages:
            if message.changelog_files:
                raise RuntimeError("compaction unexpectedly wrote changelog files")
            for new_file in message.new_files:
                if message.bucket not in by_bucket:
                    raise RuntimeError(f"compacted rows landed in bucket {message.bucket}")
                compacted = dataclasses.replace(
                    new_file, level=0 if unaware else _MAX_LEVEL,
                    file_source=_FILE_SOURCE_COMPACT,
                )
                template = by_bucket[message.bucket][0]
                commit_entries.append(
                    ManifestEntry(
                        kind=0,
                        partition=template.partition,
                        bucket=message.bucket,
                        total_buckets=template.total_buckets,
                        file=compacted,
                    )
                )
        for bucket_entries in by_bucket.values():
            for entry in bucket_entries:
                commit_entries.append(
                    ManifestEntry(
                        kind=1,
                        partition=entry.partition,
                        bucket=entry.bucket,
                        total_buckets=entry.total_buckets,
                        file=entry.file,
                    )
                )
        file_store_commit = commit.file_store_commit
        file_store_commit._try_commit(
            commit_kind="COMPACT",
            commit_identifier=2**63 - 1,
            commit_entries_plan=lambda _snapshot: commit_entries,
            detect_conflicts=True,
            changelog_entries=[],
        )
    finally:
        write.close()
        commit.close()
    return _committed_snapshot_id(table, builder.commit_user)


def expire_snapshots(warehouse: str | os.PathLike[str], name: str, *, keep_from: int) -> None:
    """Expire every snapshot older than ``keep_from``, as Paimon's expiration does.

    Deletes the snapshot files below ``keep_from`` and writes the EARLIEST
    hint. (Data and manifest files are left alone: readers never need them
    once their snapshot is gone, and tests only care about the snapshots.)
    """
    table = open_table(warehouse, name)
    manager = table.snapshot_manager()
    latest = manager.get_latest_snapshot()
    if latest is None or keep_from > latest.id:
        raise ValueError(f"cannot expire up to {keep_from}: latest is {latest and latest.id}")
    file_io = table.file_io
    for snapshot_id in range(1, keep_from):
        path = manager.get_snapshot_path(snapshot_id)
        if file_io.exists(path):
            file_io.delete(path)
    earliest_hint = f"{manager.snapshot_dir}/EARLIEST"
    file_io.overwrite_file_utf8(earliest_hint, str(keep_from))


def latest_snapshot_id(warehouse: str | os.PathLike[str], name: str) -> int | None:
    snapshot = open_table(warehouse, name).snapshot_manager().get_latest_snapshot()
    return None if snapshot is None else int(snapshot.id)


# ---------------------------------------------------------------------------
# CLI


def _cmd_create(args: argparse.Namespace) -> int:
    if args.append:
        make_append_table(args.warehouse, args.table, buckets=args.buckets)
    else:
        make_pk_table(
            args.warehouse,
            args.table,
            buckets=args.buckets,
            changelog_producer=args.changelog_producer,
        )
    return 0


def _cmd_write(args: argparse.Namespace) -> int:
    next_id = args.start
    end = args.start + args.count
    first = True
    while next_id < end:
        if not first and args.interval_ms > 0:
            time.sleep(args.interval_ms / 1000.0)
        first = False
        chunk = range(next_id, min(next_id + args.per_snapshot, end))
        snapshot_id = write_rows(args.warehouse, args.table, chunk, v=args.v)
        line = {"snapshot": snapshot_id, "first_id": chunk.start, "count": len(chunk), "v": args.v}
        print(json.dumps(line), flush=True)
        next_id = chunk.stop
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.tables")
    sub = parser.add_subparsers(dest="command", required=True)

    create = sub.add_parser("create", help="create a table")
    create.add_argument("--warehouse", required=True)
    create.add_argument("--table", required=True)
    create.add_argument("--buckets", type=int, default=8)
    create.add_argument("--append", action="store_true", help="append table (bucket-key id)")
    create.add_argument("--changelog-producer", default=None)
    create.set_defaults(func=_cmd_create)

    write = sub.add_parser("write", help="write ids start..start+count-1, one snapshot per chunk")
    write.add_argument("--warehouse", required=True)
    write.add_argument("--table", required=True)
    write.add_argument("--start", type=int, default=0)
    write.add_argument("--count", type=int, required=True)
    write.add_argument("--per-snapshot", type=int, default=10)
    write.add_argument("--interval-ms", type=int, default=0)
    write.add_argument("--v", type=int, default=0, help="value of the v column")
    write.set_defaults(func=_cmd_write)

    args = parser.parse_args(argv)
    if getattr(args, "per_snapshot", 1) <= 0:
        parser.error("--per-snapshot must be positive")
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
