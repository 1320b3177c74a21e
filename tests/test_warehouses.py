"""Which coordinator a warehouse gets: an implicit one only for a local
warehouse; ``local`` for a remote one is a file of this host keyed by the URI;
the library and the Spark source refuse a remote warehouse without one."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from coordinators.errors import ConfigError
from paimon_group.config.member import MemberConfig, resolve_coordinator
from paimon_group.config.warehouses import local_state_dir_name, normalised_warehouse
from paimon_group.protocol.records import GroupMeta


def test_normalised_warehouse() -> None:
    assert normalised_warehouse("S3A://Bucket//wh/") == "s3://bucket/wh"
    assert normalised_warehouse("s3://bucket/wh") == "s3://bucket/wh"
    assert normalised_warehouse("oss://b/a/b/") == "oss://b/a/b"
    assert normalised_warehouse("file:///tmp/x/../wh") == str(Path("/tmp/wh").resolve())


def test_local_of_a_remote_warehouse_is_keyed_by_its_uri(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    url = resolve_coordinator("s3://bucket-a/wh/", "local")
    digest = hashlib.sha256(b"s3://bucket-a/wh").hexdigest()[:12]
    assert url == (f"sqlite://{tmp_path}/paimon-group/warehouses/s3-bucket-a-{digest}/"
                   "coordinator.sqlite")
    assert resolve_coordinator("s3a://bucket-a/wh", "LOCAL") == url
    others = {resolve_coordinator(w, "local") for w in
              ("s3://bucket-b/wh", "s3://bucket-a/wh2", "oss://bucket-a/wh")}
    assert len(others) == 3 and url not in others
    assert local_state_dir_name("s3://x/wh").startswith("s3-x-")


def test_xdg_state_home_defaults_to_local_state(monkeypatch: pytest.MonkeyPatch,
                                                tmp_path: Path) -> None:
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    url = resolve_coordinator("s3://b/wh", "local")
    assert url.startswith(f"sqlite://{tmp_path}/.local/state/paimon-group/warehouses/s3-b-")


def test_local_warehouse_keeps_its_implicit_default(tmp_path: Path) -> None:
    expected = f"sqlite://{tmp_path}/wh/.paimon-group/coordinator.sqlite"
    assert resolve_coordinator(str(tmp_path / "wh"), None) == expected
    assert resolve_coordinator(str(tmp_path / "wh"), "local") == expected
    assert resolve_coordinator(f"file://{tmp_path}/wh", "") == expected
    assert resolve_coordinator("s3://b/wh", "etcd://h:2379") == "etcd://h:2379"


def test_member_config_refuses_a_remote_warehouse_without_coordinator() -> None:
    with pytest.raises(ConfigError) as err:
        MemberConfig(group="g", warehouse="s3://b/wh", table="db.t")
    message = str(err.value)
    assert "\n" not in message and "s3://b/wh" in message
    assert 'coordinator="etcd://HOST:PORT"' in message and 'coordinator="local"' in message
    cfg = MemberConfig(group="g", warehouse="s3://b/wh", table="db.t", coordinator="local")
    assert cfg.coordinator_url.startswith("sqlite://")


def test_credentials_are_refused_before_the_coordinator_is_resolved() -> None:
    with pytest.raises(ConfigError) as err:
        resolve_coordinator("s3://KEY:SECRET@b/wh", None)
    assert "SECRET" not in str(err.value) and "credentials" in str(err.value)


def test_spark_source_refuses_a_remote_warehouse_without_coordinator() -> None:
    from paimon_group.spark.source.options import SourceOptions

    with pytest.raises(ConfigError) as err:
        SourceOptions.parse({"group": "g", "warehouse": "s3://b/wh", "table": "db.t"})
    assert '.option("coordinator", "local")' in str(err.value)
    parsed = SourceOptions.parse({"group": "g", "warehouse": "s3://b/wh", "table": "db.t",
                                  "coordinator": "local"})
    assert parsed.coordinator.startswith("sqlite://")


def test_group_meta_remembers_its_warehouse_and_reads_old_records() -> None:
    meta = GroupMeta(num_shards=2, table="db.t", created_at=1.0, warehouse="s3://b/wh")
    assert GroupMeta.decode("k", meta.encode()).warehouse == "s3://b/wh"
    old = b'{"num_shards": 2, "table": "db.t", "created_at": 1.0}'
    assert GroupMeta.decode("k", old).warehouse == ""


def test_admin_local_needs_a_warehouse_and_a_remote_one_needs_a_coordinator() -> None:
    from paimon_group.cli.context import admin_coordinator

    with pytest.raises(ConfigError, match="give --warehouse too"):
        admin_coordinator({"coordinator": "local"})
    with pytest.raises(ConfigError, match="--coordinator local"):
        admin_coordinator({"warehouse": "s3://b/wh"})
