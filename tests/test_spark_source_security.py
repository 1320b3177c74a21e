"""The Spark source's TLS and authentication options reach the coordinator:
the query's member joins a group on an etcd that requires TLS client
certificates and a password, with the same option names as the CLI's
``--coordinator-*`` options; a missing certificate fails in one line."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from coordinators.errors import AuthenticationFailed, ConfigError
from paimon_group import GroupMember
from paimon_group.spark.source.options import SourceOptions
from tests.support.etcd_server import EtcdServer, Pki
from tests.support.tables import make_pk_table, write_rows
from tests.test_etcd_backend import ROOT_PASSWORD

pytestmark = pytest.mark.etcd


@pytest.fixture
def secured_etcd(etcd_server_factory: object, etcd_pki: Pki) -> EtcdServer:
    return etcd_server_factory(pki=etcd_pki, client_cert_auth=True, auth=True)  # type: ignore[operator, no-any-return]


def _options(
    server: EtcdServer, pki: Pki, wh: Path, tmp_path: Path, **extra: str
) -> dict[str, str]:
    password_file = tmp_path / "password"
    password_file.write_text(ROOT_PASSWORD + "\n")
    options = {
        "group": "secure", "warehouse": str(wh), "table": "db.t",
        "coordinator": server.url_with_prefix("spark"), "member_id": "q1",
        "coordinator_username": "root", "coordinator_password_file": str(password_file),
        "coordinator_ca": str(pki.ca), "coordinator_cert": str(pki.client_cert),
        "coordinator_key": str(pki.client_key), "coordinator_server_name": "etcd.test",
    }
    options.update(extra)
    return options


@pytest.mark.asyncio
async def test_source_options_carry_tls_and_password_to_the_member(
    secured_etcd: EtcdServer, etcd_pki: Pki, tmp_path: Path
) -> None:
    wh = tmp_path / "wh"
    make_pk_table(str(wh), "db.t", buckets=2)
    write_rows(str(wh), "db.t", range(10))
    parsed = SourceOptions.parse(_options(secured_etcd, etcd_pki, wh, tmp_path))
    assert ROOT_PASSWORD not in repr(parsed)
    async with GroupMember(parsed.member_config()) as member:
        for _ in range(400):
            if sorted(member.owned_shards) == [0, 1]:
                break
            await asyncio.sleep(0.05)
        assert sorted(member.owned_shards) == [0, 1]


@pytest.mark.asyncio
async def test_source_without_client_certificate_is_refused_in_one_line(
    secured_etcd: EtcdServer, etcd_pki: Pki, tmp_path: Path
) -> None:
    wh = tmp_path / "wh"
    make_pk_table(str(wh), "db.t", buckets=2)
    options = _options(secured_etcd, etcd_pki, wh, tmp_path)
    del options["coordinator_cert"], options["coordinator_key"]
    parsed = SourceOptions.parse(options)
    with pytest.raises(AuthenticationFailed) as caught:
        async with GroupMember(parsed.member_config()):
            pass
    assert "\n" not in str(caught.value) and ROOT_PASSWORD not in str(caught.value)


def test_unreadable_password_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read coordinator password file") as caught:
        SourceOptions.parse({"group": "g", "warehouse": str(tmp_path), "table": "db.t",
                             "coordinator_password_file": str(tmp_path / "missing")})
    assert "\n" not in str(caught.value)
