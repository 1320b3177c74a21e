"""The readers of one schema version of a table: what a batch reads with.

A planner builds a :class:`ReadView` when it starts and a new one when a
planned snapshot was committed under a newer schema (ALTER TABLE). A batch
keeps the view of the planner *at the time it was planned*: the planner may
switch to a newer schema while a batch of the previous step is still in the
handler (it plans the next step meanwhile), and that batch's ``schema``,
``to_arrow()`` and ``iter_batches()`` must still agree with each other
(a handler that opens a Parquet writer with ``batch.schema`` and then
streams ``batch.iter_batches()`` into it). Everything here is read-only
after construction, so one view can be used from several threads.

Example::

    view = ReadView(pt, identifier="db.t", include_row_kind=False, projection=None,
                    batch_rows=1024)
    table = view.read_arrow(splits)     # view.schema
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa

from paimon_group.arrowread import ArrowSplitReader, ReadPath
from paimon_group.reading.pypaimon_read import pypaimon_batches

__all__ = ["ReadView"]


class ReadView:
    """Schema, pypaimon's read builder and the Arrow read path of one schema version."""

    def __init__(self, pt: Any, *, identifier: str, include_row_kind: bool,
                 projection: Sequence[str] | None, batch_rows: int) -> None:
        builder: Any = pt.new_stream_read_builder().with_include_row_kind(include_row_kind)
        if projection is not None:
            builder.with_projection(list(projection))
        self.pt = pt
        self.schema_id = int(pt.table_schema.id)
        self.read_builder = builder
        self.schema: pa.Schema = _read_schema(pt, builder, projection, include_row_kind)
        self.batch_rows = batch_rows
        self.read_path: ReadPath | None = None
        # The Arrow reader (paimon_group.arrowread) unless switched off with
        # PAIMON_GROUP_ARROW_READER=0; pypaimon's reader otherwise.
        if os.environ.get("PAIMON_GROUP_ARROW_READER", "1").strip().lower() not in ("0", "false"):
            reader = ArrowSplitReader(pt, self.schema, include_row_kind=include_row_kind)
            self.read_path = ReadPath(reader, identifier, self.pypaimon_read_arrow,
                                      self.pypaimon_iter_batches)

    def read_arrow(self, splits: Sequence[Any]) -> pa.Table:
        """All rows of ``splits`` as one table with :attr:`schema`."""
        if not splits:
            return self.schema.empty_table()
        if self.read_path is not None:
            return self.read_path.read_arrow(list(splits))
        return self.pypaimon_read_arrow(splits)

    def pypaimon_read_arrow(self, splits: Sequence[Any]) -> pa.Table:
        if not splits:
            return self.schema.empty_table()
        table: pa.Table = self.read_builder.new_read().to_arrow(list(splits))
        return table

    def iter_batches(self, splits: Sequence[Any]) -> Iterator[pa.RecordBatch]:
        if not splits:
            return
        if self.read_path is not None:
            yield from self.read_path.iter_batches(list(splits), self.batch_rows)
        else:
            yield from self.pypaimon_iter_batches(splits)

    def pypaimon_iter_batches(self, splits: Sequence[Any]) -> Iterator[pa.RecordBatch]:
        if not splits:
            return
        yield from pypaimon_batches(self.read_builder.new_read(), splits, self.schema,
                                    self.batch_rows, primary_key=bool(self.pt.is_primary_key_table))


def _read_schema(pt: Any, builder: Any, projection: Sequence[str] | None,
                 include_row_kind: bool) -> pa.Schema:
    """The schema pypaimon's reader gives; built from the table's fields when
    pypaimon refuses to read the table (merge options it does not implement,
    such as sequence groups, which the Arrow reader may read)."""
    try:
        schema: pa.Schema = builder.new_read().to_arrow_batch_reader([]).schema
        return schema
    except NotImplementedError:
        from pypaimon.schema.data_types import PyarrowFieldParser

        every = PyarrowFieldParser.from_paimon_schema(pt.fields)
        fields = [every.field(n) for n in (projection or every.names)]
        if include_row_kind:
            fields.insert(0, pa.field("_row_kind", pa.string()))
        return pa.schema(fields)
