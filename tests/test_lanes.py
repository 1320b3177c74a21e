"""The order the durations record gives an xdist run (tests/support/lanes.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from tests.support.lanes import slow_first


@dataclass(frozen=True)
class _Item:
    nodeid: str


def _items(*ids: str) -> list[Any]:
    return [_Item(i) for i in ids]


def _ids(items: list[Any]) -> list[str]:
    return [cast(_Item, i).nodeid for i in items]


def test_each_workers_slice_starts_with_its_slow_tests_longest_first() -> None:
    ids = [f"tests/test_a.py::t{i}" for i in range(10)] + [
        "tests/test_b.py::long", "tests/test_b.py::mid", "tests/test_c.py::longest",
        "tests/test_c.py::short"]
    durations = {"tests/test_b.py::long": 200.0, "tests/test_b.py::mid": 50.0,
                 "tests/test_c.py::longest": 300.0, "tests/test_c.py::short": 2.0}
    ordered = _ids(slow_first(_items(*ids), durations, 2))
    assert sorted(ordered) == sorted(ids)
    # xdist's worksteal gives the first 7 to one worker, the other 7 to the other.
    first, second = ordered[:7], ordered[7:]
    assert first[0] == "tests/test_c.py::longest"
    assert second[:2] == ["tests/test_b.py::long", "tests/test_b.py::mid"]
    # The quick tests keep their collection order.
    quick = [i for i in ordered if i not in durations or durations[i] < 10]
    assert quick == [i for i in ids if i not in durations or durations[i] < 10]


def test_one_worker_keeps_the_collection_order() -> None:
    ids = ["tests/test_a.py::quick", "tests/test_b.py::slow"]
    assert _ids(slow_first(_items(*ids), {"tests/test_b.py::slow": 99.0}, 1)) == ids
