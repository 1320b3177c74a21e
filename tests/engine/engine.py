"""Paimon's own engine (its Java core) from Python, for compatibility tests.

The engine comes from the ``paimon-python-ali`` wheel (Paimon's core, a
1.0-SNAPSHOT of September 2024, with a py4j bridge; its manifests are in
0.9's layout): it is not a dependency of the project and is never
installed into the environment. The wheel is looked for at
``$PAIMON_GROUP_ENGINE_WHEEL``, else in ``~/.cache/paimon-group/``; it is
unpacked next to itself once, and put on ``sys.path`` by :func:`start`.
Get it with ``pip download --no-deps paimon-python-ali==0.1.1 -d
~/.cache/paimon-group/``. A JRE 11+ (``java`` on the PATH, or
``$JAVA_HOME``) runs it.

The bridge's Python API reads in batch; everything else (writes, dynamic
buckets, full compaction, streaming scans) is called on the engine's Java
objects through the bridge's gateway.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import pyarrow as pa

__all__ = ["Engine", "engine_unavailable", "start"]

WHEEL_NAME = "paimon_python_ali-0.1.1-py3-none-any.whl"
# Arrow's Java memory needs these on JDK 17.
JVM_ARGS = "--add-opens=java.base/java.nio=ALL-UNNAMED -Xmx512m -XX:+UseSerialGC"


def _wheel() -> Path | None:
    given = os.environ.get("PAIMON_GROUP_ENGINE_WHEEL")
    if given:
        return Path(given) if Path(given).is_file() else None
    found = sorted(glob.glob(str(Path.home() / ".cache" / "paimon-group" / WHEEL_NAME)))
    return Path(found[-1]) if found else None


def engine_unavailable() -> str | None:
    """Why the engine cannot run here, or None."""
    if _wheel() is None:
        return (f"Paimon's engine wheel not found: set PAIMON_GROUP_ENGINE_WHEEL or put "
                f"{WHEEL_NAME} in ~/.cache/paimon-group/")
    java_home = os.environ.get("JAVA_HOME")
    java = Path(java_home, "bin", "java") if java_home else shutil.which("java")
    if not java or not Path(java).exists():
        return "no java to run Paimon's engine"
    return None


def _unpacked(wheel: Path) -> Path:
    target = wheel.with_suffix(".unpacked")
    if not (target / "paimon_python_java").is_dir():
        partial = target.with_suffix(".partial")
        shutil.rmtree(partial, ignore_errors=True)
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(partial)
        shutil.rmtree(target, ignore_errors=True)
        partial.rename(target)
    return target


def _split_top(types: str) -> list[str]:
    """``"INT, MAP<STRING, INT>"`` -> ``["INT", "MAP<STRING, INT>"]``."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(types):
        depth += (char in "<(") - (char in ">)")
        if char == "," and depth == 0:
            parts.append(types[start:i].strip())
            start = i + 1
    parts.append(types[start:].strip())
    return parts


class Engine:
    """One engine JVM; tables are created in ``warehouse`` catalogs."""

    def __init__(self) -> None:
        from paimon_python_java.java_gateway import get_gateway

        self.gateway = get_gateway()
        self.jvm = self.gateway.jvm
        self.tmp_dir = tempfile.mkdtemp(prefix="paimon-engine-")

    def close(self) -> None:
        import paimon_python_java.java_gateway as jg

        self.gateway.shutdown()
        jg._gateway = None
        shutil.rmtree(self.tmp_dir, ignore_errors=True)

    def catalog(self, warehouse: str) -> Any:
        from paimon_python_java import Catalog

        return Catalog.create({"warehouse": warehouse})

    def create_table(
        self, warehouse: str, schema: pa.Schema, *, primary_keys: list[str],
        options: dict[str, str], partition_keys: list[str] | None = None,
        types: dict[str, str] | None = None,
    ) -> Any:
        """Table ``db.t``; ``types`` gives engine types by column where the
        pyarrow type does not say it (``CHAR(5)``, ``TIMESTAMP(9)``)."""
        from paimon_python_java.util.java_utils import _to_j_type

        builder = self.jvm.org.apache.paimon.schema.Schema.newBuilder()
        if partition_keys:
            builder.partitionKeys(partition_keys)
        if primary_keys:
            builder.primaryKey(primary_keys)
        builder.options(options)
        for field in schema:
            given = (types or {}).get(field.name)
            j_type = self._type(given) if given else _to_j_type(field.type)
            if not field.nullable:
                j_type = j_type.copy(False)
            builder.column(field.name, j_type)
        catalog = self.catalog(warehouse)
        catalog.create_database("db", True)
        identifier = self.jvm.org.apache.paimon.catalog.Identifier.fromString("db.t")
        catalog._j_catalog.createTable(identifier, builder.build(), False)
        if any("<" in given for given in (types or {}).values()):
            # the bridge's Python table has no Arrow schema for ARRAY/MAP
            return catalog._j_catalog.getTable(identifier)
        return catalog.get_table("db.t")

    def alter(self, warehouse: str, *changes: tuple[str, ...]) -> None:
        """ALTER TABLE ``db.t`` through the engine's catalog: each change is
        ``("add", name, type)``, ``("rename", old, new)``, ``("type", name,
        type)``, ``("drop", name)``, ``("not null", name)`` (``name`` may be a
        dotted path through ROWs: ``r.q``) or ``("set", option, value)``,
        types by SQL name (``INT``, ``BIGINT``)."""
        schema_change = self.jvm.org.apache.paimon.schema.SchemaChange
        j_changes = self.jvm.java.util.ArrayList()
        for change in changes:
            what, name, *rest = change
            if what == "add":
                j_changes.add(schema_change.addColumn(name, self._type(rest[0])))
            elif what == "rename":
                j_changes.add(schema_change.renameColumn(name, rest[0]))
            elif what == "type":
                j_changes.add(schema_change.updateColumnType(name, self._type(rest[0])))
            elif what == "drop":
                j_changes.add(schema_change.dropColumn(name))
            elif what == "set":
                j_changes.add(schema_change.setOption(name, rest[0]))
            elif what == "not null":
                path = name.split(".")
                names = self.gateway.new_array(self.jvm.java.lang.String, len(path))
                for i, part in enumerate(path):
                    names[i] = part
                j_changes.add(schema_change.updateColumnNullability(names, False))
            else:
                raise ValueError(f"unknown change {what!r}")
        catalog = self.catalog(warehouse)
        identifier = self.jvm.org.apache.paimon.catalog.Identifier.fromString("db.t")
        catalog._j_catalog.alterTable(identifier, j_changes, False)

    def _type(self, name: str) -> Any:
        """An engine type from its SQL name: ``CHAR(n)``, ``VARCHAR(n)``,
        ``TIMESTAMP(p)``, ``TIMESTAMP_LTZ(p)``, ``DECIMAL(p, s)``,
        ``ARRAY<t>``, ``MAP<k, v>``, ``ROW<name t, ...>``."""
        types = self.jvm.org.apache.paimon.types.DataTypes
        nested = re.fullmatch(r"\s*(ARRAY|MAP|ROW)\s*<(.*)>\s*", name, re.IGNORECASE)
        if nested:
            inner = _split_top(nested.group(2))
            if nested.group(1).upper() == "ROW":
                fields = self.gateway.new_array(self.jvm.org.apache.paimon.types.DataField,
                                                len(inner))
                for i, field in enumerate(inner):
                    field_name, field_type = field.split(" ", 1)
                    fields[i] = types.FIELD(i, field_name, self._type(field_type))
                return types.ROW(fields)
            if nested.group(1).upper() == "ARRAY":
                return types.ARRAY(self._type(inner[0]))
            return types.MAP(self._type(inner[0]).copy(False), self._type(inner[1]))
        base, _, rest = name.partition("(")
        args = [int(a) for a in rest.rstrip(")").split(",") if a.strip()]
        plain = {"INT": types.INT, "BIGINT": types.BIGINT, "STRING": types.STRING,
                 "FLOAT": types.FLOAT, "DOUBLE": types.DOUBLE, "DATE": types.DATE,
                 "SMALLINT": types.SMALLINT, "TINYINT": types.TINYINT}
        if base.strip().upper() in plain:
            return plain[base.strip().upper()]()
        make = {
            "CHAR": types.CHAR, "VARCHAR": types.VARCHAR, "TIMESTAMP": types.TIMESTAMP,
            "TIMESTAMP_LTZ": types.TIMESTAMP_WITH_LOCAL_TIME_ZONE, "DECIMAL": types.DECIMAL,
        }[base.strip().upper()]
        return make(*args)

    def write(self, warehouse: str, data: pa.Table, *, compact_buckets: int = 0) -> None:
        """One commit of ``data`` (``compact_buckets`` > 0: a full compaction
        of buckets ``0 .. compact_buckets - 1`` of the unpartitioned table
        in the same commit)."""
        table = self.catalog(warehouse).get_table("db.t")
        j_table = table._j_table
        builder = self.jvm.InvocationUtil.getBatchWriteBuilder(j_table)
        write = builder.newWrite()
        commit = builder.newCommit()
        # lookup (changelog, deletion vectors, first-row) spills to local disk
        write.withIOManager(self.jvm.org.apache.paimon.disk.IOManager.create(self.tmp_dir))
        try:
            if data.num_rows:
                self._write_rows(j_table, write, data.select(table._arrow_schema.names).cast(
                    table._arrow_schema))
            for bucket in range(compact_buckets):
                write.compact(self.jvm.BinaryRow.EMPTY_ROW, bucket, True)
            commit.commit(write.prepareCommit())
        finally:
            write.close()
            commit.close()

    def _write_rows(self, j_table: Any, write: Any, data: pa.Table) -> None:
        """``data`` converted to the engine's rows by the engine's own Arrow
        reader; a dynamic-bucket table's rows get their buckets from the
        engine's ``HashBucketAssigner`` (what its Flink and Spark sinks use;
        it reads and extends the table's hash index), the others from the
        table's bucket key."""
        jvm = self.jvm
        stream = pa.BufferOutputStream()
        with pa.RecordBatchStreamWriter(stream, data.schema) as writer:
            writer.write_table(data)
        allocator = jvm.org.apache.arrow.memory.RootAllocator()
        reader = jvm.org.apache.arrow.vector.ipc.ArrowStreamReader(
            jvm.java.io.ByteArrayInputStream(stream.getvalue().to_pybytes()), allocator)
        assigner = extractor = None
        if str(j_table.bucketMode().name()) == "HASH_DYNAMIC":
            extractor = j_table.createRowKeyExtractor()
            target = int(j_table.coreOptions().dynamicBucketTargetRowNum())
            assigner = jvm.org.apache.paimon.index.HashBucketAssigner(
                j_table.snapshotManager(), "engine-tests", j_table.store().newIndexFileHandler(),
                1, 1, 0, target)
        try:
            root = reader.getVectorSchemaRoot()
            while reader.loadNextBatch():
                rows = jvm.org.apache.paimon.arrow.reader.ArrowBatchReader(
                    j_table.rowType()).readBatch(root).iterator()
                while rows.hasNext():
                    row = rows.next()
                    if assigner is None:
                        write.write(row)
                        continue
                    extractor.setRecord(row)
                    hash_code = extractor.trimmedPrimaryKey().hashCode()
                    write.write(row, assigner.assign(extractor.partition(), hash_code))
        finally:
            reader.close()
            allocator.close()

    def stream(
        self, warehouse: str, from_snapshot: int, schema: pa.Schema | None = None
    ) -> list[tuple[Any, ...]]:
        """The engine's streaming read from ``from_snapshot`` (its deltas or
        changelogs, one snapshot a plan, through the latest snapshot): rows as
        ``(row kind, *values)`` in the engine's order (``schema`` is not used:
        the table's latest schema says the columns)."""
        return [row for _, _, row in self.stream_steps(warehouse, from_snapshot)]

    def java_table(self, warehouse: str) -> Any:
        """The engine's Java table ``db.t`` (the bridge's Python table cannot
        hold ARRAY or MAP columns)."""
        identifier = self.jvm.org.apache.paimon.catalog.Identifier.fromString("db.t")
        return self.catalog(warehouse)._j_catalog.getTable(identifier)

    def _table_at(self, warehouse: str, schema_id: int | None, options: dict[str, str]) -> Any:
        """The engine's table ``db.t`` read through schema ``schema_id`` (None:
        the latest), with ``options``."""
        table = self.java_table(warehouse)
        if schema_id is None:
            return table.copy(options)
        # Not copy(options) after copy(schema): a scan.snapshot-id there
        # travels to the schema of that snapshot.
        schema = table.schemaManager().schema(schema_id)
        merged = self.jvm.java.util.HashMap(schema.options())
        merged.putAll(options)
        return table.copy(schema.copy(merged))

    def stream_steps(
        self, warehouse: str, from_snapshot: int, schema_id: int | None = None
    ) -> list[tuple[int, int, tuple[Any, ...]]]:
        """The engine's streaming read from ``from_snapshot`` through the
        latest snapshot, with the columns of schema ``schema_id`` (None: the
        latest): ``(snapshot, bucket, (row kind, *values))`` in the engine's
        order, each row with the snapshot whose delta or changelog holds it."""
        options = {"scan.mode": "from-snapshot", "scan.snapshot-id": str(from_snapshot)}
        table = self._table_at(warehouse, schema_id, options)
        builder = self.jvm.InvocationUtil.getReadBuilder(table)
        scan = builder.newStreamScan()
        latest = int(table.snapshotManager().latestSnapshotId())
        rows: list[tuple[int, int, tuple[Any, ...]]] = []
        # One plan reads one snapshot, skipping those without changes (a
        # changelog table's APPEND under lookup): the position after the
        # plan, less one, is the snapshot its rows come from.
        for _ in range(2 * latest + 2):  # bounded: one plan a snapshot
            position = scan.checkpoint()
            if position is not None and int(position) > latest:
                break
            splits = list(scan.plan().splits())
            snapshot = int(scan.checkpoint()) - 1
            for split in splits:
                rows += [(snapshot, int(split.bucket()), row)
                         for row in self._split_rows(builder, table, split)]
        return rows

    def read_at(
        self, warehouse: str, snapshot: int, schema_id: int | None = None
    ) -> list[tuple[int, tuple[Any, ...]]]:
        """The engine's batch read of ``snapshot`` with the columns of schema
        ``schema_id`` (None: the latest): ``(bucket, (row kind, *values))``."""
        table = self._table_at(warehouse, schema_id, {"scan.snapshot-id": str(snapshot)})
        builder = self.jvm.InvocationUtil.getReadBuilder(table)
        return [(int(split.bucket()), row) for split in builder.newScan().plan().splits()
                for row in self._split_rows(builder, table, split)]

    def schema_columns(self, warehouse: str) -> dict[tuple[str, ...], int]:
        """Every schema's column names, to its id."""
        manager = self.java_table(warehouse).schemaManager()
        return {tuple(str(f.name()) for f in manager.schema(i).fields()): int(i)
                for i in manager.listAllIds()}

    def _split_rows(self, builder: Any, table: Any, split: Any) -> list[tuple[Any, ...]]:
        getters = [self._getter(f.type()) for f in table.rowType().getFields()]
        iterator = self.jvm.org.apache.paimon.reader.RecordReaderIterator(
            builder.newRead().createReader(split))
        rows: list[tuple[Any, ...]] = []
        try:
            while iterator.hasNext():
                row = iterator.next()
                values = [None if row.isNullAt(i) else get(row, i)
                          for i, get in enumerate(getters)]
                rows.append((row.getRowKind().shortString(), *values))
        finally:
            iterator.close()
        return rows

    def _getter(self, data_type: Any) -> Any:
        """A Python value from a row's (or array's) field ``i`` of ``data_type``:
        ARRAY as a list, MAP as a list of ``(key, value)`` in the engine's order."""
        type_root = str(data_type.getTypeRoot().name())
        if type_root == "ARRAY":
            element = self._getter(data_type.getElementType())
            return lambda row, i: self._elements(row.getArray(i), element)
        if type_root == "MAP":
            key, value = self._getter(data_type.getKeyType()), self._getter(
                data_type.getValueType())
            return lambda row, i: list(zip(self._elements(row.getMap(i).keyArray(), key),
                                           self._elements(row.getMap(i).valueArray(), value),
                                           strict=True))
        if type_root == "ROW":
            getters = [self._getter(f.type()) for f in data_type.getFields()]
            return lambda row, i: self._fields(row.getRow(i, len(getters)), getters)
        if type_root == "BIGINT":
            return lambda row, i: row.getLong(i)
        if type_root == "INTEGER":
            return lambda row, i: row.getInt(i)
        if type_root in ("VARCHAR", "CHAR"):
            return lambda row, i: row.getString(i).toString()
        raise ValueError(f"no getter for {type_root}")

    @staticmethod
    def _fields(row: Any, getters: list[Any]) -> tuple[Any, ...]:
        return tuple(None if row.isNullAt(j) else get(row, j) for j, get in enumerate(getters))

    @staticmethod
    def _elements(array: Any, get: Any) -> list[Any]:
        return [None if array.isNullAt(j) else get(array, j) for j in range(array.size())]

    def write_rows(self, warehouse: str, rows: list[dict[str, Any]], *,
                   compact_buckets: int = 0) -> None:
        """One commit of ``rows`` (dicts by column; INT, STRING, ARRAY of
        them as lists, MAP of them as lists of pairs), built as the engine's
        rows here: the bridge's Arrow path has no ARRAY or MAP."""
        j_table = self.java_table(warehouse)
        builder = self.jvm.InvocationUtil.getBatchWriteBuilder(j_table)
        write, commit = builder.newWrite(), builder.newCommit()
        write.withIOManager(self.jvm.org.apache.paimon.disk.IOManager.create(self.tmp_dir))
        fields = list(j_table.rowType().getFields())
        try:
            for row in rows:
                j_row = self.jvm.org.apache.paimon.data.GenericRow(len(fields))
                for i, field in enumerate(fields):
                    j_row.setField(i, self._java(row.get(str(field.name()))))
                write.write(j_row)
            for bucket in range(compact_buckets):
                write.compact(self.jvm.BinaryRow.EMPTY_ROW, bucket, True)
            commit.commit(write.prepareCommit())
        finally:
            write.close()
            commit.close()

    def _java(self, value: Any) -> Any:
        """An engine value: int -> INT, str -> STRING, list -> ARRAY, list of
        pairs under a ``("map", [...])`` tag -> MAP, values under a ``("row",
        [...])`` tag -> ROW."""
        data = self.jvm.org.apache.paimon.data
        if isinstance(value, str):
            return data.BinaryString.fromString(value)
        if isinstance(value, tuple) and value[:1] == ("row",):
            row = data.GenericRow(len(value[1]))
            for j, item in enumerate(value[1]):
                row.setField(j, self._java(item))
            return row
        if isinstance(value, tuple) and value[:1] == ("map",):
            entries = self.jvm.java.util.LinkedHashMap()
            for key, item in value[1]:
                entries.put(self._java(key), self._java(item))
            return data.GenericMap(entries)
        if isinstance(value, list):
            array = self.gateway.new_array(self.jvm.java.lang.Object, len(value))
            for j, element in enumerate(value):
                array[j] = self._java(element)
            return data.GenericArray(array)
        return value

    def read(self, warehouse: str) -> pa.Table:
        """The engine's own batch read of the latest snapshot, one split per
        read, read until two reads agree. The bridge's reader over many splits
        opens every split's reader at once on a pool thread while the caller
        drains the first, all on one shared ``TableRead``: under load in CI it
        returned tables without one of their keys (a different one each read).
        One split per read opens one reader at a time."""
        previous: pa.Table | None = None
        for _ in range(4):
            table = self.catalog(warehouse).get_table("db.t")
            builder = table.new_read_builder()
            splits = builder.new_scan().plan().splits()
            got: pa.Table = pa.concat_tables(
                [builder.new_read().to_arrow([split]) for split in splits]
                or [builder.new_read().to_arrow([])])
            if previous is not None and got.equals(previous):
                return got
            previous = got
        raise AssertionError("the engine's reads of one snapshot disagree")


def start() -> Engine:
    """The engine (one JVM per process, started at the first call)."""
    reason = engine_unavailable()
    if reason is not None:
        raise RuntimeError(reason)
    wheel = _wheel()
    assert wheel is not None
    path = str(_unpacked(wheel))
    if path not in sys.path:
        sys.path.append(path)
    os.environ.setdefault("_PYPAIMON_JVM_ARGS", JVM_ARGS)
    return Engine()
