"""Reading splits with pypaimon's own reader, in batches of a bounded size.

The Arrow reader (:mod:`paimon_group.arrowread`) reads most splits; pypaimon's
reader reads the others (see docs/design.md, "What pypaimon's reader still
reads"), and everything when ``PAIMON_GROUP_ARROW_READER=0``. pypaimon's own
batch reader gathers 65,536 merged rows of a primary-key split before it
converts them to Arrow; :func:`pypaimon_batches` cuts them into batches of at
most ``batch_rows`` rows instead. pypaimon's reader reads as the engine
once :func:`~paimon_group.reading.engine_reads.install_engine_reads` ran (when
the table was opened).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

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
