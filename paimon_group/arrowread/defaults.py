"""``fields.<name>.default-value``: the engine fills a null with the default.

Paimon's engine reads a table whose options give a field a default value
(``'fields.b.default-value' = 'x'``) through its ``DefaultValueAssigner``
(deprecated upstream, still applied): after the merge and the schema
evolution, every null of that field in a row it delivers is replaced by the
default, cast from its string as the engine's ``CastExecutors`` cast a
STRING. So a column added with a default reads the default in files written
before it, and so does a null written since. pypaimon's reader does not do
it; we do it on every path (the Arrow reader's and pypaimon's fallback) with
``pyarrow.compute.fill_null``.

A default that pyarrow cannot cast to the field's type is left out, with one
warning line (the engine refuses such a read).
"""

from __future__ import annotations

import logging
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["ColumnDefaults"]

log = logging.getLogger("paimon_group.arrowread")

_PREFIX, _SUFFIX = "fields.", ".default-value"
Rows = TypeVar("Rows", pa.Table, pa.RecordBatch)


class ColumnDefaults:
    """The default of each column of ``schema`` that has one."""

    def __init__(self, options: dict[str, str], schema: pa.Schema) -> None:
        self.values: dict[str, pa.Scalar] = {}
        for key, text in options.items():
            if not (key.startswith(_PREFIX) and key.endswith(_SUFFIX)):
                continue
            name = key[len(_PREFIX):-len(_SUFFIX)]
            if name not in schema.names:
                continue
            target = schema.field(name).type
            try:
                self.values[name] = pa.scalar(text, pa.string()).cast(target)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
                log.warning("default value %r of column %s not used: %s", text, name, err)

    def fill(self, rows: Rows) -> Rows:
        """``rows`` with the nulls of defaulted columns replaced."""
        if not self.values or not rows.num_rows:
            return rows
        columns: list[Any] = []
        for name, column in zip(rows.schema.names, rows.columns, strict=True):
            default = self.values.get(name)
            columns.append(column if default is None or not column.null_count
                           else pc.fill_null(column, default))
        if isinstance(rows, pa.RecordBatch):
            return pa.RecordBatch.from_arrays(columns, schema=rows.schema)
        return pa.Table.from_arrays(columns, schema=rows.schema)
