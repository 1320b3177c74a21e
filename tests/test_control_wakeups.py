"""A change a watch signals is never lost by the control loop (issue 29).

``ControlWatches.wait`` waits on the open watches and the local wake-up at
once, and cancels the waiters that lost the race. A waiter whose change had
already arrived when the cancel reached it still finishes its ``wait()``
(``asyncio.wait_for`` returns a result that is ready rather than raise), and
``wait()`` clears the watch's flag and returns True: dropping that result
lost the change until the next tick (2.5 s by default; measured with 40
members on etcd: a generation first seen by the median member 2.7 s late).
"""

from __future__ import annotations

import asyncio

import pytest

from paimon_group.member.watches import ControlWatches


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


def opened(watches: dict[str, FlagWatch]) -> ControlWatches:
    """A ControlWatches over fakes: ``watches[name]`` is the watch opened for
    ``name`` (opening it again gives the same fake)."""
    return ControlWatches(lambda name: watches[name])  # type: ignore[arg-type,return-value]


@pytest.mark.asyncio
async def test_a_change_signalled_while_its_waiter_is_cancelled_is_not_lost() -> None:
    members, owners = FlagWatch(), FlagWatch()
    group = FiresAndSets(members)
    watches = opened({"group": group, "members": members, "owners": owners})
    assert await watches.update(leading=True, acquiring=True) == {"members", "owners"}
    fired = await watches.wait(asyncio.Event(), timeout=5.0)
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

    watches = opened({"group": SetsWake(), "members": FlagWatch(), "owners": FlagWatch()})
    await watches.update(leading=True, acquiring=True)
    fired = await watches.wait(wake, timeout=5.0)
    await asyncio.sleep(0.01)
    assert "local" in fired or wake.is_set(), fired


class ClosableWatch(FlagWatch):
    def __init__(self) -> None:
        super().__init__()
        self.closed = False

    async def close(self) -> None:
        self.closed = True


@pytest.mark.asyncio
async def test_owner_changes_reach_a_member_only_while_it_waits_to_acquire() -> None:
    """With nothing to acquire, the owners watch is closed: no change of owner
    keys (every member's, at every move of a rebalance) reaches the member.
    Opened when it waits to acquire, it counts as fired at once: the round
    then re-reads the owner keys, after the watch was opened, so a release
    between the last read and the opening is not missed."""
    made: list[ClosableWatch] = []

    def opener(name: str) -> ClosableWatch:
        made.append(ClosableWatch())
        return made[-1]

    watches = ControlWatches(opener)  # type: ignore[arg-type]
    assert set(watches.names) == {"group"}
    assert await watches.update(leading=False, acquiring=False) == set()
    fired = await watches.wait(asyncio.Event(), timeout=0.2)
    assert fired == {"timeout"}
    assert await watches.update(leading=False, acquiring=True) == {"owners"}
    assert set(watches.names) == {"group", "owners"}
    owners = made[-1]
    owners.changed.set()
    assert await watches.update(leading=False, acquiring=True) == set()  # kept open
    assert await watches.wait(asyncio.Event(), timeout=5.0) == {"owners"}
    assert await watches.update(leading=False, acquiring=False) == set()
    assert owners.closed and set(watches.names) == {"group"}


@pytest.mark.asyncio
async def test_the_member_list_is_watched_by_the_leader_alone() -> None:
    made: dict[str, ClosableWatch] = {}

    def opener(name: str) -> ClosableWatch:
        made[name] = ClosableWatch()
        return made[name]

    watches = ControlWatches(opener)  # type: ignore[arg-type]
    assert await watches.update(leading=True, acquiring=False) == {"members"}
    assert set(watches.names) == {"group", "members"}
    await watches.update(leading=False, acquiring=False)
    assert made["members"].closed and set(watches.names) == {"group"}
    await watches.close()
    assert made["group"].closed and not watches.names
