"""Paimon consumer files that mirror the coordinator's positions (invariant 5).

Each shard's position is mirrored into ``<table>/consumer/consumer-<id>`` with
the per-shard consumer id of :func:`paimon_group.protocol.names.consumer_id`, so that
Paimon's snapshot expiration keeps every snapshot a shard has not read yet and
Paimon's tools see the group's consumers.

A pending full scan (a pinned start: the full content of snapshot ``F`` is
still to be delivered) is mirrored as ``{"nextSnapshot": F,
"paimonGroupFullScan": F}``: ``nextSnapshot`` keeps ``F`` from expiring (Paimon's
expiration reads only that field; its readers, in Java too, ignore the other),
and the marker tells a shard that resumes from the file (after a wiped or
switched coordinator) that the full scan of ``F`` is still due, not only the
snapshots after it. Without the marker a resumed shard would skip everything
the table held before ``F``.

A position also carries the moves of the group start it derives from
(``"paimonGroupStartMoves": m``, when the writer knows them): after a switch,
a shard resumed from its file is re-pinned at the moved start unless its
position is of that start, so it reads the moved start's full scan whole.
A position alone does not tell which start it is of (a shard of the earlier
start may have read past the moved start's full scan), and on a
bucket-unaware table a compaction may have moved into the shard's files rows
no batch of the earlier start gave it, which only that full scan holds
(docs/reliability.md, "Snapshot expiry and ``--on-data-loss``"). A file
without the field (written by an operator's reset, or an earlier version) is
judged as before: :func:`paimon_group.member.ownership.file_start_moves`.

A file is written whole (:func:`paimon_group.store.files.write_whole`: on a
local file system a temporary ``.consumer-...tmp`` renamed over it, which
Paimon's listing of ``consumer-*`` files never sees; an object store's upload
is whole already), so a reader sees the old value or the new, with its
marker. A read that does not parse (a file torn by a crash, by a writer of an
older version rewriting it in place, or a foreign one) is read again, up to
:data:`READ_ATTEMPTS` times; one that still does not parse is never taken as
a plain position (that would turn a pending full scan into follow-ups and
skip the table's content before it), nor as no file (the shard would start
as configured, perhaps at the latest snapshot): :meth:`ConsumerMirror.read_position`
raises :class:`UnreadableConsumerFile`, and the member stops with that one
line. Only a shard without a coordinator position reads its file.

Ordering: a value is written here only *after* the coordinator accepted it,
so the file never runs ahead of the coordinator. It may lag (writes are
throttled to one per ``interval_s`` per shard, and forced on release), which
only keeps more snapshots alive. A stale owner's late write can move the file
back to an older, committed value, never past the coordinator. Unchanged
values are not rewritten.

Example::

    mirror = ConsumerMirror(table.file_io, table.table_path, "orders")
    mirror.write(3, 42, force=True)
    assert mirror.read(3) == 42
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from pypaimon.consumer.consumer import Consumer
from pypaimon.consumer.consumer_manager import ConsumerManager

from coordinators.errors import PaimonGroupError
from paimon_group.protocol.names import consumer_id, consumer_id_pattern, origin_path
from paimon_group.store.files import is_object_store, local_names, read_text, write_whole

PARALLEL_WRITES = 8
"""Consumer files written at once on an object store (:meth:`ConsumerMirror.write_many`)."""

LOCAL_MIRROR_INTERVAL_S = 1.0
"""Default least time between two writes of one shard's consumer file, local."""

OBJECT_STORE_MIRROR_INTERVAL_S = 10.0
"""The same on an object store, where a write is an upload of three requests
(pyarrow < 20): a consumer file that lags by seconds only keeps a few more
snapshots from expiring (Paimon retains one hour by default), as Kafka commits
offsets every 5 s by default; a release and a stop still write at once."""


def mirror_interval(configured: float | None, file_io: Any) -> float:
    """``configured``, or the default for where the table lives."""
    if configured is not None:
        return configured
    return OBJECT_STORE_MIRROR_INTERVAL_S if is_object_store(file_io) else LOCAL_MIRROR_INTERVAL_S


READ_ATTEMPTS = 5
"""Reads of a consumer file that does not parse, 0.1 s apart, before it is
:class:`UnreadableConsumerFile`."""


class UnreadableConsumerFile(PaimonGroupError):
    """A shard's consumer file exists and does not parse, read after read: its
    position (and whether a full scan is pending) is unknown. Not retriable:
    the file does not mend itself."""


FULL_SCAN_FIELD = "paimonGroupFullScan"
"""The consumer-file field that marks a pending full scan of ``nextSnapshot``."""

START_MOVES_FIELD = "paimonGroupStartMoves"
"""The consumer-file field with the moves of the group start the position derives from."""


@dataclass(frozen=True)
class MirroredPosition:
    """A shard's consumer file: the next snapshot, whether the full scan of
    that snapshot is still pending (then it is the snapshot to scan), and the
    moves of the group start it derives from (None: not recorded)."""

    next_snapshot: int
    full_scan_pending: bool = False
    start_moves: int | None = None


def _parse_position(text: str) -> MirroredPosition:
    """A consumer file's text as a position (raises if it is not one)."""
    data = json.loads(text)
    if not isinstance(data, dict):
        raise TypeError(f"not a JSON object: {type(data).__name__}")
    next_snapshot = int(data["nextSnapshot"])
    moves = data.get(START_MOVES_FIELD)
    return MirroredPosition(next_snapshot,
                            full_scan_pending=data.get(FULL_SCAN_FIELD) == next_snapshot,
                            start_moves=None if moves is None else int(moves))


def _position_text(next_snapshot: int, full_scan_pending: bool, start_moves: int | None) -> str:
    """A position as a consumer file's text: Paimon's own layout
    (``{"nextSnapshot": N}``), plus our fields when they say something."""
    if not full_scan_pending and start_moves is None:
        return str(Consumer(next_snapshot=next_snapshot).to_json())
    data: dict[str, int] = {"nextSnapshot": next_snapshot}
    if full_scan_pending:
        data[FULL_SCAN_FIELD] = next_snapshot
    if start_moves is not None:
        data[START_MOVES_FIELD] = start_moves
    return json.dumps(data)


class ConsumerMirror:
    def __init__(self, file_io: Any, table_path: str, group: str, interval_s: float = 1.0,
                 *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock  # the member's monotonic clock: paces the writes
        self._manager = ConsumerManager(file_io, table_path)
        self._file_io = file_io
        self._table_path = table_path
        self._group = group
        self._interval_s = interval_s
        self._written: dict[int, tuple[int, bool, int | None]] = {}
        self._written_at: dict[int, float] = {}
        self._lock = threading.Lock()  # the two dicts above
        # One lock a shard, held over its write: writes of different shards
        # go in parallel (write_many), two of one shard never cross.
        self._shard_locks: dict[int, threading.Lock] = {}
        self.writes = 0

    @property
    def file_io(self) -> Any:
        """The file system the consumer files are written through (the
        simulation's torn-write faults key on it)."""
        return self._file_io

    def read(self, shard: int) -> int | None:
        consumer = self._manager.consumer(consumer_id(self._group, shard))
        return None if consumer is None else int(consumer.next_snapshot)

    def read_position(self, shard: int) -> MirroredPosition | None:
        """The shard's consumer file with its pending-full-scan marker, or None
        (no file). A file that does not parse is read again; raises
        :class:`UnreadableConsumerFile` if it still does not after
        :data:`READ_ATTEMPTS` reads (see the module docstring)."""
        path = self._path(shard)
        problem = ""
        for attempt in range(READ_ATTEMPTS):
            if attempt:
                time.sleep(0.1)
            text = read_text(self._file_io, path)
            if text is None:
                return None
            try:
                return _parse_position(text)
            except (ValueError, KeyError, TypeError) as err:
                problem = f"{type(err).__name__}: {err}; content {text[:60]!r}"
        raise UnreadableConsumerFile(
            f"shard {shard}: consumer file {path} does not parse after {READ_ATTEMPTS} reads "
            f"({problem}): the shard has no coordinator position and its "
            "file's is unknown, so it is not guessed: delete the file (the shard then starts "
            "as one that never had a position, from the group's start) and, to start it "
            f"elsewhere, set its position (paimon-group reset ... --shard {shard}); then start "
            "the member again")

    def _path(self, shard: int) -> str:
        return f"{self._table_path.rstrip('/')}/consumer/consumer-{consumer_id(self._group, shard)}"

    def due(self, shard: int, next_snapshot: int, *, full_scan_pending: bool = False,
            start_moves: int | None = None) -> bool:
        """Whether an unforced :meth:`write` would write now (cheap: no I/O), so
        that a caller can skip handing a write that does nothing to an I/O thread."""
        with self._lock:
            return self._due(shard, (next_snapshot, full_scan_pending, start_moves), False,
                             self._clock())

    def _due(self, shard: int, value: tuple[int, bool, int | None], force: bool,
             now: float) -> bool:
        if self._written.get(shard) == value:
            return False
        return force or now - self._written_at.get(shard, -1e18) >= self._interval_s

    def write(self, shard: int, next_snapshot: int, *, force: bool = False,
              full_scan_pending: bool = False, start_moves: int | None = None) -> bool:
        """Mirror a committed position; True if the file was written.

        ``full_scan_pending``: the position is a pinned start whose full scan
        of ``next_snapshot`` is still to be delivered; ``start_moves``: the
        moves of the group start it derives from (see the module docstring).
        """
        value = (next_snapshot, full_scan_pending, start_moves)
        with self._lock:
            shard_lock = self._shard_locks.setdefault(shard, threading.Lock())
        with shard_lock:
            with self._lock:
                now = self._clock()
                if not self._due(shard, value, force, now):
                    return False
            content = _position_text(next_snapshot, full_scan_pending, start_moves)
            write_whole(self._file_io, self._path(shard), content)
            with self._lock:
                self._written[shard] = value
                self._written_at[shard] = now
                self.writes += 1
            return True

    def write_many(self, shards: Sequence[int], next_snapshot: int, *,
                   full_scan_pending: bool = False,
                   start_moves: Mapping[int, int] | None = None) -> dict[int, BaseException]:
        """:meth:`write` for several shards at one position (``start_moves``:
        each shard's); on an object store in parallel (each file is three
        requests there: a group's start marks every shard's pending full scan
        before its first row). The errors by shard (a failed write is retried
        by the next commit)."""
        moves = start_moves or {}

        def one(shard: int) -> BaseException | None:
            try:
                self.write(shard, next_snapshot, full_scan_pending=full_scan_pending,
                           start_moves=moves.get(shard))
            except Exception as err:
                return err
            return None

        if len(shards) > 1 and is_object_store(self._file_io):
            with ThreadPoolExecutor(max_workers=min(PARALLEL_WRITES, len(shards)),
                                    thread_name_prefix="pg-mirror") as pool:
                outcomes = list(pool.map(one, shards))
        else:
            outcomes = [one(shard) for shard in shards]
        return {shard: err for shard, err in zip(shards, outcomes, strict=True)
                if err is not None}

    def pending(self) -> dict[int, int]:
        """Nothing is buffered: throttled writes are retried by the next call."""
        return {}

    def all(self) -> dict[int, int]:
        """Every consumer file of this group: ``{shard: next_snapshot}``.

        Only this group's files are read: a table's directory also holds
        other groups' and other readers' files (one listing, then one read
        per file of ours; a file deleted between the two is skipped)."""
        import re

        pattern = re.compile(consumer_id_pattern(self._group))
        out: dict[int, int] = {}
        for cid in self._consumer_ids():
            if not pattern.match(cid):
                continue
            consumer = self._manager.consumer(cid)
            if consumer is not None:
                out[int(cid.rsplit("-", 1)[1])] = int(consumer.next_snapshot)
        return out

    def _consumer_ids(self) -> list[str]:
        """The ids of every consumer file of the table (a local directory's
        in one scan, not a ``stat`` per file)."""
        prefix = ConsumerManager.CONSUMER_PREFIX
        names = local_names(self._file_io, f"{self._table_path}/consumer")
        if names is None:
            return [str(cid) for cid in self._manager.list_all_ids()]
        return [n[len(prefix):] for n in names if n.startswith(prefix)]

    def delete_all(self) -> int:
        """Delete every consumer file of this group (and the record of which
        incarnation wrote them, :mod:`paimon_group.reading.consumer_meta`)."""
        shards = self.all()
        for shard in shards:
            self._manager.delete_consumer(consumer_id(self._group, shard))
        self._file_io.delete_quietly(origin_path(self._table_path, self._group))
        return len(shards)
