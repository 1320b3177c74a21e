"""One poll of the table per group: the leader polls, the members watch.

Without this every member asks the store for a new snapshot at every poll
interval, N members N times the requests for the same answer (on an object
store each is billed). Instead:

* the **leader** polls the table (one request per poll interval: the snapshot
  after the latest it knows) and publishes the latest snapshot id in the
  coordinator key ``groups/<group>/table/head``, when it changes and at least
  every :data:`HEAD_BEAT_S` (the *beat*, so that members can tell a live
  publisher from a gone one), guarded by its leader epoch (a deposed leader
  cannot publish; the key's one writer is
  :class:`~paimon_group.protocol.table_head.TableHead`);
* every **member** watches that key: a new latest wakes its read loop at once,
  and while the record is fresh its read loop skips the store for shards
  already past the published latest (:meth:`HeadView.nothing_new_at`);
* a member whose record is not fresh (no beat seen for :data:`HEAD_STALE_S`:
  no leader, a leader that cannot reach the store, an older version leading)
  polls the table by itself, as before. So no snapshot is missed: the
  record only ever lets a member skip looking for a snapshot the leader
  found absent moments ago.

The record also carries what every member would otherwise fetch for itself:

* the **text of the latest snapshot's file** (when it is at most
  :data:`HEAD_SNAPSHOT_MAX` bytes): the members that plan that snapshot take
  it from their table's memory (:meth:`ShardedTable.remember_snapshot`)
  instead of reading it, two requests each on an object store. A snapshot
  file is written once under its id and never changed; a table re-created
  under the same name (ids used again) is caught by the identity check;
* on an object store, the **manifest list and manifests** a follow-up step of
  that snapshot reads (:mod:`paimon_group.store.handed_over`, up to 64 KiB), in the
  publication of a new latest only (not in the beats): members plan from
  them instead of reading them, four requests each;
* the **table's identity** as the leader's last check found it (every
  :data:`TABLE_CHECK_S`): while the record is fresh and names the group's
  table, members skip their own check (two requests each every 5 s). A
  leader that finds the table gone or replaced publishes that at once (the
  members then check, and stop, by themselves); one that cannot check
  publishes no identity (they check by themselves).

So an idle group makes the same requests whatever its number of members, and
a new snapshot costs each member only the manifests its shards need.

The head is a hint, never a position: plans are still made from the table's
own files (invariant 4), positions still only move by fenced commits.

Example::

    view = HeadView(stale_after_s=15.0, clock=lambda: 100.0)
    assert not view.nothing_new_at(5)                  # nothing seen: poll
    view.observe(HeadRecord(latest=4, beat=1))
    assert view.nothing_new_at(5) and not view.nothing_new_at(4)
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import functools
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from coordinators.errors import CoordinatorError
from coordinators.protocol import Coordinator
from paimon_group.protocol.names import GroupKeys
from paimon_group.protocol.table_head import TableHead

__all__ = [
    "HEAD_BEAT_S", "HEAD_SNAPSHOT_MAX", "HEAD_STALE_S", "HEAD_VOUCH_S", "TABLE_CHECK_S",
    "HeadLoop", "HeadPublisher", "HeadRecord", "HeadView", "TablePoll", "TablePoller",
]

log = logging.getLogger("paimon_group.member")

HEAD_BEAT_S = 5.0
"""The leader republishes the head at least this often, changed or not."""

HEAD_STALE_S = 3 * HEAD_BEAT_S
"""A head record not seen to beat for this long is not trusted: members poll."""

HEAD_SNAPSHOT_MAX = 8 * 1024
"""The largest snapshot file carried in the head (a snapshot file is about
1 KiB; the record goes to every member on every beat)."""

TABLE_CHECK_S = 5.0
"""How often the table is checked to exist and be the group's: by the leader
for the group while the head is fresh, else by each member."""

HEAD_VOUCH_S = 1.5 * HEAD_BEAT_S
"""How long after its last beat a head record stands for the table's identity
(shorter than :data:`HEAD_STALE_S`). A leader that stops beating may have
stopped because it found the table replaced, without saying so (it failed
in its read loop first); its last identity is up to TABLE_CHECK_S old when
published. Trusting it for 15 s more would put a member's notice of a
re-created table past 20 s; the worst case is
TABLE_CHECK_S + HEAD_VOUCH_S + TABLE_CHECK_S = 17.5 s. A live leader beats
every HEAD_BEAT_S plus at most one poll interval: with a poll interval up to
2.5 s the vouching never lapses; beyond it members check now and then."""


@dataclass(frozen=True)
class TablePoll:
    """What the leader found polling the table: the latest snapshot id (None:
    empty table), the text of that snapshot's file (None: not read, or too
    large) and the table's identity at the last check (None: not checked or
    the check failed; ``""``: the table is gone)."""

    latest: int | None
    snapshot: str | None = None
    table_id: str | None = None
    files: Mapping[str, bytes] | None = None
    # A group of several tables: each table's latest snapshot id by the
    # first group shard of its range (a table not polled is left out).
    tables: Mapping[int, int | None] | None = None
    # Whether ``tables`` holds only tables that the leader's last identity
    # check (at most TABLE_CHECK_S before) found in place: then they are
    # vouched for as the one table of a group is by ``table_id``.
    tables_checked: bool = False


@dataclass(frozen=True)
class HeadRecord:
    """The published head: a :class:`TablePoll` and a beat counter that every
    publication increases. Records of an older version have only ``latest``
    and ``beat``: the rest decodes as unknown."""

    latest: int | None
    beat: int
    snapshot: str | None = None
    table_id: str | None = None
    files: Mapping[str, bytes] | None = None
    tables: Mapping[int, int | None] | None = None  # as TablePoll's
    tables_checked: bool = False  # as TablePoll's

    def encode(self) -> bytes:
        files = None if self.files is None else \
            {name: base64.b64encode(data).decode() for name, data in self.files.items()}
        doc: dict[str, Any] = {"latest": self.latest, "beat": self.beat,
                               "snapshot": self.snapshot, "table_id": self.table_id,
                               "files": files}
        if self.tables is not None:
            doc["tables"] = {str(first): latest for first, latest in self.tables.items()}
            if self.tables_checked:
                doc["tables_checked"] = True
        return json.dumps(doc).encode()

    @classmethod
    def decode(cls, data: bytes | None) -> HeadRecord | None:
        """The record, or None for no key or one we cannot read."""
        if data is None:
            return None
        try:
            doc = json.loads(data)
            latest = doc["latest"]
            snapshot, table_id = doc.get("snapshot"), doc.get("table_id")
            files, tables = doc.get("files"), doc.get("tables")
            return cls(None if latest is None else int(latest), int(doc["beat"]),
                       snapshot if isinstance(snapshot, str) else None,
                       table_id if isinstance(table_id, str) else None,
                       {str(k): base64.b64decode(v) for k, v in files.items()}
                       if isinstance(files, dict) else None,
                       _tables_of(tables) if isinstance(tables, dict) else None,
                       isinstance(tables, dict) and doc.get("tables_checked") is True)
        except (ValueError, KeyError, TypeError, AttributeError, binascii.Error):
            return None


# The last table map decoded, as read and as decoded: the beats between two
# new snapshots carry the same map (200 ids at 200 tables), decoded once.
_last_tables: tuple[dict[str, Any], Mapping[int, int | None]] = ({}, {})


def _tables_of(raw: dict[str, Any]) -> Mapping[int, int | None]:
    """The ``tables`` of a head record, as read (``{"first": latest}``),
    decoded; the same mapping, not a copy, while the map is unchanged
    (records are read-only). Raises as the decode would on a malformed map."""
    global _last_tables
    last_raw, last = _last_tables
    if raw == last_raw:
        return last
    decoded = {int(k): None if v is None else int(v) for k, v in raw.items()}
    _last_tables = (raw, decoded)
    return decoded


@functools.lru_cache(maxsize=4)
def decoded_head(value: bytes | None) -> HeadRecord | None:
    """:meth:`HeadRecord.decode`, once per process for the same bytes: every
    member of a process reads the same record at each publication, and a group
    of 200 tables' record carries 200 snapshot ids. Read-only, as
    :func:`~paimon_group.protocol.records.decoded_meta`'s."""
    return HeadRecord.decode(value)


class HeadView:
    """What a member knows of the published head (I/O free, injectable clock)."""

    def __init__(self, *, stale_after_s: float | None = None,
                 vouch_s: float | None = None,
                 clock: Callable[[], float] | None = None) -> None:
        self._stale_after_s = HEAD_STALE_S if stale_after_s is None else stale_after_s
        self._vouch_s = min(self._stale_after_s, HEAD_VOUCH_S if vouch_s is None else vouch_s)
        self.clock = clock or time.monotonic
        self.record: HeadRecord | None = None
        self._beat_seen_at = -1e18

    def observe(self, record: HeadRecord | None, *, beat: bool = True) -> bool:
        """Take a record read from the coordinator; True when its latest is
        newer than the one known (a reader should look now). ``beat=False``:
        the record found at the start of a session, which may be a gone
        leader's last one: it is kept, but not fresh until it changes."""
        if record is None:
            return False
        known = self.record
        if known is not None and record.beat == known.beat and record.latest == known.latest:
            return False  # the same publication read again: not a beat
        self.record = record
        if beat:
            self._beat_seen_at = self.clock()
        if record.tables is not None:
            before = known.tables if known is not None and known.tables is not None else {}
            if before == record.tables:
                return False  # a beat alone: one comparison, not a walk of every table
            return any(latest is not None and latest > (before.get(first) or -1)
                       for first, latest in record.tables.items())
        old = -1 if known is None or known.latest is None else known.latest
        return record.latest is not None and record.latest > old

    def forget(self) -> None:
        """A new session (rejoin): nothing is trusted until seen again."""
        self.record = None
        self._beat_seen_at = -1e18

    @property
    def fresh(self) -> bool:
        return self.record is not None and \
            self.clock() - self._beat_seen_at < self._stale_after_s

    def nothing_new_at(self, position: int) -> bool:
        """Whether a shard whose next snapshot is ``position`` may skip asking
        the store: the head is fresh and says that snapshot does not exist."""
        if not self.fresh:
            return False
        assert self.record is not None
        return self.record.latest is None or position > self.record.latest

    def nothing_new_in(self, first: int, position: int) -> bool:
        """:meth:`nothing_new_at` for the table of a group of several tables
        whose range starts at group shard ``first``."""
        if not self.fresh:
            return False
        assert self.record is not None
        tables = self.record.tables
        if tables is None or first not in tables:
            return False
        latest = tables[first]
        return latest is None or position > latest

    def vouches_for_table(self, first: int) -> bool:
        """:meth:`vouches_for` for the table of a group of several tables whose
        range starts at group shard ``first``: the leader's last identity
        check found it in place (its range's identity: a range is never used
        again for another table, a re-created one gets a range of its own)."""
        if self.record is None or self.clock() - self._beat_seen_at >= self._vouch_s:
            return False
        record = self.record
        return record.tables_checked and record.tables is not None and first in record.tables

    def vouches_for(self, table_id: str) -> bool:
        """Whether a beat was seen in the last :data:`HEAD_VOUCH_S` and its
        leader's last check found the group's table (``table_id``; ``""``: a
        group of an older version, which knows no identity: any table that
        exists) in place: then a member need not check it itself."""
        if self.record is None or self.clock() - self._beat_seen_at >= self._vouch_s:
            return False
        assert self.record is not None
        found = self.record.table_id
        return bool(found) and (not table_id or found == table_id)


class TablePoller:
    """The leader's poll of the table (blocking: run it off the event loop).

    ``latest`` finds the latest snapshot id, ``snapshot_text`` reads a
    snapshot's file (None: absent), ``identity`` the table's identity
    (:func:`paimon_group.protocol.identity.table_identity`). A snapshot's text is read
    once per new latest; the identity every ``check_every_s``.
    """

    def __init__(self, *, latest: Callable[[], int | None],
                 snapshot_text: Callable[[int], str | None], identity: Callable[[], str],
                 files: Callable[[str], Mapping[str, bytes]] | None = None,
                 check_every_s: float | None = None,
                 clock: Callable[[], float] | None = None) -> None:
        self._latest, self._snapshot_text, self._identity = latest, snapshot_text, identity
        self._files = files
        self._files_of: tuple[int | None, Mapping[str, bytes] | None] = (None, None)
        self._check_every_s = check_every_s
        self._clock = clock or time.monotonic
        self._text_of: tuple[int | None, str | None] = (None, None)
        self._table_id: str | None = None
        self._checked_at = -1e18

    def poll(self) -> TablePoll:
        latest = self._latest()  # errors: the head loop skips this tick
        if latest is not None and self._text_of[0] != latest:
            try:
                text = self._snapshot_text(latest)
            except Exception as err:  # the members read it themselves
                log.debug("snapshot %s not read for the table head: %s", latest, err)
                text = None
            self._text_of = (latest, text if text is not None
                             and len(text.encode()) <= HEAD_SNAPSHOT_MAX else None)
            self._files_of = (latest, self._follow_up_files(text))
        every = TABLE_CHECK_S if self._check_every_s is None else self._check_every_s
        if self._clock() - self._checked_at >= every:
            try:
                self._table_id = self._identity()
            except Exception as err:  # the members check by themselves
                log.debug("table not checked for the table head: %s", err)
                self._table_id = None
            self._checked_at = self._clock()
        text = self._text_of[1] if self._text_of[0] == latest else None
        files = self._files_of[1] if self._files_of[0] == latest else None
        return TablePoll(latest, text, self._table_id, files)

    def _follow_up_files(self, text: str | None) -> Mapping[str, bytes] | None:
        if text is None or self._files is None:
            return None
        try:
            return self._files(text) or None
        except Exception as err:  # the members read them themselves
            log.debug("manifests not read for the table head: %s", err)
            return None


class HeadPublisher:
    """When the leader publishes (I/O free): on a change, or on the beat."""

    def __init__(self, *, beat_s: float | None = None,
                 clock: Callable[[], float] | None = None) -> None:
        self._beat_s = HEAD_BEAT_S if beat_s is None else beat_s
        self._clock = clock or time.monotonic
        self.published: HeadRecord | None = None
        self._published_at = -1e18

    def due(self, poll: TablePoll | int | None) -> HeadRecord | None:
        """The record to publish now for what was polled (or a bare latest
        id), or None: on a new latest or identity, or on the beat."""
        if not isinstance(poll, TablePoll):
            poll = TablePoll(poll)
        last = self.published
        if last is not None and last.latest == poll.latest and \
                last.table_id == poll.table_id and last.tables == poll.tables and \
                last.tables_checked == poll.tables_checked and \
                self._clock() - self._published_at < self._beat_s:
            return None
        # The files go with the publication of a new latest only: the beats
        # that follow, sent to every member every few seconds, stay small.
        new_latest = last is None or last.latest != poll.latest
        return HeadRecord(poll.latest, (last.beat + 1) if last is not None else 1,
                          poll.snapshot, poll.table_id, poll.files if new_latest else None,
                          None if poll.tables is None else dict(poll.tables),
                          poll.tables_checked and poll.tables is not None)

    def done(self, record: HeadRecord) -> None:
        self.published = record
        self._published_at = self._clock()

    def reset(self) -> None:
        """Leadership lost or regained: the next poll publishes."""
        self.published = None
        self._published_at = -1e18


class HeadLoop:
    """Runs for one session of a member: publishes when it leads, follows
    otherwise (see the module docstring).

    ``poll``: polls the table (:class:`TablePoller`, off the event loop);
    ``leader_epoch``: ours, or None when we do not lead; ``woken``: called
    when the head shows a new snapshot; ``learned``: called with every record
    published or read (the member keeps its snapshot text).
    """

    def __init__(self, coord: Coordinator, keys: GroupKeys, view: HeadView, *,
                 poll_s: float, poll: Callable[[], Awaitable[TablePoll]],
                 leader_epoch: Callable[[], int | None], woken: Callable[[], None],
                 learned: Callable[[HeadRecord], None] | None = None) -> None:
        self._head, self.view = TableHead(coord, keys), view
        self._poll_s = poll_s
        self._poll, self._leader_epoch, self._woken = poll, leader_epoch, woken
        self._learned = learned
        self._publisher = HeadPublisher(clock=view.clock)  # the member's clock
        self._stopped = False

    def stop(self) -> None:
        """End :meth:`run` at its next tick. Besides cancelling its task: on
        Python 3.11 ``asyncio.wait_for`` can swallow a cancel that arrives as
        the awaited event fires (the loop would run on, and a member's stop
        would wait for it until the run ended)."""
        self._stopped = True

    async def run(self) -> None:
        watch = self._head.watch()
        try:
            unread = not await self._read(beat=False)
            while not self._stopped:
                epoch = self._leader_epoch()
                if epoch is None:
                    self._publisher.reset()
                    # A read that failed is tried again at the next tick: the
                    # change its watch reported would otherwise be missed
                    # until the next beat, or never if no beat comes.
                    if await watch.wait(self._poll_s) or unread:
                        unread = not await self._read()
                    continue
                try:
                    await self._publish(epoch)
                except CoordinatorError as err:
                    log.debug("table head not published: %s", err)
                await asyncio.sleep(self._poll_s)
        finally:
            with contextlib.suppress(Exception):
                await watch.close()

    async def _read(self, *, beat: bool = True) -> bool:
        """Read the head into the view; False when the coordinator did not answer."""
        try:
            value = await self._head.read()
        except CoordinatorError as err:
            log.debug("table head not read: %s", err)
            return False
        self._observe(decoded_head(value), beat=beat)
        return True

    def _observe(self, record: HeadRecord | None, *, beat: bool = True) -> None:
        if record is not None and self._learned is not None:
            self._learned(record)  # before the wake-up: the reader plans from it
        if self.view.observe(record, beat=beat):
            self._woken()

    async def _publish(self, epoch: int) -> None:
        try:
            polled = await self._poll()
        except Exception as err:  # the readers poll by themselves and report it
            log.debug("table head not polled: %s", err)
            return
        record = self._publisher.due(polled)
        if record is None:
            return
        if await self._head.publish(epoch, record.encode()):
            self._publisher.done(record)
            self._observe(record)
