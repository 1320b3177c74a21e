"""pypaimon's reader, made to read as Paimon's engine reads: one explicit
installation, :func:`install_engine_reads`.

Importing this module (or any other of paimon_group) changes nothing in
pypaimon. :func:`install_engine_reads` does, once per process, when the
first group table is opened (:meth:`ShardedTable.load
<paimon_group.reading.table.ShardedTable.load>`, which every table the
project reads or writes goes through: a member's table, a Paimon sink's
target, the Spark source's, the operator tools'). It replaces, on the
classes of the running pypaimon, for every user of pypaimon in that process:

* ``ManifestFileManager._get_value_stats_fields``: manifests written by
  Paimon 0.9 and 0.8 read (:func:`accept_paimon_09_manifests`);
* ``RecordBatchReader._iter_df_rows``: the nanoseconds of TIMESTAMP(7..9)
  kept on rows merged row by row (:func:`keep_nanoseconds_in_rows`);
* ``FormatPyArrowReader._post_process_batch``: CHAR(n) read from ORC
  trimmed (:func:`trim_orc_chars`) and a Parquet ROW of nulls read as a
  null ROW (:func:`read_parquet_rows_as_the_engine`).

These are classes, not objects the project builds, because pypaimon builds
their instances itself: a ``ManifestFileManager`` inside its scanners and
its commit (the sink's target), the readers inside a ``TableRead``'s split
read. The engine's lookup merge, which can be given to one object, is not
here: :func:`paimon_group.arrowread.levels.follow_lookup_levels` changes the
``TableRead`` objects the project builds (``ReadView``), and nothing else.
Each change checks that the pypaimon it changes has the part it
replaces, and leaves a pypaimon without it as it is; each replaced method
calls the one it replaces and changes only what the engine reads otherwise
(docs/design.md, "What we deliver equals what Paimon's engine reads").
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from paimon_group.arrowread.parquet_rows import engine_parquet_rows, needs_engine_parquet_rows

__all__ = [
    "accept_paimon_09_manifests",
    "install_engine_reads",
    "keep_nanoseconds_in_rows",
    "read_parquet_rows_as_the_engine",
    "trim_orc_chars",
]

_lock = threading.Lock()
_installed = False

# The changes a replaced method already holds, on its ``_engine_reads``
# attribute: the one that replaces it again keeps the set, so each change is
# made once even where two of them replace the same method.
_MARKS = "_engine_reads"


def install_engine_reads() -> None:
    """Make pypaimon's reader, in this process, read as the engine reads
    (the module docstring says what changes). Idempotent and thread-safe:
    the first call changes pypaimon's classes, later calls nothing."""
    global _installed
    if _installed:
        return
    with _lock:
        if _installed:
            return
        accept_paimon_09_manifests()
        keep_nanoseconds_in_rows()
        trim_orc_chars()
        read_parquet_rows_as_the_engine()
        _installed = True


def _marks(method: Any) -> frozenset[str]:
    return frozenset(getattr(method, _MARKS, ()))


def accept_paimon_09_manifests() -> None:
    """Let pypaimon's manifest reader read manifests written by Paimon 0.9
    and 0.8 (idempotent; every ``ManifestFileManager`` of the process).

    A data file's metadata gained ``_VALUE_STATS_COLS`` in Paimon 1.0 and
    ``_FILE_SOURCE`` in 0.9. pypaimon indexes both unconditionally and raises
    ``KeyError`` on an older manifest. The engine reads such a file as its
    ``DataFileMeta09Serializer`` / ``08`` do: value stats over every column
    (``_VALUE_STATS_COLS`` null) and no file source. We supply exactly those
    two missing fields as None, in the record pypaimon goes on reading from,
    before pypaimon looks at them; manifests that have them are untouched.
    """
    from pypaimon.manifest.manifest_file_manager import ManifestFileManager

    original = getattr(ManifestFileManager, "_get_value_stats_fields", None)
    if original is None or "paimon_09" in _marks(original):
        return  # another pypaimon: it reads old manifests or raises as it does

    def value_stats_fields(self: Any, file_dict: dict[str, Any], file_schema: Any) -> Any:
        # ``file_dict`` is the record pypaimon then builds the DataFileMeta
        # from: the defaults must land in it, not in a copy.
        file_dict.setdefault("_VALUE_STATS_COLS", None)
        file_dict.setdefault("_FILE_SOURCE", None)
        return original(self, file_dict, file_schema)

    setattr(value_stats_fields, _MARKS, _marks(original) | {"paimon_09"})
    ManifestFileManager._get_value_stats_fields = value_stats_fields


def keep_nanoseconds_in_rows() -> None:
    """Let pypaimon's row-by-row reader keep the nanoseconds of
    TIMESTAMP(7..9) values (idempotent; the whole process).

    pypaimon turns a decoded batch into rows through polars, whose rows hold
    ``datetime.datetime`` values: microseconds, the nanoseconds dropped. The
    engine keeps them (its ``Timestamp`` has a nano-of-millisecond), and so
    does the Arrow reader, so a split left to pypaimon's reader (merged,
    streaming, partial-update, aggregation ...) would read other values than
    one that is not. Here the nanosecond columns of those rows carry
    ``pandas.Timestamp`` values instead: exact, ordered and compared like
    datetimes by the merge functions, and converted back to Arrow exactly.
    """
    from pypaimon.read.reader.iface.record_batch_reader import RecordBatchReader

    original = RecordBatchReader.__dict__.get("_iter_df_rows")
    if not isinstance(original, staticmethod) or "nanoseconds" in _marks(original.__func__):
        return  # another pypaimon, or done already
    rows_of = original.__func__

    def iter_df_rows(df: Any) -> Iterator[tuple[Any, ...]]:
        import polars as pl

        nanos = [
            (i, dtype.time_zone)
            for i, dtype in enumerate(df.dtypes)
            if isinstance(dtype, pl.Datetime) and dtype.time_unit == "ns"
        ]
        rows: Iterator[tuple[Any, ...]] = rows_of(df)
        if not nanos:
            return rows
        return _with_nanoseconds(rows, nanos, {i: df.to_series(i) for i, _ in nanos})

    setattr(iter_df_rows, _MARKS, _marks(rows_of) | {"nanoseconds"})
    RecordBatchReader._iter_df_rows = staticmethod(iter_df_rows)


def _with_nanoseconds(
    rows: Iterator[tuple[Any, ...]], nanos: list[tuple[int, str | None]], series: dict[int, Any]
) -> Iterator[tuple[Any, ...]]:
    """``rows`` with the columns ``nanos`` (index, time zone) replaced by
    exact ``pandas.Timestamp`` values of ``series`` (polars, ns)."""
    import pandas as pd  # type: ignore[import-untyped]
    import polars as pl

    epochs = {i: series[i].cast(pl.Int64).to_list() for i, _ in nanos}
    for n, row in enumerate(rows):
        values = list(row)
        for i, zone in nanos:
            epoch = epochs[i][n]
            values[i] = None if epoch is None else pd.Timestamp(epoch, unit="ns", tz=zone)
        yield tuple(values)


def trim_orc_chars() -> None:
    """Let pypaimon's reader trim CHAR(n) values read from ORC, as the
    engine does (idempotent; the whole process).

    ORC stores a CHAR(n) value padded with spaces to n characters, and ORC's
    own reader, which the engine reads with, trims trailing spaces from CHAR
    columns; pyarrow's does not, so pypaimon would give ``'ab   '`` where
    the engine and the Arrow reader give ``'ab'``.
    """
    from pypaimon.read.reader.format_pyarrow_reader import FormatPyArrowReader

    original = FormatPyArrowReader.__dict__.get("_post_process_batch")
    if original is None or "orc_chars" in _marks(original):
        return  # another pypaimon, or done already

    def post_process(self: Any, batch: pa.RecordBatch) -> pa.RecordBatch:
        batch = original(self, batch)
        if getattr(self, "_file_format", None) != "orc":
            return batch
        for field in getattr(self, "read_fields", ()):
            kind = str(field.type).split("(")[0].strip().upper()
            index = batch.schema.get_field_index(field.name) if kind == "CHAR" else -1
            if index >= 0:
                trimmed = pc.utf8_rtrim(batch.column(index), characters=" ")
                batch = batch.set_column(index, batch.schema.field(index), trimmed)
        return batch

    setattr(post_process, _MARKS, _marks(original) | {"orc_chars"})
    FormatPyArrowReader._post_process_batch = post_process


def read_parquet_rows_as_the_engine() -> None:
    """Let pypaimon's reader read a ROW of a Parquet file whose fields are
    all null as a null ROW, as the engine's Parquet reader does and the Arrow
    reader does (idempotent; the whole process;
    :mod:`paimon_group.arrowread.parquet_rows`).

    pyarrow, which pypaimon decodes Parquet with, keeps a ROW of nulls; so a
    split left to pypaimon's reader would read another value than one that
    is not (and ``nested_update`` would keep a row the engine drops). Each
    Parquet batch is given the engine's nulls as it is decoded, before the
    merge; batches without a ROW column are returned as they are.
    """
    from pypaimon.read.reader.format_pyarrow_reader import FormatPyArrowReader

    original = FormatPyArrowReader.__dict__.get("_post_process_batch")
    if original is None or "parquet_rows" in _marks(original):
        return  # another pypaimon, or done already

    def post_process(self: Any, batch: pa.RecordBatch) -> pa.RecordBatch:
        batch = original(self, batch)
        if getattr(self, "_file_format", None) != "parquet":
            return batch
        for index, field in enumerate(batch.schema):
            if needs_engine_parquet_rows(field.type):
                batch = batch.set_column(index, field, engine_parquet_rows(batch.column(index)))
        return batch

    setattr(post_process, _MARKS, _marks(original) | {"parquet_rows"})
    FormatPyArrowReader._post_process_batch = post_process
