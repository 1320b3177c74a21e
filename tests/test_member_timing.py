"""The member's timings derived from its session timeout (paimon_group/config/timing.py):
worked examples, the configuration's own, and that no other module derives them."""

from __future__ import annotations

import doctest
import re
from pathlib import Path

import pytest

import paimon_group.config.timing as timing_module
from coordinators.errors import ConfigError
from paimon_group.config.member import MemberConfig
from paimon_group.config.timing import MemberTiming, default_margin_s

REPO = Path(__file__).resolve().parents[1]


def config(**kw: float) -> MemberConfig:
    return MemberConfig(group="orders", warehouse="/tmp/wh", table="db.orders", **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("session", "margin", "tick", "check", "register", "rejoin", "host_stop", "stuck"),
    [
        # the default session: every timing a multiple of it, or its floor
        (10.0, 2.5, 2.5, 60.0, 16.0, 60.0, 60.0, 30.0),
        # a short session: the tick, the check, the rejoin and the probe keep their floors
        (0.4, 0.1, 0.2, 10.0, 1.6, 60.0, 31.2, 30.0),
        (1.0, 0.25, 0.25, 10.0, 2.5, 60.0, 33.0, 30.0),
        # a long session: each grows with it
        (30.0, 7.5, 7.5, 180.0, 46.0, 180.0, 120.0, 90.0),
    ],
)
def test_worked_examples(session: float, margin: float, tick: float, check: float,
                         register: float, rejoin: float, host_stop: float, stuck: float) -> None:
    t = MemberTiming.of(session)
    assert t.session_timeout_s == session
    assert t.margin_s == pytest.approx(margin)
    assert t.control_tick_s == pytest.approx(tick)
    assert t.ownership_check_s == pytest.approx(check)
    assert t.register_wait_s == pytest.approx(register)
    assert t.rejoin_give_up_s == pytest.approx(rejoin)
    assert t.host_stop_wait_s == pytest.approx(host_stop)
    assert t.stuck_loop_s == pytest.approx(stuck)


@pytest.mark.parametrize("session", [0.05, 0.4, 3, 10.0, 17.3, 45])
def test_the_same_values_as_the_expressions_they_replace(session: float) -> None:
    """Each property is exactly the expression its user computed before."""
    t = config(session_timeout_s=session).timing
    assert t.margin_s == session / 4  # config/member.py, the default margin
    assert t.control_tick_s == max(0.2, session / 4)  # member/control.py, twice
    # member/ownership.py: six sessions since the operators' forced mark
    assert t.ownership_check_s == max(10.0, 6 * session)
    assert t.map_check_s == max(2.0, session)  # member/control.py: the group record
    assert t.register_wait_s == session * 1.5 + 1.0  # member/membership.py, registering
    assert t.rejoin_give_up_s == max(60.0, session * 6)  # member/membership.py, rejoining
    assert t.host_stop_wait_s == session * 3 + 30  # spark/source/driver.py, stop
    assert t.stuck_loop_s == max(30.0, 3 * float(session))  # ops/metrics.py, /healthz


def test_the_module_example() -> None:
    failures, tried = doctest.testmod(timing_module, raise_on_error=False)
    assert failures == 0 and tried > 0


def test_a_configured_margin_is_kept() -> None:
    cfg = config(session_timeout_s=8.0, safety_margin_s=1.0)
    assert cfg.timing == MemberTiming(session_timeout_s=8.0, margin_s=1.0)
    assert cfg.timing.control_tick_s == 2.0  # the tick follows the session, not the margin
    assert config().timing == MemberTiming.of(10.0) and default_margin_s(10.0) == 2.5


def test_the_timing_is_frozen() -> None:
    t = MemberTiming.of(10.0)
    with pytest.raises(AttributeError):
        t.session_timeout_s = 5.0  # type: ignore[misc]


@pytest.mark.parametrize(("kw", "message"), [
    ({"session_timeout_s": 0.0}, "--session-timeout-s must be positive"),
    ({"session_timeout_s": -1.0}, "--session-timeout-s must be positive"),
    ({"session_timeout_s": 4.0, "safety_margin_s": 4.0},
     "the safety margin must be below the session timeout"),
])
def test_the_config_checks_the_session_once(kw: dict[str, float], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        config(**kw)


def test_no_other_module_derives_a_timing_from_the_session() -> None:
    """Arithmetic on ``session_timeout_s`` lives in config/timing.py only."""
    arithmetic = re.compile(r"session_timeout_s\s*[-+*/%]|[-+*/%]\s*[\w.]*session_timeout_s\b")
    found = [f"{p.relative_to(REPO)}:{n}" for p in sorted((REPO / "paimon_group").rglob("*.py"))
             if p.name != "timing.py"
             for n, line in enumerate(p.read_text().splitlines(), 1) if arithmetic.search(line)]
    assert found == []
