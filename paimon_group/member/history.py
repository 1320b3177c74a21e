"""An opt-in history of what a member did, for fault tests and audits.

Each line of the JSONL file is one event with a monotonic timestamp (``t``,
CLOCK_MONOTONIC, comparable across the processes of one host) and a wall-clock
one (``wall``). Events: ``acquire``, ``release``, ``lost``, ``deliver`` (a
batch handed to the handler and returned), ``commit`` (an attempt, with
``outcome`` ``accepted`` / ``rejected`` / ``refused`` -- refused locally,
never sent: the member was leaving and its session was already closed, or
the shard's revocation had ended; ``written`` false: accepted, its position
not written, being lower than one stored).

The file is never opened through a symbolic link (refused in one line), and
is created readable and writable by its owner only (0600).

Example::

    >>> import tempfile, os, json
    >>> path = os.path.join(tempfile.mkdtemp(), "h.jsonl")
    >>> rec = HistoryRecorder(path, member_id="m1")
    >>> rec.record("acquire", shard=0, epoch=3)
    >>> json.loads(open(path).read())["event"]
    'acquire'
"""

from __future__ import annotations

import errno
import json
import os
import threading
from typing import Any

from paimon_group.config.clock import SYSTEM_CLOCK, Clock
from paimon_group.errors import ConfigError

HISTORY_MODE = 0o600
"""A new history file is its owner's alone (an existing one keeps its mode)."""


def symlink_refusal(path: str, what: str = "history file") -> ConfigError:
    """The one line refusing a history path that is a symbolic link (``what``:
    how the path was given, ``--history`` on the command line)."""
    return ConfigError(f"{what} {path} is a symbolic link: refused (it could send the "
                       "history anywhere); give the path of the file itself")


def open_history(path: str) -> int:
    """``path`` opened to append, created :data:`HISTORY_MODE` if missing; never
    through a symbolic link (``O_NOFOLLOW``: one planted in a shared folder
    would make the member write, or create, a file of the link's choosing)."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(path, flags, HISTORY_MODE)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise symlink_refusal(path) from None
        raise


class HistoryRecorder:
    """Appends events to a JSONL file; each write is one ``O_APPEND`` line."""

    def __init__(self, path: str, member_id: str, clock: Clock = SYSTEM_CLOCK) -> None:
        self.path = path
        self.member_id = member_id
        self._clock = clock
        self._lock = threading.Lock()
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self._fd = open_history(path)

    def record(self, event: str, **fields: Any) -> None:
        line = {
            "t": self._clock.monotonic(),
            "wall": self._clock.wall(),
            "event": event,
            "member": self.member_id,
            "pid": os.getpid(),
            **fields,
        }
        data = (json.dumps(line, sort_keys=True) + "\n").encode()
        with self._lock:
            if self._fd < 0:
                return  # closed: the member has stopped
            os.write(self._fd, data)

    def close(self) -> None:
        """Close the file, once. A second close must not close the descriptor
        number again: the process may have reused it for another file since
        (a member stopped twice would close the history of a member started
        after it, whose next write fails with EBADF; a socket or a database
        could as well be closed)."""
        with self._lock:
            fd, self._fd = self._fd, -1
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` ran: records made since are dropped (a member
        closes its history when it stops, a start that failed included)."""
        return self._fd < 0


class NullRecorder(HistoryRecorder):
    """Records nothing."""

    def __init__(self) -> None:
        self.member_id = ""
        self._fd = -1

    def record(self, event: str, **fields: Any) -> None:
        return None

    def close(self) -> None:
        return None
