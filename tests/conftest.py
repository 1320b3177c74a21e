"""Suite-wide fixtures. Real servers are started by the plugins below, on free
loopback ports; in CI (``CI=true``) a missing server binary fails, never skips."""

import logging
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest_plugins = [
    "tests.support.etcd_server",
    "tests.support.zk_server",
    "tests.support.s3_server",
    "tests.support.lanes",
    "tests.support.spark_session",
]


# configure_logging (run by every in-process CLI invocation) sets the level of
# the root logger and silences the coordinator clients' loggers; without this
# a later test that captures kazoo's packet log would depend on test order.
_LOGGERS_SET_BY_THE_CLI = (
    "", "pypaimon", "py4j", "urllib3", "kazoo", "coordinators.zookeeper.kazoo",
    "aetcd", "grpc",
)


@pytest.fixture(autouse=True)
def _restore_signal_handlers() -> Iterator[None]:
    """An in-process ``run`` installs its SIGTERM and SIGINT handlers in the
    test's process and, stopping before it joined, leaves them: later tests
    get the defaults back."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for signum, handler in saved.items():
        if signal.getsignal(signum) is not handler and handler is not None:
            signal.signal(signum, handler)


@pytest.fixture(autouse=True)
def _restore_logging_levels() -> Iterator[None]:
    loggers = [logging.getLogger(name) for name in _LOGGERS_SET_BY_THE_CLI]
    levels = [logger.level for logger in loggers]
    yield
    for logger, level in zip(loggers, levels, strict=True):
        logger.setLevel(level)


def _coordinator_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An SQLite file of the test, or a fresh prefix on the suite's etcd or
    ZooKeeper server (``request.param``: sqlite, etcd, zk)."""
    if request.param == "sqlite":
        return f"sqlite://{tmp_path}/coordinator.sqlite"
    url: str = request.getfixturevalue(f"{request.param}_url")
    return url


_SQLITE = "sqlite"
_ETCD = pytest.param("etcd", marks=pytest.mark.etcd)
_ZK = pytest.param("zk", marks=pytest.mark.zk)


@pytest.fixture(params=[_SQLITE, _ETCD, _ZK])
def group_coordinator(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A coordinator URL for a group of real processes: sqlite, etcd, ZooKeeper."""
    return _coordinator_url(request, tmp_path)


@pytest.fixture(params=[_SQLITE, _ETCD])
def coordinator(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A coordinator URL on the embedded coordinator and on etcd (the tests
    whose ZooKeeper case another test covers)."""
    return _coordinator_url(request, tmp_path)
