"""The member's timings, all derived from its session timeout in one place.

A member's clocks follow its session: it stops processing a margin before
its session could expire, its control loop ticks a few times per session,
a restart waits about one session for its own dead session to go. Each of
these is a named property of :class:`MemberTiming`, a frozen value built
once from the configuration (``MemberConfig.timing``) and asked by the parts
that act on it; no other module does arithmetic on the session timeout.
Nothing here reads a clock or does I/O.

Example (the default session of 10 s)::

    >>> t = MemberTiming.of(10.0)
    >>> t.margin_s, t.control_tick_s, t.ownership_check_s
    (2.5, 2.5, 60.0)
    >>> t.register_wait_s, t.rejoin_give_up_s, t.host_stop_wait_s, t.stuck_loop_s
    (16.0, 60.0, 60.0, 30.0)
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MemberTiming", "default_margin_s"]

#: The shortest control tick: a very short session does not make the control
#: loop spin.
MIN_CONTROL_TICK_S = 0.2
#: The shortest interval between two checks of a member's own owner keys
#: that nothing called for.
MIN_OWNERSHIP_CHECK_S = 10.0
#: The shortest interval between two reads of the group record nothing called for.
MIN_MAP_CHECK_S = 2.0
#: The least time a member keeps trying to rejoin after a lost session.
MIN_REJOIN_GIVE_UP_S = 60.0
#: The least time without a control tick the liveness probe tolerates.
MIN_STUCK_LOOP_S = 30.0


def default_margin_s(session_timeout_s: float) -> float:
    """The safety margin when none is configured: a quarter of the session."""
    return session_timeout_s / 4


@dataclass(frozen=True)
class MemberTiming:
    """The timings of one member (see the module docstring).

    ``session_timeout_s`` is the configured session timeout (positive: the
    configuration checks it); ``margin_s`` how long before its local session
    deadline the member stops processing and committing (invariant 3).
    """

    session_timeout_s: float
    margin_s: float

    @classmethod
    def of(cls, session_timeout_s: float, safety_margin_s: float | None = None) -> MemberTiming:
        """The timings of a session; ``safety_margin_s`` None: the default margin."""
        margin = default_margin_s(session_timeout_s) if safety_margin_s is None else safety_margin_s
        return cls(session_timeout_s=float(session_timeout_s), margin_s=float(margin))

    @property
    def control_tick_s(self) -> float:
        """The control loop's longest wait between two rounds, and how long a
        wake-up by owner changes alone may skip the full round: a quarter of
        the session, so that a round runs several times per session."""
        return max(MIN_CONTROL_TICK_S, self.session_timeout_s / 4)

    @property
    def ownership_check_s(self) -> float:
        """How often a member re-reads its own owner keys when nothing called
        for it (no operator's ``forced`` mark moved, no sweep due: member/ownership.py):
        every six sessions, at least 10 s apart. It only finds an owner key
        deleted some other way sooner than the member's next commit would."""
        return max(MIN_OWNERSHIP_CHECK_S, 6 * self.session_timeout_s)

    @property
    def map_check_s(self) -> float:
        """How often a follower of a group of several tables re-reads the group
        record when no new assignment called for it (member/control.py): once
        per session, at least every 2 s apart."""
        return max(MIN_MAP_CHECK_S, self.session_timeout_s)

    @property
    def register_wait_s(self) -> float:
        """How long a member whose id is still registered waits for that
        registration to go: a crashed process's key outlives it by up to one
        session (and the server's own slack); longer, a live process holds it."""
        return self.session_timeout_s * 1.5 + 1.0

    @property
    def rejoin_give_up_s(self) -> float:
        """How long a member that lost its session keeps trying to rejoin:
        six sessions, at least a minute."""
        return max(MIN_REJOIN_GIVE_UP_S, self.session_timeout_s * 6)

    @property
    def host_stop_wait_s(self) -> float:
        """How long a host (the Spark source's driver) waits for the member's
        leave to end: three sessions and 30 s, past which it stops waiting."""
        return self.session_timeout_s * 3 + 30

    @property
    def stuck_loop_s(self) -> float:
        """How long without a control tick the liveness probe calls the loop
        stuck: the loop ticks at least every quarter session, so three whole
        sessions without a tick is a stuck loop, not a slow one (at least 30 s)."""
        return max(MIN_STUCK_LOOP_S, 3 * self.session_timeout_s)
