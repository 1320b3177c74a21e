"""Per-field merges: the partial-update and aggregation merge engines.

Where ``deduplicate`` keeps a key's latest record whole, these merge a key's
records (in sequence order) field by field:

* ``partial-update``: each field takes its latest non-null value;
* ``aggregation``: each field is aggregated by its function
  (``fields.<name>.aggregate-function``, else
  ``fields.default-aggregate-function``, else ``last_non_null_value``).

Read here, vectorized (a sort, then one grouped aggregation per field with
pyarrow compute), for the cases whose semantics pyarrow reproduces exactly;
:func:`field_merge_reason` says why a table is left to pypaimon's reader
otherwise:

* a function other than ``sum``, ``product``, ``max``, ``min``,
  ``bool_and``, ``bool_or``, ``last_value``, ``last_non_null_value``,
  ``first_value``, ``first_non_null_value`` (each skips nulls but the two
  that keep them, as the engine's), ``listagg`` (without ``distinct``),
  ``collect`` (with and without ``distinct``), ``merge_map`` and
  ``nested_update`` (collect.py, on the element and key types it lists);
  floating-point ``sum`` and ``product`` and ``listagg`` are folded in the
  engine's order (folds.py);
* per-field aggregation under partial-update, removing records on delete,
  a sequence group ordered by more than one field.

A partial-update sequence group (``fields.<g>.sequence-group = a,b``) takes
``g``, ``a`` and ``b`` together, nulls included, from the key's record with
the greatest non-null ``g`` (the latest of equal ones), all null when no
record has a ``g``, as the engine's ``PartialUpdateMergeFunction``; a key
with one record in its section keeps it whole (the engine does not merge a
lone record).

A section that holds a retraction (``-U``/``-D``) is left to pypaimon's
reader too (:class:`~paimon_group.arrowread.files.Unsupported` from
:func:`merge_fields`): the engines retract per function, or raise.

Example, partial-update, key 1: records ``(1, a=x, b=null)`` then
``(1, a=null, b=y)`` merge to ``(1, a=x, b=y)``; under aggregation with
``sum`` on ``v``: ``(1, v=2)``, ``(1, v=3)`` merge to ``(1, v=5)``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from paimon_group.arrowread.collect import (
    COLLECTIONS,
    collection_reason,
    nested_key_reason,
    nested_update,
)
from paimon_group.arrowread.files import SEQUENCE_NUMBER, VALUE_KIND, Unsupported
from paimon_group.arrowread.folds import FOLDS
from paimon_group.arrowread.merge import integer_key_order, key_changes
from paimon_group.arrowread.nullability import cast_column

__all__ = ["FIELD_MERGE_ENGINES", "field_functions", "field_merge_reason", "list_delimiters",
           "merge_fields", "nested_keys", "sequence_groups"]

FIELD_MERGE_ENGINES = frozenset({"partial-update", "aggregation"})

# function -> (pyarrow hash aggregation, skip nulls)
_FUNCTIONS: dict[str, tuple[str, bool]] = {
    "sum": ("sum", True),
    "max": ("max", True),
    "min": ("min", True),
    "last_value": ("last", False),
    "last_non_null_value": ("last", True),
    "first_value": ("first", False),
    "first_non_null_value": ("first", True),
    "product": ("product", True),
    "bool_and": ("all", True),
    "bool_or": ("any", True),
}


def _options(table: Any) -> dict[str, str]:
    return {str(k): str(v) for k, v in table.options.options.to_map().items()}


def field_functions(table: Any, columns: Sequence[str]) -> dict[str, str]:
    """The merge function of each of ``columns`` (their names in the table)."""
    options = _options(table)
    engine = getattr(table.options.merge_engine(), "value", str(table.options.merge_engine()))
    if engine == "partial-update":
        return {c: "last_non_null_value" for c in columns}
    default = options.get("fields.default-aggregate-function", "last_non_null_value")
    functions = {c: options.get(f"fields.{c}.aggregate-function", default).strip().lower()
                 for c in columns}
    # collect's distinct changes what it computes: a function of its own here.
    return {c: "collect distinct" if f == "collect" and options.get(
        f"fields.{c}.distinct", "false").strip().lower() == "true" else f
        for c, f in functions.items()}


def sequence_groups(table: Any) -> dict[str, list[str]]:
    """Each partial-update sequence group: its sequence field, its fields."""
    groups: dict[str, list[str]] = {}
    for key, value in _options(table).items():
        if key.startswith("fields.") and key.endswith(".sequence-group"):
            groups[key[len("fields."):-len(".sequence-group")]] = [
                f.strip() for f in value.split(",") if f.strip()]
    return groups


def list_delimiters(table: Any) -> dict[str, str]:
    """The ``list-agg-delimiter`` of every column (``,`` unless given)."""
    options = _options(table)
    return {f.name: options.get(f"fields.{f.name}.list-agg-delimiter", ",")
            for f in table.fields}


def nested_keys(table: Any) -> dict[str, list[str]]:
    """The ``nested-key`` fields of every column (empty unless given)."""
    options = _options(table)
    return {f.name: [k.strip() for k in options.get(f"fields.{f.name}.nested-key", "").split(",")
                     if k.strip()] for f in table.fields}


def _nested_reason(table: Any, column: str) -> str | None:
    # Options of Paimon versions after the engine tested here: not merged here.
    for key in _options(table):
        if key.startswith(f"fields.{column}.") and key.endswith(
                ("nested-sequence-field", "nested-key-null-strategy", "count-limit")):
            return f"aggregate function nested_update with {key}"
    field = next(f for f in table.fields if f.name == column)
    row = getattr(getattr(field.type, "element", None), "fields", [])
    return nested_key_reason({f.name: str(f.type).upper() for f in row},
                             nested_keys(table).get(column, []))


def _folded(function: str, arrow_type: pa.DataType) -> bool:
    """Whether ``function`` is folded in order (folds.py) on this type."""
    return function == "listagg" or (
        function in ("sum", "product") and pa.types.is_floating(arrow_type))


def _fold_reason(function: str, type_name: str, distinct: bool) -> str | None:
    if function == "listagg" and (distinct or not type_name.startswith(
            ("STRING", "VARCHAR", "CHAR"))):
        return "aggregate function listagg with distinct" if distinct else (
            f"aggregate function listagg on {type_name}")
    return None


def field_merge_reason(table: Any, value_columns: Sequence[str]) -> str | None:
    """Why a partial-update or aggregation table is not merged here, or None."""
    options = _options(table)
    engine = getattr(table.options.merge_engine(), "value", str(table.options.merge_engine()))
    fields = {f.name for f in table.fields}
    for sequence, grouped in sequence_groups(table).items():
        if engine != "partial-update" or sequence not in fields or not set(grouped) <= fields:
            return f"merge-engine {engine} with sequence group {sequence!r}"
    for key in options:
        if key.endswith("remove-record-on-delete") or key.endswith(
                "remove-record-on-sequence-group"):
            return f"merge-engine {engine} with {key}"
    if engine == "partial-update" and any(k.endswith(".aggregate-function") for k in options):
        return "merge-engine partial-update with aggregate functions"
    types = {f.name: str(f.type).upper() for f in table.fields}
    for column, function in field_functions(table, value_columns).items():
        if function not in _FUNCTIONS and function not in FOLDS and function not in COLLECTIONS \
                and function != "nested_update":
            return f"merge-engine {engine} with aggregate function {function}"
        reason = collection_reason(function, types.get(column, "")) or (
            _nested_reason(table, column) if function == "nested_update" else None)
        if reason is not None:
            return f"merge-engine {engine} with {reason}"
        distinct = options.get(f"fields.{column}.distinct", "false").lower() == "true"
        reason = _fold_reason(function, types.get(column, ""), distinct)
        if reason is not None:
            return f"merge-engine {engine} with {reason}"
    return None


def merge_fields(rows: pa.Table, keys: Sequence[str], functions: Mapping[str, str], *,
                 sequence_fields: Sequence[str] = (), ascending: bool = True,
                 delimiters: Mapping[str, str] | None = None,
                 groups: Mapping[str, Sequence[str]] | None = None,
                 nested: Mapping[str, Sequence[str]] | None = None) -> pa.Table:
    """One merged record per key of ``rows`` (a section: every record of its
    keys, with ``_SEQUENCE_NUMBER`` and ``_VALUE_KIND``), in key order, as
    ``+I``. ``functions``: the merge function of each value column; other
    columns (keys, partition) are taken from the key's latest record. The
    records of a key are in ``sequence_fields`` order (``ascending`` or not),
    then ``_SEQUENCE_NUMBER``, as the deduplicate merge orders them.
    ``delimiters``: each ``listagg`` column's delimiter (``,`` otherwise);
    ``groups``: the sequence groups (:func:`sequence_groups`); ``nested``: each
    ``nested_update`` column's nested key (:func:`nested_keys`)."""
    if rows.num_rows == 0:
        return rows
    kinds = np.asarray(rows.column(VALUE_KIND).to_numpy(zero_copy_only=False))
    if not ((kinds == 0) | (kinds == 2)).all():
        raise Unsupported("a retraction in a partial-update or aggregation merge")
    # The rows are never materialised in key order as a whole: each column is
    # taken once, at the positions it needs (``order`` composed with them).
    fast = integer_key_order(rows, keys, sequence_fields)
    if fast is not None:
        order, changes = fast
    else:
        direction = "ascending" if ascending else "descending"
        sort_keys = ([(k, "ascending") for k in keys] + [(f, direction) for f in sequence_fields]
                     + [(SEQUENCE_NUMBER, "ascending")])
        order = np.asarray(pc.sort_indices(rows, sort_keys=sort_keys, null_placement="at_start")
                           .to_numpy(zero_copy_only=False), dtype=np.int64)
        changes = key_changes([rows.column(k).take(order) for k in keys])
    starts = np.flatnonzero(np.concatenate(([True], changes)))
    last = np.flatnonzero(np.concatenate((changes, [True])))
    values = _merged_values(rows, order, starts, functions, delimiters=delimiters or {},
                            groups=groups or {}, nested=nested or {})
    merged = rows.take(pa.array(order[last]))
    for column, value in values.items():
        target = merged.schema.field(column).type
        value = cast_column(value, target)
        merged = merged.set_column(merged.schema.get_field_index(column), column, value)
    kind_index = merged.schema.get_field_index(VALUE_KIND)
    return merged.set_column(kind_index, VALUE_KIND,
                             pa.array(np.zeros(merged.num_rows, dtype=np.int8)))


def _merged_values(rows: pa.Table, order: np.ndarray, starts: np.ndarray,
                   functions: Mapping[str, str], *, delimiters: Mapping[str, str],
                   groups: Mapping[str, Sequence[str]],
                   nested: Mapping[str, Sequence[str]]) -> dict[str, Any]:
    """Each merged column's value per key: ``rows`` in ``order`` (key, then
    sequence order) are the keys' records, each key's from ``starts``."""
    taken = pa.array(order)

    def ordered(column: str) -> Any:
        return rows.column(column).take(taken)

    folded = {c: f for c, f in functions.items() if _folded(f, rows.schema.field(c).type)}
    collected = {c: f for c, f in functions.items() if f in COLLECTIONS or f == "nested_update"}
    picked = {c: f for c, f in functions.items() if c not in folded and c not in collected
              and _FUNCTIONS[f][0] in ("first", "last")}
    hashed = {c: f for c, f in functions.items()
              if c not in folded and c not in collected and c not in picked}
    values: dict[str, Any] = {
        **{c: FOLDS[f](ordered(c), starts, delimiters.get(c, ",")) for c, f in folded.items()},
        **{c: nested_update(ordered(c), starts, nested.get(c, ()))
           if f == "nested_update" else COLLECTIONS[f](ordered(c), starts)
           for c, f in collected.items()},
        **{c: _pick(rows.column(c), order, f, starts) for c, f in picked.items()},
        **(_hash_aggregate(rows.select(list(hashed)).take(taken), hashed, starts)
           if hashed else {})}
    for sequence, grouped in groups.items():
        winners = _group_winners(ordered(sequence), starts)
        values.update({c: ordered(c).take(winners) for c in (sequence, *grouped)
                       if c in rows.column_names})
    return values


def _pick(values: Any, order: np.ndarray, function: str, starts: Any) -> Any:
    """first/last (non-null) value of ``values`` (in ``order``, its keys'
    records from ``starts``): a position per key, by a segmented min/max of
    row positions (nulls excluded when they are skipped), taken at once."""
    how, skip_nulls = _FUNCTIONS[function]
    n = len(values)
    positions = np.arange(n, dtype=np.int64)
    if skip_nulls and values.null_count:
        valid = np.asarray(values.is_valid().to_numpy(zero_copy_only=False), dtype=bool)[order]
        positions = np.where(valid, positions, -1 if how == "last" else n)
    chosen = (np.maximum.reduceat(positions, starts) if how == "last"
              else np.minimum.reduceat(positions, starts))
    missing = (chosen < 0) | (chosen >= n)
    return values.take(pa.array(order[np.where(missing, 0, chosen)],
                                mask=missing if missing.any() else None))


def _hash_aggregate(ordered: pa.Table, hashed: Mapping[str, str], starts: Any
                    ) -> dict[str, Any]:
    """One grouped pyarrow aggregation for the order-free functions."""
    if not hashed:
        return {}
    group = np.repeat(np.arange(len(starts), dtype=np.int64),
                      np.diff(np.append(starts, ordered.num_rows)))
    grouped = pa.table({"_g": group, **{c: ordered.column(c) for c in hashed}})
    aggregations = []
    for column, function in hashed.items():
        how, skip_nulls = _FUNCTIONS[function]
        aggregations.append((column, how, pc.ScalarAggregateOptions(
            skip_nulls=skip_nulls, min_count=1)))
    result = grouped.group_by("_g", use_threads=False).aggregate(aggregations)
    return {c: result.column(f"{c}_{_FUNCTIONS[f][0]}") for c, f in hashed.items()}


def _group_winners(sequence: Any, starts: Any) -> pa.Array:
    """Per key, the position of its record with the greatest non-null
    ``sequence`` (the latest of equal ones), null when there is none: the
    engine updates a group from each record whose sequence is not null and
    at least the group's. A key's only record is its own winner: the
    engine's ReducerMergeFunctionWrapper returns a lone record unmerged."""
    n = len(sequence)
    lengths = np.diff(np.append(starts, n))
    ranked = pa.table({"key": np.repeat(np.arange(len(starts), dtype=np.int64), lengths),
                       "sequence": sequence, "position": np.arange(n, dtype=np.int64)})
    order = pc.sort_indices(ranked, sort_keys=[("key", "ascending"), ("sequence", "ascending"),
                                               ("position", "ascending")],
                            null_placement="at_start")
    ends = np.append(starts[1:], n) - 1
    winners = np.asarray(order.to_numpy(zero_copy_only=False), dtype=np.int64)[ends]
    found = np.asarray(sequence.is_valid().to_numpy(zero_copy_only=False), dtype=bool)[winners]
    found |= lengths == 1
    return pa.array(np.where(found, winners, 0), mask=~found)
