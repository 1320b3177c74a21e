"""The epoch fence of the sinks: per (group, shard), the highest epoch that
has published, and a lock that makes the check and the publication one step.

Epochs of a shard strictly increase across its owners, so a writer whose
epoch is lower than one that has published for the shard is a former owner
(paused, partitioned, or a query that lost the shard): it is refused. Used
by :class:`~paimon_group.spark.sinks.ParquetBatchSink` and by the streaming
source's :func:`~paimon_group.spark.source.sink.write_replacing`. The state
lives on a POSIX filesystem (``flock`` locks, atomic renames): local, or a
shared mount whose locks work across hosts.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

from paimon_group.errors import StaleSinkWrite

__all__ = ["EpochFence", "Fenced", "StaleSinkWrite", "fsync_dir", "state_dir_of",
           "write_atomically"]


class Fenced(Protocol):
    """What the fence needs of a writer: its group, shard and epoch."""

    @property
    def group(self) -> str: ...

    @property
    def shard(self) -> int: ...

    @property
    def epoch(self) -> int: ...


class EpochFence:
    """Highest epoch that has written, per (group, shard), in files under ``directory``.

    :meth:`hold` takes an exclusive lock for the (group, shard) (``flock``:
    processes on one host, or a shared filesystem whose locks work across
    hosts), checks the batch's epoch against the recorded one, records it if
    higher, and keeps the lock while the caller publishes, so the check and
    the write are one atomic step for every writer of that shard.

    Example::

        fence = EpochFence("/data/out/_fence")
        with fence.hold(batch):      # raises StaleSinkWrite if a newer epoch wrote
            publish(batch)
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)

    def _paths(self, group: str, shard: int) -> tuple[Path, Path]:
        base = self.directory / f"pg_group={group}"
        return base / f"pg_shard={shard}.epoch", base / f"pg_shard={shard}.lock"

    def highest(self, group: str, shard: int) -> int | None:
        """The highest epoch recorded for (group, shard), or None."""
        path, _ = self._paths(group, shard)
        try:
            return int(path.read_text().strip())
        except FileNotFoundError:
            return None

    def check(self, batch: Fenced) -> None:
        """Raise :class:`StaleSinkWrite` if a newer epoch already wrote (no lock; a hint)."""
        highest = self.highest(batch.group, int(batch.shard))
        if highest is not None and int(batch.epoch) < highest:
            raise self._stale(batch, highest)

    def _stale(self, batch: Fenced, highest: int) -> StaleSinkWrite:
        return StaleSinkWrite(
            f"sink fence {self.directory}: shard {batch.shard} of group {batch.group!r} was "
            f"written with epoch {highest}; refusing epoch {batch.epoch} (this member no "
            "longer owns the shard)"
        )

    @contextlib.contextmanager
    def shared(self, group: str, shard: int) -> Iterator[None]:
        """Hold (group, shard)'s lock in shared mode: no publication of the
        shard happens meanwhile (a reader's consistent view)."""
        _, lock_path = self._paths(group, int(shard))
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        with open(lock_path, "a+b") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_SH)
            try:
                yield
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)

    @contextlib.contextmanager
    def hold(self, batch: Fenced, *, check_epoch: bool = True) -> Iterator[None]:
        """Lock (group, shard); unless ``check_epoch`` is False, refuse a stale epoch and
        record a newer one. Publish inside the ``with`` block."""
        group, shard, epoch = batch.group, int(batch.shard), int(batch.epoch)
        path, lock_path = self._paths(group, shard)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(lock_path, "a+b") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            try:
                if check_epoch:
                    highest = self.highest(group, shard)
                    if highest is not None and epoch < highest:
                        raise self._stale(batch, highest)
                    if highest is None or epoch > highest:
                        write_atomically(path, f"{epoch}\n".encode())
                yield
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def state_dir_of(root: Path) -> Path:
    """Where a sink rooted at ``root`` keeps its staging, fence and log.

    A sink created by an earlier version keeps them inside ``root``
    (``root/_fence`` exists): they stay there, so its fence's recorded
    epochs keep refusing stale writers.
    """
    if (root / "_fence").is_dir():
        return root
    return root.parent / f".{root.name}.pg-sink"
