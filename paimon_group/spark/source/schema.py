"""The columns a query was defined with, and the schema changes that stop it.

Spark fixes a streaming query's schema when the query is defined: every
batch the source returns must have exactly those columns and types. The
source reads with the table's current schema (pypaimon evolves older files
to it by field id), so a change of one of the query's columns while the
query runs is decided here:

* **a column added** (``ALTER TABLE ... ADD COLUMN``) is followed: it is not
  one of the query's columns, so it is neither read nor delivered, and the
  rows go on, with the query's columns;
* **a column renamed, dropped, or of another type in Spark** (``BIGINT`` to
  ``STRING``; a nested field of a ``ROW`` added, renamed or dropped; not
  ``VARCHAR(10)`` to ``VARCHAR(20)`` nor ``TIMESTAMP(3)`` to ``TIMESTAMP(6)``,
  which Spark sees as the same ``string`` and ``timestamp_ntz``) stops the
  query with one line (:class:`SchemaChanged`) naming each change and what
  to do: restart the query from its checkpoint, which reads the table's new
  schema. Before, Spark failed the batch with its
  ``DATA_SOURCE_RETURN_SCHEMA_MISMATCH`` ("Expected: 6 columns, Found: 5"):
  pypaimon drops a projected name that no longer exists.

Columns are matched by Paimon field id, so a rename is told from a drop;
types are compared as Spark types, without nullability (Spark is told every
column, and every field inside one, is nullable).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from paimon_group.arrowread.nullability import relaxed
from paimon_group.errors import PaimonGroupError

__all__ = ["QueryColumn", "QuerySchema", "SchemaChanged", "check_schema", "query_schema"]


class SchemaChanged(PaimonGroupError):
    """A column of a running query was renamed, dropped or changed type in the table."""


@dataclass(frozen=True)
class QueryColumn:
    """One table column of a query, as the table had it when the query was defined."""

    name: str
    field_id: int
    type_name: str   # Paimon's type, for the line
    spark_type: str  # Spark's type (simpleString: no nullability), as Spark was told


@dataclass(frozen=True)
class QuerySchema:
    """The table columns of a query (not ``_row_kind`` nor the metadata columns)."""

    schema_id: int
    columns: tuple[QueryColumn, ...]

    def only(self, names: Iterable[str]) -> QuerySchema:
        """The columns among ``names`` (the query's Spark schema), in its order."""
        by_name = {c.name: c for c in self.columns}
        return QuerySchema(self.schema_id, tuple(by_name[n] for n in names if n in by_name))


def _type_name(field: Any) -> str:
    return str(field.type).replace(" NOT NULL", "")


def _spark_type(field: Any) -> str:
    from pypaimon.schema.data_types import PyarrowFieldParser
    from pyspark.sql.pandas.types import from_arrow_type

    arrow: pa.DataType = relaxed(PyarrowFieldParser.from_paimon_field(field).type)
    return str(from_arrow_type(arrow).simpleString())


def query_schema(table_schema: Any, names: Iterable[str] | None = None) -> QuerySchema:
    """The columns ``names`` (default: all) of pypaimon's ``table_schema``."""
    fields = list(table_schema.fields)
    wanted = None if names is None else set(names)
    return QuerySchema(int(table_schema.id), tuple(
        QueryColumn(f.name, int(f.id), _type_name(f), _spark_type(f))
        for f in fields if wanted is None or f.name in wanted))


def schema_changes(expected: QuerySchema, table_schema: Any) -> list[str]:
    """What happened to the query's columns in pypaimon's ``table_schema`` (none: ``[]``)."""
    by_id = {int(f.id): f for f in table_schema.fields}
    changes: list[str] = []
    for column in expected.columns:
        field = by_id.get(column.field_id)
        if field is None:
            changes.append(f"column {column.name!r} dropped")
        elif field.name != column.name:
            changes.append(f"column {column.name!r} renamed to {field.name!r}")
        elif _spark_type(field) != column.spark_type:
            changes.append(f"column {column.name!r} changed type from {column.type_name} "
                           f"to {_type_name(field)}")
    return changes


def check_schema(expected: QuerySchema | None, table_schema: Any, table: str) -> None:
    """Raise :class:`SchemaChanged` (one line) if one of the query's columns was
    renamed, dropped or changed type in ``table_schema``; columns added pass."""
    if expected is None:
        return
    changes = schema_changes(expected, table_schema)
    if changes:
        raise SchemaChanged(
            f"table {table}: {'; '.join(changes)} (schema {expected.schema_id} -> "
            f"{int(table_schema.id)}) while the query ran; a running query keeps the columns "
            "it was defined with, so it stops: restart it from its checkpoint to read the "
            "table's new schema (docs/spark.md, schema changes)")

