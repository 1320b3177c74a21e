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
    table, retractions = view.read_counted(splits)   # and its -U/-D rows
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.compute as pc

from paimon_group.arrowread import ArrowSplitReader, ReadPath
from paimon_group.arrowread.levels import follow_lookup_levels
from paimon_group.reading.pypaimon_read import pypaimon_batches

__all__ = ["ReadView"]

_Rows = TypeVar("_Rows", pa.Table, pa.RecordBatch)
# Row kinds that take a row back: update-before and delete.
_RETRACTIONS = pa.array(["-U", "-D"], pa.string())


class ReadView:
    """Schema, pypaimon's read builder and the Arrow read path of one schema version.

    On a primary-key table the readers read each row's kind also when row
    kinds were not requested (then the ``_row_kind`` column is dropped from
    what is returned): :meth:`read_counted` and :meth:`iter_counted` count
    the deletes and update-befores read (``ShardBatch.retractions``), so
    that a sink never writes a delete as an insert unknowingly.
    """

    def __init__(self, pt: Any, *, identifier: str, include_row_kind: bool,
                 projection: Sequence[str] | None, batch_rows: int) -> None:
        self.include_row_kind = include_row_kind
        # An append table's rows are all inserts: nothing to count there.
        self._kinds = include_row_kind or bool(pt.is_primary_key_table)
        builder: Any = pt.new_stream_read_builder().with_include_row_kind(self._kinds)
        if projection is not None:
            builder.with_projection(list(projection))
        self.pt = pt
        self.schema_id = int(pt.table_schema.id)
        self.read_builder = builder
        # What the readers give (``_row_kind`` first when they read kinds) ...
        self._read_schema: pa.Schema = _read_schema(pt, builder, projection, self._kinds)
        # ... and what is returned.
        self.schema: pa.Schema = self._read_schema if include_row_kind or not self._kinds \
            else self._read_schema.remove(0)
        self.batch_rows = batch_rows
        self.read_path: ReadPath | None = None
        # The Arrow reader (paimon_group.arrowread) unless switched off with
        # PAIMON_GROUP_ARROW_READER=0; pypaimon's reader otherwise.
        if os.environ.get("PAIMON_GROUP_ARROW_READER", "1").strip().lower() not in ("0", "false"):
            reader = ArrowSplitReader(pt, self._read_schema, include_row_kind=self._kinds)
            self.read_path = ReadPath(reader, identifier, self._pypaimon_table,
                                      self._pypaimon_batches)

    def read_arrow(self, splits: Sequence[Any]) -> pa.Table:
        """All rows of ``splits`` as one table with :attr:`schema`."""
        return self.read_counted(splits)[0]

    def read_counted(self, splits: Sequence[Any]) -> tuple[pa.Table, int]:
        """:meth:`read_arrow`, and the deletes and update-befores among the rows."""
        if not splits:
            return self.schema.empty_table(), 0
        if self.read_path is not None:
            return self._counted(self.read_path.read_arrow(list(splits)))
        return self._counted(self._pypaimon_table(splits))

    def pypaimon_read_arrow(self, splits: Sequence[Any]) -> pa.Table:
        return self._counted(self._pypaimon_table(splits))[0]

    def _pypaimon_table(self, splits: Sequence[Any]) -> pa.Table:
        if not splits:
            return self._read_schema.empty_table()
        table: pa.Table = self._new_read().to_arrow(list(splits))
        return table

    def _new_read(self) -> Any:
        """A pypaimon ``TableRead`` of this view, its merges of a lookup
        table those of the engine (:func:`follow_lookup_levels`)."""
        return follow_lookup_levels(self.read_builder.new_read())

    def iter_batches(self, splits: Sequence[Any]) -> Iterator[pa.RecordBatch]:
        for batch, _ in self.iter_counted(splits):
            yield batch

    def iter_counted(self, splits: Sequence[Any]) -> Iterator[tuple[pa.RecordBatch, int]]:
        """:meth:`iter_batches`, each batch with its deletes and update-befores."""
        if not splits:
            return
        if self.read_path is not None:
            batches = self.read_path.iter_batches(list(splits), self.batch_rows)
        else:
            batches = self._pypaimon_batches(splits)
        for batch in batches:
            yield self._counted(batch)

    def pypaimon_iter_batches(self, splits: Sequence[Any]) -> Iterator[pa.RecordBatch]:
        for batch in self._pypaimon_batches(splits):
            yield self._counted(batch)[0]

    def _pypaimon_batches(self, splits: Sequence[Any]) -> Iterator[pa.RecordBatch]:
        if not splits:
            return
        yield from pypaimon_batches(self._new_read(), splits, self._read_schema,
                                    self.batch_rows, primary_key=bool(self.pt.is_primary_key_table))

    def _counted(self, rows: _Rows) -> tuple[_Rows, int]:
        """``rows`` as :attr:`schema` says (their ``_row_kind`` dropped unless
        requested), and their deletes and update-befores."""
        if not self._kinds:
            return rows, 0
        found = pc.sum(pc.is_in(rows.column(0), value_set=_RETRACTIONS)).as_py()
        if not self.include_row_kind:
            rows = rows.remove_column(0)
        return rows, int(found or 0)


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
