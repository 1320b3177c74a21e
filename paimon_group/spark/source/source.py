"""``spark.readStream.format("paimon-group")``: the Python Data Source of the group.

Where each piece runs:

* :class:`PaimonGroupDataSource` (the query's definition, in the user's
  driver process): checks the options and opens the table for its schema,
  so bad options fail ``load()`` with one line, before anything is joined.
* :class:`PaimonGroupStreamReader` (the Python process Spark starts for the
  source on the driver, one per running query): joins the group on its
  first offset call (:class:`~paimon_group.spark.source.driver.GroupDriver`),
  turns the owned shards' positions into offsets, plans each batch, and
  commits it (fenced). Spark also builds a reader to ship ``read`` to the
  executors: the constructor joins nothing, and the member never travels
  (``__getstate__``).
* ``read`` (executors): reads the pieces of one shard as Arrow record
  batches through the project's read path (``ShardPlanner.iter_batches``).

Offsets, restart and commit rules: :mod:`paimon_group.spark.source.offsets`
and docs/spark.md. A query over several tables (options ``tables`` or
``pattern``): :mod:`paimon_group.spark.source.tables`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxFiles,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from paimon_group.errors import ConfigError, PaimonGroupError
from paimon_group.spark.source.driver import GroupDriver
from paimon_group.spark.source.offsets import (
    Caps,
    Cursor,
    Piece,
    Planner,
    ShardRange,
    decode_end_moves,
    decode_ends,
    decode_offset,
    encode_offset,
    moved_past_gap,
    piece_gone,
    plan_batch,
    same_incarnation,
    start_cursor,
)
from paimon_group.spark.source.options import SourceOptions
from paimon_group.spark.source.schema import (
    QuerySchema,
    QueryTables,
    check_schema,
    query_schema,
    spark_fields,
)
from paimon_group.spark.source.tables import (
    TABLE_METADATA_TYPES,
    JoinedColumns,
    TablePartition,
    plan_tables,
    read_table_partition,
    tables_schema,
)

__all__ = ["PaimonGroupDataSource", "PaimonGroupStreamReader", "ShardPartition"]

log = logging.getLogger("paimon_group.spark_source")

UNCAPPED = ReadMaxRows(2**63 - 1)
"""The default read limit without caps. Not ``ReadAllAvailable``: Spark passes
that to ``latestOffset`` under ``Trigger.Once`` (whatever the default), and
only then, so the reader can tell Once from the other triggers."""

TRIGGER_ONCE = (
    "Trigger.Once is not supported by the paimon-group source: Spark calls no source method "
    "after a Once batch, so the group would never learn that its rows were written and the "
    "group's next reader would read them again; use .trigger(availableNow=True), which reads "
    "everything available when the query starts, commits each batch, and ends")
"""The line a query under Trigger.Once (deprecated by Spark for AvailableNow) stops with."""

CHECK_TABLE_OPTIONS = 'check the options "warehouse" and "table" of the paimon-group source'
"""How a table not found ends its line here: the source's options, not the CLI's flags."""


def arrow_schema(options: SourceOptions) -> tuple[pa.Schema, QuerySchema | QueryTables]:
    """The rows' Arrow schema: the table's columns (``_row_kind`` first when asked),
    then the metadata columns when asked. Every column, and every field
    inside one, is nullable (:func:`spark_fields`). And the table's columns
    by field id, which the running query checks its reads against. A query
    over several tables: :func:`~paimon_group.spark.source.tables.tables_schema`."""
    from paimon_group.reading.table import ShardedTable

    if not options.single_table:
        return tables_schema(options)
    table = ShardedTable.open(options.warehouse, options.table, options.catalog_options,
                              check=CHECK_TABLE_OPTIONS)
    planner = table.planner(1, include_row_kind=options.include_row_kind)
    fields = spark_fields(planner.schema)
    if options.metadata_columns:
        fields += [pa.field(name, typ) for name, typ in _METADATA_TYPES]
    return pa.schema(fields), query_schema(planner.view.pt.table_schema)


_METADATA_TYPES = (("_pg_shard", pa.int32()), ("_pg_snapshot", pa.int64()),
                   ("_pg_epoch", pa.int64()))


class PaimonGroupDataSource(DataSource):
    """The ``paimon-group`` source; see the module docstring and docs/spark.md.

    Example::

        spark.dataSource.register(PaimonGroupDataSource)
        df = (spark.readStream.format("paimon-group").option("group", "orders")
              .option("warehouse", "/data/wh").option("table", "db.orders").load())
    """

    @classmethod
    def name(cls) -> str:
        return "paimon-group"

    def __init__(self, options: Any) -> None:
        super().__init__(options)
        self.source_options = SourceOptions.parse(dict(options))
        # The table's columns when the query was defined (Spark pickles the
        # source after schema(), for the reader): their field ids tell a
        # rename from a drop while the query runs.
        self.query_schema: QuerySchema | QueryTables | None = None
        self.arrow: pa.Schema | None = None

    def schema(self) -> StructType:
        from pyspark.sql.pandas.types import from_arrow_schema

        self.arrow, self.query_schema = arrow_schema(self.source_options)
        return from_arrow_schema(self.arrow)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        extra = {"_row_kind", *(name for name, _ in _METADATA_TYPES)}
        if not self.source_options.single_table:
            extra |= {"_pg_table", *(name for name, _ in TABLE_METADATA_TYPES)}
        columns = tuple(n for n in schema.fieldNames() if n not in extra)
        defined = getattr(self, "query_schema", None)
        arrow = getattr(self, "arrow", None)
        if defined is None or arrow is None:
            # A schema given by the user: the columns as the table has them now.
            arrow, defined = arrow_schema(self.source_options)
        if isinstance(defined, QueryTables):
            # A query over several tables reads into the schema Spark has.
            arrow = pa.schema([arrow.field(n) for n in schema.fieldNames() if n in arrow.names])
        return PaimonGroupStreamReader(self.source_options, columns, defined.only(columns),
                                       arrow)


class ShardPartition(InputPartition):
    """One shard's pieces of one micro-batch (read by one task, in snapshot order)."""

    def __init__(self, shard: int, epoch: int, pieces: list[Piece]) -> None:
        super().__init__(shard)
        self.shard = shard
        self.epoch = epoch
        self.pieces = pieces

    def __repr__(self) -> str:
        snapshots = [p.snapshot for p in self.pieces]
        return f"ShardPartition(shard={self.shard}, epoch={self.epoch}, snapshots={snapshots})"


class PaimonGroupStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets, partitions and commits of one query; see the module docstring."""

    def __init__(self, options: SourceOptions, columns: tuple[str, ...] | None = None,
                 query_schema: QuerySchema | QueryTables | None = None,
                 arrow: pa.Schema | None = None) -> None:
        self.options = options
        # The table's columns when the query was defined: a column added to
        # the table later is not read (Spark's schema of a running query is
        # fixed); restart the query to get it. One of them renamed, dropped
        # or of another type stops the query (paimon_group.spark.source.schema).
        self.columns = columns
        self.query_schema = query_schema
        # A query over several tables: the rows' Arrow schema (Spark's).
        self.arrow = arrow
        self._driver: GroupDriver | None = None
        # Trigger.AvailableNow: no snapshot after this one is read (a query
        # over several tables: per table, by its first group shard).
        self._target: int | None = None
        self._targets: dict[int, int] | None = None
        self._joined: JoinedColumns | None = None
        # Pieces planned by latestOffset, for the partitions() call that follows.
        self._planned: dict[str, dict[int, list[Piece]]] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options, "columns": self.columns,
                "query_schema": self.query_schema, "arrow": self.arrow, "_driver": None,
                "_planned": {}, "_target": None, "_targets": None, "_joined": None}

    # -- the group ---------------------------------------------------------

    @property
    def driver(self) -> GroupDriver:
        if self._driver is None:
            driver = GroupDriver(self.options)
            driver.start()
            self._driver = driver
        return self._driver

    def initialOffset(self) -> dict[str, Any]:
        self.driver  # noqa: B018  (join now: a bad coordinator fails the query at start)
        return encode_offset({})

    def prepareForTriggerAvailableNow(self) -> None:
        """Read up to the table's latest snapshot now, then report nothing new.

        The member holds every shard the group assigned to it first (a
        member the group has not placed yet would plan no shard, and Spark
        would end the query at once): one line if that takes longer than
        ``ready_timeout_s``."""
        driver = self.driver
        if not driver.ready:
            raise PaimonGroupError(
                f"Trigger.AvailableNow: member {driver.member.member_id!r} of group "
                f"{driver.group!r} did not hold its assigned shards within ready_timeout_s="
                f"{self.options.ready_timeout_s:g} s, so it cannot read what is available; "
                "the group's other members may still hold them (paimon-group describe --group "
                f"{driver.group} ...): raise the option ready_timeout_s, or run the query again")
        if self.options.single_table:
            self._target = driver.planner.table.latest_snapshot_id() or 0
        else:
            self._targets = {p.first: p.table.latest_snapshot_id() or 0
                             for p in driver.all_planners()}

    def getDefaultReadLimit(self) -> ReadLimit:
        """The options' caps, or :data:`UNCAPPED`: never Spark's ``ReadAllAvailable``,
        which ``latestOffset`` then gets only under ``Trigger.Once`` (refused)."""
        if self.options.max_rows_per_batch is not None:
            return ReadMaxRows(self.options.max_rows_per_batch)
        if self.options.max_snapshots_per_batch is not None:
            # No snapshot limit in Spark's vocabulary: a snapshot is the "file" here.
            return ReadMaxFiles(self.options.max_snapshots_per_batch)
        return UNCAPPED

    def _caps(self, limit: ReadLimit | None) -> Caps:
        if isinstance(limit, ReadMaxRows) and limit.max_rows >= UNCAPPED.max_rows:
            return Caps()
        if isinstance(limit, ReadMaxRows):
            return Caps(self.options.max_snapshots_per_batch, limit.max_rows)
        if isinstance(limit, ReadMaxFiles):
            return Caps(limit.max_files, self.options.max_rows_per_batch)
        return Caps(self.options.max_snapshots_per_batch, self.options.max_rows_per_batch)

    def latestOffset(self, start: dict[str, Any] | None = None,
                     limit: ReadLimit | None = None) -> dict[str, Any]:
        """The next batch's end offset, or ``start`` itself when nothing is new.

        ``start`` is the end of the previous batch, which Spark has completed
        (written to its commit log) before asking: its positions are
        committed now (forward only), so the coordinator is never more than
        the running batch behind the checkpoint.
        """
        if isinstance(limit, ReadAllAvailable):
            raise ConfigError(TRIGGER_ONCE)
        driver = self.driver
        previous, ends = decode_offset(start), decode_ends(start)
        end_moves = decode_end_moves(start)
        if previous and not same_incarnation(start, driver.incarnation):
            # A checkpoint of an earlier incarnation of the group (deleted and
            # re-created under the same name): its positions are of other
            # shards or before another start, and must not move this group's.
            log.warning("checkpointed offset of an earlier incarnation of group %r: ignored; "
                        "the shards continue from the group's own positions", driver.group)
            previous, ends, end_moves = {}, {}, {}
        if ends:
            # Every end up to ``start`` is of a batch Spark completed: the
            # shards held now (also one that came back) move on to it (not
            # one re-pinned at a moved start since: it scans that first).
            driver.commit(ends, _incarnation(start), end_moves)
        owned = driver.owned()
        cursors = {s: start_cursor(cursor, previous.get(s), ends.get(s), end_moves.get(s, 0))
                   for s, (_, cursor) in owned.items()}
        cursors, reached, pieces = self._plan(driver, cursors, self._caps(limit))
        ranges = {s: ShardRange(shard=s, epoch=owned[s][0], next=c.next, full=c.full,
                                to=reached[s], moves=c.moves) for s, c in cursors.items()}
        if all(r.empty for r in ranges.values()):
            return start if start is not None else encode_offset({})
        end = encode_offset(ranges, driver.incarnation, ends, end_moves,
                            getattr(driver, "source", None))
        self._planned = {_key(end): pieces}
        driver.hold({s: r.to for s, r in ranges.items() if not r.empty})
        return end

    def _plan(self, driver: GroupDriver, cursors: dict[int, Cursor], caps: Caps
              ) -> tuple[dict[int, Cursor], dict[int, int], dict[int, list[Piece]]]:
        """The next batch from ``cursors`` (:func:`plan_batch`; a query over
        several tables: :func:`plan_tables`), its columns checked."""
        if not self.options.single_table:
            return plan_tables(
                driver.planners_of(cursors), cursors, columns=self._columns(),
                targets=self._targets, caps=caps,
                fail_on_data_loss=self.options.fail_on_data_loss, config=driver.member.config,
                move_start=driver.move_start)
        latest = driver.planner.table.latest_snapshot_id()
        if self._target is not None and latest is not None:
            latest = min(latest, self._target)
        planned = plan_batch(
            driver.planner, cursors, latest=latest, caps=caps,
            fail_on_data_loss=self.options.fail_on_data_loss, config=driver.member.config,
            move_start=driver.move_start)
        # Snapshots planned under a newer schema: the planner follows it.
        assert not isinstance(self.query_schema, QueryTables)
        check_schema(self.query_schema, driver.planner.view.pt.table_schema,
                     driver.planner.table.identifier)
        return planned

    def _columns(self) -> JoinedColumns:
        if self._joined is None:
            assert isinstance(self.query_schema, QueryTables)
            self._joined = JoinedColumns(self.query_schema)
        return self._joined

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        """One partition per shard with rows, from the plan of ``end`` (re-planned
        from the offset itself when Spark re-runs a checkpointed batch)."""
        ranges = {s: r for s, r in decode_offset(end).items() if not r.empty}
        if start == end or not ranges:
            return []
        pieces = self._planned.pop(_key(end), None)
        if pieces is None:
            pieces = self._replan(ranges)
        if not self.options.single_table:
            return [TablePartition(s, ranges[s].epoch, pieces[s], planner.name, planner.first,
                                   self._columns().of(planner))
                    for planner, shards in self.driver.planners_of(sorted(ranges)).items()
                    for s in shards if pieces.get(s)]
        return [ShardPartition(s, ranges[s].epoch, pieces[s])
                for s in sorted(ranges) if pieces.get(s)]

    def _replan(self, ranges: dict[int, ShardRange]) -> dict[int, list[Piece]]:
        """The pieces of a batch Spark re-runs from its checkpointed offset.

        Its own range, except for shards whose range starts in snapshots that
        expired since and whose group position moved past them (the
        ``paimon-group reset`` the data-loss line gives, or a member that
        skipped the gap): those read from the group's position (see
        :func:`~paimon_group.spark.source.offsets.moved_past_gap`).
        """
        driver = self.driver
        if self.options.single_table:
            return self._replan_with(driver.planner, ranges)
        pieces: dict[int, list[Piece]] = {}
        for planner, shards in driver.planners_of(ranges).items():
            pieces.update(self._replan_with(planner, {s: ranges[s] for s in shards}))
        return pieces

    def _replan_with(self, planner: Planner, ranges: dict[int, ShardRange]
                     ) -> dict[int, list[Piece]]:
        """:meth:`_replan` of one table's shards, planned by its ``planner``."""
        driver = self.driver
        cursors = {s: Cursor(next=r.next, full=r.full, moves=r.moves) for s, r in ranges.items()}
        until = {s: r.to for s, r in ranges.items()}
        earliest = planner.table.earliest_snapshot_id()
        if earliest is not None and any(c.done_before < earliest for c in cursors.values()):
            stored = driver.stored_cursors(
                [s for s, c in cursors.items() if c.done_before < earliest])
            planned = cursors
            cursors, until, moved = moved_past_gap(planned, until, stored, earliest)
            if moved:
                log.warning(
                    "re-run batch: shards %s: snapshots %d..%d of table %s expired before it "
                    "read them, and the group's positions moved past them since (a reset, or a "
                    "member that skipped them): it reads these shards from the group's "
                    "positions; the rows of the expired snapshots are lost to the query",
                    ", ".join(map(str, moved)), min(planned[s].done_before for s in moved),
                    earliest - 1, planner.table.identifier)
        _, _, pieces = plan_batch(planner, cursors, until=until,
                                  fail_on_data_loss=self.options.fail_on_data_loss,
                                  config=driver.member.config, move_start=driver.move_start)
        return pieces

    def commit(self, end: dict[str, Any]) -> None:
        """The fenced group commit of the batch ending at ``end`` (see GroupDriver.commit).

        An ``end`` of an earlier incarnation of the group is ignored, as
        ``latestOffset`` ignores it: restarted from its checkpoint after the
        group was deleted and re-created, the query gets ``latestOffset(old
        end)``, then ``commit(old end)`` for the batch before the restart,
        whose positions, written over the new group's pinned full scan,
        would skip every snapshot between."""
        ends = decode_ends(end)
        if not ends:
            return
        driver = self.driver
        if not same_incarnation(end, driver.incarnation):
            log.info("commit of an offset of an earlier incarnation of group %r ignored",
                     driver.group)
            return
        driver.commit(ends, _incarnation(end), decode_end_moves(end))

    def stop(self) -> None:
        if self._driver is not None:
            self._driver.stop()
            self._driver = None

    # -- executors -----------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, TablePartition):
            assert self.arrow is not None
            return read_table_partition(self.options, partition, self.arrow)
        assert isinstance(partition, ShardPartition)
        assert not isinstance(self.query_schema, QueryTables)
        return read_partition(self.options, partition, self.columns, self.query_schema)


def read_partition(options: SourceOptions, partition: ShardPartition,
                   columns: Sequence[str] | None = None,
                   query_schema: QuerySchema | None = None) -> Iterator[pa.RecordBatch]:
    """The rows of one partition as record batches, through the project's read path
    (only ``columns`` of the table are decoded, when given). One of the
    ``query_schema``'s columns renamed, dropped or of another type in the
    table now: :class:`~paimon_group.spark.source.schema.SchemaChanged`."""
    from paimon_group.reading.table import ShardedTable

    table = ShardedTable.open(options.warehouse, options.table, options.catalog_options,
                              check=CHECK_TABLE_OPTIONS)
    check_schema(query_schema, table.table.table_schema, table.identifier)
    planner = table.planner(1, include_row_kind=options.include_row_kind,
                            projection=list(columns) if columns else None)
    schema = pa.schema(spark_fields(planner.schema)
                       + ([pa.field(n, t) for n, t in _METADATA_TYPES]
                          if options.metadata_columns else []))
    for piece in partition.pieces:
        try:
            for batch in planner.iter_batches(piece.splits):
                if batch.num_rows == 0:
                    continue
                columns = [c if c.type == f.type else c.cast(f.type)
                           for c, f in zip(batch.columns, schema, strict=False)]
                if options.metadata_columns:
                    n = batch.num_rows
                    columns += [pa.repeat(pa.scalar(value, typ), n) for value, (_, typ) in zip(
                        (partition.shard, piece.snapshot, partition.epoch), _METADATA_TYPES,
                        strict=True)]
                yield pa.RecordBatch.from_arrays(columns, schema=schema)
        except FileNotFoundError as err:
            piece_gone(options.fail_on_data_loss, table, partition.shard, piece, err)


def _incarnation(offset: dict[str, Any] | None) -> str:
    """The incarnation of the group an offset records ("" if none)."""
    return str((offset or {}).get("group") or "")


def _key(offset: dict[str, Any]) -> str:
    return json.dumps(offset, sort_keys=True)
