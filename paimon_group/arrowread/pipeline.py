"""Reading splits whole with the next units decoding while one merges.

A read of splits (``to_arrow``) goes unit by unit (a file, or a merged
section), in split order. Each file of a unit is decoded by a task on the
process's decode pool (pyarrow releases the GIL while it decodes), and the
files of up to :data:`UNITS_AHEAD` following units are submitted as soon as
the calling thread takes a unit, so that they decode while the caller merges
the unit (sort, take: GIL released too) and cuts its output. With 2 cores
the decode of the next section overlaps the merge of this one, and the files
of one section decode side by side, which a read of one split (a shard of
one bucket) did not do before.

Memory: at most the unit being merged and :data:`UNITS_AHEAD` units decoded
ahead are held beyond the output (which a whole read holds anyway).

A split that turns out :class:`Unsupported` while its files decode gives no
output here (None): the caller hands it whole to pypaimon's reader. Its
remaining units are not decoded; decodes already running when a split fails
or the read stops are waited for before the read returns.

Deadlock: only the calling thread waits on decode tasks, and decode tasks
wait on nothing but fetches (the I/O pool), so this must not be called from
a decode-pool thread (nothing in the package does).
"""

from __future__ import annotations

import collections
import concurrent.futures
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

import pyarrow as pa

from paimon_group.arrowread.fetch import SplitFetches
from paimon_group.arrowread.files import Unsupported
from paimon_group.arrowread.reader import ArrowSplitReader, Unit, decode_pool

__all__ = ["UNITS_AHEAD", "read_split_tables"]

UNITS_AHEAD = 2
"""Units whose files are submitted for decoding beyond the one being merged."""


class _Pending:
    """A unit submitted for decoding: its split's index and its files' tasks."""

    def __init__(self, split: int, unit: Unit, tasks: list[Future[pa.Table]]) -> None:
        self.split = split
        self.unit = unit
        self.tasks = tasks


class _SplitTables:
    """Reads the splits' units in order; see the module docstring."""

    def __init__(self, reader: ArrowSplitReader, splits: Sequence[Any],
                 note: Callable[[str], None]) -> None:
        self.reader = reader
        self.splits = splits
        self.note = note
        self.results: list[list[pa.Table] | None] = [[] for _ in splits]
        self.jobs: collections.deque[tuple[int, Unit]] = collections.deque()
        self.units: list[list[Unit]] = [[] for _ in splits]
        self.left: list[int] = [0] * len(splits)  # units of each split not merged yet
        self.fetches: dict[int, SplitFetches] = {}
        self.pending: collections.deque[_Pending] = collections.deque()
        self.abandoned: list[Future[pa.Table]] = []
        for index, split in enumerate(splits):
            try:
                units = reader.units(split)
            except Unsupported as err:
                self._fail(index, err)
                continue
            self.units[index] = units
            self.left[index] = len(units)
            self.jobs.extend((index, unit) for unit in units)

    def _fail(self, index: int, err: Unsupported) -> None:
        self.note(str(err))
        self.results[index] = None
        fetches = self.fetches.pop(index, None)
        if fetches is not None:
            fetches.close()

    def _submit(self) -> None:
        pool = decode_pool()
        while self.jobs and len(self.pending) < UNITS_AHEAD:
            index, unit = self.jobs.popleft()
            if self.results[index] is None:  # its split failed: pypaimon reads it
                continue
            ahead = self.fetches.get(index)
            if ahead is None:  # the split starts: all its files start fetching
                units = self.units[index]
                ahead = SplitFetches(self.reader.table.file_io,
                                     [f for u in units for f, _ in u.files], units=len(units))
                self.fetches[index] = ahead
            try:
                decoders = self.reader.unit_decoders(unit, ahead)
            except Unsupported as err:
                self._fail(index, err)
                continue
            self.pending.append(_Pending(index, unit, [pool.submit(d) for d in decoders]))

    def _merge(self, unit: _Pending) -> None:
        results = self.results[unit.split]
        if results is None:  # an earlier unit of its split failed
            self._abandon(unit.tasks)
        else:
            try:
                tables = [task.result() for task in unit.tasks]
                unit.tasks = []  # the merge frees the decoded files (merge_unit)
                results.extend(self.reader.tables(self.reader.merge_unit(unit.unit, tables)))
            except Unsupported as err:
                self._fail(unit.split, err)
        self.left[unit.split] -= 1
        if self.left[unit.split] == 0:
            fetches = self.fetches.pop(unit.split, None)
            if fetches is not None:
                fetches.close()

    def run(self) -> list[list[pa.Table] | None]:
        try:
            self._submit()
            while self.pending:
                unit = self.pending.popleft()
                self._submit()  # the next units decode while this one merges
                self._merge(unit)
            return self.results
        finally:
            for unit in self.pending:
                self._abandon(unit.tasks)
            for fetches in self.fetches.values():
                fetches.close()
            # No decode of this read outlives it (nor holds its memory after).
            concurrent.futures.wait(self.abandoned)

    def _abandon(self, tasks: list[Future[pa.Table]]) -> None:
        """Cancel ``tasks``; those already running are waited for at the end."""
        self.abandoned.extend(task for task in tasks if not task.cancel())


def read_split_tables(reader: ArrowSplitReader, splits: Sequence[Any],
                      note: Callable[[str], None]) -> list[list[pa.Table] | None]:
    """The output tables of each split, in order (None: ``Unsupported``, with
    ``note(reason)`` called once per such split; pypaimon reads it)."""
    return _SplitTables(reader, splits, note).run()
