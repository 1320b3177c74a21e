"""A query over several tables (options ``tables`` or ``pattern``): its schema, plan and reads.

One DataFrame for every table of the group (docs/spark.md, a query over
several tables):

* **Its columns** are the union by name of the tables' columns when the query
  is defined (:func:`tables_schema`, :func:`~paimon_group.spark.source.schema.union_columns`):
  ``_row_kind`` first when asked, then each name once (the tables sorted by
  name, each name where a table first has it), then ``_pg_table`` (the row's
  table, ``database.table``), then, with ``metadata_columns``, ``_pg_shard``
  (the table's own shard), ``_pg_snapshot``, ``_pg_epoch`` and
  ``_pg_group_shard`` (the group's shard: the key of the group's positions).
  A column a table does not have is null in its rows.
* **Its offsets** are the single table's, per group shard: the group's
  positions are per group shard, and so are the query's ranges and commits.
* **Its plan**: the group shards of one table are planned by that table's
  planner (:class:`TablePlanner`, the table's ``ShardPlanner`` in the group's
  numbers: group shard ``k`` is the table's shard ``k - first``), one table
  after the other, each up to its own latest snapshot; the caps
  (``max_snapshots_per_batch``, ``max_rows_per_batch``) hold per table.
* **Its reads**: one partition per group shard (:class:`TablePartition`),
  read with its table's columns among the query's, the others null.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import InputPartition

from coordinators.urls import redact_url
from paimon_group.config.member import MemberConfig
from paimon_group.errors import ConfigError
from paimon_group.reading.planner import PlannedTable, ShardPlanner
from paimon_group.reading.steps import StepPlan
from paimon_group.spark.source.offsets import (
    Caps,
    Cursor,
    MoveStart,
    Piece,
    piece_gone,
    plan_batch,
)
from paimon_group.spark.source.options import SourceOptions
from paimon_group.spark.source.schema import (
    QueryTables,
    TableColumns,
    check_schema,
    spark_fields,
    union_columns,
)

__all__ = ["TABLE_METADATA_TYPES", "JoinedColumns", "TablePartition", "TablePlanner",
           "plan_tables", "read_table_partition", "tables_schema"]

TABLE_METADATA_TYPES = (("_pg_shard", pa.int32()), ("_pg_snapshot", pa.int64()),
                        ("_pg_epoch", pa.int64()), ("_pg_group_shard", pa.int32()))
"""The metadata columns of a query over several tables (``metadata_columns``)."""

CHECK_TABLES_OPTIONS = ('check the options "warehouse" and "tables" (or "pattern") of the '
                        "paimon-group source")


class TablePlanner:
    """One table's planner in the group's shard numbers: shards and plans
    are the group's (``first`` + the table's), so a batch's offsets, lost
    ranges and data-loss lines name group shards, as the group's positions."""

    def __init__(self, name: str, table_id: str, first: int, planner: ShardPlanner) -> None:
        self.name, self.table_id, self.first = name, table_id, first
        self.planner = planner

    def __repr__(self) -> str:
        return f"TablePlanner({self.name!r}, first={self.first})"

    @property
    def table(self) -> PlannedTable:
        return self.planner.table

    @property
    def rule(self) -> Any:
        return self.planner.rule

    @property
    def table_schema(self) -> Any:
        """The table's schema the planner follows (pypaimon's)."""
        return self.planner.view.pt.table_schema

    def _local(self, shards: Iterable[int]) -> list[int]:
        return [s - self.first for s in shards]

    def _shifted(self, step: StepPlan) -> StepPlan:
        return dataclasses.replace(step, num_shards=None, splits={
            self.first + k: v for k, v in step.splits.items()})

    def plan_full(self, shards: Iterable[int], snapshot_id: int) -> StepPlan:
        return self._shifted(self.planner.plan_full(self._local(shards), snapshot_id))

    def plan_next(self, shards: Iterable[int], next_snapshot: int) -> StepPlan | None:
        step = self.planner.plan_next(self._local(shards), next_snapshot)
        return None if step is None else self._shifted(step)


def tables_schema(options: SourceOptions) -> tuple[pa.Schema, QueryTables]:
    """The rows' Arrow schema of a query over several tables (the module
    docstring), and each table's columns by field id. One line for a plain
    name not found, no table matched, or a column name of two types."""
    from paimon_group.reading.discovery import list_subscribed, raise_if_missing
    from paimon_group.reading.table import ShardedTable

    catalog, location, _ = ShardedTable.open_catalog(options.warehouse, options.catalog_options)
    listing = list_subscribed(catalog, options.subscription)
    raise_if_missing(listing, redact_url(location), CHECK_TABLES_OPTIONS)
    listed = [t for t in listing.tables if t.kind is not None]
    if not listed:
        raise ConfigError(
            f"no table of warehouse {redact_url(location)} matches option {options.names}: "
            "a query's columns are the tables' when it starts, so one must exist; "
            f"{CHECK_TABLES_OPTIONS}")
    schemas: list[tuple[str, str, Any]] = []
    fields: dict[str, pa.Field] = {}
    for entry in listed:
        table = ShardedTable.in_catalog(catalog, location, entry.name)
        planner = table.planner(1, include_row_kind=options.include_row_kind)
        schemas.append((entry.name, entry.identity, planner.view.pt.table_schema))
        for f in spark_fields(planner.schema):
            fields.setdefault(f.name, f)
    query = union_columns(schemas)
    out = [fields["_row_kind"]] if options.include_row_kind else []
    out += [fields[c.name] for c in query.columns]
    out.append(pa.field("_pg_table", pa.string()))
    if options.metadata_columns:
        out += [pa.field(name, typ) for name, typ in TABLE_METADATA_TYPES]
    return pa.schema(out), query


class JoinedColumns:
    """The query's tables' columns (:class:`QueryTables`), and those of the
    tables that joined the group since the query started (checked once, when
    first planned: :meth:`QueryTables.fit`)."""

    def __init__(self, query: QueryTables) -> None:
        self.query = query
        self._joined: dict[tuple[str, str], TableColumns] = {}

    def of(self, planner: TablePlanner) -> TableColumns:
        known = self.query.of(planner.name, planner.table_id)
        if known is None:
            key = (planner.name, planner.table_id)
            known = self._joined.get(key)
            if known is None:
                known = self._joined[key] = self.query.fit(planner.name, planner.table_id,
                                                           planner.table_schema)
        return known


Planned = tuple[dict[int, Cursor], dict[int, int], dict[int, list[Piece]]]


def plan_tables(planners: Mapping[TablePlanner, Sequence[int]], cursors: Mapping[int, Cursor],
                *, columns: JoinedColumns, targets: dict[int, int] | None, caps: Caps,
                fail_on_data_loss: bool, config: MemberConfig,
                move_start: MoveStart | None) -> Planned:
    """:func:`~paimon_group.spark.source.offsets.plan_batch` for each table's
    shards among ``cursors`` (``planners``: the shards by table), each up to
    its latest snapshot (with ``targets``, Trigger.AvailableNow: up to its
    latest when first seen), its columns checked (:class:`JoinedColumns`)."""
    moved: dict[int, Cursor] = {}
    reached: dict[int, int] = {}
    pieces: dict[int, list[Piece]] = {}
    for planner, shards in planners.items():
        latest = planner.table.latest_snapshot_id()
        if targets is not None and latest is not None:
            latest = min(latest, targets.setdefault(planner.first, latest))
        mine = {s: cursors[s] for s in shards}
        table_moved, table_reached, table_pieces = plan_batch(
            planner, mine, latest=latest, caps=caps, fail_on_data_loss=fail_on_data_loss,
            config=config, move_start=move_start)
        # Snapshots planned under a newer schema: the planner follows it.
        check_schema(columns.of(planner).columns, planner.table_schema, planner.name)
        moved.update(table_moved)
        reached.update(table_reached)
        pieces.update(table_pieces)
    return moved, reached, pieces


class TablePartition(InputPartition):
    """One group shard's pieces of one micro-batch of a query over several
    tables: its table, the table's first group shard and its columns."""

    def __init__(self, shard: int, epoch: int, pieces: list[Piece], table: str, first: int,
                 columns: TableColumns) -> None:
        super().__init__(shard)
        self.shard, self.epoch, self.pieces = shard, epoch, pieces
        self.table, self.first, self.columns = table, first, columns

    def __repr__(self) -> str:
        snapshots = [p.snapshot for p in self.pieces]
        return (f"TablePartition(table={self.table!r}, shard={self.shard - self.first}, "
                f"group_shard={self.shard}, epoch={self.epoch}, snapshots={snapshots})")


def read_table_partition(options: SourceOptions, partition: TablePartition,
                         schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """The rows of one partition in the query's ``schema``: the table's
    columns among it (cast to the query's type when the Arrow types differ),
    nulls for the others, and the columns the source adds."""
    from paimon_group.reading.table import ShardedTable

    table = ShardedTable.open(options.warehouse, partition.table, options.catalog_options,
                              check=CHECK_TABLES_OPTIONS)
    check_schema(partition.columns.columns, table.table.table_schema, table.identifier)
    names = [c.name for c in partition.columns.columns.columns if c.name in schema.names]
    planner = table.planner(1, include_row_kind=options.include_row_kind,
                            projection=names or None)
    for piece in partition.pieces:
        try:
            for batch in planner.iter_batches(piece.splits):
                if batch.num_rows:
                    yield _in_schema(batch, schema, partition, piece.snapshot)
        except FileNotFoundError as err:
            piece_gone(options.fail_on_data_loss, table, partition.shard, piece, err)


def _in_schema(batch: pa.RecordBatch, schema: pa.Schema, partition: TablePartition,
               snapshot: int) -> pa.RecordBatch:
    n = batch.num_rows
    added = {"_pg_table": partition.table, "_pg_shard": partition.shard - partition.first,
             "_pg_snapshot": snapshot, "_pg_epoch": partition.epoch,
             "_pg_group_shard": partition.shard}
    columns: list[pa.Array] = []
    for f in schema:
        if f.name in added:
            columns.append(pa.repeat(pa.scalar(added[f.name], f.type), n))
            continue
        i = batch.schema.get_field_index(f.name)
        if i < 0:
            columns.append(pa.nulls(n, f.type))
            continue
        column = batch.column(i)
        columns.append(column if column.type == f.type else column.cast(f.type))
    return pa.RecordBatch.from_arrays(columns, schema=schema)
