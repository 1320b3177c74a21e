"""What a member tells its operator when the coordinator stops answering.

The session's own log lines speak of leases and renewals; an operator wants
to know, at once and in one line, that the coordinator is unreachable and
what the member does about it. :class:`Reachability` is a small I/O-free
object (it is fed session states and the clock, and returns the line to log,
or None), so its wording and its once-per-episode rule are tested alone.

Transitions it reports (once each per episode)::

    CONNECTED ──renewal unanswered──> SUSPENDED   "coordinator URL unreachable: ..."
    SUSPENDED ──renewal confirmed───> CONNECTED   "coordinator URL reachable again ..."
    any       ──session ended───────> LOST        "coordinator session lost: ..."

Example::

    >>> r = Reachability("etcd://etcd-0:2379", safety_margin_s=2.5)
    >>> print(r.on_state("suspended", now=100.0, deadline=108.0))  # doctest: +ELLIPSIS
    coordinator etcd://etcd-0:2379 unreachable: ... at most 8 s more, ... in 5.5 s, ...
    >>> r.on_state("suspended", now=101.0, deadline=108.0) is None
    True
    >>> r.on_state("connected", now=102.0, deadline=118.0)
    'coordinator etcd://etcd-0:2379 reachable again after 2.0 s: carrying on with the same shards'
"""

from __future__ import annotations

__all__ = ["Reachability"]


class Reachability:
    """One line per change of the coordinator's reachability (see the module docstring)."""

    def __init__(self, url: str, *, safety_margin_s: float) -> None:
        self.url = url  # shown as given: callers pass it with credentials redacted
        self.safety_margin_s = safety_margin_s
        self._since: float | None = None  # when the current unreachable episode began
        self._lost = False

    def on_state(self, state: str, *, now: float, deadline: float) -> str | None:
        """The line to log for the session's new ``state`` (``connected``,
        ``suspended``, ``lost``), or None when there is nothing new to say."""
        if state == "suspended":
            if self._since is not None:
                return None
            self._since = now
            left = max(0.0, deadline - now)
            pause = max(0.0, left - self.safety_margin_s)
            return (f"coordinator {self.url} unreachable: this member keeps its shards for at "
                    f"most {left:.0f} s more, stops handing out batches and committing in "
                    f"{pause:.1f} s, and keeps retrying; if it is not back by then, the shards "
                    "go to other members and this member rejoins")
        if state == "connected":
            since, self._since = self._since, None
            if since is None or self._lost:
                self._lost = False
                return None
            return (f"coordinator {self.url} reachable again after {now - since:.1f} s: "
                    "carrying on with the same shards")
        if state == "lost" and not self._lost:
            self._lost = True
            self._since = None
            return (f"coordinator session lost ({self.url}): this member dropped its shards "
                    "(other members take them over) and rejoins when the coordinator answers")
        return None
