"""A change a watch signals is never lost by the control loop (issue 29).

``_wait_for_change`` waits on the three watches and the local wake-up at
once, and cancels the waiters that lost the race. A waiter whose change had
already arrived when the cancel reached it still finishes its ``wait()``
(``asyncio.wait_for`` returns a result that is ready rather than raise), and
``wait()`` clears the watch's flag and returns True: dropping that result
lost the change until the next tick (2.5 s by default; measured with 40
members on etcd: a generation first seen by the median member 2.7 s late).
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from paimon_group.member.control import Control


class FlagWatch:
    """A watch as the etcd backend's: a flag, set by the stream, cleared by the
    ``wait()`` that reports it."""

    def __init__(self) -> None:
        self.changed = asyncio.Event()

    async def wait(self, timeout: float | None = None) -> bool:
        try:
            await asyncio.wait_for(self.changed.wait(), timeout)
        except TimeoutError:
            return False
        self.changed.clear()
        return True


class FiresAndSets(FlagWatch):
    """Fires at once, and sets ``other``'s flag on its way out: ``other``'s
    waiter completes just after the loop woke up for this one."""

    def __init__(self, other: FlagWatch) -> None:
        super().__init__()
        self.other = other

    async def wait(self, timeout: float | None = None) -> bool:
        await asyncio.sleep(0)
        self.other.changed.set()
        return True


@pytest.mark.asyncio
async def test_a_change_signalled_while_its_waiter_is_cancelled_is_not_lost() -> None:
    members, owners = FlagWatch(), FlagWatch()
    group = FiresAndSets(members)
    member = SimpleNamespace(_watches=[group, members, owners], _wake=asyncio.Event(),
                             WATCH_NAMES=Control.WATCH_NAMES, _pending_acquisitions=lambda: [1])
    fired = await Control._wait_for_change(member, timeout=5.0)  # type: ignore[arg-type]
    await asyncio.sleep(0.01)  # what the cancelled waiter still does, done
    # Reported now, or still pending for the next wait: never consumed unseen.
    assert "members" in fired or members.changed.is_set(), fired
    assert "group" in fired


@pytest.mark.asyncio
async def test_a_local_wake_up_during_a_watch_wake_up_is_kept() -> None:
    """A local wake-up set while the loop handles a watch's is not cleared
    unseen either."""
    wake = asyncio.Event()

    class SetsWake(FlagWatch):
        async def wait(self, timeout: float | None = None) -> bool:
            await asyncio.sleep(0)
            wake.set()  # the local waiter completes just after the loop woke up for this
            return True

    member = SimpleNamespace(_watches=[SetsWake(), FlagWatch(), FlagWatch()], _wake=wake,
                             WATCH_NAMES=Control.WATCH_NAMES, _pending_acquisitions=lambda: [1])
    fired = await Control._wait_for_change(member, timeout=5.0)  # type: ignore[arg-type]
    await asyncio.sleep(0.01)
    assert "local" in fired or wake.is_set(), fired


@pytest.mark.asyncio
async def test_owner_changes_wake_a_member_only_while_it_waits_to_acquire() -> None:
    """With nothing to acquire, a change of owner keys (every member's, at
    every move of a rebalance) does not wake the loop; it is taken by the
    first wait once the member waits to acquire a shard."""
    group, members, owners = FlagWatch(), FlagWatch(), FlagWatch()
    pending: list[int] = []
    member = SimpleNamespace(_watches=[group, members, owners], _wake=asyncio.Event(),
                             WATCH_NAMES=Control.WATCH_NAMES,
                             _pending_acquisitions=lambda: list(pending))
    owners.changed.set()
    fired = await Control._wait_for_change(member, timeout=0.2)  # type: ignore[arg-type]
    assert fired == {"timeout"}
    assert owners.changed.is_set()  # kept for later
    pending.append(3)
    fired = await Control._wait_for_change(member, timeout=5.0)  # type: ignore[arg-type]
    assert fired == {"owners"}
