"""Virtual time for the simulation: an event loop that never waits.

:class:`SimLoop` is an asyncio selector loop whose clock is virtual. When the
loop would block (nothing ready, the next timer ``t`` seconds away) it does
not sleep: it moves the clock forward by ``t`` and runs that timer at once. So
a run that lasts a minute of the member's time (session timeouts, control
ticks, revoke timeouts, commit lingers) costs only the CPU its code uses.

Two more things make a run a pure function of its seed:

* ``run_in_executor`` (``asyncio.to_thread`` too) runs the function inline, on
  the loop's thread: a plan or a read of the table takes no virtual time and
  finishes in the same order every time (no thread scheduling decides it);
* the virtual clock (:class:`SimClock`) is handed to whatever reads time:
  each member gets it as its ``clock=`` (its loops, deadlines, lease checks
  and history read it), the simulated coordinator and sink read the loop's
  ``time()``; ``time.monotonic`` and ``time.time`` are never replaced. Every
  read on the loop's thread advances it by one microsecond, so two events
  are never recorded at the same instant and the history checker's strict
  orderings are decidable. Reads from other threads do not advance it.

String hashing must be fixed as well (``PYTHONHASHSEED=0``): the member
iterates over sets of member ids in places, and that order decides the order
of coordinator calls. :mod:`tests.sim.__main__` and the pytest entry run the
seeds in processes started with it.

Example::

    loop = SimLoop()
    loop.run_until_complete(asyncio.sleep(3600))   # returns at once
    assert loop.clock.now >= 3600
    member = GroupMember(config, clock=loop.clock)  # the member on that clock
"""

from __future__ import annotations

import asyncio
import selectors
import threading
from collections.abc import Callable
from typing import Any

TICK_S = 1e-6
WALL_EPOCH = 1_750_000_000.0  # the virtual wall clock at virtual monotonic 0


class SimDeadlock(Exception):
    """Nothing is scheduled and nothing can wake the loop: every task waits for ever."""


class SimSpin(SimDeadlock):
    """The loop ran far more often than any run needs: something spins."""


START = 1000.0
# A run takes some 10,000 loop iterations; a task that spins (wakes up
# without waiting) takes hundreds of thousands before the ticking clock gets
# anywhere, so the run stops there and says so.
SPIN_LIMIT = 300_000


class SimClock:
    def __init__(self, start: float = START) -> None:
        self.now = start
        self.loop_thread: int | None = None

    def monotonic(self) -> float:
        if threading.get_ident() == self.loop_thread:
            self.now += TICK_S
        return self.now

    def wall(self) -> float:
        return WALL_EPOCH + self.now


class _VirtualSelector(selectors.DefaultSelector):  # type: ignore[misc,valid-type]
    def __init__(self, clock: SimClock) -> None:
        super().__init__()
        self._clock = clock
        self.iterations = 0

    def select(self, timeout: float | None = None) -> list[Any]:
        self.iterations += 1
        if self.iterations > SPIN_LIMIT:
            raise SimSpin(f"the event loop ran {SPIN_LIMIT} times in {self._clock.now - START:.1f}"
                          " virtual seconds: a task is spinning without waiting")
        ready = super().select(0)
        if ready or timeout == 0:
            return ready  # type: ignore[no-any-return]
        if timeout is None:
            raise SimDeadlock("no timer is scheduled and no task can run")
        self._clock.now += max(0.0, timeout)
        return []


class SimLoop(asyncio.SelectorEventLoop):
    def __init__(self, clock: SimClock | None = None) -> None:
        self.clock = clock or SimClock()
        super().__init__(_VirtualSelector(self.clock))
        self.clock.loop_thread = threading.get_ident()

    def time(self) -> float:
        return self.clock.monotonic()

    def run_in_executor(  # type: ignore[override]
            self, executor: Any, func: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = self.create_future()
        try:
            future.set_result(func(*args))
        except BaseException as err:  # delivered to whoever awaits it
            if isinstance(err, KeyboardInterrupt | SystemExit):
                raise
            future.set_exception(err)
        return future
