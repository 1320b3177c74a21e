"""Consumer files rewritten in place, as a local file system does it.

pypaimon's ``FileIO.overwrite_file_utf8`` opens the file for writing (the
file is truncated) and then writes the text: a reader in between reads an
empty file. On virtual time every I/O call runs inline, so nothing could
come in between; :func:`torn_consumer_writes` splits such a rewrite of a
consumer file (``consumer-...``) at a virtual-time step: the truncate now,
the text ``window`` seconds later (a loop timer), so a member starting or
resuming meanwhile reads the empty file. ``time.sleep`` on the loop's thread
moves the virtual clock (pypaimon's consumer reader retries after 0.2 s) and
completes the rewrites that are due. A rewrite that another replaces first
is dropped; the rewrite of a file deleted meanwhile (consumer expiration, a
dropped table) does not bring it back. A process killed in the window
(:meth:`Tears.abandon`) never writes the text: the file stays empty.

A writer that writes atomically (a temporary file renamed over the old one)
never passes through ``overwrite_file_utf8`` on the consumer file's own
path, so it never tears.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from tests.sim.loop import SimClock

CONSUMER_FILE = re.compile(r"/consumer/consumer-pg-[^/]+-shard-\d+$")
FULL_SCAN_MARK = "paimonGroupFullScan"  # paimon_group.reading.mirror.FULL_SCAN_FIELD


class Tears:
    def __init__(self, seed: int, clock: SimClock, loop: asyncio.AbstractEventLoop) -> None:
        self.rng = random.Random(f"tear:{seed}")
        self.clock = clock
        self.loop = loop
        # path -> (due, text, token, writer: the id of the writing member's FileIO)
        self.pending: dict[str, tuple[float, str, int, int]] = {}
        self._token = 0
        self.torn = 0  # rewrites split
        self.torn_reads = 0  # reads that saw a torn file
        self.abandoned = 0  # rewrites whose writer was killed in the window: left empty
        # shards whose file was read torn while its text marked a pending full scan
        self.torn_full_scans: set[int] = set()

    def texts(self) -> dict[str, str]:
        """Path (on the file system) -> the text being written."""
        return {p: text for p, (_due, text, _t, _w) in self.pending.items()}

    def write(self, real: Callable[..., Any], file_io: Any, path: str, content: str) -> None:
        fs_path = str(file_io.to_filesystem_path(path))
        if threading.get_ident() != self.clock.loop_thread or not CONSUMER_FILE.search(fs_path) \
                or not content or os.environ.get("PG_SIM_TEARS") == "0":
            self.pending.pop(fs_path, None)
            real(file_io, path, content)
            return
        real(file_io, path, "")  # opened for writing: truncated
        self._token += 1
        token = self._token
        due = self.clock.now + self.rng.uniform(0.001, 0.3)
        self.pending[fs_path] = (due, content, token, id(file_io))
        self.torn += 1
        self.loop.call_at(due, self._finish, fs_path, token)

    def _finish(self, fs_path: str, token: int) -> None:
        entry = self.pending.get(fs_path)
        if entry is None or entry[2] != token:
            return
        del self.pending[fs_path]
        if os.path.exists(fs_path):  # deleted meanwhile: the write went to the unlinked file
            with open(fs_path, "w", encoding="utf-8") as f:
                f.write(entry[1])

    def abandon(self, file_io: Any) -> None:
        """The writing process was killed: its rewrites in flight never
        complete (the files stay truncated, empty)."""
        for fs_path, entry in list(self.pending.items()):
            if entry[3] == id(file_io):
                del self.pending[fs_path]
                self.abandoned += 1

    def flush(self) -> None:
        for fs_path, (due, _text, token, _w) in list(self.pending.items()):
            if due <= self.clock.now:
                self._finish(fs_path, token)

    def read(self, real: Callable[..., Any], file_io: Any, path: str) -> Any:
        fs_path = str(file_io.to_filesystem_path(path))
        entry = self.pending.get(fs_path)
        if entry is not None:
            self.torn_reads += 1
            if FULL_SCAN_MARK in entry[1]:
                shard = fs_path.rsplit("-", 1)[1]
                self.torn_full_scans.add(int(shard) if shard.isdigit() else -1)
        return real(file_io, path)

    def sleep(self, real: Callable[[float], None], seconds: float) -> None:
        if threading.get_ident() != self.clock.loop_thread:
            real(seconds)
            return
        self.clock.now += max(0.0, seconds)
        self.flush()


@contextlib.contextmanager
def torn_consumer_writes(tears: Tears) -> Iterator[None]:
    from pypaimon.common.file_io import FileIO

    real_write = FileIO.overwrite_file_utf8
    real_read = FileIO.read_file_utf8
    real_sleep = time.sleep
    FileIO.overwrite_file_utf8 = (
        lambda self, path, content: tears.write(real_write, self, path, content))
    FileIO.read_file_utf8 = (
        lambda self, path: tears.read(real_read, self, path))
    time.sleep = lambda s: tears.sleep(real_sleep, float(s))
    try:
        yield
    finally:
        FileIO.overwrite_file_utf8 = real_write
        FileIO.read_file_utf8 = real_read
        time.sleep = real_sleep
