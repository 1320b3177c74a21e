"""A sink that writes each source table's output into its own Paimon target.

A group of several tables (docs/many-tables.md) delivers batches of each of
its tables; :class:`PaimonSinks` routes each batch by its source table
(``batch.table``, ``database.table``) to the
:class:`~paimon_group.sink.paimon.PaimonSink` of that table's target, given
as a mapping of source table to target table or as a function of the source
table. Each target keeps its own marks, so each source table's output is in
its target once. Several source tables may share one target: their marks
are kept per source table there (:mod:`paimon_group.sink.marks`). A batch of
a source table without a target is refused in one line, nothing written.

Example (a ``paimon-group run`` handler)::

    from paimon_group.sink import PaimonSinks

    sinks = PaimonSinks("/data/wh", {"shop.orders": "shop.orders_enriched",
                                     "shop.items": "shop.items_enriched"})

    def handle(batch):
        sinks.write(enrich(batch.to_arrow()), batch)
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from paimon_group.errors import ConfigError, PaimonGroupError
from paimon_group.sink.marks import Verdict
from paimon_group.sink.paimon import COMMIT_INTERVAL_S, COMMIT_ROWS, PaimonSink, SourceBatch

__all__ = ["PaimonSinks", "Targets"]

Targets = Mapping[str, str] | Callable[[str], str | None]
"""Source table -> target table (each ``database.table``): a mapping, or a
function (None, or a missing key: the source table has no target)."""


class PaimonSinks:
    """Writes each source table's output into its own Paimon target, once.

    ``targets``: a mapping of source table to target table (every target is
    opened here, so a target the sink cannot write is refused at once), or
    a function of the source table (a target is opened at the first batch of
    a source table routed to it). The other arguments are
    :class:`~paimon_group.sink.paimon.PaimonSink`'s, for every target.
    Thread-safe: one serves every shard of a member, whatever its table.
    """

    def __init__(
        self,
        warehouse: str,
        targets: Targets,
        *,
        catalog_options: Mapping[str, str] | None = None,
        commit_interval_s: float = COMMIT_INTERVAL_S,
        commit_rows: int = COMMIT_ROWS,
    ) -> None:
        self._warehouse = warehouse
        self._catalog_options = catalog_options
        self._commit_interval_s = commit_interval_s
        self._commit_rows = commit_rows
        self._lock = threading.Lock()
        self._sinks: dict[str, PaimonSink] = {}  # by target table
        self._closed = False
        self._mapping: dict[str, str] | None = None
        if isinstance(targets, Mapping):
            self._mapping = _checked(targets)
            try:
                for target in dict.fromkeys(self._mapping.values()):
                    self._open(target)
            except BaseException:
                self.close()
                raise
        elif callable(targets):
            self._route = targets
        else:
            raise ConfigError(
                f"PaimonSinks takes a mapping of source table to target table, or a function "
                f"of the source table, not a {type(targets).__name__} (one target: PaimonSink)")

    @property
    def sinks(self) -> dict[str, PaimonSink]:
        """The sink of each target opened so far, by target table."""
        with self._lock:
            return dict(self._sinks)

    def target_of(self, table: str) -> str:
        """The target table of the source ``table``; one line if it has none."""
        if self._mapping is not None:
            target: str | None = self._mapping.get(table)
            names = ", ".join(sorted(self._mapping))
            why = f"the sink's mapping names {names} only"
        else:
            try:
                target = self._route(table)
            except LookupError:
                target = None
            why = "the sink's function of the source table gave none"
        if not target:
            raise ConfigError(f"no target for the source table {table!r}: {why}; add it, or "
                              "leave the table out of the group's --table")
        return target

    def sink_of(self, table: str) -> PaimonSink:
        """The sink of the source ``table``'s target (opened if it is not yet)."""
        return self._open(self.target_of(table))

    def write(self, rows: Any, batch: SourceBatch) -> None:
        """Write ``rows`` as the output of ``batch`` into its source table's
        target, as :meth:`PaimonSink.write <paimon_group.sink.paimon.PaimonSink.write>`
        writes them (its errors are that sink's)."""
        self.sink_of(_table_of(batch)).write(rows, batch)

    def write_many(self, items: Sequence[tuple[Any, SourceBatch]]) -> list[Verdict]:
        """:meth:`PaimonSink.write_many <paimon_group.sink.paimon.PaimonSink.write_many>`
        of each target's items (one commit per target, in the order the
        targets first appear); each item's verdict, in order."""
        by_target: dict[str, list[int]] = {}
        for i, (_, batch) in enumerate(items):
            by_target.setdefault(self.target_of(_table_of(batch)), []).append(i)
        verdicts: list[Verdict | None] = [None] * len(items)
        for target, indexes in by_target.items():
            found = self._open(target).write_many([items[i] for i in indexes])
            for i, verdict in zip(indexes, found, strict=True):
                verdicts[i] = verdict
        return [v for v in verdicts if v is not None]

    def close(self, timeout: float | None = None) -> None:
        """Close every target's sink (each commits what it has queued). Idempotent."""
        with self._lock:
            self._closed = True
            sinks = list(self._sinks.values())
        for sink in sinks:
            sink.close(timeout)

    def __enter__(self) -> PaimonSinks:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _open(self, target: str) -> PaimonSink:
        with self._lock:
            if self._closed:
                raise PaimonGroupError("the sink is closed")
            sink = self._sinks.get(target)
            if sink is None:
                sink = PaimonSink(self._warehouse, target,
                                  catalog_options=self._catalog_options,
                                  commit_interval_s=self._commit_interval_s,
                                  commit_rows=self._commit_rows)
                self._sinks[target] = sink
            return sink


def _checked(targets: Mapping[str, str]) -> dict[str, str]:
    """``targets`` as a dict; one line for a name that is not ``database.table``."""
    out = dict(targets)
    for name in (*out, *out.values()):
        if not isinstance(name, str) or name.count(".") != 1 or "" in name.split("."):
            raise ConfigError(f"PaimonSinks: {name!r} is not a table name (database.table)")
    return out


def _table_of(batch: SourceBatch) -> str:
    """The source table of ``batch``; one line for a batch that does not say."""
    table = str(getattr(batch, "table", "") or "")
    if not table:
        raise ConfigError(
            f"group {batch.group} shard {batch.shard}: the batch does not say its source "
            "table (ShardBatch(table=...)), and PaimonSinks writes each source table's "
            "output into the target it names")
    return table
