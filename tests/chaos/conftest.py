"""Fixtures of the chaos suite: the coordinator of each backend, and a run log.

``chaos_backend`` is parametrised over the embedded SQLite coordinator, etcd
and ZooKeeper (a shared server with a fresh prefix / chroot per test), like
``tests/test_group_processes.py``. Scenarios that kill or pause the
coordinator itself use ``etcd_server_factory`` / ``zk_server_factory``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos.scenario import Backend

BACKENDS = [
    "sqlite",
    pytest.param("etcd", marks=pytest.mark.etcd),
    pytest.param("zk", marks=pytest.mark.zk),
]


@pytest.fixture(params=BACKENDS)
def chaos_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    name: str = request.param
    if name == "sqlite":
        return Backend(name, f"sqlite://{tmp_path}/coordinator.sqlite")
    url: str = request.getfixturevalue(f"{name}_url")
    return Backend(name, url)
