"""The read path of a planner: the Arrow reader first, pypaimon's reader for
what it cannot read exactly (one log line per reason per table).

Both entry points keep split order: the rows of a bucket come out in commit
order (streaming splits) or key order (merged splits), as pypaimon gives.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pyarrow as pa

from coordinators.errors import PaimonGroupError
from paimon_group.arrowread.defaults import ColumnDefaults
from paimon_group.arrowread.files import Unsupported
from paimon_group.arrowread.pipeline import read_split_tables
from paimon_group.arrowread.reader import ArrowSplitReader

__all__ = ["ReadPath"]

log = logging.getLogger("paimon_group.arrowread")


class ReadPath:
    """Reads splits with :class:`ArrowSplitReader`, falling back per split.

    ``fallback_table(splits)`` and ``fallback_batches(splits)`` are
    pypaimon's reads of the same splits (the planner's).
    """

    def __init__(
        self,
        reader: ArrowSplitReader,
        identifier: str,
        fallback_table: Callable[[Sequence[Any]], pa.Table],
        fallback_batches: Callable[[Sequence[Any]], Iterator[pa.RecordBatch]],
    ) -> None:
        self.reader = reader
        self.identifier = identifier
        self._fallback_table = fallback_table
        self._fallback_batches = fallback_batches
        self.fallback_splits = 0
        """Splits pypaimon's reader has read (for tests and metrics)."""
        # Filled on both readers' rows, as the engine fills them (defaults.py).
        self._defaults = ColumnDefaults(
            dict(reader.table.options.options.to_map()), reader.schema)
        self._logged: set[str] = set()
        self._lock = threading.Lock()
        if reader.fallback_reason is not None:
            self._note(reader.fallback_reason)

    def _note(self, reason: str, splits: int = 0) -> None:
        with self._lock:
            self.fallback_splits += splits
            if reason in self._logged:
                return
            self._logged.add(reason)
        log.info(
            "table %s: pypaimon's reader reads splits with %s (the Arrow reader does not)",
            self.identifier,
            reason,
        )

    def read_arrow(self, splits: Sequence[Any]) -> pa.Table:
        """All rows of ``splits``; the files of the next units decode while
        one merges (pipeline.py)."""
        return self._defaults.fill(self._read_arrow(splits))

    def iter_batches(self, splits: Sequence[Any], batch_rows: int) -> Iterator[pa.RecordBatch]:
        """Batches of at most ``batch_rows`` rows, one unit (a file, or a
        merged section) decoded at a time, its files in parallel; Arrow's
        unused memory released after each unit."""
        for batch in self._iter_batches(splits, batch_rows):
            yield self._defaults.fill(batch)

    def _read_arrow(self, splits: Sequence[Any]) -> pa.Table:
        if self.reader.fallback_reason is not None:
            self._note(self.reader.fallback_reason, len(splits))
            return self._fallback_table(splits)

        read = read_split_tables(self.reader, splits, lambda reason: self._note(reason, 1))
        parts = [[self._fallback_table([split])] if got is None else got
                 for split, got in zip(splits, read, strict=True)]
        tables = [t for part in parts for t in part if t.num_rows]
        if not tables:
            return self.reader.schema.empty_table()
        return pa.concat_tables(tables)

    def _iter_batches(self, splits: Sequence[Any], batch_rows: int
                      ) -> Iterator[pa.RecordBatch]:
        if self.reader.fallback_reason is not None:
            self._note(self.reader.fallback_reason, len(splits))
            yield from self._fallback_batches(splits)
            return
        pool = pa.default_memory_pool()
        for split in splits:
            try:
                units = self.reader.units(split)
            except Unsupported as err:
                self._note(str(err), 1)
                yield from self._fallback_batches([split])
                continue
            delivered = False
            try:
                for unit in units:
                    for piece in self.reader.stream_unit(unit, batch_rows):
                        for batch in self.reader.batches([piece], batch_rows):
                            delivered = True
                            yield batch
                    pool.release_unused()
            except Unsupported as err:
                if delivered:  # rows of this split were delivered: pypaimon cannot resume
                    raise PaimonGroupError(
                        f"table {self.identifier}: cannot read a split of bucket "
                        f"{split.bucket}: {err}"
                    ) from err
                self._note(str(err), 1)
                yield from self._fallback_batches([split])
