"""When the leader publishes after the member list changed: arrivals in a burst are coalesced.

A lone join is published at once: nothing is gained by waiting. A join that
follows the previous change within ``quiet_s`` starts a burst (a group
starting, members scaled up together, a rolling restart's returns): the
leader then waits until the list has been quiet for ``quiet_s``, but never
longer than ``max_wait_s`` from the burst's first change, and publishes once.
A departure is always published at once and ends a burst: a member that left
has stopped reading, so its shards wait for the publication (a pause), while
a member not yet given shards delays nobody's rows (measured: coalescing
departures too put 0.2 s into the handoff benchmark's p99, where a member
leaves 0.15 s after it joined).

Why: each publication moves shards (a release and an acquisition each) and
wakes every member, which decodes the whole assignment. Starting 200 members
over 2,048 shards, publishing at every arrival moved each shard about
ln(200) = 5 times and published about 200 generations; coalesced, a few.
Kafka's group coordinator waits ``group.initial.rebalance.delay.ms`` (3 s)
for the same reason, but for a new group only and at every start; here a
single change costs nothing and a burst at most ``max_wait_s``.

A forming group (no live member holds shards of the published assignment,
or there is none yet: nobody reads, so nobody's rows wait) is published
only once the list has been quiet for ``forming_quiet_s``, but never later
than ``forming_max_s`` after the leader first saw it, the first list
included: Kafka's ``group.initial.rebalance.delay.ms`` for a group with no
members, which each join extends by 3 s up to the rebalance timeout (5 min
by default). Without it the leader published at once for the first few
members of a starting group (21 of 200 at 200 x 2,048), they acquired
every shard, and when the others had arrived nine in ten shards moved
again (3,900 acquisitions and 1,800 releases for 2,048 shards). The cap is
60 s: arrivals that last a minute (1,000 members started by two
processes) are one generation; with a 3 s cap the first few members took
every shard, their processes acquired thousands while still starting the
others, and the start of 1,000 x 8,192 on ZooKeeper took 221.6 s. A join
into a stable group is never held by it: its group is not forming.

An I/O-free timing object (the clock is passed in), as aiokafka's heartbeat.

Example (quiet 0.2 s, at most 2 s)::

    >>> s = ArrivalSettle(quiet_s=0.2, max_wait_s=2.0)
    >>> s.delay({"a"}, now=10.0)             # the first list: publish
    0.0
    >>> s.delay({"a", "b"}, now=20.0)        # a lone join: publish
    0.0
    >>> round(s.delay({"a", "b", "c"}, now=20.1), 3)   # 0.1 s later: a burst
    0.2
    >>> round(s.delay({"a", "b", "c", "d"}, now=20.25), 3)  # still arriving
    0.2
    >>> s.delay({"a", "b", "c", "d"}, now=20.45)   # quiet for 0.2 s: publish
    0.0
    >>> s.delay({"a", "b", "c", "d", "e"}, now=20.5)     # a lone join again
    0.0
    >>> round(s.delay({"a", "b", "c", "d", "e", "f"}, now=20.6), 3)  # a burst
    0.2
    >>> s.delay({"a", "b", "c", "e", "f"}, now=20.65)   # a departure: at once
    0.0

A forming group (quiet 1 s, at most 60 s)::

    >>> f = ArrivalSettle()
    >>> f.delay({"a"}, now=0.0, forming=True)       # the first member waits
    1.0
    >>> f.delay({"a", "b"}, now=0.6, forming=True)  # an arrival: quiet again
    1.0
    >>> f.delay({"a", "b"}, now=1.6, forming=True)  # quiet for 1 s: publish
    0.0
"""

from __future__ import annotations

from collections.abc import Collection

QUIET_S = 0.2
MAX_WAIT_S = 2.0
FORMING_QUIET_S = 1.0
FORMING_MAX_S = 60.0


class ArrivalSettle:
    """See the module docstring."""

    def __init__(self, quiet_s: float = QUIET_S, max_wait_s: float = MAX_WAIT_S,
                 forming_quiet_s: float = FORMING_QUIET_S,
                 forming_max_s: float = FORMING_MAX_S) -> None:
        self.quiet_s = quiet_s
        self.max_wait_s = max_wait_s
        self.forming_quiet_s = forming_quiet_s
        self.forming_max_s = forming_max_s
        self._members: frozenset[str] | None = None
        self._changed_at = -1e18
        self._burst_from: float | None = None

    def delay(self, members: Collection[str], *, now: float, forming: bool = False) -> float:
        """Seconds to wait before publishing for ``members`` (0: publish now);
        ``forming``: the group is forming (the module docstring)."""
        current = frozenset(members)
        if current != self._members:
            departed = self._members is not None and bool(self._members - current)
            if forming:
                if self._burst_from is None:
                    self._burst_from = now
            elif (not departed and self._members is not None
                    and now - self._changed_at < self.quiet_s):
                if self._burst_from is None:
                    self._burst_from = self._changed_at
            else:
                self._burst_from = None
            self._members, self._changed_at = current, now
        if self._burst_from is None:
            return 0.0
        quiet, longest = ((self.forming_quiet_s, self.forming_max_s) if forming
                          else (self.quiet_s, self.max_wait_s))
        wait = min(self._changed_at + quiet, self._burst_from + longest) - now
        if wait <= 0:
            self._burst_from = None
            return 0.0
        return wait
