"""Row kinds in a sink's output: how a source change's kind reaches the target.

A member asked for row kinds (``include_row_kind``, ``--include-row-kind``)
delivers each row with ``_row_kind``: ``+I`` (insert), ``-U`` (the value
before an update), ``+U`` (the value after it) or ``-D`` (delete). Output
rows that carry ``_row_kind`` are written with that kind:

* a primary-key target declares ``'rowkind.field'``, a ``STRING`` column the
  sink fills from ``_row_kind``: Paimon then applies the kind (a ``-D``
  removes its key, a ``-U`` retracts it as Paimon does; ``+I``/``+U`` upsert);
* an append target records the kind in its ``STRING`` column ``_row_kind``,
  each change one row.

A target that cannot represent a retraction (``-U``/``-D``) refuses output
that holds one, in one line. Output without ``_row_kind`` is inserts; but
if the batch it came from read retractions from the source
(``ShardBatch.retractions``, counted whether or not kinds were requested),
the sink refuses it in one line rather than write a delete as an insert.

Example::

    kinds = kind_column(rows, "db.t")        # None: the rows carry no kinds
    retracted = retractions(kinds)           # rows that are -U or -D
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from paimon_group.errors import ConfigError

__all__ = ["KINDS", "RETRACTIONS", "ROW_KIND", "kind_column", "retractions"]

ROW_KIND = "_row_kind"
"""The column a member delivers each row's kind in."""
KINDS = ("+I", "-U", "+U", "-D")
RETRACTIONS = ("-U", "-D")


def kind_column(rows: pa.Table, identifier: str) -> pa.ChunkedArray | None:
    """``rows``' ``_row_kind`` as strings (None: the rows carry none); one
    line for a kind that is not one of :data:`KINDS` (or null)."""
    if ROW_KIND not in rows.column_names:
        return None
    column = rows.column(ROW_KIND)
    try:
        kinds: pa.ChunkedArray = column.cast(pa.string())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
        raise ConfigError(f"the output rows for {identifier} carry {ROW_KIND} of type "
                          f"{column.type}: it holds +I, -U, +U or -D") from err
    if kinds.null_count:
        raise ConfigError(f"the output rows for {identifier} carry {kinds.null_count} rows "
                          f"whose {ROW_KIND} is null: each holds +I, -U, +U or -D")
    unknown = sorted(set(pc.unique(kinds).to_pylist()) - set(KINDS))
    if unknown:
        raise ConfigError(f"the output rows for {identifier} carry {ROW_KIND} "
                          f"{', '.join(map(repr, unknown[:5]))}: each holds +I, -U, +U or -D")
    return kinds


def retractions(kinds: pa.ChunkedArray | pa.Array | None) -> int:
    """The ``-U`` and ``-D`` rows among ``kinds`` (0 for None)."""
    if kinds is None or len(kinds) == 0:
        return 0
    found = pc.sum(pc.is_in(kinds, value_set=pa.array(RETRACTIONS))).as_py()
    return int(found or 0)
