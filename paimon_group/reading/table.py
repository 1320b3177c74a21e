"""The Paimon table a group reads: opening it, its snapshots, start positions.

:class:`ShardedTable` wraps one pypaimon ``FileStoreTable`` and knows its
kind (:class:`~paimon_group.protocol.sharding.TableKind`): fixed buckets, dynamic
buckets (primary key, ``bucket = -1``), bucket-unaware append
(``bucket = -1``) or postpone buckets (``bucket = -2``, accepted only with a
compaction-made changelog). How its rows are spread over shards is the
group's sharding rule (:mod:`paimon_group.protocol.sharding`); variants no rule can
shard raise :class:`~paimon_group.errors.UnsupportedTable` with one line.

Example::

    from paimon_group.reading.start import parse_start
    from paimon_group.reading.table import ShardedTable

    table = ShardedTable.open("/data/warehouse", "db.orders")
    start = table.resolve_start(parse_start("latest-full"))
    planner = table.planner(table.default_shards)
    if start.full_scan_snapshot is not None:
        step = planner.plan_full(range(table.default_shards), start.full_scan_snapshot)
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from coordinators.credentials import scrub, secret_values
from coordinators.errors import ConfigError, PaimonGroupError
from coordinators.urls import redact_url
from paimon_group.errors import SnapshotExpired, TableNotFound, TableReplaced
from paimon_group.protocol.identity import table_identity
from paimon_group.protocol.sharding import (
    ShardRule,
    TableKind,
    choose_rule,
    default_shards,
    table_kind,
)
from paimon_group.reading.start import ResolvedStart, StartKind, StartPosition
from paimon_group.store import object_store
from paimon_group.store.files import FileProbe, is_object_store, read_text
from paimon_group.store.handed_over import HANDED_OVER_MAX, HandedOverFileIO, HandedOverFiles

if TYPE_CHECKING:
    from paimon_group.reading.planner import ShardPlanner

__all__ = ["ShardedTable"]

_TABLE_NAME_RE = re.compile(r"[^.\s]+\.[^.\s]+")
_SNAPSHOT_FILE_RE = re.compile(r"snapshot-(\d+)")

LATEST_PROBES = 8
"""Snapshots probed one by one past the known latest before the LATEST hint
is read instead (many new snapshots at once: a catch-up)."""

LATEST_RECHECK_S = 30.0
"""How long a latest snapshot id found by a full read (the LATEST hint,
checked) is confirmed by asking for the next snapshot alone."""

REMEMBERED_SNAPSHOTS = 4
"""How many snapshot texts handed over by the group's head a table keeps."""


def _location_to_open(warehouse: str) -> str:
    """The location pypaimon opens: an absolute path for a local warehouse
    (every process opens the same directory whatever its working directory);
    a URL as given, its scheme the one the store's client was set up for.
    Not the warehouse's name: the group records and compares that one
    (:func:`paimon_group.config.warehouses.normalised_warehouse`: symlinks
    resolved, ``file://`` dropped, ``s3a`` as ``s3``)."""
    if "://" in warehouse:
        return warehouse
    return os.path.abspath(os.path.expanduser(warehouse))


def _open_failure(err: Exception, table: str, location: str,
                  options: Mapping[str, str]) -> PaimonGroupError:
    """One line for a table that failed to open: a failed request to the object
    store (:func:`~paimon_group.store.object_store.store_failure`), else the
    error's first line with the warehouse redacted and secret option values
    scrubbed; a ``ValueError`` (pypaimon's bad option) as a ConfigError."""
    failure = object_store.store_failure(err, table, location, options)
    if failure is not None:
        return failure
    shown = redact_url(location)
    reason = _scrubbed(str(err).strip().split("\n", 1)[0], options).replace(location, shown)
    if isinstance(err, ValueError):
        return ConfigError(f"cannot open table {table} in warehouse {shown}: {reason}")
    return PaimonGroupError(f"cannot open table {table} in warehouse {shown}: "
                            f"{type(err).__name__}: {reason}")


def _scrubbed(text: str, options: Mapping[str, str]) -> str:
    return scrub(text, secret_values(options))


def _cause(err: Exception, location: str, options: Mapping[str, str]) -> Exception | None:
    """``err`` as the cause of the one-line error, or None when an error of its
    chain quotes a secret option value or the warehouse unredacted (a
    traceback would show it), or is an object store's failure (pyarrow's
    traceback adds nothing to the line)."""
    hidden = redact_url(location) != location
    seen: BaseException | None = err
    for _ in range(8):
        if seen is None:
            break
        text = str(seen)
        if _scrubbed(text, options) != text or (hidden and location in text) \
                or isinstance(seen, OSError):
            return None
        seen = seen.__cause__ or seen.__context__
    return err


class ShardedTable:
    """A Paimon table, ready to be read shard by shard.

    Attributes: ``identifier`` (``"db.table"``), ``warehouse``, ``kind``,
    ``num_buckets`` (None unless the kind is fixed), ``table_path``, ``table`` (the pypaimon
    ``FileStoreTable``), ``is_primary_key_table`` and ``changelog_producer``
    (``"none"``, ``"input"``, ``"lookup"`` or ``"full-compaction"``).

    Snapshot ids are read fresh from the file system on every call: another
    process commits while we run.

    Example::

        table = ShardedTable.open("/data/warehouse", "db.orders")
        print(table.num_buckets, table.latest_snapshot_id())
    """

    def __init__(self, pypaimon_table: Any, *, warehouse: str, identifier: str) -> None:
        """Wrap an already-loaded pypaimon table; prefer :meth:`open`.

        pypaimon's reader reads as the engine from here on
        (:func:`~paimon_group.reading.engine_reads.install_engine_reads`)."""
        from paimon_group.reading.engine_reads import install_engine_reads

        install_engine_reads()
        self.table: Any = pypaimon_table
        self.warehouse = warehouse
        self.identifier = identifier
        self.table_path: str = str(pypaimon_table.table_path)
        self.is_primary_key_table: bool = bool(pypaimon_table.is_primary_key_table)
        self.kind: TableKind = table_kind(pypaimon_table, identifier)
        bucket = int(pypaimon_table.options.bucket())
        self.num_buckets: int | None = bucket if self.kind is TableKind.FIXED else None
        producer = pypaimon_table.options.changelog_producer()
        self.changelog_producer: str = str(getattr(producer, "value", producer) or "none")
        self._snapshot_manager: Any = pypaimon_table.snapshot_manager()
        self._snapshot_files = FileProbe(self._snapshot_manager.file_io,
                                         self._snapshot_manager.snapshot_dir)
        # The identity the group was created on (set by the member when it
        # joins; "" unknown): see raise_if_dropped.
        self.expected_identity = ""
        # The monotonic clock of the rechecks below: the member's once it
        # opened the table (MemberCore.opened).
        self.clock: Callable[[], float] = time.monotonic
        # (latest snapshot id, monotonic time of the full read that found it)
        self._latest_known: tuple[int | None, float] = (None, 0.0)
        # Snapshot files' texts handed over by the group's head (member/head.py),
        # newest REMEMBERED_SNAPSHOTS; replaced whole, never changed in place
        # (read by planning threads).
        self._remembered: dict[int, str] = {}
        # Manifest lists and manifests handed over the same way (object stores).
        self.handed_over = HandedOverFiles()

    @classmethod
    def open(
        cls,
        warehouse: str,
        table: str,
        catalog_options: Mapping[str, str] | None = None,
        *,
        check: str = "check --warehouse and --table",
    ) -> ShardedTable:
        """Open ``table`` (``DB.TABLE``) from a filesystem warehouse.

        ``catalog_options`` are extra pypaimon catalog options (e.g. object
        store credentials); ``warehouse`` always wins over a ``warehouse`` key
        in them. Raises :class:`TableNotFound`, :class:`UnsupportedTable` or
        :class:`ConfigError` (malformed name). ``check`` ends the line of a
        table not found: the settings to check, as the caller names them.
        """
        loaded, location = cls.load(warehouse, table, catalog_options, check=check)
        return cls(loaded, warehouse=location, identifier=table)

    @staticmethod
    def load(
        warehouse: str,
        table: str,
        catalog_options: Mapping[str, str] | None = None,
        *,
        check: str = "check --warehouse and --table",
    ) -> tuple[Any, str]:
        """The pypaimon table ``table`` and the warehouse's location, as
        :meth:`open` loads them, without the checks of a table to read
        (a sink's target is checked for what it writes).

        The one place pypaimon is changed: before the table is loaded,
        :func:`~paimon_group.reading.engine_reads.install_engine_reads` makes
        pypaimon's reader, in this process, read as the engine reads (once;
        docs/design.md, "What we deliver equals what Paimon's engine reads")."""
        from pypaimon.catalog.catalog_exception import (
            DatabaseNotExistException,
            TableNotExistException,
        )

        if not _TABLE_NAME_RE.fullmatch(table):
            raise ConfigError(f"bad table name {table!r}: expected DATABASE.TABLE, e.g. db.orders")
        catalog, location, options = ShardedTable.open_catalog(warehouse, catalog_options,
                                                               for_table=table)
        try:
            loaded = catalog.get_table(table)
        except (TableNotExistException, DatabaseNotExistException, FileNotFoundError) as err:
            raise TableNotFound(
                f"table {table} not found in warehouse {redact_url(location)}: {check}"
            ) from err
        except PaimonGroupError:
            raise  # ours, one line already (an endpoint carrying credentials)
        except Exception as err:  # never a raw traceback quoting the warehouse
            raise _open_failure(err, table, location, options) \
                from _cause(err, location, options)
        return loaded, location

    @staticmethod
    def open_catalog(warehouse: str, catalog_options: Mapping[str, str] | None = None, *,
                     for_table: str = "tables") -> tuple[Any, str, dict[str, str]]:
        """The pypaimon catalog of ``warehouse`` (``catalog_options`` as
        :meth:`open` takes them), its location and the options it was made
        with: :meth:`load` opens one table in it, a group of several tables
        lists and opens all of its tables in one (:meth:`in_catalog`).
        Errors as :meth:`open`'s, in one line, naming ``for_table``."""
        from pypaimon import CatalogFactory

        from paimon_group.config.member import refuse_credentials_in_warehouse
        from paimon_group.reading.engine_reads import install_engine_reads

        refuse_credentials_in_warehouse(warehouse)
        install_engine_reads()
        location = _location_to_open(warehouse)
        options = dict(catalog_options or {})
        options["warehouse"] = location
        try:
            catalog = CatalogFactory.create(options)
            # Before the first request: pypaimon's S3 timeouts hang a wrong endpoint.
            object_store.bound_requests(catalog.file_io, location, options)
        except PaimonGroupError:
            raise
        except Exception as err:  # never a raw traceback quoting the warehouse
            raise _open_failure(err, for_table, location, options) \
                from _cause(err, location, options)
        return catalog, location, options

    @classmethod
    def in_catalog(cls, catalog: Any, location: str, table: str) -> ShardedTable:
        """Table ``table`` of an open catalog (:meth:`open_catalog`);
        TableNotFound if it is not there (dropped since it was listed)."""
        from pypaimon.catalog.catalog_exception import (
            DatabaseNotExistException,
            TableNotExistException,
        )

        try:
            loaded = catalog.get_table(table)
        except (TableNotExistException, DatabaseNotExistException, FileNotFoundError) as err:
            raise TableNotFound(
                f"table {table} not found in warehouse {redact_url(location)}") from err
        return cls(loaded, warehouse=location, identifier=table)

    @property
    def partitioned(self) -> bool:
        return bool(self.table.partition_keys)

    @property
    def default_rule(self) -> ShardRule:
        """The sharding rule a new group on this table gets
        (:mod:`paimon_group.protocol.sharding`)."""
        return choose_rule(self.table, self.kind)

    @property
    def default_shards(self) -> int:
        """Shard count of a new group without ``--shards``: the bucket count of a
        fixed-bucket table, else :data:`~paimon_group.protocol.sharding.DEFAULT_SHARDS`."""
        return default_shards(self.kind, self.num_buckets)

    def __repr__(self) -> str:
        buckets = self.num_buckets if self.num_buckets is not None else self.kind.value
        return f"ShardedTable({self.identifier!r}, buckets={buckets})"

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
        try:
            text = read_text(manager.file_io, f"{manager.snapshot_dir}/{name}")
        except OSError:
            return None
        text = (text or "").strip()
        return int(text) if text.isdigit() else None

    def _snapshot_exists(self, snapshot_id: int) -> bool:
        # get_snapshot_path's name; plain whatever the id
        return self._snapshot_files.exists_plain(f"snapshot-{snapshot_id}")

    def latest_snapshot_id(self, *, fresh: bool = False) -> int | None:
        """Id of the newest committed snapshot, or None for an empty table.

        Reads the LATEST hint and checks it (the hint may lag a commit), falling
        back to listing the snapshot directory, like Paimon's ``findLatest``;
        no snapshot file is parsed. Between such reads (at most
        :data:`LATEST_RECHECK_S` apart, or with ``fresh``), the latest id found
        is confirmed by asking for the one snapshot after it: one request on an
        object store instead of four for a table with no new snapshot (what
        an idle poll costs). Snapshot ids only grow; a table rolled back or
        re-created under us is found by the full read (and by the planner,
        which asks ``fresh`` when a snapshot at or below this id is missing).
        """
        known, checked = self._latest_known
        if not fresh and known is not None and self.clock() - checked < LATEST_RECHECK_S:
            # Probe forward from the known latest, as Paimon's findLatest
            # does after its hint: one request per new snapshot and one more.
            probe = known + 1
            while probe - known <= LATEST_PROBES and self._snapshot_exists(probe):
                probe += 1
            if probe - known <= LATEST_PROBES:
                self._latest_known = (probe - 1, checked)
                return probe - 1
        hint = self._read_hint("LATEST")
        if hint is not None and self._snapshot_exists(hint) and not self._snapshot_exists(hint + 1):
            latest: int | None = hint
        else:
            ids = self._list_snapshot_ids()
            latest = ids[-1] if ids else None
        self._latest_known = (latest, self.clock())
        return latest

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
        """The pypaimon ``Snapshot`` with this id, or None if absent (expired or
        future). Read with one open (pypaimon's manager asks ``exists()`` first:
        three requests on an object store, two here), parsed as pypaimon does;
        or taken from a text the group's head handed over
        (:meth:`remember_snapshot`): no request."""
        from pypaimon.common.json_util import JSON
        from pypaimon.snapshot.snapshot import Snapshot

        text = self._remembered.get(snapshot_id)
        if text is None:
            text = self.snapshot_text(snapshot_id)
        return None if text is None else JSON.from_json(text, Snapshot)

    def snapshot_retained(self, snapshot_id: int) -> bool:
        """Whether the file of snapshot ``snapshot_id`` is in the store (asked
        of the store, never of the texts remembered: they outlive an expiry;
        :mod:`paimon_group.reading.expiry`)."""
        return self._snapshot_exists(snapshot_id)

    def snapshot_text(self, snapshot_id: int) -> str | None:
        """The text of a snapshot's file, read from the store (None: absent)."""
        manager = self._snapshot_manager
        return read_text(manager.file_io, manager.get_snapshot_path(snapshot_id))

    def remember_snapshot(self, snapshot_id: int | None, text: str | None) -> None:
        """Keep the text of snapshot ``snapshot_id``'s file as read by another
        member moments ago (the group's head), so that planning it costs no
        request. A snapshot file is written once under its id and never
        changed; a table re-created under the same name, whose ids start again,
        is caught by the identity checks (and a text of another table's
        snapshot names manifests this table does not have: the plan fails
        loudly, never reads wrong rows). Only the newest few are kept."""
        if snapshot_id is None or text is None or self._remembered.get(snapshot_id) == text:
            return
        kept = dict(self._remembered)
        kept[snapshot_id] = text
        for old in sorted(kept)[:-REMEMBERED_SNAPSHOTS]:
            del kept[old]
        self._remembered = kept

    def forget_snapshots(self) -> None:
        """Drop the snapshot texts and files kept (the table was found gone or
        replaced)."""
        self._remembered = {}
        self.handed_over.clear()

    def manifest_dir(self) -> str:
        return f"{self.table_path.rstrip('/')}/manifest"

    def follow_up_files(self, snapshot_text: str) -> dict[str, bytes]:
        """The manifest list and manifests a follow-up step of this snapshot
        reads (its changelog ones with a changelog producer), read from an
        object store to be handed over with the group's head
        (:mod:`paimon_group.store.handed_over`): up to ``HANDED_OVER_MAX`` bytes in
        all, the list first. Empty on a local file system (reads cost nothing
        there) and for a snapshot that follow-up steps skip."""
        from pypaimon.common.json_util import JSON
        from pypaimon.manifest.manifest_list_manager import ManifestListManager
        from pypaimon.snapshot.snapshot import Snapshot

        from paimon_group.reading.steps import follow_up_scans

        file_io = self.table.file_io
        changelog = self.changelog_producer != "none"
        snapshot = JSON.from_json(snapshot_text, Snapshot)
        if not is_object_store(file_io) or not follow_up_scans(snapshot, changelog=changelog):
            return {}
        name = snapshot.changelog_manifest_list if changelog else snapshot.delta_manifest_list
        directory = self.manifest_dir()
        files: dict[str, bytes] = {}
        budget = HANDED_OVER_MAX

        def take(file_name: str) -> bool:
            nonlocal budget
            def read() -> bytes:
                with file_io.new_input_stream(f"{directory}/{file_name}") as source:
                    got: bytes = source.read()
                return got

            # Kept: this member plans from it too (and a new group's first
            # look at its table may be reading it now: read once).
            data = self.handed_over.fetch(file_name, read)
            if len(data) > budget:
                return False
            files[file_name] = data
            budget -= len(data)
            return True

        if not name or not take(name):
            return {}
        lists = ManifestListManager(self.table)
        held = HandedOverFiles()
        held.add(files)
        lists.file_io = HandedOverFileIO(file_io, held, directory)
        for meta in lists.read(name):
            if not take(meta.file_name):
                break
        return files

    def snapshot_commit_time_ms(self, snapshot_id: int) -> int | None:
        """Commit time (epoch ms) of a snapshot, or None if it does not exist."""
        snapshot = self.snapshot(snapshot_id)
        return None if snapshot is None else int(snapshot.time_millis)

    def raise_if_dropped(self) -> None:
        """Raise :class:`TableNotFound` if the table's schema directory is gone
        (the table was dropped under us), :class:`TableReplaced` if it is
        another table now (re-created; when the group's identity is known).
        For a planner that finds a snapshot it pinned missing and none after
        it: a dropped or re-created table, not one whose
        snapshot is still to come (which would say "does not exist yet" for
        a dropped table)."""
        file_io = self._snapshot_manager.file_io
        if not file_io.exists(f"{self.table_path}/schema"):
            raise TableNotFound(
                f"table {self.identifier} not found in warehouse {self.warehouse}: it was "
                "dropped while the group read it"
            )
        # A table of that name that is another table: dropped and re-created
        # (a pinned snapshot of the old table does not "exist yet": it never
        # will, and a host waiting for it would wait for ever).
        current = table_identity(self.table) if self.expected_identity else ""
        if current and current != self.expected_identity:
            raise TableReplaced(
                f"table {self.identifier} was dropped and re-created while the group read it "
                f"(table identity {self.expected_identity}, now {current}): the group's "
                "positions belong to the old table, so nothing more is read"
            )

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
        """Where a shard with no committed position starts (see :mod:`paimon_group.reading.start`).

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
        rule: ShardRule | None = None,
    ) -> ShardPlanner:
        """A :class:`~paimon_group.reading.planner.ShardPlanner` for ``num_shards`` shards
        under ``rule`` (default: :attr:`default_rule`; a group passes its own)."""
        from paimon_group.reading.planner import ShardPlanner

        return ShardPlanner(
            self,
            num_shards,
            rule=rule,
            include_row_kind=include_row_kind,
            projection=projection,
            catch_up_threshold=catch_up_threshold,
        )
