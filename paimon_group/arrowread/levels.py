"""The engine's lookup merge, for tables whose compactions look up older
values: ``changelog-producer = lookup``, ``deletion-vectors.enabled`` or
``force-lookup`` (the engine's ``CoreOptions.needLookup()``), every merge
engine but first-row.

A lookup compaction merges a key's new level-0 records with its value
looked up from the higher levels and writes the merged value to a level
above 0, while the older value stays where it is, further up. So the
engine reads such a table with its ``LookupMergeFunction``: of a key's
records above level 0 it merges only the one of the lowest level (the
latest merged value), together with the key's level-0 records. A merge of
all of a key's records counts the older values twice under an aggregation
(``sum``) and may bring older fields back under partial-update; pypaimon's
reader merges all of them.

:func:`lookup_level_drops` gives, per file of a merged split, the row
positions the engine does not merge (a key's records above its lowest
level above 0; rows deleted by a deletion vector are not records).
:func:`follow_lookup_levels` makes the merged reads of one pypaimon
``TableRead`` drop those rows, as extra deletion-vector positions (that
object only: importing this module changes nothing in pypaimon).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from paimon_group.arrowread.classify import char_columns, trimmed_keys
from paimon_group.arrowread.files import (
    Unsupported,
    apply_deletion_vector,
    decode_file,
    read_deletion_vector,
)
from paimon_group.arrowread.merge import key_changes

__all__ = ["follow_lookup_levels", "lookup_level_drops", "merges_by_lookup"]

log = logging.getLogger("paimon_group.arrowread")

_LEVEL = "_paimon_group_level"
_FILE = "_paimon_group_file"
_POSITION = "_paimon_group_position"


def _option(table: Any, name: str) -> str:
    value = table.options.options.to_map().get(name)
    return str(value).strip().lower() if value is not None else ""


def merges_by_lookup(table: Any) -> bool:
    """Whether the engine reads ``table`` with its ``LookupMergeFunction``."""
    if not table.is_primary_key_table:
        return False
    engine = getattr(table.options.merge_engine(), "value", str(table.options.merge_engine()))
    if engine == "first-row":  # the engine does not wrap first-row
        return False
    return (
        _option(table, "changelog-producer") == "lookup"
        or _option(table, "deletion-vectors.enabled") == "true"
        or _option(table, "force-lookup") == "true"
    )


def lookup_level_drops(
    table: Any, files: list[Any], deleted: dict[str, list[int]]
) -> dict[str, list[int]]:
    """Positions, by file name, of the rows of ``files`` (one merged split)
    that the engine's lookup merge leaves out; ``deleted`` holds the
    positions already deleted by deletion vectors. Raises
    :class:`Unsupported` when a file's keys cannot be decoded here."""
    from pypaimon.schema.data_types import PyarrowFieldParser

    upper = [f for f in files if int(f.level) > 0]
    if len({int(f.level) for f in upper}) < 2:
        return {}  # one level above 0 holds each key once: nothing to leave out
    keys = trimmed_keys(table)
    types = {f.name: f.type for f in PyarrowFieldParser.from_paimon_schema(table.fields)}
    parts = []
    for index, file in enumerate(upper):
        rows = decode_file(table.file_io, file, keys, types, trim=char_columns(table))
        rows = rows.append_column(_POSITION, pa.array(np.arange(rows.num_rows, dtype=np.int64)))
        rows = apply_deletion_vector(rows, deleted.get(file.file_name))
        rows = rows.append_column(_LEVEL, pa.array(np.full(rows.num_rows, int(file.level))))
        parts.append(rows.append_column(_FILE, pa.array(np.full(rows.num_rows, index))))
    rows = pa.concat_tables(parts)
    order = [(k, "ascending") for k in keys] + [(_LEVEL, "ascending")]
    indices = pc.sort_indices(rows, sort_keys=order, null_placement="at_start")
    changes = key_changes([rows.column(k).take(indices) for k in keys])
    dropped = indices.filter(pa.array(np.concatenate(([False], ~changes))))
    out = rows.take(dropped)
    drops: dict[str, list[int]] = {}
    for index, position in zip(out.column(_FILE).to_pylist(), out.column(_POSITION).to_pylist(),
                               strict=True):
        drops.setdefault(upper[index].file_name, []).append(position)
    return drops


class _WithDrops:
    """A deletion vector (or none) plus the positions the lookup merge
    leaves out: what pypaimon's ``ApplyDeletionVectorReader`` asks."""

    def __init__(self, base: Any, drops: list[int]) -> None:
        self._base = base
        self._drops = frozenset(drops)

    def is_deleted(self, position: int) -> bool:
        if position in self._drops:
            return True
        return bool(self._base is not None and self._base.is_deleted(position))


def _dv_factory(base: Callable[[], Any] | None, drops: list[int]) -> Callable[[], Any]:
    return lambda: _WithDrops(base() if base is not None else None, drops)


_warned: set[tuple[str, str]] = set()


def _warn_once(table: str, reason: str) -> None:
    if (table, reason) in _warned:  # a benign race: at worst one line twice
        return
    _warned.add((table, reason))
    log.warning("table %s: a lookup merge as pypaimon merges it, not as the engine: %s",
                table, reason)


def follow_lookup_levels(read: Any) -> Any:
    """``read``, a pypaimon ``TableRead``, with its merged reads of a lookup
    table merged as the engine merges them (see the module docstring);
    returns it.

    Only this object changes, and only on a lookup table: its
    ``_create_split_read`` is wrapped on the instance, and each
    ``MergeFileSplitRead`` it makes gets, on that instance, a
    ``_genarate_deletion_file_readers`` that adds the rows the engine leaves
    out to the deletion vectors. pypaimon's classes are left as they are; a
    pypaimon without these parts reads as it does."""
    from pypaimon.read.split_read import MergeFileSplitRead

    create = getattr(read, "_create_split_read", None)
    if create is None or "_create_split_read" in vars(read) \
            or not merges_by_lookup(read.table):
        return read  # another pypaimon, done already, or nothing to follow

    def create_split_read(*args: Any, **kwargs: Any) -> Any:
        split_read = create(*args, **kwargs)
        base = getattr(split_read, "_genarate_deletion_file_readers", None)
        if isinstance(split_read, MergeFileSplitRead) and base is not None:
            split_read._genarate_deletion_file_readers = (
                lambda: _with_lookup_drops(split_read, base))
        return split_read

    read._create_split_read = create_split_read
    return read


def _with_lookup_drops(split_read: Any, generate: Callable[[], None]) -> None:
    """pypaimon's deletion-vector readers of ``split_read`` (``generate``
    makes them), and the lookup merge's drops as more deleted positions."""
    generate()
    split = split_read.split
    if getattr(split, "is_streaming", False):
        return
    table = split_read.table
    files = list(split.files)
    deletions = list(split.data_deletion_files or [None] * len(files))
    deleted = {
        f.file_name: read_deletion_vector(table.file_io, d)
        for f, d in zip(files, deletions, strict=True) if d is not None
    }
    try:
        drops = lookup_level_drops(table, files, deleted)
    except Unsupported as err:
        _warn_once(str(getattr(table, "identifier", "")), str(err))
        return
    readers = split_read.deletion_file_readers
    for name, positions in drops.items():
        readers[name] = _dv_factory(readers.get(name), positions)
