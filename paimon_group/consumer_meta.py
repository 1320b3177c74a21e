"""Which group incarnation wrote a group's Paimon consumer files, and whether a
shard may resume from them.

The consumer files (``consumer-pg-<group>-shard-<k>``, :mod:`paimon_group.mirror`)
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

    {"group": "orders", "incarnation": "5f0c...", "num_shards": 4, "sharding": "bucket"}

Transitions:

* **a group is created** (its record did not exist): before the record is
  written, :func:`prepare_new_group` reads this origin. If the group's
  consumer files were written under the same shard count and rule, they are
  kept (a shard without a position resumes from its file). Otherwise (another
  count or rule, or files without an origin, written before origins existed)
  they are deleted, with one log line, and shards without a position start as
  configured (``--start``). Then the origin is stamped with the new group's
  incarnation, count and rule.
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

import json
import logging
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from paimon_group.names import origin_path

if TYPE_CHECKING:
    from paimon_group.mirror import ConsumerMirror
    from paimon_group.records import GroupMeta

__all__ = ["ConsumerFilesOrigin", "adopt_winner", "origin_path", "prepare_new_group",
           "resume_allowed"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ConsumerFilesOrigin:
    """The group incarnation (and its shard count and rule) that writes the
    group's consumer files."""

    group: str
    incarnation: str
    num_shards: int
    sharding: str

    @classmethod
    def read(cls, file_io: Any, table_path: str, group: str) -> ConsumerFilesOrigin | None:
        """The stored origin, or None if there is none (or it cannot be parsed:
        then nothing is trusted)."""
        path = origin_path(table_path, group)
        try:
            if not file_io.exists(path):
                return None
            data = json.loads(file_io.read_file_utf8(path))
            return cls(group=str(data["group"]), incarnation=str(data["incarnation"]),
                       num_shards=int(data["num_shards"]), sharding=str(data["sharding"]))
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError) as err:
            log.warning("unreadable consumer-file origin %s: %s", path, err)
            return None

    def write(self, file_io: Any, table_path: str) -> None:
        file_io.overwrite_file_utf8(origin_path(table_path, self.group),
                                    json.dumps(asdict(self), sort_keys=True))

    def matches(self, num_shards: int, sharding: str) -> bool:
        return self.num_shards == num_shards and self.sharding == sharding


def prepare_new_group(
    mirror: ConsumerMirror, file_io: Any, table_path: str, origin: ConsumerFilesOrigin
) -> str | None:
    """Vet a new group's existing consumer files and stamp ``origin`` (see the
    module docstring); the one line to log when files were discarded, else None.

    Runs before the group record is written, so no member can resume from a
    file this discards.
    """
    files = mirror.all()
    previous = ConsumerFilesOrigin.read(file_io, table_path, origin.group)
    note = None
    if files and (previous is None or not previous.matches(origin.num_shards, origin.sharding)):
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
    if current != ours:
        return False
    ConsumerFilesOrigin(ours.group, meta.incarnation, meta.num_shards, meta.sharding).write(
        file_io, table_path)
    return True


def resume_allowed(meta: GroupMeta, origin: ConsumerFilesOrigin | None) -> bool:
    """Whether a shard of the group in ``meta`` without a coordinator position
    may resume from its consumer file (see the module docstring)."""
    if meta.incarnation:
        return (origin is not None and origin.incarnation == meta.incarnation
                and origin.matches(meta.num_shards, meta.sharding))
    return origin is None or origin.matches(meta.num_shards, meta.sharding)
