"""The ZooKeeper backend's two clients (docs/zookeeper.md, "Client: kazoo or the
asyncio connection").

The choice (``?client=``, ``PAIMON_GROUP_ZK_CLIENT``); no thread per client on
the asyncio connection (the default); and the backend's session, security and
ACL tests of ``tests/test_zk_backend.py`` and ``tests/test_zk_security.py`` run
again here on kazoo, chosen for
the whole process (the conformance suite runs on it as the ``zk-kazoo`` backend).
"""

from __future__ import annotations

import threading

import pytest

from coordinators import ConnectOptions, open_coordinator
from coordinators.errors import ConfigError, InvalidCoordinatorURL
from coordinators.zookeeper import parse_url
from coordinators.zookeeper.aio import AioZkClient
from tests.test_zk_backend import (  # noqa: F401  (collected here again, on kazoo)
    test_aba_a_stale_owner_fails_although_the_new_znode_looks_the_same,
    test_acl_audit_digest_every_znode_is_creator_only,
    test_acl_audit_sasl_every_znode_is_creator_only,
    test_credentials_never_reach_reprs_messages_or_logs,
    test_explicit_acl_list_is_applied,
    test_no_contact_for_a_whole_session_timeout_is_lost_for_good,
    test_server_restart_keeps_the_session_and_rearms_watches,
    test_short_server_pause_suspends_then_the_same_session_resumes,
    test_sigstopped_holder_expires_goes_lost_and_its_writes_are_rejected,
    test_tls_with_certificate_and_host_name_verification,
    test_unreachable_server_fails_with_one_line,
    test_wrong_digest_password_is_refused_with_one_line,
    test_wrong_sasl_password_and_missing_credentials_are_refused,
    test_znode_layout_is_a_value_a_flag_and_an_epoch_marker,
)
from tests.test_zk_security import (  # noqa: F401  (collected here again, on kazoo)
    test_a_digest_acl_is_shown_with_its_hash_masked_everywhere,
    test_a_tls_failure_is_said_at_once_naming_the_server,
    test_what_our_members_made_is_accepted_on_every_auth_mode,
)

zk = pytest.mark.zk


@pytest.fixture(autouse=True)
def kazoo_client(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every coordinator of these tests (and of their subprocesses) on kazoo,
    unless its URL chooses."""
    monkeypatch.setenv("PAIMON_GROUP_ZK_CLIENT", "kazoo")


class TestChoice:
    def test_the_url_chooses_and_is_shown(self) -> None:
        target = parse_url("zk://h:1/c?acl=open&client=kazoo")
        assert target.client == "kazoo"
        assert target.display() == "zk://h:1/c?acl=open&client=kazoo"
        assert parse_url("zk://h:1/c?client=asyncio").display() == "zk://h:1/c?client=asyncio"
        assert parse_url("zk://h:1/c").client is None

    def test_an_unknown_client_is_refused_with_one_line(self) -> None:
        with pytest.raises(InvalidCoordinatorURL, match=r"unknown client 'threads'.*kazoo or"):
            parse_url("zk://h:1/c?client=threads")

    def test_the_environment_chooses_unless_the_url_does(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        coordinator = open_coordinator("zk://h:1/c?acl=open")
        assert coordinator.client_kind == "kazoo"  # type: ignore[attr-defined]
        coordinator = open_coordinator("zk://h:1/c?acl=open&client=asyncio")
        assert coordinator.client_kind == "asyncio"  # type: ignore[attr-defined]
        monkeypatch.delenv("PAIMON_GROUP_ZK_CLIENT")
        coordinator = open_coordinator("zk://h:1/c?acl=open")
        assert coordinator.client_kind == "asyncio"  # type: ignore[attr-defined]
        monkeypatch.setenv("PAIMON_GROUP_ZK_CLIENT", "gevent")
        with pytest.raises(ConfigError, match="PAIMON_GROUP_ZK_CLIENT='gevent'"):
            coordinator = open_coordinator("zk://h:1/c?acl=open")
            coordinator.client_kind  # type: ignore[attr-defined]  # noqa: B018


@zk
@pytest.mark.asyncio
async def test_the_asyncio_client_starts_no_thread(zk_url: str) -> None:
    """Ten coordinators, their sessions, keys and watches: no thread more
    (kazoo starts a connection thread and callback threads per client)."""
    before = threading.active_count()
    coordinators = [open_coordinator(f"{zk_url}&client=asyncio",
                                     ConnectOptions(session_timeout_s=10))
                    for _ in range(10)]
    try:
        for i, coordinator in enumerate(coordinators):
            await coordinator.connect()
            assert isinstance(coordinator.client, AioZkClient)  # type: ignore[attr-defined]
            assert await coordinator.create(f"members/m{i}", b"", ephemeral=True) is not None
        async with coordinators[0].watch("members/") as members:
            assert await members.wait(timeout=10)
            await coordinators[1].delete("members/m1")
            assert await members.wait(timeout=10)
        assert len(await coordinators[2].list("members/")) == 9
        assert threading.active_count() == before
    finally:
        for coordinator in coordinators:
            await coordinator.close()
