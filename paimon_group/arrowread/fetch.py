"""How a data file's bytes come off the store: few requests on an object store.

On a local disk pyarrow reads a file where it lies, column by column, and that
costs nothing but the reads. On an object store every read is a request with
a round trip (and a price): pyarrow's Parquet reader asks for the footer, then
for each column chunk apart, six ranged GETs for a small primary-key file (and
one HEAD, for the size, that pyarrow's Python API cannot skip).

So, on a remote file system:

* a file up to :data:`WHOLE_FILE_BYTES` (the size the manifest gives) is
  fetched whole, in one GET, and decoded from memory: Paimon's data files are
  mostly far smaller than that (``target-file-size`` is 128 MiB for primary-key
  tables, but level-0 files and most files of a streaming job are a few MiB);
* a larger file is opened with Parquet's ``pre_buffer``: the footer, then the
  projected columns' chunks coalesced into as few ranged reads as their
  layout allows (only the projected columns are fetched);
* the files of a split are fetched ahead, several at once, on an I/O pool of
  their own (:class:`Prefetcher`), while the file before them decodes; a
  split read whole starts fetching all its files (up to 64 MiB) at once,
  not section by section (:class:`SplitFetches`).

A local file system reads as before.
"""

from __future__ import annotations

import collections
import contextlib
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pyarrow as pa

from paimon_group.store.files import is_remote_fs as is_remote

__all__ = ["WHOLE_FILE_BYTES", "Prefetcher", "SplitFetches", "fetch_ahead", "fetch_whole",
           "is_remote", "open_source"]

WHOLE_FILE_BYTES = 16 << 20
"""A remote data file up to this size is fetched in one GET and decoded from
memory; a larger one is read by ranges (footer, then coalesced columns)."""

PREFETCH_FILES = 4
"""Files of a split fetched ahead of the one decoding (at most
``PREFETCH_FILES * WHOLE_FILE_BYTES`` bytes held per split being read)."""

SPLIT_AHEAD_BYTES = PREFETCH_FILES * WHOLE_FILE_BYTES
"""The most bytes of a split's files fetched ahead of its units (:class:`SplitFetches`)."""

IO_THREADS = 8
"""Threads that wait on the object store: requests, not CPU, so more than the
decode pool's; shared by the process."""

_IO_POOL: ThreadPoolExecutor | None = None
_IO_POOL_LOCK = threading.Lock()


def io_pool() -> ThreadPoolExecutor:
    """The process-wide pool of :data:`IO_THREADS` threads that fetch files.
    Separate from the decode pool: a decode thread may wait on a fetch, and a
    fetch never waits on anything but the store (no nesting, so no deadlock)."""
    global _IO_POOL
    with _IO_POOL_LOCK:
        if _IO_POOL is None:
            _IO_POOL = ThreadPoolExecutor(IO_THREADS, thread_name_prefix="paimon-group-fetch")
        return _IO_POOL


def _whole(file: Any) -> bool:
    size = getattr(file, "file_size", None)
    return size is not None and 0 <= int(size) <= WHOLE_FILE_BYTES


def fetch_whole(file_io: Any, file: Any) -> pa.Buffer | None:
    """The bytes of ``file`` if it lives on an object store and is fetched whole
    (see the module docstring); None when it is read where it lies."""
    fs = file_io.filesystem
    if not is_remote(fs) or not _whole(file):
        return None
    with fs.open_input_file(file_io.to_filesystem_path(file.physical_path())) as source:
        data: pa.Buffer = source.read_buffer()
    return data


@contextlib.contextmanager
def open_source(file_io: Any, file: Any, fetched: pa.Buffer | None = None
                ) -> Iterator[tuple[Any, bool]]:
    """``(source, pre_buffer)`` to decode ``file`` from: the bytes fetched
    already, the file fetched whole now, or the file opened for ranged reads
    (``pre_buffer`` True on an object store: coalesce the column reads)."""
    if fetched is None:
        fetched = fetch_whole(file_io, file)
    if fetched is not None:
        yield pa.BufferReader(fetched), False
        return
    fs = file_io.filesystem
    with fs.open_input_file(file_io.to_filesystem_path(file.physical_path())) as source:
        yield source, is_remote(fs)


def fetch_ahead(file_io: Any, files: Sequence[Any], ahead: SplitFetches | None = None
                ) -> dict[int, Future[pa.Buffer | None]]:
    """The fetches of ``files`` (by ``id(file)``), without waiting for them:
    those ``ahead`` started, the others started now on the I/O pool; empty
    on a local file system (files are read where they lie)."""
    futures = ahead.futures(files) if ahead is not None else {}
    if not is_remote(getattr(file_io, "filesystem", None)):
        return futures
    for file in files:
        if id(file) not in futures:
            futures[id(file)] = io_pool().submit(fetch_whole, file_io, file)
    return futures


class Prefetcher:
    """Fetches the files of a split ahead, at most :data:`PREFETCH_FILES` at once.

    ``take(i)`` returns the bytes of file ``i`` (None when it is read where it
    lies) and starts the fetch of the next ones; files must be taken in order.
    On a local file system nothing is fetched and every ``take`` is None.
    """

    def __init__(self, file_io: Any, files: Sequence[Any]) -> None:
        self._file_io = file_io
        self._files = list(files)
        self._active = is_remote(getattr(file_io, "filesystem", None)) and len(self._files) > 1
        self._ahead: collections.deque[Future[pa.Buffer | None]] = collections.deque()
        self._next = 0

    def _fill(self) -> None:
        while self._next < len(self._files) and len(self._ahead) < PREFETCH_FILES:
            self._ahead.append(io_pool().submit(fetch_whole, self._file_io,
                                                self._files[self._next]))
            self._next += 1

    def take(self) -> pa.Buffer | None:
        if not self._active:
            return None
        self._fill()
        data = self._ahead.popleft().result()
        self._fill()
        return data

    def close(self) -> None:
        """Drop what was fetched and not taken (a read that stopped early)."""
        for future in self._ahead:
            future.cancel()
        self._ahead.clear()


class SplitFetches:
    """The files of a whole split fetched at once, ahead of its units.

    A merged split is read section by section (each a unit); fetching each
    section's files only when it decodes makes one round trip a section on
    an object store. This fetches every file of the split that is fetched
    whole, up to :data:`SPLIT_AHEAD_BYTES` in all (in order), on the I/O
    pool as soon as the split starts; :meth:`futures` hands a unit its files'
    bytes (None for a file not fetched ahead: it is fetched as before).
    Nothing is done on a local file system or for a split of one unit.
    """

    def __init__(self, file_io: Any, files: Sequence[Any], *, units: int) -> None:
        self._ahead: dict[int, Future[pa.Buffer | None]] = {}
        if units < 2 or not is_remote(getattr(file_io, "filesystem", None)):
            return
        budget = SPLIT_AHEAD_BYTES
        for file in files:
            if not _whole(file) or int(file.file_size) > budget:
                break
            budget -= int(file.file_size)
            self._ahead[id(file)] = io_pool().submit(fetch_whole, file_io, file)

    def futures(self, files: Sequence[Any]) -> dict[int, Future[pa.Buffer | None]]:
        """The fetches started ahead for ``files`` (by ``id(file)``), handed
        over (not waited for): each is taken once."""
        return {id(f): future for f in files
                if (future := self._ahead.pop(id(f), None)) is not None}

    def close(self) -> None:
        """Drop what was fetched and not taken (a read that stopped early)."""
        for future in self._ahead.values():
            future.cancel()
        self._ahead.clear()
