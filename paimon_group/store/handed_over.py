"""Metadata files handed over by the group's head: read from the store once by
the leader, planned from by every member.

When a new snapshot is committed, every member that owns shards plans it:
each reads the snapshot's delta (or changelog) manifest list and the
manifests in it, the same few small files, four requests a member on an
object store (pyarrow asks for a file's size before it reads it). The
leader's head poll (:mod:`paimon_group.member.head`) reads them once, up to
:data:`HANDED_OVER_MAX` bytes in all, and publishes them with the new latest;
each member keeps them here, and its planner's manifest readers take them
from memory (:class:`HandedOverFileIO`).

Manifest lists and manifests are written once under a unique name and never
changed, so the bytes handed over are exactly what the store would return;
a file not handed over (too large, an older snapshot, a member that missed
the publication) is read from the store as before.

Example::

    files = HandedOverFiles()
    files.add({"manifest-list-1": b"..."})
    assert files.get("manifest-list-1") == b"..."
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any

import pyarrow as pa

__all__ = ["HANDED_OVER_KEPT", "HANDED_OVER_MAX", "HandedOverFileIO", "HandedOverFiles"]

HANDED_OVER_MAX = 64 * 1024
"""The most bytes of metadata files the head hands over for one snapshot."""

HANDED_OVER_KEPT = 16 * 1024 * 1024
"""How many bytes of handed-over files a member keeps (the newest)."""


class HandedOverFiles:
    """Files by name (a table's manifest directory), the newest kept up to
    ``kept`` bytes; shared by the event loop (which adds) and planning threads
    (which read)."""

    def __init__(self, kept: int = HANDED_OVER_KEPT) -> None:
        self._kept = kept
        self._lock = threading.Lock()
        self._files: dict[str, bytes] = {}
        self._bytes = 0
        self._flights: dict[str, Future[bytes]] = {}  # reads under way, by name

    def add(self, files: Mapping[str, bytes]) -> None:
        with self._lock:
            for name, data in files.items():
                if len(data) > self._kept:
                    continue
                old = self._files.pop(name, None)
                self._bytes -= 0 if old is None else len(old)
                self._files[name] = data
                self._bytes += len(data)
            while self._bytes > self._kept:
                oldest = next(iter(self._files))
                self._bytes -= len(self._files.pop(oldest))

    def get(self, name: str) -> bytes | None:
        with self._lock:
            return self._files.get(name)

    def fetch(self, name: str, read: Callable[[], bytes], *, keep: bool = True) -> bytes:
        """The file's bytes: kept, being read by another thread (waited for:
        two threads never read one file at once, e.g. the leader's head poll
        and a new group's first look at its table), or read now by ``read``
        (and kept, with ``keep``)."""
        with self._lock:
            data = self._files.get(name)
            if data is not None:
                return data
            flight = self._flights.get(name)
            mine = flight is None and keep
            if mine:
                flight = self._flights[name] = Future()
        if flight is not None and not mine:
            return flight.result()
        if not mine:
            return read()
        assert flight is not None
        try:
            data = read()
        except BaseException as err:
            flight.set_exception(err)
            raise
        finally:
            with self._lock:
                self._flights.pop(name, None)
        self.add({name: data})
        flight.set_result(data)
        return data

    def clear(self) -> None:
        with self._lock:
            self._files.clear()
            self._bytes = 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._files)


class HandedOverFileIO:
    """A pypaimon ``FileIO`` for manifest readers: files of ``directory`` that
    were handed over are read from memory, everything else by ``delegate``;
    with ``keep``, what is read of ``directory`` is kept too (a new group's
    first look at its table, read again by its first plan)."""

    def __init__(self, delegate: Any, files: HandedOverFiles, directory: str, *,
                 keep: bool = False) -> None:
        self._delegate = delegate
        self._files = files
        self._prefix = directory.rstrip("/") + "/"
        self._keep = keep

    def new_input_stream(self, path: str) -> Any:
        if not path.startswith(self._prefix):
            return self._delegate.new_input_stream(path)
        def read() -> bytes:
            with self._delegate.new_input_stream(path) as source:
                data: bytes = source.read()
            return data

        return pa.BufferReader(self._files.fetch(path[len(self._prefix):], read, keep=self._keep))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._delegate, name)
