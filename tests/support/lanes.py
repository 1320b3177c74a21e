"""The suite's lanes, from the durations its runs record.

``tests/durations.json`` holds each test's seconds (setup, call and teardown)
from a recorded run of the whole suite on 2 cores. Two options use it:

``--lane fast``
    the edit loop's lane: every test that took at most ``FAST_LIMIT_S`` in
    the recorded run and is not a chaos test, and every test the record does
    not know yet (a new test runs until the next record says it is slow).
    Real servers, real processes and the engine stay in it where they are
    quick; what it leaves out runs in the full suite.
``--record-durations``
    write this run's durations into ``tests/durations.json`` (tests not run
    keep their recorded figure). The full suite records them in CI's lane so
    the fast lane follows the suite as it changes.

On xdist workers the record also orders the run: the slow tests first,
shared between the workers (:func:`slow_first`).

The record is data, not a verdict: a test's figure varies by a factor of 2
with the machine's load, so the fast lane's limit leaves room.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

DURATIONS = Path(__file__).resolve().parents[1] / "durations.json"
FAST_LIMIT_S = 1.0
SLOW_FIRST_S = 10.0
LANES = ("fast", "full")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("lanes", "the suite's lanes (tests/support/lanes.py)")
    group.addoption("--lane", choices=LANES, default="full",
                    help="fast: the tests the durations record shows quick; full: all")
    group.addoption("--record-durations", action="store_true", default=False,
                    help="write this run's durations into tests/durations.json")


def recorded() -> dict[str, float]:
    """The recorded durations by test id (none when there is no record)."""
    if not DURATIONS.exists():
        return {}
    data: dict[str, float] = json.loads(DURATIONS.read_text())
    return data


def in_fast_lane(item: pytest.Item, durations: dict[str, float]) -> bool:
    if item.get_closest_marker("chaos") is not None:
        return False
    seconds = durations.get(item.nodeid)
    return seconds is None or seconds <= FAST_LIMIT_S


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    durations = recorded()
    if config.getoption("--lane") == "fast":
        keep = [item for item in items if in_fast_lane(item, durations)]
        left = [item for item in items if not in_fast_lane(item, durations)]
        if left:
            config.hook.pytest_deselected(items=left)
            items[:] = keep
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        items[:] = slow_first(items, durations, int(workerinput["workercount"]))


def slow_first(items: list[pytest.Item], durations: dict[str, float],
               workers: int) -> list[pytest.Item]:
    """``items`` ordered so that each of ``workers`` xdist workers starts
    with its share of the slow tests, longest first.

    ``--dist worksteal`` hands each worker a contiguous slice of the
    collection (the first ``len // workers`` items to one, and so on) and
    an idle worker steals the tail of another's queue: a long test left
    late in a slice starts late and stretches the run's end. Here the tests
    the record shows at least ``SLOW_FIRST_S`` long are grouped by module
    (a module's slow tests stay together, so a module-scoped fixture is
    set up once for them), the groups dealt to the slices longest first,
    each to the slice with the least recorded time so far; the other tests
    fill the slices in collection order. Every worker collects the same
    order (the record is the same file), as xdist requires."""
    if workers < 2:
        return items
    modules: dict[str, list[pytest.Item]] = defaultdict(list)
    rest: list[pytest.Item] = []
    for item in items:
        if durations.get(item.nodeid, 0.0) >= SLOW_FIRST_S:
            modules[item.nodeid.split("::")[0]].append(item)
        else:
            rest.append(item)

    def seconds(group: list[pytest.Item]) -> float:
        return sum(durations[item.nodeid] for item in group)

    slices: list[list[pytest.Item]] = [[] for _ in range(workers)]
    loads = [0.0] * workers
    for group in sorted(modules.values(), key=seconds, reverse=True):
        k = loads.index(min(loads))
        slices[k].extend(sorted(group, key=lambda item: durations[item.nodeid], reverse=True))
        loads[k] += seconds(group)
    ordered: list[pytest.Item] = []
    left = len(items)
    for k in range(workers):
        size = max(left // (workers - k), len(slices[k]))
        fill = size - len(slices[k])
        ordered += slices[k] + rest[:fill]
        del rest[:fill]
        left -= size
    return ordered + rest


class DurationRecorder:
    """Sums each test's phases as their reports arrive (on xdist, at the
    controller), and writes the record at the end of the session."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid] += report.duration

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if hasattr(session.config, "workerinput"):
            return  # an xdist worker: the controller writes
        merged = recorded()
        merged.update({k: round(v, 3) for k, v in self.seconds.items()})
        DURATIONS.write_text(json.dumps(dict(sorted(merged.items())), indent=0) + "\n")


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--record-durations") and not hasattr(config, "workerinput"):
        config.pluginmanager.register(DurationRecorder(), "pg-duration-recorder")
