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

A forming group (no live member holds shards of the published assignment,
or there is none yet) whose leader sees a lone member publishes at once: a
lone ``run``, a restarted member, a Spark query's first batch get their
shards with no wait. A forming group of more than one member,
and a group whose lone member was published at once and which sees an
arrival within ``forming_quiet_s`` of its last change (the young group:
its start was a burst after all), is published only once the list has been
quiet for ``forming_quiet_s``, but never later than ``forming_max_s`` after
the burst began: Kafka's ``group.initial.rebalance.delay.ms`` (3 s, each
join extending it up to the rebalance timeout), paid by a burst only, at
the cost of one generation more when its first member was seen alone.
While a young group's burst is held (:attr:`PublishDelay.holding`), its
leader acquires no more of the shards it was given alone
(:mod:`paimon_group.member.control`): the next generation moves most of
them. Without the forming wait the leader published at once for the first
few members of a starting group (21 of 200 at 200 x 2,048), they acquired
every shard, and when the others had arrived nine in ten shards moved again
(3,900 acquisitions and 1,800 releases for 2,048 shards). The cap is 60 s:
arrivals that last a minute (1,000 members started by two processes) are
one generation; with a 3 s cap the first few members took every shard,
their processes acquired thousands while still starting the others, and
the start of 1,000 x 8,192 on ZooKeeper took 221.6 s. A join into a stable
group is never held by it: its group is not forming, nor young.

An I/O-free timing object (the clock is passed in), as aiokafka's heartbeat.

Example (quiet 0.2 s, at most 2 s)::

    >>> s = PublishDelay(quiet_s=0.2, max_wait_s=2.0)
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

    >>> f = PublishDelay()
    >>> f.delay({"a"}, now=0.0, forming=True)       # a lone member: at once
    0.0
    >>> f.delay({"a", "b"}, now=0.6)                # young: an arrival holds
    1.0
    >>> f.holding
    True
    >>> f.delay({"a", "b"}, now=1.6)                # quiet for 1 s: publish
    0.0
    >>> g = PublishDelay()
    >>> g.delay({"a", "b"}, now=0.0, forming=True)  # two at once: a burst
    1.0
"""

from __future__ import annotations

from collections.abc import Collection

QUIET_S = 0.2
MAX_WAIT_S = 2.0
FORMING_QUIET_S = 1.0
FORMING_MAX_S = 60.0


class PublishDelay:
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
        # The burst under way is a forming one (its quiet and cap).
        self._forming = False
        # A forming group's lone member was published at once (and nothing
        # changed since): an arrival within forming_quiet_s is a burst.
        self._alone = False

    def young(self, now: float) -> bool:
        """Whether an arrival now would start a forming burst: a lone member
        of a forming group was published at once less than ``forming_quiet_s``
        ago, and the list has not changed since."""
        return self._alone and now - self._changed_at < self.forming_quiet_s

    @property
    def members(self) -> frozenset[str]:
        """The list last seen (empty before the first)."""
        return self._members or frozenset()

    @property
    def holding(self) -> bool:
        """Whether a forming burst holds the next generation back."""
        return self._burst_from is not None and self._forming

    def delay(self, members: Collection[str], *, now: float, forming: bool = False) -> float:
        """Seconds to wait before publishing for ``members`` (0: publish now);
        ``forming``: the group is forming (the module docstring)."""
        current = frozenset(members)
        if current != self._members:
            self._changed(current, now, forming)
        if self._burst_from is None:
            return 0.0
        quiet, longest = ((self.forming_quiet_s, self.forming_max_s) if self._forming
                          else (self.quiet_s, self.max_wait_s))
        wait = min(self._changed_at + quiet, self._burst_from + longest) - now
        if wait <= 0:
            self._burst_from, self._forming = None, False
            return 0.0
        return wait

    def _changed(self, current: frozenset[str], now: float, forming: bool) -> None:
        """The list is now ``current``: start, extend or end a burst."""
        departed = self._members is not None and bool(self._members - current)
        young = self.young(now) and not departed
        self._alone = False
        if forming and len(current) == 1 and self._burst_from is None:
            self._alone = True  # a lone member: published at once
        elif forming or young or self.holding:
            if self._burst_from is None:
                self._burst_from = now
            self._forming = True
        elif (not departed and self._members is not None
                and now - self._changed_at < self.quiet_s):
            if self._burst_from is None:
                self._burst_from = self._changed_at
        else:
            self._burst_from = None
        self._members, self._changed_at = current, now
