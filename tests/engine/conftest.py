"""The engine fixture: one engine JVM for the session (tests/engine/engine.py).

Where the engine cannot run the tests skip, saying why, except in CI
(``CI=true``), where they fail: a CI run must never pass by skipping its
real-engine tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.engine.engine import Engine, engine_unavailable, start
from tests.support.etcd_server import _missing


@pytest.fixture(scope="session")
def engine() -> Iterator[Engine]:
    reason = engine_unavailable()
    if reason is not None:
        _missing(reason)
    started = start()
    try:
        yield started
    finally:
        started.close()
