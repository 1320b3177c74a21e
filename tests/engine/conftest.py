"""The engine fixture: one engine JVM for the session (tests/engine/engine.py);
the tests skip, saying why, where the engine cannot run."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.engine.engine import Engine, engine_unavailable, start


@pytest.fixture(scope="session")
def engine() -> Iterator[Engine]:
    reason = engine_unavailable()
    if reason is not None:
        pytest.skip(reason)
    started = start()
    try:
        yield started
    finally:
        started.close()
