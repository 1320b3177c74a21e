"""Shard-exact planning: which files of which snapshots each shard reads next.

Which shard holds which files is the group's sharding rule
(:class:`~paimon_group.protocol.sharding.Sharding`): ``bucket % S`` by default,
(partition, bucket) for partitioned and dynamic-bucket tables, the data file
for bucket-unaware append tables (invariant 4: every plan a shard reads
holds exactly its rows, on every path). pypaimon's
streaming scan cannot be used per shard for this: its bucket filter is not
applied to the initial full scan nor to the diff-based catch-up, so ``S``
shards would each read the whole table there. And calling it once per owned
shard would read the same manifests once per shard. So :class:`ShardPlanner`
plans itself, reusing pypaimon's building blocks:

* it reads the manifests of a step **once per call** whatever the number of
  shards asked for, keeps only entries of the requested shards (by bucket
  while the manifests are decoded when the rule depends on the bucket alone)
  and routes every split by the rule, cutting a split whose files belong to
  several shards (file rule) into one split per shard; :class:`StepPlan`
  re-checks the routing of every split and raises
  :class:`~paimon_group.errors.PlanInvariantViolated`. Files in a negative
  bucket (the pending bucket of postpone tables) are never read: no reader
  can see them until a compaction assigns them a bucket.
* **initial** (``plan_full``): the full content of one snapshot, through
  pypaimon's ``FileScanner`` (the merged, batch view of primary-key tables,
  with deletion vectors), exactly as pypaimon's streaming scan does its first
  plan, but with our bucket filter.
* **delta** / **changelog** follow-ups (``plan_next``): one snapshot; its delta
  manifests (``changelog-producer = none``) or its changelog manifests (input,
  lookup, full-compaction); snapshots pypaimon's follow-up scanner would not
  scan (``should_scan``: COMPACT and OVERWRITE snapshots for deltas; snapshots
  without a changelog for changelogs) give a step with no splits that still
  advances. Splits are marked streaming, so primary-key rows are read as the
  changes they are (no merge, row kinds kept), as pypaimon does.
* **catch-up** (``plan_next`` when more than ``catch_up_threshold`` snapshots
  are unread): ONE step to the latest snapshot made of the union of the
  delta/changelog manifests of every scannable snapshot in the gap, read once.
  pypaimon's ``IncrementalDiffScanner`` is deliberately NOT used: it diffs
  the file sets of two snapshots, so a file that compaction rewrote inside
  the gap is "new" and every row in it, including rows delivered before the
  gap, is delivered again (measured in tests/test_planner.py). The union of
  increments delivers exactly the changes committed in the gap, each once,
  in commit order per bucket.

A position that points below the earliest retained snapshot raises
:class:`~paimon_group.errors.SnapshotExpired`: never skipped silently.

Example::

    from paimon_group.reading.table import ShardedTable

    table = ShardedTable.open("/data/warehouse", "db.orders")   # 8 buckets
    planner = table.planner(3)                                   # 3 shards
    step = planner.plan_next([0, 2], next_snapshot=5)
    if step is not None:
        for shard, splits in step.splits.items():
            rows = planner.read_arrow(splits)                    # buckets b % 3 == shard
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

import pyarrow as pa
from pypaimon.read.scanner.file_scanner import FileScanner

from coordinators.errors import PaimonGroupError
from paimon_group.errors import SnapshotExpired
from paimon_group.protocol.sharding import Sharding, ShardRule
from paimon_group.reading.expiry import expired_if_gone
from paimon_group.reading.read_view import ReadView
from paimon_group.reading.steps import (
    BatchKind,
    PlannerStats,
    Split,
    StepPlan,
    check_routing,
    follow_up_scans,
    increment_manifests,
)
from paimon_group.store.handed_over import HandedOverFileIO

__all__ = [
    "BatchKind",
    "PlannedTable",
    "PlannerStats",
    "ShardPlanner",
    "StepPlan",
    "check_routing",
]

log = logging.getLogger("paimon_group.planner")  # a stable name, whatever the module path


class PlannedTable(Protocol):
    """What the planner reads of a table (a
    :class:`~paimon_group.reading.table.ShardedTable`, which makes planners with
    :meth:`~paimon_group.reading.table.ShardedTable.planner`)."""

    @property
    def table(self) -> Any:
        """The pypaimon ``FileStoreTable``."""

    @property
    def identifier(self) -> str: ...

    @property
    def changelog_producer(self) -> str: ...

    @property
    def default_rule(self) -> ShardRule: ...

    def latest_snapshot_id(self, *, fresh: bool = False) -> int | None: ...

    def earliest_snapshot_id(self) -> int | None: ...

    def snapshot(self, snapshot_id: int) -> Any | None: ...

    def snapshot_retained(self, snapshot_id: int) -> bool: ...

    def expired_error(self, snapshot_id: int) -> SnapshotExpired: ...

    def raise_if_dropped(self) -> None: ...

    def manifest_dir(self) -> str: ...


class _IncrementDeletesFile(Exception):
    """An incremental manifest held a DELETE entry (raised inside pypaimon's reader)."""


class ShardPlanner:
    """Plans and reads steps for shards of one table; see the module docstring.

    Create it with :meth:`ShardedTable.planner`. It holds no position: the
    caller passes ``next_snapshot`` in and commits ``StepPlan.next_snapshot``.
    Safe to use from one thread at a time for planning; reads may run in
    other threads. ``batch_rows`` bounds the batches of :meth:`iter_batches`
    (default: the table option ``read.batch-size``, 1,024 unless set).

    Example::

        planner = table.planner(4, include_row_kind=True)
        step = planner.plan_full([0, 1, 2, 3], table.latest_snapshot_id())
        for batch in planner.iter_batches(step.splits[2]):
            print(batch.num_rows)
    """

    def __init__(
        self,
        table: PlannedTable,
        num_shards: int,
        *,
        include_row_kind: bool = False,
        projection: Sequence[str] | None = None,
        catch_up_threshold: int = 10,
        batch_rows: int | None = None,
        rule: ShardRule | None = None,
    ) -> None:
        if isinstance(num_shards, bool) or not isinstance(num_shards, int) or num_shards < 1:
            raise PaimonGroupError(
                f"number of shards must be a positive integer, not {num_shards!r}"
            )
        if catch_up_threshold < 1:
            raise PaimonGroupError(f"catch_up_threshold must be >= 1, not {catch_up_threshold}")
        self.table = table
        self.num_shards = num_shards
        self.sharding = Sharding(table.default_rule if rule is None else rule, num_shards)
        self.include_row_kind = include_row_kind
        self.projection: tuple[str, ...] | None = tuple(projection) if projection else None
        self.catch_up_threshold = catch_up_threshold
        self.stats = PlannerStats()

        pt = table.table
        self._changelog = table.changelog_producer != "none"
        self.follow_up_kind = BatchKind.CHANGELOG if self._changelog else BatchKind.DELTA
        self.batch_rows = int(
            batch_rows if batch_rows is not None else pt.options.read_batch_size()
        )
        if self.batch_rows < 1:
            raise PaimonGroupError(f"batch_rows must be >= 1, not {self.batch_rows}")
        self._max_workers = max(1, min(8, os.cpu_count() or 1))
        self._overwrites_warned: set[int] = set()
        self._build_read(pt)

    def _build_read(self, pt: Any) -> None:
        """Everything that depends on the table's schema: the manifest
        readers, the read builder, :attr:`schema` and the Arrow read path.

        Built at construction and again by :meth:`_follow_schema` when a
        planned snapshot was committed under a newer schema (ALTER TABLE):
        the attributes are replaced one by one, each a complete object, so a
        read running in another thread meanwhile uses either the old or the
        new reader, both of which read old files (pypaimon maps fields by id,
        a column added later reads as null).
        """
        from pypaimon.manifest.manifest_file_manager import ManifestFileManager
        from pypaimon.manifest.manifest_list_manager import ManifestListManager

        view = ReadView(pt, identifier=self.table.identifier,
                        include_row_kind=self.include_row_kind, projection=self.projection,
                        batch_rows=self.batch_rows)
        self._pt: Any = pt
        self._schema_id = view.schema_id
        self._manifest_lists: Any = ManifestListManager(pt)
        self._manifests: Any = ManifestFileManager(pt)
        handed_over = getattr(self.table, "handed_over", None)
        if handed_over is not None:
            # Files the group's head handed over are read from memory
            # (paimon_group.store.handed_over); the rest from the store.
            io = HandedOverFileIO(pt.file_io, handed_over, self.table.manifest_dir())
            self._manifest_lists.file_io = io
            self._manifests.file_io = io
        # One attribute, replaced whole: a batch keeps the view it was planned
        # with (paimon_group.reading.read_view), whatever the planner switches to.
        self._view = view

    def _follow_schema(self, snapshot: Any) -> None:
        """Pick up a schema change before planning ``snapshot``.

        A snapshot committed under a schema newer than the one this planner
        reads with (``ALTER TABLE ... ADD COLUMN``) switches the read path to
        the table's latest schema, so that its rows, and every row after,
        come with the new columns, as a member started now would deliver
        them. Without this the columns of a running member would stay those
        of its start, forever.
        """
        schema_id = getattr(snapshot, "schema_id", None)
        if schema_id is None or int(schema_id) <= self._schema_id:
            return
        from pypaimon.schema.schema_manager import SchemaManager
        from pypaimon.table.file_store_table import FileStoreTable

        pt = self._pt
        latest = SchemaManager(pt.file_io, str(pt.table_path)).latest()
        if latest is None or int(latest.id) <= self._schema_id:
            return
        log.info("table %s: schema %d -> %d at snapshot %s: reading its new columns",
                 self.table.identifier, self._schema_id, int(latest.id), snapshot.id)
        self._build_read(FileStoreTable(pt.file_io, pt.identifier, pt.table_path, latest,
                                        pt.catalog_environment))

    def __repr__(self) -> str:
        return (
            f"ShardPlanner({self.table.identifier!r}, shards={self.num_shards}, "
            f"rule={self.sharding.rule.value}, follow_up={self.follow_up_kind.value})"
        )

    @property
    def schema(self) -> pa.Schema:
        """The arrow schema of what is read (``_row_kind`` first when requested)."""
        return self._view.schema

    @property
    def view(self) -> ReadView:
        """The readers of the current schema version (a batch keeps the one it
        was planned with: :mod:`paimon_group.reading.read_view`)."""
        return self._view

    @property
    def rule(self) -> ShardRule:
        return self.sharding.rule

    def shard_of(self, bucket: int, partition: Any = (), file_name: str = "") -> int:
        """The shard that holds a file of ``bucket`` in ``partition``."""
        return self.sharding.shard_of(partition, bucket, file_name)

    # -- planning ------------------------------------------------------------

    def _shard_set(self, shards: Iterable[int]) -> frozenset[int]:
        result = frozenset(int(s) for s in shards)
        bad = sorted(s for s in result if not 0 <= s < self.num_shards)
        if bad:
            raise PaimonGroupError(
                f"shards {bad} do not exist: this planner has shards 0..{self.num_shards - 1}"
            )
        return result

    def _bucket_filter(self, shard_set: frozenset[int]) -> Callable[[int], bool]:
        return self.sharding.bucket_filter(shard_set)

    def _entry_filter(self, shard_set: frozenset[int]) -> Callable[[Any], bool] | None:
        """Under a rule that needs more than the bucket, whether a decoded
        manifest entry is of a requested shard (None: the bucket filter
        already decides). An entry's ADD and DELETE name the same file, so
        they are kept or dropped together."""
        sharding = self.sharding
        if sharding.by_bucket_only or len(shard_set) == self.num_shards:
            return None
        return lambda entry: sharding.shard_of_entry(entry) in shard_set

    def _manifest_may_hold(self, meta: Any, shard_set: frozenset[int]) -> bool:
        """False only when a manifest's bucket range proves it has none of our buckets."""
        low, high = meta.min_bucket, meta.max_bucket
        if low is None or high is None:
            return True
        if high < 0:
            return False  # only pending (postpone) buckets: nothing a reader can see
        if len(shard_set) == self.num_shards or not self.sharding.by_bucket_only:
            return True
        low = max(int(low), 0)
        high = min(int(high), low + self.num_shards - 1)
        return any(b % self.num_shards in shard_set for b in range(low, high + 1))

    def _prune_manifests(self, manifests: Sequence[Any], shard_set: frozenset[int]) -> list[Any]:
        kept = [m for m in manifests if self._manifest_may_hold(m, shard_set)]
        self.stats.add(manifests_read=len(kept), manifests_skipped=len(manifests) - len(kept))
        return kept

    def _snapshot(self, snapshot_id: int) -> Any | None:
        self.stats.add(snapshots_read=1)
        return self.table.snapshot(snapshot_id)

    def _route(self, splits: Iterable[Split], shard_set: frozenset[int]) -> dict[int, list[Split]]:
        """Splits per requested shard; splits (or files) of other shards are
        dropped (with the bucket rule they were mostly filtered while decoding)."""
        return self.sharding.route(splits, shard_set)

    def _step(
        self,
        kind: BatchKind,
        first: int,
        last: int,
        routed: Mapping[int, Sequence[Split]],
    ) -> StepPlan:
        self.stats.add(steps_planned=1)
        return StepPlan(
            kind=kind,
            snapshot_id=last,
            next_snapshot=last + 1,
            splits=routed,
            num_shards=self.num_shards,
            first_snapshot=first,
            rule=self.sharding.rule,
        )

    def plan_full(self, shards: Iterable[int], snapshot_id: int) -> StepPlan:
        """The full content of ``snapshot_id`` for ``shards`` (kind INITIAL).

        Reads the snapshot's manifests once; ``next_snapshot`` is
        ``snapshot_id + 1``. Raises :class:`SnapshotExpired` if the snapshot
        has expired.
        """
        shard_set = self._shard_set(shards)
        snapshot = self._snapshot(snapshot_id)
        if snapshot is None:
            latest = self.table.latest_snapshot_id(fresh=True)
            if latest is not None and snapshot_id <= latest:
                raise self.table.expired_error(snapshot_id)
            self.table.raise_if_dropped()
            raise PaimonGroupError(
                f"cannot fully scan snapshot {snapshot_id} of table {self.table.identifier}: "
                f"it does not exist yet (latest: {latest})"
            )
        self._follow_schema(snapshot)
        if not shard_set:
            return self._step(BatchKind.INITIAL, snapshot_id, snapshot_id, {})

        def manifest_scanner() -> tuple[list[Any], Any]:
            manifests = self._manifest_lists.read_all(snapshot)
            self.stats.add(manifest_lists_read=2)
            return self._prune_manifests(manifests, shard_set), snapshot

        scanner = _ShardFileScanner(
            self._pt, manifest_scanner, self._bucket_filter(shard_set),
            self._entry_filter(shard_set), file_io=self._manifests.file_io,
        )
        with expired_if_gone(self.table, snapshot_id):  # a snapshot planned from memory too
            splits = scanner.scan().splits()
        return self._step(
            BatchKind.INITIAL, snapshot_id, snapshot_id, self._route(splits, shard_set)
        )

    def _should_scan(self, snapshot: Any) -> bool:
        """Whether a follow-up step reads ``snapshot``
        (:func:`~paimon_group.reading.steps.follow_up_scans`).

        An OVERWRITE snapshot (INSERT OVERWRITE, e.g. the rewrite of a bucket
        rescale) is skipped as Paimon's streaming reads skip it, but never
        silently: one warning line names it (once per snapshot).
        """
        scan = follow_up_scans(snapshot, changelog=self._changelog)
        if not scan and snapshot.commit_kind == "OVERWRITE":
            self._warn_overwrite(int(snapshot.id))
        return scan

    def _warn_overwrite(self, snapshot_id: int) -> None:
        if snapshot_id in self._overwrites_warned:
            return
        self._overwrites_warned.add(snapshot_id)
        log.warning(
            "snapshot %d of table %s is an OVERWRITE: a streaming read skips it, as Paimon's "
            "does, so the rows it rewrote are not delivered again; the rows it added anew are "
            "not delivered at all (read them with a batch read of snapshot %d)",
            snapshot_id, self.table.identifier, snapshot_id,
        )

    def _increment_manifests(self, snapshot: Any) -> list[Any]:
        self.stats.add(manifest_lists_read=1)
        return increment_manifests(self._manifest_lists, snapshot, changelog=self._changelog)

    def plan_next(self, shards: Iterable[int], next_snapshot: int, *, known_latest: int |
                  None = None, catch_up_threshold: int | None = None) -> StepPlan | None:
        """The next step for shards whose position is ``next_snapshot``.

        None when that snapshot does not exist yet. A delta or changelog step
        of that one snapshot, or, when more than ``catch_up_threshold``
        snapshots are unread (``latest - next_snapshot + 1``), one catch-up
        step to the latest. Raises :class:`SnapshotExpired` when
        ``next_snapshot`` is older than the earliest retained snapshot.
        ``known_latest``: a latest snapshot id found moments ago by someone
        else (the group's published head) that reaches ``next_snapshot``;
        the table is then not asked for it (a wrong one is caught as below);
        ``catch_up_threshold``: this step's, instead of the planner's."""
        if next_snapshot < 1:
            raise PaimonGroupError(f"snapshot ids start at 1, not {next_snapshot}")
        shard_set = self._shard_set(shards)
        if known_latest is not None and known_latest >= next_snapshot:
            latest: int | None = known_latest
        else:
            latest = self.table.latest_snapshot_id()
        if latest is None or next_snapshot > latest:
            return None
        try:
            with expired_if_gone(self.table, next_snapshot):
                return self._plan_next_to(shard_set, next_snapshot, latest, catch_up_threshold
                                          or self.catch_up_threshold)
        except SnapshotExpired:
            # The latest id may be one confirmed only by the absence of its
            # successor (ShardedTable.latest_snapshot_id): a table rolled back
            # or re-created under us has no snapshot `next_snapshot` yet, which
            # is not an expiry. Read it afresh, as before that shortcut.
            fresh = self.table.latest_snapshot_id(fresh=True)
            if fresh is None or next_snapshot > fresh:
                return None
            raise

    def _plan_next_to(self, shard_set: frozenset[int], next_snapshot: int, latest: int,
                      catch_up_threshold: int) -> StepPlan:
        unread = latest - next_snapshot + 1
        if unread > catch_up_threshold:
            return self._plan_catch_up(shard_set, next_snapshot, latest)
        snapshot = self._snapshot(next_snapshot)
        if snapshot is None:
            raise self.table.expired_error(next_snapshot)
        self._follow_schema(snapshot)
        if not self._should_scan(snapshot) or not shard_set:
            return self._step(
                self.follow_up_kind, next_snapshot, next_snapshot, {k: () for k in shard_set}
            )
        manifests = self._increment_manifests(snapshot)
        splits = self._increment_splits(manifests, shard_set, next_snapshot)
        return self._step(
            self.follow_up_kind, next_snapshot, next_snapshot, self._route(splits, shard_set)
        )

    def _plan_catch_up(self, shard_set: frozenset[int], first: int, last: int) -> StepPlan:
        manifests: list[Any] = []
        for snapshot_id in range(first, last + 1):
            snapshot = self._snapshot(snapshot_id)
            if snapshot is None:
                raise self.table.expired_error(snapshot_id)
            self._follow_schema(snapshot)
            if shard_set and self._should_scan(snapshot):
                manifests.extend(self._increment_manifests(snapshot))
        splits = self._increment_splits(manifests, shard_set, last) if shard_set else []
        return self._step(BatchKind.CATCH_UP, first, last, self._route(splits, shard_set))

    def _increment_splits(
        self, manifests: Sequence[Any], shard_set: frozenset[int], snapshot_id: int
    ) -> list[Split]:
        """Streaming splits of the increment manifests, in commit order per bucket."""
        from pypaimon.read.scanner.append_table_split_generator import AppendTableSplitGenerator

        kept = self._prune_manifests(manifests, shard_set)
        if not kept:
            return []
        bucket_ok = self._bucket_filter(shard_set)

        def only_adds(entry: Any) -> bool:
            if entry.kind != 0:
                raise _IncrementDeletesFile(entry.file.file_name)
            return True

        try:
            entries = self._manifests.read_entries_parallel(
                kept,
                manifest_entry_filter=only_adds,
                max_workers=self._max_workers,
                early_entry_filter=lambda bucket, _total: bucket_ok(bucket),
            )
        except _IncrementDeletesFile as err:
            raise PaimonGroupError(
                f"an incremental manifest of table {self.table.identifier} up to snapshot "
                f"{snapshot_id} deletes file {err}: not a streamable increment"
            ) from err
        sharding = self.sharding
        entries = [
            e for e in entries
            if bucket_ok(int(e.bucket))
            and (sharding.by_bucket_only or sharding.shard_of_entry(e) in shard_set)
        ]
        if not entries:
            return []
        options = self._pt.options
        # The append generator groups by (partition, bucket) keeping the order
        # the entries were committed in and packs files in that order; the
        # primary-key generator would reorder overlapping files into sorted
        # runs, which only matters for merged reads. Streaming splits of
        # primary-key tables are read file by file without merging.
        generator = AppendTableSplitGenerator(
            self._pt,
            options.source_split_target_size(),
            options.source_split_open_file_cost(),
            {},
            snapshot_id=snapshot_id,
        )
        splits: list[Split] = generator.create_splits(entries)
        for split in splits:
            split.is_streaming = True
        return splits

    # -- reading -------------------------------------------------------------

    def read_arrow(self, splits: Sequence[Split]) -> pa.Table:
        """All rows of ``splits`` as one table with :attr:`schema`: the
        Arrow reader's (``paimon_group.arrowread``), equal to pypaimon's."""
        return self._view.read_arrow(splits)

    def pypaimon_read_arrow(self, splits: Sequence[Split]) -> pa.Table:
        """:meth:`read_arrow` by pypaimon's reader."""
        return self._view.pypaimon_read_arrow(splits)

    def iter_batches(self, splits: Sequence[Split]) -> Iterator[pa.RecordBatch]:
        """Record batches of ``splits``, streamed, in split order, of at
        most :attr:`batch_rows` rows: the Arrow reader's, one split decoded
        at a time (its files in parallel), see ``paimon_group.arrowread``;
        pypaimon's (:meth:`pypaimon_iter_batches`) for splits it cannot read."""
        yield from self._view.iter_batches(splits)

    def pypaimon_iter_batches(self, splits: Sequence[Split]) -> Iterator[pa.RecordBatch]:
        """Record batches of ``splits`` by pypaimon's reader, in split order.

        Splits are read one after another, so that the changes of a bucket
        come out in commit order and at most one split is open at a time.
        Primary-key splits that pypaimon merges row by row (its Python
        reader) come out in batches of at most :attr:`batch_rows` rows:
        pypaimon's own batch reader gathers 65,536 merged rows before it
        converts them to Arrow (a constant, not an option), which for most
        buckets is the whole bucket. Splits read from raw files come out in
        pypaimon's batches of ``read.batch-size`` rows. After each split,
        Arrow's pool returns the memory it no longer uses to the system.
        """
        yield from self._view.pypaimon_iter_batches(splits)


class _ShardFileScanner(FileScanner):  # type: ignore[misc]
    """pypaimon's FileScanner with our bucket filter applied while manifests
    are decoded (entries of other shards' buckets are never materialised),
    and, under a rule that needs the partition or the file, our entry filter
    applied to each decoded entry (other shards' files never reach the split
    generator).

    If a later pypaimon stops calling ``_build_early_bucket_filter`` or
    ``_filter_manifest_entry``, plans stay exact:
    :meth:`ShardPlanner._route` drops splits (and files) of other shards.
    """

    def __init__(
        self,
        table: Any,
        manifest_scanner: Callable[[], Any],
        bucket_ok: Callable[[int], bool],
        entry_ok: Callable[[Any], bool] | None = None,
        file_io: Any = None,
    ) -> None:
        self._shard_bucket_ok = bucket_ok
        self._shard_entry_ok = entry_ok
        super().__init__(table, manifest_scanner)
        if file_io is not None:  # the planner's (handed-over files from memory)
            self.manifest_file_manager.file_io = file_io

    def _filter_manifest_entry(self, entry: Any) -> bool:
        if self._shard_entry_ok is not None and not self._shard_entry_ok(entry):
            return False
        return bool(super()._filter_manifest_entry(entry))

    def _build_early_bucket_filter(self) -> Callable[[int, int], bool]:
        inner = super()._build_early_bucket_filter()
        bucket_ok = self._shard_bucket_ok
        if inner is None:
            return lambda bucket, _total: bucket_ok(bucket)
        return lambda bucket, total: bucket_ok(bucket) and bool(inner(bucket, total))
