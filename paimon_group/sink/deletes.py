"""The deletes a primary-key target's data file holds, recorded in its metadata.

Paimon reads a section of a bucket that is one data file **raw**, without
merging, when the file's metadata says it holds no delete (``deleteRowCount``
0; a file of one level without deletes, likewise): its rows come out as they
are, ``-D`` and ``-U`` rows among them, as present rows. pypaimon's
primary-key writer records 0 for every file, also one holding the deletes
the sink wrote through ``'rowkind.field'``: a key the source deleted, alone
in its bucket's only file, then reads as present (in Spark, Flink or
pypaimon alike) until a compaction merges it away.

So the sink counts them itself, after the files are written and before they
are committed: for a batch whose rows hold a retraction, it reads back each
new file's ``_VALUE_KIND`` column (one small column of files it has just
written) and sets the file's ``delete_row_count`` to its ``-U`` and ``-D``
rows, as Paimon's own writers do. A format it cannot read back (Avro) gets
the batch's retractions, an upper bound: any count above 0 keeps the file
from being read raw, which is what matters.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["count_deletes"]

_RETRACTING_KINDS = pa.array([1, 3], pa.int8())  # -U, -D as _VALUE_KIND bytes


def count_deletes(file_io: Any, messages: Iterable[Any], retracted: int) -> None:
    """Set each new file's ``delete_row_count`` in ``messages`` (their
    :class:`~pypaimon.write.commit_message.CommitMessage`), for rows that
    held ``retracted`` retractions (0: nothing to count, every file holds
    none)."""
    if retracted <= 0:
        return
    for message in messages:
        for meta in message.new_files:
            counted = _read_back(file_io, meta)
            meta.delete_row_count = retracted if counted is None else counted


def _read_back(file_io: Any, meta: Any) -> int | None:
    """The ``-U`` and ``-D`` rows of one data file, or None when its format
    is not one pyarrow reads a column of (Avro)."""
    path = str(getattr(meta, "file_path", None) or "")
    if not path.endswith((".parquet", ".orc")):
        return None
    with file_io.new_input_stream(path) as stream:
        if path.endswith(".parquet"):
            import pyarrow.parquet as pq

            kinds = pq.ParquetFile(stream).read(columns=["_VALUE_KIND"]).column(0)
        else:
            import pyarrow.orc as orc

            kinds = orc.ORCFile(stream).read(columns=["_VALUE_KIND"]).column(0)
    found = pc.sum(pc.is_in(kinds.cast(pa.int8()), value_set=_RETRACTING_KINDS)).as_py()
    return int(found or 0)
