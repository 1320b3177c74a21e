"""The ARRAY and MAP aggregate functions, vectorized: ``collect``, ``merge_map``
and ``nested_update`` (:func:`nested_update`).

The engine's ``AggregateMergeFunction`` folds a key's records in sequence
order, ``acc = agg(acc, value)`` from ``acc = null``; for these two:

* ``collect`` (``FieldCollectAgg``), without ``distinct``: the key's non-null
  arrays concatenated in record order, elements (nulls and duplicates
  included) in their order; null when every array is null; an empty array
  counts (``[]`` then null is ``[]``).
* ``collect`` with ``fields.<name>.distinct = true``: the same elements
  without repeats (one null at most). The engine collects them in a Java
  ``HashSet``, so its order is its hash order; we keep each element's first
  occurrence in record order (a set either way: compare as sets).
* ``merge_map`` (``FieldMergeMapAgg``): the key's non-null maps put into one,
  a later value (null included) replacing an earlier one of the same map
  key; null when every map is null. The engine's ``HashMap`` has hash order;
  we keep each map key where it first occurs, with its latest value.

A key with one record in its section is kept whole (the engine's
``ReducerMergeFunctionWrapper`` does not merge a lone record): a lone
``distinct`` array keeps its repeats, a lone map its repeated keys.

Distinct elements and map keys are compared by value with a pyarrow hash
grouping; :data:`HASHABLE` lists the element types whose Java ``equals``
that reproduces (not FLOAT/DOUBLE, whose NaN and -0.0 Java compares by bits;
not BYTES, whose ``byte[]`` Java compares by identity; not nested values).

Every function takes the key-ordered values and the first position of each
key, and gives one value per key.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["COLLECTIONS", "HASHABLE", "collection_reason", "nested_key_reason", "nested_update"]

HASHABLE = ("TINYINT", "SMALLINT", "INT", "BIGINT", "STRING", "VARCHAR", "CHAR", "BOOLEAN",
            "DATE", "DECIMAL", "TIMESTAMP")
"""Type names (as Paimon prints them) compared by value here as the engine
compares them (distinct ``collect`` elements, ``merge_map`` keys)."""


def _inner(type_name: str, prefix: str) -> str:
    return type_name[len(prefix):type_name.rfind(">")].strip()


def _map_key(type_name: str) -> str:
    """``MAP<k, v>``'s ``k`` (``k`` may hold a comma in parentheses: DECIMAL(p, s))."""
    inner, depth = _inner(type_name, "MAP<"), 0
    for i, char in enumerate(inner):
        depth += (char in "<(") - (char in ">)")
        if char == "," and depth == 0:
            return inner[:i].strip()
    return inner


def _hashable(type_name: str) -> bool:
    base = type_name.split("(")[0].split("<")[0].split(" ")[0].strip()
    return base in HASHABLE and "LOCAL TIME ZONE" not in type_name


def collection_reason(function: str, type_name: str) -> str | None:
    """Why ``function`` on a column of ``type_name`` is not read here, or None."""
    if function in ("collect", "collect distinct"):
        if not type_name.startswith("ARRAY<"):
            return f"aggregate function collect on {type_name}"
        if function == "collect distinct" and not _hashable(_inner(type_name, "ARRAY<")):
            return f"aggregate function collect with distinct on {type_name}"
    if function == "nested_update" and not type_name.startswith("ARRAY<ROW<"):
        return f"aggregate function nested_update on {type_name}"
    if function == "merge_map":
        if not type_name.startswith("MAP<"):
            return f"aggregate function merge_map on {type_name}"
        if not _hashable(_map_key(type_name)):
            return f"aggregate function merge_map on {type_name}"
    return None


def nested_key_reason(row_fields: Mapping[str, str], nested_key: Sequence[str]) -> str | None:
    """Why ``nested_update`` with ``nested_key`` over rows of ``row_fields``
    (name -> type name) is not read here, or None: the engine compares nested
    keys as binary rows, which a pyarrow grouping reproduces on the
    :data:`HASHABLE` types only."""
    for name in nested_key:
        if name not in row_fields or not _hashable(row_fields[name]):
            return f"aggregate function nested_update with nested-key {name!r}"
    return None


def _as_lists(values: Any) -> pa.ListArray:
    """A LIST or MAP column (one chunk) as a ListArray (a MAP's entries as
    ``struct<key, value>``), nulls kept."""
    values = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    if isinstance(values, pa.MapArray):
        entries = pa.StructArray.from_arrays([values.keys, values.items], ["key", "value"])
        return pa.ListArray.from_arrays(values.offsets, entries, mask=values.is_null())
    return values


def _layout(lists: pa.ListArray, starts: Any) -> tuple[Any, Any, Any]:
    """Per element: its key; per key: whether any record is non-null, its
    record count."""
    n = len(lists)
    counts = np.asarray(pc.list_value_length(lists).fill_null(0).to_numpy(
        zero_copy_only=False), dtype=np.int64)
    valid = np.asarray(lists.is_valid().to_numpy(zero_copy_only=False), dtype=np.int64)
    records = np.diff(np.append(starts, n))
    key_of_record = np.repeat(np.arange(len(starts), dtype=np.int64), records)
    element_keys = np.repeat(key_of_record, counts)
    return element_keys, np.add.reduceat(valid, starts) > 0, records


def _rebuild(element_keys: Any, elements: pa.Array, present: Any, keys: int,
             as_map: pa.DataType | None) -> pa.Array:
    """Per key, its (key-ordered) ``elements``: a list, or a map of ``as_map``."""
    sizes = np.bincount(element_keys, minlength=keys) if len(element_keys) else np.zeros(
        keys, dtype=np.int64)
    offsets = pa.array(np.concatenate(([0], np.cumsum(sizes))), pa.int32())
    mask = pa.array(~present)
    if as_map is not None:
        return pa.MapArray.from_arrays(offsets, elements.field("key"), elements.field("value"),
                                       type=as_map, mask=mask)
    return pa.ListArray.from_arrays(offsets, elements, mask=mask)


def _merge(values: Any, starts: Any, dedupe_by: str | None, keep: str) -> pa.Array:
    """The key's elements concatenated, or, where ``dedupe_by`` names what
    repeats are (the element itself, or a map entry's key), one element per
    repeat: its first occurrence's place, the ``keep`` (``min``/``max``)
    occurrence's value. Lone records are left whole."""
    lists = _as_lists(values)
    element_keys, present, records = _layout(lists, starts)
    elements = lists.flatten()
    if dedupe_by is not None and len(elements):
        positions = np.arange(len(elements), dtype=np.int64)
        lone = records[element_keys] == 1
        # A lone record's elements group by their own position: never merged.
        group = np.where(lone, -1 - positions, element_keys)
        by = elements if dedupe_by == "element" else elements.field("key")
        grouped = pa.table({"g": group, "e": by, "p": positions}).group_by(
            ["g", "e"], use_threads=False).aggregate(
                [("p", "min")] + ([("p", keep)] if keep != "min" else []))
        first = np.asarray(grouped.column("p_min").to_numpy(zero_copy_only=False))
        chosen = np.asarray(grouped.column(f"p_{keep}").to_numpy(zero_copy_only=False))
        order = np.argsort(first, kind="stable")
        place, chosen = first[order], chosen[order]
        if dedupe_by == "element":
            elements = elements.take(pa.array(place))
        else:
            entries = elements.take(pa.array(place))
            elements = pa.StructArray.from_arrays(
                [entries.field("key"), elements.field("value").take(pa.array(chosen))],
                ["key", "value"])
        element_keys = element_keys[place]
    as_map = values.type if pa.types.is_map(values.type) else None
    return _rebuild(element_keys, elements, present, len(starts), as_map)


def _collect(values: Any, starts: Any) -> pa.Array:
    return _merge(values, starts, None, "min")


def _collect_distinct(values: Any, starts: Any) -> pa.Array:
    return _merge(values, starts, "element", "min")


def _merge_map(values: Any, starts: Any) -> pa.Array:
    return _merge(values, starts, "key", "max")


def nested_update(values: Any, starts: Any, nested_key: Sequence[str]) -> pa.Array:
    """``nested_update`` (``FieldNestedUpdateAgg``) of an ``ARRAY<ROW>``: a
    key whose records hold one non-null array keeps it whole (the engine's
    first ``agg`` returns its input as is); otherwise the non-null rows of
    its arrays in record order, and with ``fields.<name>.nested-key`` one
    row per nested key, the latest (the engine's ``HashMap`` has hash order;
    we keep each nested key where it first occurs)."""
    lists = _as_lists(values)
    element_keys, present, _ = _layout(lists, starts)
    valid = np.asarray(lists.is_valid().to_numpy(zero_copy_only=False), dtype=np.int64)
    merged_key = (np.add.reduceat(valid, starts) >= 2)[element_keys]
    elements = lists.flatten()
    if len(elements):
        row_valid = np.asarray(elements.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        kept = np.flatnonzero(~merged_key | row_valid)
        elements, element_keys, merged_key = (
            elements.take(pa.array(kept)), element_keys[kept], merged_key[kept])
    if nested_key and len(elements):
        positions = np.arange(len(elements), dtype=np.int64)
        group = np.where(merged_key, element_keys, -1 - positions)
        by = {f"k{i}": elements.field(name) for i, name in enumerate(nested_key)}
        grouped = pa.table({"g": group, **by, "p": positions}).group_by(
            ["g", *by], use_threads=False).aggregate([("p", "min"), ("p", "max")])
        first = np.asarray(grouped.column("p_min").to_numpy(zero_copy_only=False))
        latest = np.asarray(grouped.column("p_max").to_numpy(zero_copy_only=False))
        order = np.argsort(first, kind="stable")
        elements = elements.take(pa.array(latest[order]))
        element_keys = element_keys[first[order]]
    return _rebuild(element_keys, elements, present, len(starts), None)


COLLECTIONS: dict[str, Callable[[Any, Any], pa.Array]] = {
    "collect": _collect, "collect distinct": _collect_distinct, "merge_map": _merge_map}
"""(key-ordered values, first position of each key) -> one value per key."""
