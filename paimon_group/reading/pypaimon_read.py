"""Reading splits with pypaimon's own reader, in batches of a bounded size.

The Arrow reader (:mod:`paimon_group.arrowread`) reads most splits; pypaimon's
reader reads the others (see docs/design.md, "What pypaimon's reader still
reads"), and everything when ``PAIMON_GROUP_ARROW_READER=0``. pypaimon's own
batch reader gathers 65,536 merged rows of a primary-key split before it
converts them to Arrow; :func:`pypaimon_batches` cuts them into batches of at
most ``batch_rows`` rows instead.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from paimon_group.arrowread.parquet_rows import engine_parquet_rows, needs_engine_parquet_rows
from paimon_group.reading.steps import Split


def _reader_batches(
    read: Any, splits: list[Split], *, parallelism: int | None
) -> Generator[pa.RecordBatch, None, None]:
    """The non-empty batches of pypaimon's own batch reader over ``splits``."""
    reader = read.to_arrow_batch_reader(splits, parallelism=parallelism)
    try:
        for batch in reader:
            if batch.num_rows:
                yield batch
    finally:
        close = getattr(reader, "close", None)
        if close is not None:
            close()


@dataclass(frozen=True)
class _RowMergeHooks:
    """The parts of a pypaimon ``TableRead`` that its batch reader is made of,
    used to cut a merged split into batches of a bounded number of rows.

    These are private to pypaimon (checked for in :meth:`of`): without them,
    or with a native reader (which reads in batches of its own), reading
    falls back to pypaimon's batch reader.
    """

    read: Any
    create_reader: Callable[[Split], Any]
    row_values: Callable[[Any, Any], tuple[Any, ...]]
    to_batches: Callable[[list[tuple[Any, ...]], list[str], pa.Schema], Iterable[pa.RecordBatch]]

    @classmethod
    def of(cls, read: Any) -> _RowMergeHooks | None:
        try:
            from pypaimon.read.native_plan import native_reader_available

            if native_reader_available():
                return None
        except ImportError:
            pass
        create = getattr(read, "_TableRead__create_reader_for_split", None)
        values = getattr(read, "_serialize_blob_view_row_tuple", None)
        convert = getattr(read, "_convert_rows_to_output_batches", None)
        if create is None or values is None or convert is None:
            return None
        return cls(read, create, values, convert)

    def batches(
        self, split: Split, schema: pa.Schema, batch_rows: int
    ) -> Generator[pa.RecordBatch, None, None]:
        """The rows of one split as batches of at most ``batch_rows`` rows."""
        from pypaimon.read.reader.iface.record_batch_reader import RecordBatchReader

        reader = self.create_reader(split)
        if isinstance(reader, RecordBatchReader):
            # Not a row-by-row merge after all: pypaimon's batches are bounded.
            reader.close()
            yield from _reader_batches(self.read, [split], parallelism=1)
            return
        with_kinds = bool(self.read.include_row_kind)
        rows: list[tuple[Any, ...]] = []
        kinds: list[str] = []
        try:
            while (row_iterator := reader.read_batch()) is not None:
                for row in iter(row_iterator.next, None):
                    rows.append(self.row_values(row, reader))
                    if with_kinds:
                        kinds.append(row.get_row_kind().to_string())
                    if len(rows) >= batch_rows:
                        yield from self._convert(rows, kinds, schema)
                        rows, kinds = [], []
            if rows:
                yield from self._convert(rows, kinds, schema)
        finally:
            reader.close()

    def _convert(
        self, rows: list[tuple[Any, ...]], kinds: list[str], schema: pa.Schema
    ) -> Iterator[pa.RecordBatch]:
        for batch in self.to_batches(rows, kinds, schema):
            if batch.num_rows:
                yield batch


def pypaimon_batches(
    read: Any, splits: Sequence[Split], schema: pa.Schema, batch_rows: int, *,
    primary_key: bool,
) -> Iterator[pa.RecordBatch]:
    """Record batches of ``splits`` by pypaimon's ``read`` (a ``TableRead``),
    in split order.

    Splits are read one after another, so that the changes of a bucket
    come out in commit order and at most one split is open at a time.
    Primary-key splits that pypaimon merges row by row (its Python
    reader) come out in batches of at most ``batch_rows`` rows:
    pypaimon's own batch reader gathers 65,536 merged rows before it
    converts them to Arrow (a constant, not an option), which for most
    buckets is the whole bucket. Splits read from raw files come out in
    pypaimon's batches of ``read.batch-size`` rows. After each split,
    Arrow's pool returns the memory it no longer uses to the system.
    """
    hooks = _RowMergeHooks.of(read)
    if hooks is None:
        # A native (Rust) reader, or a pypaimon without the hooks below:
        # its own batch reader, bounded or not as it is.
        streaming = any(getattr(s, "is_streaming", False) for s in splits)
        yield from _reader_batches(
            read, list(splits), parallelism=1 if streaming else None
        )
        return
    pool = pa.default_memory_pool()
    for split in splits:
        batches: Generator[pa.RecordBatch, None, None]
        if _merged_row_by_row(split, primary_key):
            batches = hooks.batches(split, schema, batch_rows)
        else:
            batches = _reader_batches(read, [split], parallelism=1)
        try:
            yield from batches
        finally:
            batches.close()
            pool.release_unused()


def _merged_row_by_row(split: Split, primary_key: bool) -> bool:
    """Whether pypaimon reads ``split`` through its primary-key merge
    (rows), rather than from raw files (Arrow batches)."""
    return primary_key and (
        bool(getattr(split, "is_streaming", False))
        or not bool(getattr(split, "raw_convertible", False))
    )


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
    if original is None or getattr(original, "_accepts_paimon_09", False):
        return  # another pypaimon: it reads old manifests or raises as it does

    def value_stats_fields(self: Any, file_dict: dict[str, Any], file_schema: Any) -> Any:
        # ``file_dict`` is the record pypaimon then builds the DataFileMeta
        # from: the defaults must land in it, not in a copy.
        file_dict.setdefault("_VALUE_STATS_COLS", None)
        file_dict.setdefault("_FILE_SOURCE", None)
        return original(self, file_dict, file_schema)

    value_stats_fields._accepts_paimon_09 = True  # type: ignore[attr-defined]
    ManifestFileManager._get_value_stats_fields = value_stats_fields


accept_paimon_09_manifests()


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
    if not isinstance(original, staticmethod) or getattr(
        original.__func__, "_keeps_nanoseconds", False
    ):
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

    iter_df_rows._keeps_nanoseconds = True  # type: ignore[attr-defined]
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


keep_nanoseconds_in_rows()


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
    if original is None or getattr(original, "_trims_orc_chars", False):
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

    post_process._trims_orc_chars = True  # type: ignore[attr-defined]
    FormatPyArrowReader._post_process_batch = post_process


trim_orc_chars()


def read_parquet_rows_as_the_engine() -> None:
    """Let pypaimon's reader read a ROW of a Parquet file whose fields are
    all null as a null ROW, as the engine's Parquet reader does and the Arrow
    reader does (idempotent; the whole process; :mod:`paimon_group.arrowread.parquet_rows`).

    pyarrow, which pypaimon decodes Parquet with, keeps a ROW of nulls; so a
    split left to pypaimon's reader would read another value than one that
    is not (and ``nested_update`` would keep a row the engine drops). Each
    Parquet batch is given the engine's nulls as it is decoded, before the
    merge; batches without a ROW column are returned as they are.
    """
    from pypaimon.read.reader.format_pyarrow_reader import FormatPyArrowReader

    original = FormatPyArrowReader.__dict__.get("_post_process_batch")
    if original is None or getattr(original, "_engine_parquet_rows", False):
        return  # another pypaimon, or done already

    def post_process(self: Any, batch: pa.RecordBatch) -> pa.RecordBatch:
        batch = original(self, batch)
        if getattr(self, "_file_format", None) != "parquet":
            return batch
        for index, field in enumerate(batch.schema):
            if needs_engine_parquet_rows(field.type):
                batch = batch.set_column(index, field, engine_parquet_rows(batch.column(index)))
        return batch

    post_process._engine_parquet_rows = True  # type: ignore[attr-defined]
    FormatPyArrowReader._post_process_batch = post_process


read_parquet_rows_as_the_engine()
