"""The simulation's coordinator (``SimStore`` behind ``FaultyCoordinator`` with
no faults) passes the coordinator conformance suite that every real backend
passes (``tests/conformance/``), on real time: what the simulation checks the
members against behaves as etcd, ZooKeeper and the embedded backend do."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conformance.conftest import coord, open_coord, start_holder
from tests.conformance.test_protocol import *  # noqa: F403
from tests.conformance.test_sessions import *  # noqa: F403
from tests.conformance.test_watch import *  # noqa: F403
from tests.sim.coordinator import FaultPlan, SimStore
from tests.sim.scenario import World, _sim_scheme

__all__ = ["coord", "open_coord", "start_holder"]


@pytest.fixture
def coordinator_url() -> Iterator[str]:
    world = World(0, SimStore(), FaultPlan(0, 0.0, 10.0))
    with _sim_scheme(world):
        yield "sim://conformance/c/0"


@pytest.fixture
def multi_process() -> None:
    pytest.skip("the simulated coordinator lives in one process")
