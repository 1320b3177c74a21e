"""A member's clock: the one its loops, deadlines, leases and history read.

A member reads time through the :class:`Clock` it was built with (the
``clock=`` of :class:`~paimon_group.member.group_member.GroupMember`), never
``time.monotonic`` or ``time.time`` directly, so a test or a simulation runs
a member on a clock of its own without replacing anything process-wide (as
kazoo takes its sleep from its handler and tenacity its ``sleep=``).

``monotonic()`` is the clock of every interval and deadline; the session's
local deadline is compared with it too, so the member stops processing
before its lease could expire on the same clock that paces its loops.
``wall()`` is the clock of the instants a member records (a start resolved,
a history line's ``wall``).

>>> clock = ManualClock(start=10.0)
>>> clock.advance(2.5)
>>> clock.monotonic(), clock.wall() - clock.monotonic() == ManualClock.WALL_OFFSET
(12.5, True)
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """Monotonic time for intervals and deadlines, wall time for records."""

    def monotonic(self) -> float: ...

    def wall(self) -> float: ...


class SystemClock:
    """The process's clocks: ``time.monotonic`` and ``time.time``."""

    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()

    def __repr__(self) -> str:
        return "SystemClock()"


SYSTEM_CLOCK: Clock = SystemClock()
"""The default of every member."""


class ManualClock:
    """A clock that moves only when told (for tests)."""

    WALL_OFFSET = 1_700_000_000.0

    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def monotonic(self) -> float:
        return self.now

    def wall(self) -> float:
        return self.WALL_OFFSET + self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
