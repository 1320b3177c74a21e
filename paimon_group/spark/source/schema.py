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

A query over several tables (:class:`QueryTables`) has the union of their
columns by name, each name of one Spark type: the same name of two types in
two tables is refused when the query is defined, in one line naming both.
Each table's own columns among them are checked as one table's are; a table
that joins the group while the query runs is read if its columns of the
query's names have the query's types (:meth:`QueryTables.fit`), and stops
the query with one line if one has another.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from paimon_group.arrowread.nullability import relaxed
from paimon_group.errors import ConfigError, PaimonGroupError

__all__ = ["QueryColumn", "QuerySchema", "QueryTables", "SchemaChanged", "TableColumns",
           "check_schema", "query_schema", "spark_fields", "union_columns"]

ADDED_COLUMNS = ("_row_kind", "_pg_table", "_pg_shard", "_pg_group_shard", "_pg_snapshot",
                 "_pg_epoch")
"""The columns the source adds to a query over several tables: no table's
column may have one of these names."""


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


def spark_fields(schema: pa.Schema) -> list[pa.Field]:
    """The table's columns as Spark is told of them: nullable, and so is
    every field inside them. Spark checks the batches a source returns
    against the schema and trusts its NOT NULL: the read path's batches do
    not carry Paimon's NOT NULL of a column, and a field inside a ROW made
    NOT NULL after files were written keeps those files' nulls
    (``arrowread/nullability.py``), which Spark would read as a NOT NULL
    value that is not there (a NullPointerException in its executor)."""
    return [pa.field(f.name, relaxed(f.type), True, f.metadata) for f in schema]


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



@dataclass(frozen=True)
class TableColumns:
    """One table of a query over several tables: its identity and its
    columns among the query's (by field id, as the table had them)."""

    name: str
    table_id: str
    columns: QuerySchema


@dataclass(frozen=True)
class QueryTables:
    """The table columns of a query over several tables: the union by name
    (``columns``: each name once, with the Spark type of the query, in the
    order the tables, sorted by name, first have them) and each table's own."""

    columns: tuple[QueryColumn, ...]
    tables: tuple[TableColumns, ...]

    def of(self, name: str, table_id: str) -> TableColumns | None:
        """The columns of table ``name`` under identity ``table_id`` (None: a
        table the query was not defined with, or re-created since)."""
        return next((t for t in self.tables if t.name == name and t.table_id == table_id), None)

    def only(self, names: Iterable[str]) -> QueryTables:
        """The columns among ``names`` (the query's Spark schema), in its order."""
        wanted = list(names)
        by_name = {c.name: c for c in self.columns}
        return QueryTables(tuple(by_name[n] for n in wanted if n in by_name),
                           tuple(TableColumns(t.name, t.table_id, t.columns.only(wanted))
                                 for t in self.tables))

    def fit(self, name: str, table_id: str, table_schema: Any) -> TableColumns:
        """The columns of a table the query was not defined with (one that
        joined the group since): those of the query's names, which must be of
        the query's types (:class:`SchemaChanged`, one line, if one is not);
        its other columns are not delivered (as a column added to a table)."""
        types = {c.name: c for c in self.columns}
        mine = query_schema(table_schema, types)
        wrong = [f"column {c.name!r} is {c.type_name} there, {types[c.name].type_name} in the "
                 "query" for c in mine.columns if c.spark_type != types[c.name].spark_type]
        if wrong:
            raise SchemaChanged(
                f"table {name} joined the query's tables, but {'; '.join(wrong)}: a query over "
                "several tables has one type per column name, fixed when it starts, so it "
                "stops; read that table in a query of its own, or narrow the query's tables "
                "(docs/spark.md, a query over several tables)")
        return TableColumns(name, table_id, mine.only(types))


def union_columns(tables: Iterable[tuple[str, str, Any]]) -> QueryTables:
    """The columns of a query over ``tables`` (``(name, table_id, pypaimon
    table schema)``, sorted by name): the union by name; a name of two Spark
    types in two tables, or a column named as one the source adds, is one
    ConfigError line."""
    union: dict[str, tuple[QueryColumn, str]] = {}
    own: list[TableColumns] = []
    for name, table_id, table_schema in tables:
        mine = query_schema(table_schema)
        for column in mine.columns:
            if column.name in ADDED_COLUMNS:
                raise ConfigError(
                    f"table {name} has a column {column.name!r}, which a query over several "
                    "tables adds itself: read that table in a query of its own")
            seen = union.get(column.name)
            if seen is None:
                union[column.name] = (column, name)
            elif seen[0].spark_type != column.spark_type:
                raise ConfigError(
                    f"column {column.name!r} is {seen[0].type_name} in table {seen[1]} and "
                    f"{column.type_name} in table {name}: a query over several tables has one "
                    "column per name, of one type; read them in separate queries, or choose "
                    "tables whose columns agree (docs/spark.md, a query over several tables)")
        own.append(TableColumns(name, table_id, mine))
    return QueryTables(tuple(c for c, _ in union.values()), tuple(own))
