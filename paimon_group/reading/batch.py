"""What a handler receives: one shard's part of one planned step.

A :class:`ShardBatch` is cheap to build (it holds splits, not rows); rows are
read only when the handler asks, all at once with :meth:`ShardBatch.to_arrow`
or streamed with :meth:`ShardBatch.iter_batches` (bounded memory). Its
progress (``next_snapshot``) is committed by the member, fenced by ``epoch``,
after the handler returns: delivery is at-least-once.

Example (a handler for ``paimon-group run --handler mymodule:handle``)::

    def handle(batch):
        print(batch)                         # ShardBatch(g1 shard 3/8 epoch 17 delta @42 ...)
        for record_batch in batch.iter_batches():
            sink.write(record_batch)         # exactly this shard's rows of this step
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa

from paimon_group.errors import (
    BatchExpired,
    DataFileMissing,
    PaimonGroupError,
    PlanInvariantViolated,
)
from paimon_group.protocol.sinks import SinkRegistry
from paimon_group.reading.expiry import missing_file_error
from paimon_group.reading.planner import BatchKind, StepPlan, check_routing

if TYPE_CHECKING:
    from paimon_group.reading.planner import ShardPlanner

__all__ = ["HeldOutput", "ShardBatch"]


class HeldOutput(Protocol):
    """A sink holding a batch's output until its handler is done with it
    (:meth:`ShardBatch.hold_output`)."""

    def seal(self, batch: ShardBatch) -> concurrent.futures.Future[None]:
        """Commit every part written for ``batch``, together; the future
        ends once they are committed (or with why not)."""
        ...

    def drop(self, batch: ShardBatch) -> None:
        """Forget every part written for ``batch``: none is committed."""
        ...


def _checked_splits(plan: StepPlan, planner: ShardPlanner, shard: int,
                    num_shards: int) -> tuple[Any, ...]:
    """``plan``'s splits of ``shard``, each checked to belong to it."""
    if planner.num_shards != num_shards:
        raise PlanInvariantViolated(
            f"planner plans {planner.num_shards} shards but the batch is for shard "
            f"{shard} of {num_shards}"
        )
    if shard not in plan.splits:
        raise PlanInvariantViolated(f"the step was not planned for shard {shard}")
    splits = tuple(plan.splits[shard])
    check_routing({shard: splits}, num_shards, planner.rule)
    return splits


class ShardBatch:
    """Shard ``shard`` of ``num_shards``: its rows for one step, read on demand.

    Attributes: ``group``, ``member_id``, ``shard``, ``num_shards``, ``epoch``
    (the fencing epoch of this member's ownership of the shard),
    ``incarnation`` (the group's, in its coordinator: a group re-created on
    another or a wiped coordinator has another, and its epochs start anew;
    empty if unknown), ``start_moves`` (the moves of the group start the
    shard's position derives from: :class:`~paimon_group.protocol.records.GroupStart`),
    ``table_id`` (the identity of the table the group reads,
    :func:`~paimon_group.protocol.identity.table_identity`; empty if unknown),
    ``sharding`` (the group's sharding rule, a
    :class:`~paimon_group.protocol.sharding.ShardRule` value), ``snapshot_id``
    (the last snapshot the step covers), ``first_snapshot``,
    ``kind`` (:class:`~paimon_group.reading.planner.BatchKind`), ``next_snapshot``
    (the position committed after the handler returns), ``splits``,
    ``num_splits``, ``estimated_rows`` (from file metadata: rows before a
    primary-key merge, so an upper bound for INITIAL batches), ``schema`` and
    ``rows_read`` (the rows :meth:`to_arrow` and :meth:`iter_batches` actually
    produced so far; a handler that reads twice counts twice) and
    ``retractions`` (the deletes and update-befores among them, ``-D`` and
    ``-U``, counted the same way and whether or not row kinds were
    requested: a sink refuses output that dropped them,
    :mod:`paimon_group.sink.kinds`), ``sinks`` (the delivering member's
    :class:`~paimon_group.protocol.sinks.SinkRegistry`, where a sink that
    writes the batch's output registers for ``describe``; None for a batch
    built outside a member), ``table`` (the table read, ``database.table``;
    empty for a batch built without it) and ``group_shard`` (the group's
    number of the shard: ``shard`` itself in a group of one table; in a group
    of several, ``shard`` is the table's own shard and ``group_shard`` the
    group's, docs/many-tables.md).

    A file of the batch found missing when it is read means data loss if
    Paimon's expiry deleted it (snapshot ``first_snapshot`` expired while the
    batch was held): :meth:`to_arrow` and :meth:`iter_batches` raise
    :class:`~paimon_group.errors.BatchExpired` (a ``SnapshotExpired``), and
    the member handles it as ``--on-data-loss`` says (the handler is not
    called again for it). Otherwise they raise
    :class:`~paimon_group.errors.DataFileMissing`, one line naming the file.
    ``lost`` holds that error once raised (None before), whatever the
    handler did with it.

    Built by the member runtime::

        ShardBatch(group="g1", member_id="m1", shard=3, num_shards=8, epoch=17,
                   plan=step, planner=planner)

    ``plan`` is the :class:`~paimon_group.reading.planner.StepPlan` the planner made
    for a set of shards including ``shard``; the constructor takes
    ``plan.splits[shard]`` and checks again that each split's bucket belongs
    to ``shard`` (:class:`PlanInvariantViolated` otherwise).
    """

    __slots__ = (
        "_held",
        "_output_closed",
        "_output_sealed",
        "_planner",
        "_view",
        "epoch",
        "first_snapshot",
        "group",
        "group_shard",
        "incarnation",
        "kind",
        "lost",
        "member_id",
        "next_snapshot",
        "num_shards",
        "retractions",
        "rows_read",
        "shard",
        "sink_holds",
        "sinks",
        "snapshot_id",
        "splits",
        "start_moves",
        "table",
        "table_id",
    )

    def __init__(
        self,
        *,
        group: str,
        member_id: str,
        shard: int,
        num_shards: int,
        epoch: int,
        plan: StepPlan,
        planner: ShardPlanner,
        incarnation: str = "",
        start_moves: int = 0,
        table_id: str = "",
        sinks: SinkRegistry | None = None,
        table: str = "",
        group_shard: int | None = None,
    ) -> None:
        splits = _checked_splits(plan, planner, shard, num_shards)
        self.group = group
        self.member_id = member_id
        self.shard = shard
        self.num_shards = num_shards
        self.epoch = epoch
        self.incarnation = incarnation
        self.start_moves = start_moves
        self.table_id = table_id
        self.table = table
        self.group_shard = shard if group_shard is None else group_shard
        self.kind: BatchKind = plan.kind
        self.snapshot_id = plan.snapshot_id
        self.first_snapshot = (
            plan.first_snapshot if plan.first_snapshot is not None else plan.snapshot_id
        )
        self.next_snapshot = plan.next_snapshot
        self.splits: tuple[Any, ...] = splits
        self.rows_read = 0
        self.retractions = 0
        self.lost: BatchExpired | DataFileMissing | None = None
        # Set by a sink that already holds this batch's output (the next
        # source snapshot it holds it up to): the member commits that position
        # instead of the batch's own, also if the handler swallowed the
        # sink's AlreadyWritten (iterator mode: the loop body went on).
        self.sink_holds: int | None = None
        # The member's registry of the sinks its batches are written to: a
        # sink registers there at its first write (protocol/sinks.py).
        self.sinks = sinks
        # Sinks holding parts of this batch's output, committed together
        # once the handler is done with the batch (hold_output).
        self._held: list[HeldOutput] = []
        self._output_closed = False  # the member is done with the batch
        self._output_sealed = False
        self._planner = planner
        # The readers this step was planned with: the planner may switch to a
        # newer schema (ALTER TABLE) while this batch is in the handler, and
        # schema, to_arrow() and iter_batches() must still agree.
        self._view = planner.view

    @property
    def sharding(self) -> str:
        """The group's sharding rule (a
        :class:`~paimon_group.protocol.sharding.ShardRule` value)."""
        return self._planner.rule.value

    @property
    def num_splits(self) -> int:
        return len(self.splits)

    @property
    def estimated_rows(self) -> int:
        """Rows in this batch's files according to their metadata."""
        return sum(int(split.row_count) for split in self.splits)

    @property
    def buckets(self) -> tuple[int, ...]:
        """The buckets whose files this batch reads (the group's sharding rule put
        them, in their partitions, in this shard)."""
        return tuple(sorted({int(split.bucket) for split in self.splits}))

    @property
    def schema(self) -> pa.Schema:
        """Schema of :meth:`to_arrow` (``_row_kind`` first when row kinds were requested)."""
        return self._view.schema

    def to_arrow(self) -> pa.Table:
        """Exactly this shard's rows for this step, as one table."""
        try:
            table, retractions = self._view.read_counted(self.splits)
        except FileNotFoundError as err:
            raise self._files_gone(err) from err
        self.rows_read += table.num_rows
        self.retractions += retractions
        return table

    def iter_batches(self) -> Iterator[pa.RecordBatch]:
        """This shard's rows for this step as record batches, streamed.

        Memory is bounded by one split's read (a bucket's files open at
        once) plus one batch: merged primary-key rows come in batches of at
        most ``read.batch-size`` rows (table option, default 1,024), see
        :meth:`~paimon_group.reading.planner.ShardPlanner.iter_batches`. Rows are
        counted in ``rows_read`` as the batches are produced.
        """
        try:
            for batch, retractions in self._view.iter_counted(self.splits):
                self.rows_read += batch.num_rows
                self.retractions += retractions
                yield batch
        except FileNotFoundError as err:
            raise self._files_gone(err) from err

    def _files_gone(self, err: FileNotFoundError) -> BatchExpired | DataFileMissing:
        """What a file of this batch found missing means (reading/expiry.py);
        kept in ``lost``."""
        # An expiry is for good; a file missing from a retained snapshot may
        # be found expired at the next read.
        if not isinstance(self.lost, BatchExpired):
            self.lost = missing_file_error(
                self._planner.table, err, shards=(self.shard,), first=self.first_snapshot,
                last=self.snapshot_id, full_scan=self.kind is BatchKind.INITIAL)
        return self.lost

    # -- output held by sinks until the handler is done -----------------

    def hold_output(self, sink: HeldOutput) -> None:
        """Called by a sink at its first write of this batch's output. A
        handler may write the batch in several parts (one per record batch
        of :meth:`iter_batches`); the sink holds them, and the member seals
        them once the handler returned (:meth:`seal_output`: all parts
        committed together, before the batch's position) or drops them when
        it raised (:meth:`drop_output`: none committed, the next attempt
        writes them again)."""
        if self._output_closed:
            raise PaimonGroupError(
                f"{self!r} was handed back already (its handler returned, or the "
                "member stopped it): write a batch's output before the handler returns")
        if all(held is not sink for held in self._held):
            self._held.append(sink)

    def seal_output(self) -> list[concurrent.futures.Future[None]]:
        """Seal the output every sink holds for this batch; one future per
        sink, ended once its parts are committed."""
        held, self._held = self._held, []
        self._output_sealed = self._output_sealed or bool(held)
        return [sink.seal(self) for sink in held]

    @property
    def output_sealed(self) -> bool:
        """Whether a sink held output of this batch that was sealed."""
        return self._output_sealed

    def drop_output(self) -> None:
        """Drop the output every sink holds for this batch (a handler's
        attempt failed: the next one writes it again)."""
        held, self._held = self._held, []
        for sink in held:
            sink.drop(self)

    def close_output(self) -> None:
        """The member is done with the batch: what no one sealed is dropped,
        and a later write of its output is refused (a handler still running
        after its member stopped waiting for it)."""
        self._output_closed = True
        self.drop_output()

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        return self.iter_batches()

    def __repr__(self) -> str:
        span = (
            f"@{self.snapshot_id}"
            if self.first_snapshot == self.snapshot_id
            else f"@{self.first_snapshot}..{self.snapshot_id}"
        )
        return (
            f"ShardBatch({self.group} shard {self.shard}/{self.num_shards} epoch {self.epoch} "
            f"{self.kind.value} {span} splits={self.num_splits} rows~{self.estimated_rows})"
        )
