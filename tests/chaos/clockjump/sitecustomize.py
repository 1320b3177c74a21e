"""Shifts this process's wall clock by an offset read from a file (scenario 9).

Put this directory on the ``PYTHONPATH`` of one ``paimon-group run`` process
and set ``PG_WALL_CLOCK_OFFSET_FILE``: ``time.time()`` and ``time.time_ns()``
then return the real time plus the offset in seconds written in that file
(re-read at most every 50 ms), so a test jumps the wall clock of a running
member by rewriting the file. ``time.monotonic()`` is untouched: that is the
clock every deadline must use. (``datetime.now()`` reads the C clock and is
not shifted.)

grpc is exempt: it turns a timeout into an absolute ``time.time()`` deadline
that its C core compares with the C realtime clock, which this patch cannot
shift; in a real jump both clocks move together, so grpc keeps the real time
here (otherwise every etcd call of a member jumped back 30 s would expire at
once, an artefact of the patch).

Debian's libfaketime 0.9.10 was tried first: with
``FAKETIME_DONT_FAKE_MONOTONIC=1`` (a wall-clock-only jump) Python 3.11's
``time.sleep`` fails with EINVAL (its ``clock_nanosleep`` wrapper), and
without it the monotonic clock jumps too, which is not this scenario.

Example::

    echo 30 > offset; PG_WALL_CLOCK_OFFSET_FILE=offset \\
        PYTHONPATH=tests/chaos/clockjump python -c "import time; print(time.time())"
"""

from __future__ import annotations

import os
import sys
import time

_path = os.environ.get("PG_WALL_CLOCK_OFFSET_FILE")

if _path:
    _offset_file: str = _path
    _real_time = time.time
    _real_time_ns = time.time_ns
    _state = {"offset": 0.0, "read_at": -1.0}

    def _offset() -> float:
        now = time.monotonic()
        if now - _state["read_at"] > 0.05:
            try:
                with open(_offset_file) as f:
                    _state["offset"] = float(f.read().strip() or 0)
            except (OSError, ValueError):
                pass  # keep the last offset while the file is being rewritten
            _state["read_at"] = now
        return _state["offset"]

    def _exempt() -> bool:
        caller = sys._getframe(2).f_globals.get("__name__", "")
        return isinstance(caller, str) and caller.startswith("grpc")

    def _time() -> float:
        return _real_time() if _exempt() else _real_time() + _offset()

    def _time_ns() -> int:
        return _real_time_ns() if _exempt() else _real_time_ns() + int(_offset() * 1e9)

    time.time = _time
    time.time_ns = _time_ns
