"""Which tables and splits the Arrow reader reads, and how.

Table level (:func:`table_fallback_reason`): a reason to leave every split
of a table to pypaimon's reader, or None. Split level (:func:`split_mode`,
:func:`split_fallback_reason`): how a split is read, exactly as pypaimon's
``TableRead`` decides it:

* ``RAW``: append tables, and primary-key splits pypaimon marks
  ``raw_convertible`` (files of one level without deletes, or with deletion
  vectors): the files are decoded in order, deletion vectors applied, every
  row ``+I``;
* ``STREAM``: primary-key splits of delta, changelog and catch-up steps
  (``is_streaming``): the files are decoded in commit order with their own
  row kinds, deletes and update-befores included, nothing merged;
* ``MERGE``: the other primary-key splits of a full scan: merged per section
  (files whose key ranges overlap); a section of one sorted run has each key
  once and is only decoded, deletes dropped.
"""

from __future__ import annotations

import enum
from typing import Any

from paimon_group.arrowread.fieldmerge import FIELD_MERGE_ENGINES, field_merge_reason
from paimon_group.arrowread.files import SUPPORTED_FORMATS, file_format

__all__ = [
    "SplitMode",
    "char_columns",
    "split_fallback_reason",
    "split_mode",
    "table_fallback_reason",
]

_UNSUPPORTED_TYPES = ("BLOB", "VARIANT", "VECTOR")
_FLOATING = ("FLOAT", "DOUBLE")


class SplitMode(enum.Enum):
    RAW = "raw"
    STREAM = "stream"
    MERGE = "merge"


def _base_type(field: Any) -> str:
    return str(field.type).split("(")[0].split(" ")[0].split("<")[0].upper()


def table_fallback_reason(table: Any, read_columns: list[str]) -> str | None:
    """Why pypaimon's reader must read every split of ``table``, or None."""
    options = table.options
    fields = {f.name: f for f in table.fields}
    missing = [c for c in read_columns if c not in fields]
    if missing:
        return f"columns {missing} are not fields of the table"
    for name in read_columns:
        if any(t in str(fields[name].type).upper() for t in _UNSUPPORTED_TYPES):
            return f"column {name!r} has type {fields[name].type}"
    if options.data_evolution_enabled() or options.row_tracking_enabled():
        return "data evolution / row tracking"
    if not table.is_primary_key_table:
        return None
    reason = _merge_engine_reason(table, read_columns)
    if reason is not None:
        return reason
    keys = trimmed_keys(table)
    if not keys:
        return "primary key equals the partition keys"
    for name in keys:
        if _base_type(fields[name]) in _FLOATING:
            return f"floating-point primary key {name!r}"
    for name in options.sequence_field():
        field = fields.get(name)
        if field is None:
            return f"sequence.field {name!r} is not a field"
        if _base_type(field) in _FLOATING:
            return f"floating-point sequence.field {name!r}"
    return None


def _merge_engine_reason(table: Any, read_columns: list[str]) -> str | None:
    options = table.options
    engine = getattr(options.merge_engine(), "value", str(options.merge_engine()))
    if engine in FIELD_MERGE_ENGINES:
        merged_by_key = set(table.primary_keys) | set(table.partition_keys or ())
        return field_merge_reason(table, [c for c in read_columns if c not in merged_by_key])
    if engine not in ("deduplicate", "first-row"):
        return f"merge-engine {engine}"
    return None


def char_columns(table: Any) -> frozenset[str]:
    """The table's CHAR(n) columns (trimmed when read from ORC, files.py)."""
    return frozenset(f.name for f in table.fields if _base_type(f) == "CHAR")


def trimmed_keys(table: Any) -> list[str]:
    """The primary key without the partition keys: what rows are merged by."""
    partition = set(table.partition_keys or ())
    return [k for k in table.primary_keys if k not in partition]


def split_mode(table: Any, split: Any) -> SplitMode:
    """How pypaimon's ``TableRead`` reads ``split`` (see the module docstring)."""
    if not table.is_primary_key_table:
        return SplitMode.RAW
    if getattr(split, "is_streaming", False):
        return SplitMode.STREAM
    if getattr(split, "raw_convertible", False):
        return SplitMode.RAW
    return SplitMode.MERGE


def split_fallback_reason(table: Any, split: Any) -> str | None:
    """Why pypaimon's reader must read ``split``, or None."""
    if type(split).__name__ != "DataSplit":
        return f"split type {type(split).__name__}"
    for file in split.files:
        # Files of an older schema are mapped by field id (evolution.py).
        if getattr(file, "write_cols", None):
            return "files with write columns"
        fmt = file_format(file.file_name)
        if fmt not in SUPPORTED_FORMATS:
            return f"file format {fmt!r}"
    return None
