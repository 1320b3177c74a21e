"""The Paimon table a group reads: opening it, its snapshots, start positions.

:class:`ShardedTable` wraps one pypaimon ``FileStoreTable`` whose rows can be
sharded by bucket: shard ``k`` of ``S`` holds bucket ``b`` iff ``b % S == k``.
That needs every row of a key to stay in one bucket, so only fixed-bucket
tables (``bucket > 0``: primary-key tables, and append tables with a
bucket key) are accepted. Postpone-bucket tables (``bucket = -2``, rows wait
in a pending bucket until compaction assigns them), bucket-unaware append
tables (``bucket = -1`` without primary key: every file is in bucket 0) and
dynamic-bucket primary-key tables (``bucket = -1``: no fixed bucket count to
shard by) raise :class:`~paimon_group.errors.UnsupportedTable`.

Example::

    from paimon_group.start import parse_start
    from paimon_group.table import ShardedTable

    table = ShardedTable.open("/data/warehouse", "db.orders")
    start = table.resolve_start(parse_start("latest-full"))
    planner = table.planner(table.num_buckets)
    if start.full_scan_snapshot is not None:
        step = planner.plan_full(range(table.num_buckets), start.full_scan_snapshot)
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from coordinators.errors import ConfigError
from paimon_group.errors import SnapshotExpired, TableNotFound, UnsupportedTable
from paimon_group.start import ResolvedStart, StartKind, StartPosition

if TYPE_CHECKING:
    from paimon_group.planner import ShardPlanner

__all__ = ["ShardedTable"]

_TABLE_NAME_RE = re.compile(r"[^.\s]+\.[^.\s]+")
_SNAPSHOT_FILE_RE = re.compile(r"snapshot-(\d+)")


def _normalise_warehouse(warehouse: str) -> str:
    """Absolute path for a local warehouse (so every process names the same
    directory whatever its working directory); URLs are left as they are."""
    if "://" in warehouse:
        return warehouse
    return os.path.abspath(os.path.expanduser(warehouse))


class ShardedTable:
    """A fixed-bucket Paimon table, ready to be read shard by shard.

    Attributes: ``identifier`` (``"db.table"``), ``warehouse``,
    ``num_buckets``, ``table_path``, ``table`` (the pypaimon
    ``FileStoreTable``), ``is_primary_key_table`` and ``changelog_producer``
    (``"none"``, ``"input"``, ``"lookup"`` or ``"full-compaction"``).

    Snapshot ids are read fresh from the file system on every call: another
    process commits while we run.

    Example::

        table = ShardedTable.open("/data/warehouse", "db.orders")
        print(table.num_buckets, table.latest_snapshot_id())
    """

    def __init__(self, pypaimon_table: Any, *, warehouse: str, identifier: str) -> None:
        """Wrap an already-loaded pypaimon table; prefer :meth:`open`."""
        self.table: Any = pypaimon_table
        self.warehouse = warehouse
        self.identifier = identifier
        self.table_path: str = str(pypaimon_table.table_path)
        self.is_primary_key_table: bool = bool(pypaimon_table.is_primary_key_table)
        self.num_buckets: int = self._check_shardable()
        producer = pypaimon_table.options.changelog_producer()
        self.changelog_producer: str = str(getattr(producer, "value", producer) or "none")
        self._snapshot_manager: Any = pypaimon_table.snapshot_manager()

    @classmethod
    def open(
        cls,
        warehouse: str,
        table: str,
        catalog_options: Mapping[str, str] | None = None,
    ) -> ShardedTable:
        """Open ``table`` (``DB.TABLE``) from a filesystem warehouse.

        ``catalog_options`` are extra pypaimon catalog options (e.g. object
        store credentials); ``warehouse`` always wins over a ``warehouse`` key
        in them. Raises :class:`TableNotFound`, :class:`UnsupportedTable` or
        :class:`ConfigError` (malformed name).
        """
        from pypaimon import CatalogFactory
        from pypaimon.catalog.catalog_exception import (
            DatabaseNotExistException,
            TableNotExistException,
        )

        if not _TABLE_NAME_RE.fullmatch(table):
            raise ConfigError(f"bad table name {table!r}: expected DATABASE.TABLE, e.g. db.orders")
        location = _normalise_warehouse(warehouse)
        options = dict(catalog_options or {})
        options["warehouse"] = location
        try:
            catalog = CatalogFactory.create(options)
            loaded = catalog.get_table(table)
        except (TableNotExistException, DatabaseNotExistException) as err:
            raise TableNotFound(
                f"table {table} not found in warehouse {location}: check --warehouse and --table"
            ) from err
        except FileNotFoundError as err:
            raise TableNotFound(
                f"table {table} not found in warehouse {location}: check --warehouse and --table"
            ) from err
        except ValueError as err:
            raise ConfigError(f"cannot open table {table} in warehouse {location}: {err}") from err
        return cls(loaded, warehouse=location, identifier=table)

    def _check_shardable(self) -> int:
        bucket = int(self.table.options.bucket())
        name = self.identifier
        if bucket == -2:
            raise UnsupportedTable(
                f"table {name} uses postpone buckets (bucket = -2): its rows sit in a pending "
                "bucket until compaction assigns them, so they cannot be sharded by bucket; "
                "set a fixed 'bucket' count (> 0) on the table"
            )
        if bucket == -1 and not self.is_primary_key_table:
            raise UnsupportedTable(
                f"table {name} is a bucket-unaware append table (bucket = -1): every file is "
                "in bucket 0, so there is nothing to shard; recreate it with 'bucket' > 0 and "
                "a 'bucket-key'"
            )
        if bucket == -1:
            raise UnsupportedTable(
                f"table {name} uses dynamic buckets (bucket = -1): there is no fixed bucket "
                "count to shard by; set a fixed 'bucket' count (> 0) on the table"
            )
        if bucket <= 0:
            raise UnsupportedTable(f"table {name} has unsupported bucket option {bucket}")
        return bucket

    def __repr__(self) -> str:
        return f"ShardedTable({self.identifier!r}, buckets={self.num_buckets})"

    # -- snapshots -----------------------------------------------------------

    def _list_snapshot_ids(self) -> list[int]:
        manager = self._snapshot_manager
        file_io = manager.file_io
        if not file_io.exists(manager.snapshot_dir):
            return []
        ids = []
        for status in file_io.list_status(manager.snapshot_dir) or []:
            match = _SNAPSHOT_FILE_RE.fullmatch(str(status.path).rstrip("/").split("/")[-1])
            if match:
                ids.append(int(match.group(1)))
        return sorted(ids)

    def _read_hint(self, name: str) -> int | None:
        manager = self._snapshot_manager
        path = f"{manager.snapshot_dir}/{name}"
        try:
            if not manager.file_io.exists(path):
                return None
            text = manager.file_io.read_file_utf8(path).strip()
        except OSError:
            return None
        return int(text) if text.isdigit() else None

    def _snapshot_exists(self, snapshot_id: int) -> bool:
        manager = self._snapshot_manager
        return bool(manager.file_io.exists(manager.get_snapshot_path(snapshot_id)))

    def latest_snapshot_id(self) -> int | None:
        """Id of the newest committed snapshot, or None for an empty table.

        Reads the LATEST hint and checks it (the hint may lag a commit), falling
        back to listing the snapshot directory, like Paimon's ``findLatest``;
        no snapshot file is parsed.
        """
        hint = self._read_hint("LATEST")
        if hint is not None and self._snapshot_exists(hint) and not self._snapshot_exists(hint + 1):
            return hint
        ids = self._list_snapshot_ids()
        return ids[-1] if ids else None

    def earliest_snapshot_id(self) -> int | None:
        """Id of the oldest retained snapshot, or None for an empty table."""
        hint = self._read_hint("EARLIEST")
        if (
            hint is not None
            and self._snapshot_exists(hint)
            and (hint == 1 or not self._snapshot_exists(hint - 1))
        ):
            return hint
        ids = self._list_snapshot_ids()
        return ids[0] if ids else None

    def snapshot(self, snapshot_id: int) -> Any | None:
        """The pypaimon ``Snapshot`` with this id, or None if absent (expired or future)."""
        return self._snapshot_manager.get_snapshot_by_id(snapshot_id)

    def snapshot_commit_time_ms(self, snapshot_id: int) -> int | None:
        """Commit time (epoch ms) of a snapshot, or None if it does not exist."""
        snapshot = self.snapshot(snapshot_id)
        return None if snapshot is None else int(snapshot.time_millis)

    def expired_error(self, snapshot_id: int) -> SnapshotExpired:
        """The error for a position whose snapshot is gone (one loud line)."""
        earliest = self.earliest_snapshot_id()
        return SnapshotExpired(
            f"snapshot {snapshot_id} of table {self.identifier} has expired before it was read "
            f"(earliest retained: {earliest}): rows would be lost, so reading stops; reset the "
            "position explicitly, and keep consumer files from expiring"
        )

    # -- start positions -----------------------------------------------------

    def resolve_start(self, start: StartPosition) -> ResolvedStart:
        """Where a shard with no committed position starts (see :mod:`paimon_group.start`).

        An empty table resolves to follow-ups from snapshot 1 for every kind.
        ``snapshot:N`` below the earliest retained snapshot and ``timestamp:T``
        older than the earliest retained snapshot (when snapshots were expired)
        raise :class:`SnapshotExpired`: those rows are gone, and nothing is
        skipped silently.
        """
        latest = self.latest_snapshot_id()
        if start.kind is StartKind.SNAPSHOT:
            return self._resolve_snapshot(start, latest)
        if latest is None:
            return ResolvedStart(next_snapshot=1)
        if start.kind is StartKind.LATEST_FULL:
            return ResolvedStart(next_snapshot=latest + 1, full_scan_snapshot=latest)
        if start.kind is StartKind.LATEST:
            return ResolvedStart(next_snapshot=latest + 1)
        if start.kind is StartKind.EARLIEST:
            earliest = self.earliest_snapshot_id()
            if earliest is None:  # everything vanished between the two reads
                return ResolvedStart(next_snapshot=1)
            return ResolvedStart(next_snapshot=earliest + 1, full_scan_snapshot=earliest)
        if start.kind is StartKind.TIMESTAMP:
            return self._resolve_timestamp(start, latest)
        raise ConfigError(f"unsupported start position {start}")

    def _resolve_snapshot(self, start: StartPosition, latest: int | None) -> ResolvedStart:
        snapshot_id = start.snapshot_id
        if snapshot_id is None or snapshot_id < 1:
            raise ConfigError(f"bad start position {start}: snapshot ids start at 1")
        if latest is not None and snapshot_id <= latest and not self._snapshot_exists(snapshot_id):
            raise self.expired_error(snapshot_id)
        return ResolvedStart(next_snapshot=snapshot_id)

    def _resolve_timestamp(self, start: StartPosition, latest: int) -> ResolvedStart:
        if start.timestamp_ms is None:
            raise ConfigError(f"bad start position {start}: missing timestamp")
        target = start.timestamp_ms
        earliest = self.earliest_snapshot_id()
        if earliest is None:
            return ResolvedStart(next_snapshot=1)
        # Commit times grow with snapshot ids: binary search for the first
        # snapshot committed at or after the target.
        low, high = earliest, latest + 1
        while low < high:
            mid = (low + high) // 2
            snapshot = self.snapshot(mid)
            if snapshot is None:  # expired while we searched
                raise self.expired_error(mid)
            if int(snapshot.time_millis) >= target:
                high = mid
            else:
                low = mid + 1
        if low == earliest and earliest > 1:
            # Snapshots before the earliest retained one were expired; some of
            # them may have been committed after the target.
            raise SnapshotExpired(
                f"start {start} is not after the earliest retained snapshot {earliest} of table "
                f"{self.identifier}: snapshots committed after it may have expired; "
                "use --start earliest to read from the earliest retained snapshot"
            )
        return ResolvedStart(next_snapshot=low)

    # -- planning ------------------------------------------------------------

    def planner(
        self,
        num_shards: int,
        *,
        include_row_kind: bool = False,
        projection: Sequence[str] | None = None,
        catch_up_threshold: int = 10,
    ) -> ShardPlanner:
        """A :class:`~paimon_group.planner.ShardPlanner` for ``num_shards`` shards."""
        from paimon_group.planner import ShardPlanner

        return ShardPlanner(
            self,
            num_shards,
            include_row_kind=include_row_kind,
            projection=projection,
            catch_up_threshold=catch_up_threshold,
        )
