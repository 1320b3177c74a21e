"""Merge-on-read of primary-key rows with pyarrow compute, as pypaimon merges.

pypaimon merges the sorted runs of a section row by row: a min-heap ordered
by (primary key, ``sequence.field`` values, ``_SEQUENCE_NUMBER``) feeds each
key's versions, in that order, to the merge function; deletes and
update-befores are then dropped (``DropDeleteRecordReader``). The same result
in columns:

1. one stable ``sort_indices`` over the section's rows by the same keys
   (``sequence.field`` nulls first in either sort order, as pypaimon's
   comparator; descending order flips non-null values only);
2. the group boundaries where the primary key changes (each sorted key
   column against its successor; with ``primary-key.nullable`` a null key
   equals a null and differs from every value, as the engine's key
   comparator, which orders nulls first -- ``not_equal`` alone gives null
   there, which would merge a null key with its neighbour);
3. **deduplicate**: the last row of each key, kept only when it is ``+I`` or
   ``+U``; **first-row**: the first ``+I``/``+U`` row of each key (deletes
   and update-befores are skipped with ``ignore-delete``; without it pypaimon
   refuses them with an error, so such a section is left to pypaimon's
   reader, which raises that same error).

The merged rows come out in primary-key order, as pypaimon's do.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from paimon_group.arrowread.files import SEQUENCE_NUMBER, VALUE_KIND, Unsupported

__all__ = ["ROW_KINDS", "adds_only", "integer_key_order", "key_changes", "merge_indices",
           "row_kind_strings"]

ROW_KINDS = ("+I", "-U", "+U", "-D")
"""Row kind strings by ``_VALUE_KIND`` byte, as pypaimon prints them."""

_KIND_STRINGS = pa.array(ROW_KINDS, type=pa.string())


def row_kind_strings(kinds: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray | pa.Array:
    """``_VALUE_KIND`` bytes as pypaimon's ``_row_kind`` strings."""
    result: pa.ChunkedArray | pa.Array = pc.take(_KIND_STRINGS, kinds.cast(pa.int32()))
    return result


def _is_add(kinds: pa.ChunkedArray | pa.Array) -> np.ndarray:
    values = np.asarray(kinds.to_numpy(zero_copy_only=False))
    result: np.ndarray = (values == 0) | (values == 2)
    return result


def adds_only(table: pa.Table) -> pa.Table:
    """The ``+I``/``+U`` rows of ``table`` (deletes and update-befores dropped)."""
    mask = _is_add(table.column(VALUE_KIND))
    return table if mask.all() else table.filter(pa.array(mask))


def key_changes(sorted_keys: Sequence[pa.ChunkedArray]) -> np.ndarray:
    """``changes[i]`` is True when sorted row ``i + 1`` has another key than row ``i``."""
    n = len(sorted_keys[0])
    changes = np.zeros(max(n - 1, 0), dtype=bool)
    if n < 2:
        return changes
    for column in sorted_keys:
        before, after = column.slice(0, n - 1), column.slice(1)
        differs = pc.fill_null(pc.not_equal(before, after), False)
        changes |= np.asarray(differs.to_numpy(zero_copy_only=False), dtype=bool)
        if column.null_count:
            # not_equal is null where either side is: null vs null is the
            # same key, null vs a value another one.
            one_null = pc.xor(pc.is_null(before), pc.is_null(after))
            changes |= np.asarray(one_null.to_numpy(zero_copy_only=False), dtype=bool)
    return changes


def merge_indices(
    table: pa.Table,
    keys: Sequence[str],
    sequence_fields: Sequence[str],
    *,
    ascending: bool,
    first_row: bool,
    ignore_delete: bool,
) -> pa.Array:
    """Row indices of ``table`` that a merge keeps, in primary-key order.

    ``table`` holds the rows of one section (all versions of its keys) with
    the key columns, the ``sequence.field`` columns, ``_SEQUENCE_NUMBER``
    and ``_VALUE_KIND``. Raises :class:`Unsupported` where pypaimon's merge
    would raise (first-row without ``ignore-delete`` meeting a delete).
    """
    fast = _merge_integer_key(table, keys, sequence_fields, first_row=first_row,
                              ignore_delete=ignore_delete)
    if fast is not None:
        return fast
    order = "ascending" if ascending else "descending"
    sort_keys = [(k, "ascending") for k in keys]
    sort_keys += [(f, order) for f in sequence_fields]
    sort_keys.append((SEQUENCE_NUMBER, "ascending"))
    indices = pc.sort_indices(table, sort_keys=sort_keys, null_placement="at_start")
    is_add = _is_add(table.column(VALUE_KIND).take(indices))
    if first_row:
        if not ignore_delete and not is_add.all():
            raise Unsupported("first-row merge met a delete without ignore-delete")
        indices = indices.filter(pa.array(is_add))
        is_add = np.ones(len(indices), dtype=bool)
    n = len(indices)
    if n == 0:
        return indices
    sorted_keys = [table.column(k).take(indices) for k in keys]
    changes = key_changes(sorted_keys)
    if first_row:
        keep = np.concatenate(([True], changes))
    else:
        keep = np.concatenate((changes, [True])) & is_add
    result: pa.Array = indices.filter(pa.array(keep))
    return result


def integer_key_order(table: pa.Table, keys: Sequence[str], sequence_fields: Sequence[str]
                      ) -> tuple[np.ndarray, np.ndarray] | None:
    """The order of the sort by (key, ``_SEQUENCE_NUMBER``) in the common case,
    in numpy, and ``changes`` (:func:`key_changes`) along it: one integer key
    without nulls, no ``sequence.field``, and each key's rows already in
    sequence order in ``table`` (as they are when the section's files are
    concatenated oldest first, see ``ArrowSplitReader.merge_unit``).

    Then a stable sort by the key alone is that sort: numpy's stable sort is
    a timsort, which merges the few sorted runs a section is made of in about
    linear time, where pyarrow's multi-column sort compares rows generically.
    None when the case does not hold (checked on the rows: a key whose rows
    are out of sequence order), for the general sort.
    """
    if len(keys) != 1 or sequence_fields or table.num_rows < 2:
        return None
    column = table.column(keys[0])
    if column.null_count or not pa.types.is_integer(column.type):
        return None
    key = np.asarray(column.to_numpy())
    order = np.argsort(key, kind="stable")
    sorted_key = key[order]
    changes: np.ndarray = sorted_key[1:] != sorted_key[:-1]
    sequence = np.asarray(table.column(SEQUENCE_NUMBER).to_numpy())[order]
    if np.any(~changes & (sequence[1:] < sequence[:-1])):
        return None
    return order, changes


def _merge_integer_key(table: pa.Table, keys: Sequence[str], sequence_fields: Sequence[str],
                       *, first_row: bool, ignore_delete: bool) -> pa.Array | None:
    """:func:`merge_indices` on :func:`integer_key_order` (None where it is None)."""
    fast = integer_key_order(table, keys, sequence_fields)
    if fast is None:
        return None
    order, changes = fast
    is_add = _is_add(table.column(VALUE_KIND))[order]
    if first_row:
        if not ignore_delete and not is_add.all():
            raise Unsupported("first-row merge met a delete without ignore-delete")
        if not is_add.all():
            # the group starts among the adds only: compare each add's key
            # with the previous add's
            sorted_key = np.asarray(table.column(keys[0]).to_numpy())[order[is_add]]
            order = order[is_add]
            if len(order) == 0:
                return pa.array(order)
            changes = sorted_key[1:] != sorted_key[:-1]
        keep = np.concatenate(([True], changes))
    else:
        keep = np.concatenate((changes, [True])) & is_add
    return pa.array(order[keep])
