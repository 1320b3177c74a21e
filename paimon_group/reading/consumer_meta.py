"""Which group incarnation wrote a group's Paimon consumer files, and whether a
shard may resume from them.

The consumer files (``consumer-pg-<group>-shard-<k>``, :mod:`paimon_group.reading.mirror`)
are the fallback position of a shard that has none in the coordinator: after
the coordinator was wiped or switched, or with the per-host embedded
coordinator of a remote warehouse on a new host. But shard ``k`` of a group
with 8 shards holds other buckets than shard ``k`` of one with 4 (or with
another sharding rule), so a file written under another shard count is the
position of other rows: resuming from it skips rows.

A consumer file holds only ``{"nextSnapshot": N}`` (Paimon's own readers, in
Java too, parse it), so what wrote the files is kept beside them, in
``<table>/consumer/paimon-group-<group>.json`` (not ``consumer-`` prefixed:
Paimon's consumer listing, expiration and tools never see it)::

    {"group": "orders", "incarnation": "5f0c...", "num_shards": 4, "sharding": "bucket",
     "start": {"next_snapshot": 8, "full_scan": 7, "start": "latest-full"}}

``start`` is the group's one start (:class:`~paimon_group.protocol.records.GroupStart`),
copied here once the coordinator accepted it (:func:`record_start`). A shard
that never had a position, and so has no consumer file, starts from it after
a wiped or switched coordinator, like every shard that does have one: resolved
again instead, after a compaction of a bucket-unaware table it would start
from other files than its peers did, and lose or repeat the rows the
compaction moved (the same straddle as one start per group prevents).

Transitions:

* **a group is created** (its record did not exist): before the record is
  written, :func:`prepare_new_group` reads this origin. If the group's
  consumer files were written under the same shard count and rule, they are
  kept (a shard without a position resumes from its file). Otherwise (another
  count or rule, or files without an origin, written before origins existed)
  they are deleted, with one log line, and shards without a position start as
  configured (``--start``). Then the origin is stamped with the new group's
  incarnation, count and rule, and, when files were kept, the start they
  were read from (the group's start, once the coordinator knows it again,
  is that one: :func:`carried_start`).
* **a shard has no position** (:func:`resume_allowed`): its file is used only
  if the origin carries the group record's incarnation, i.e. the creation step
  above ran for this very group (a group record written by another creator
  that lost the race, or a crash before the stamp, makes the files untrusted:
  the shard starts as configured, which never skips more than the configured
  start does). A creator that lost the race hands its stamp to the winner
  (:func:`adopt_winner`) when the winner's count and rule are the ones it
  vetted for. Within one incarnation a shard without a position has no file
  of its own (files are written only after the coordinator accepted a
  position), so every file it finds predates the group, and was vetted above.
* **groups created before incarnations existed** (empty ``incarnation``) keep
  the former behaviour, except that an origin that names another shard count
  or rule is still refused.

Example::

    origin = ConsumerFilesOrigin.read(table.file_io, table.table_path, "orders")
    resume_allowed(meta, origin)
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from coordinators.errors import PaimonGroupError
from paimon_group.protocol.names import origin_path
from paimon_group.protocol.records import GroupStart
from paimon_group.store.files import read_text, write_whole

if TYPE_CHECKING:
    from paimon_group.protocol.records import GroupMeta
    from paimon_group.reading.mirror import ConsumerMirror

__all__ = ["ConsumerFilesOrigin", "UnreadableOrigin", "adopt_winner", "carried_start",
           "origin_path", "prepare_new_group", "record_start", "resume_allowed", "write_whole"]

log = logging.getLogger("paimon_group.consumer_meta")  # a stable name, whatever the module path


class UnreadableOrigin(PaimonGroupError):
    """The origin file exists and cannot be parsed: the consumer files are
    neither trusted nor deleted."""


@dataclass(frozen=True)
class ConsumerFilesOrigin:
    """The group incarnation (and its shard count and rule) that writes the
    group's consumer files."""

    group: str
    incarnation: str
    num_shards: int
    sharding: str
    start: GroupStart | None = None

    @classmethod
    def read(cls, file_io: Any, table_path: str, group: str, *,
             strict: bool = False) -> ConsumerFilesOrigin | None:
        """The stored origin, or None if there is none (or it cannot be parsed:
        then nothing is trusted; with ``strict`` that raises
        :class:`UnreadableOrigin` instead)."""
        path = origin_path(table_path, group)
        try:
            text = _read_whole_json(file_io, path)
            if text is None:
                return None
            data = json.loads(text)
            start = data.get("start")
            return cls(group=str(data["group"]), incarnation=str(data["incarnation"]),
                       num_shards=int(data["num_shards"]), sharding=str(data["sharding"]),
                       start=None if start is None else GroupStart._from_dict(start))
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError) as err:
            if strict:
                raise UnreadableOrigin(f"unreadable consumer-file origin {path}: {err}") from err
            log.warning("unreadable consumer-file origin %s: %s", path, err)
            return None

    def write(self, file_io: Any, table_path: str) -> None:
        data = asdict(self)
        if self.start is None:
            del data["start"]
        write_whole(file_io, origin_path(table_path, self.group), json.dumps(data, sort_keys=True))

    def matches(self, num_shards: int, sharding: str) -> bool:
        return self.num_shards == num_shards and self.sharding == sharding


ORIGIN_READ_ATTEMPTS = 3


def _read_whole_json(file_io: Any, path: str) -> str | None:
    """The text of ``path``, read again (up to :data:`ORIGIN_READ_ATTEMPTS`
    times, 0.1 s apart) while it is not JSON. On an object store a read is a
    HEAD for the size then a ranged GET: an object replaced between the two
    by another member creating the group at once is read cut short (seen with
    four members on S3), though every upload is whole."""
    text = read_text(file_io, path)
    for _ in range(ORIGIN_READ_ATTEMPTS - 1):
        if text is None:
            return None
        try:
            json.loads(text)
            return text
        except ValueError:
            time.sleep(0.1)
            text = read_text(file_io, path)
    return text


def prepare_new_group(
    mirror: ConsumerMirror, file_io: Any, table_path: str, origin: ConsumerFilesOrigin
) -> str | None:
    """Vet a new group's existing consumer files and stamp ``origin`` (see the
    module docstring); the one line to log when files were discarded, else None.

    Runs before the group record is written, so no member can resume from a
    file this discards. Kept files keep the start they were read from.
    """
    files = mirror.all()
    # Unreadable (not absent): raise, so that the files are kept, not deleted
    # as files of no known origin; the group then starts its shards without
    # a position as configured (membership logs why).
    previous = ConsumerFilesOrigin.read(file_io, table_path, origin.group, strict=True)
    note = None
    if files and previous is not None and previous.matches(origin.num_shards, origin.sharding):
        origin = dataclasses.replace(origin, start=previous.start)
    elif files:
        written = ("by a version that did not record its shard count" if previous is None else
                   f"under {previous.num_shards} shards (sharding {previous.sharding})")
        mirror.delete_all()
        note = (f"group {origin.group!r}: {len(files)} consumer files of an earlier incarnation "
                f"were written {written}, not {origin.num_shards} shards (sharding "
                f"{origin.sharding}): they are not resumed from (deleted), and shards without "
                "a coordinator position start as configured (--start)")
    origin.write(file_io, table_path)
    return note


def adopt_winner(file_io: Any, table_path: str, ours: ConsumerFilesOrigin,
                 meta: GroupMeta) -> bool:
    """After losing the race to create the group (``meta`` names another
    incarnation), hand the origin we stamped to the winner, if it is still
    ours and the winner's shard count and rule are those we vetted the files
    for; True if it was rewritten. (Both creators read the same files and
    decide alike; without this a loser that stamped last would leave the
    winner's shards unable to resume.)"""
    if meta.incarnation in ("", ours.incarnation) or not ours.matches(meta.num_shards,
                                                                       meta.sharding):
        return False
    current = ConsumerFilesOrigin.read(file_io, table_path, ours.group)
    if current is None or current.incarnation != ours.incarnation or not current.matches(
            ours.num_shards, ours.sharding):
        return False
    dataclasses.replace(current, incarnation=meta.incarnation).write(file_io, table_path)
    return True


def carried_start(file_io: Any, table_path: str, group: str,
                  meta: GroupMeta) -> GroupStart | None:
    """The start the group's trusted consumer files were read from, if any:
    the start of a group re-created over them (see the module docstring)."""
    origin = ConsumerFilesOrigin.read(file_io, table_path, group)
    if origin is None or origin.start is None or not resume_allowed(meta, origin):
        return None
    return origin.start


def record_start(file_io: Any, table_path: str, group: str, meta: GroupMeta,
                 start: GroupStart) -> bool:
    """Copy the group's start, once the coordinator accepted it, into the origin
    this incarnation stamped; True if it was written. (Never into another
    incarnation's origin, nor over another start, unless ``start`` moved
    further than the one recorded: :mod:`paimon_group.member.moved_start`.)"""
    origin = ConsumerFilesOrigin.read(file_io, table_path, group)
    if origin is None or not meta.incarnation or origin.incarnation != meta.incarnation:
        return False
    if origin.start is not None and origin.start.moves >= start.moves:
        return False
    dataclasses.replace(origin, start=start).write(file_io, table_path)
    return True


def resume_allowed(meta: GroupMeta, origin: ConsumerFilesOrigin | None) -> bool:
    """Whether a shard of the group in ``meta`` without a coordinator position
    may resume from its consumer file (see the module docstring)."""
    if meta.incarnation:
        return (origin is not None and origin.incarnation == meta.incarnation
                and origin.matches(meta.num_shards, meta.sharding))
    return origin is None or origin.matches(meta.num_shards, meta.sharding)
