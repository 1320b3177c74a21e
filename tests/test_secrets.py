"""Secrets never in errors, reprs, logs, metrics or ``describe`` output, and no
password over a plaintext connection unless allowed (issue finding 11).

A known secret string is planted in a catalog option, the coordinator password
and a config file; every way the project shows a configuration or an error is
searched for it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from coordinators import ConfigError, ConnectOptions, Secret
from coordinators.credentials import describe_option, is_secret_key, mask_options
from coordinators.etcd import EtcdCoordinator
from coordinators.zookeeper import ZooKeeperCoordinator
from paimon_group import GroupMember, MemberConfig
from paimon_group.cli import main
from tests.support.tables import make_pk_table, write_rows

SECRET = "TOPSECRET-9f3b7c1d"


def _one_line_without_secret(text: str) -> None:
    assert SECRET not in text, text
    assert len(text.strip().splitlines()) == 1, text


# -- masking rules ---------------------------------------------------------------


@pytest.mark.parametrize(
    "key",
    ["s3.secret-key", "s3.access-key", "fs.oss.accessKeySecret", "dlf.token", "jdbc.password",
     "fs.s3a.session.token", "token", "gcs.credentials", "azure.sas-signature"],
)
def test_secret_looking_keys_are_masked(key: str) -> None:
    assert is_secret_key(key)
    assert mask_options({key: SECRET, "s3.endpoint": "http://minio:9000"}) == {
        key: "***", "s3.endpoint": "http://minio:9000"}


@pytest.mark.parametrize(
    "pair", [f"s3.secret-key:{SECRET}", f"s3.secret-key {SECRET}", f"={SECRET}", SECRET,
             f"dlf.token={SECRET}"],
)
def test_a_user_given_pair_is_shown_without_its_secret(pair: str) -> None:
    assert SECRET not in describe_option(pair)


# -- the command line ---------------------------------------------------------------


def _run(args: list[str], env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(main, args, env=env or {}, catch_exceptions=False)


@pytest.mark.parametrize(
    "option", [f"s3.secret-key:{SECRET}", f"s3.secret-key {SECRET}", SECRET],
)
def test_a_malformed_catalog_option_is_refused_without_its_value(
    tmp_path: Path, option: str
) -> None:
    result = _run(["run", "--group", "g", "--warehouse", str(tmp_path / "wh"), "--table", "d.t",
                   "--handler", "json:dumps", "--catalog-option", option])
    assert result.exit_code == 2
    assert "must be KEY=VALUE" in result.output
    _one_line_without_secret(result.output)


def test_a_config_file_that_does_not_parse_is_not_quoted(tmp_path: Path) -> None:
    config = tmp_path / "member.yaml"
    config.write_text(f'group: g\ncatalog-option:\n  s3.secret-key: "{SECRET}\n  x: [\n')
    result = _run(["run", "--config", str(config)])
    assert result.exit_code == 2
    assert "cannot parse config file" in result.output
    assert SECRET not in result.output


def test_describe_with_a_secret_catalog_option_never_prints_it(tmp_path: Path) -> None:
    wh = tmp_path / "wh"
    make_pk_table(str(wh), "db.t", buckets=2)
    write_rows(str(wh), "db.t", range(4))
    coord = f"sqlite://{tmp_path}/c.sqlite"

    async def start_group() -> None:
        cfg = MemberConfig(group="g", warehouse=str(wh), table="db.t", coordinator=coord,
                           catalog_options={"s3.secret-key": SECRET}, session_timeout_s=3)
        async with GroupMember(cfg):
            pass

    asyncio.run(start_group())
    for extra in ([], ["--json"]):
        result = _run(["describe", "--group", "g", "--warehouse", str(wh), "--table", "db.t",
                       "--coordinator", coord, "--catalog-option", f"s3.secret-key={SECRET}",
                       *extra])
        assert result.exit_code == 0, result.output
        assert SECRET not in result.output


# -- reprs, logs, metrics, errors of a running member -----------------------------------


def test_member_config_repr_and_str_mask_catalog_secrets() -> None:
    cfg = MemberConfig(
        group="g", warehouse="/wh", table="db.t", coordinator="memory://x",
        catalog_options={"s3.secret-key": SECRET, "s3.endpoint": "http://minio:9000"},
        connect=ConnectOptions(username="u", password=Secret(SECRET),
                               extra={"sasl_token": SECRET}),
    )
    for text in (repr(cfg), str(cfg), f"{cfg}", repr(cfg.connect_options())):
        assert SECRET not in text
    assert "'s3.secret-key': '***'" in repr(cfg) and "http://minio:9000" in repr(cfg)


@pytest.mark.parametrize("given", [SECRET, SECRET.encode()], ids=["str", "bytes"])
def test_a_password_given_in_the_clear_is_never_shown(given: Any) -> None:
    """``ConnectOptions(password="...")``, not wrapped in a ``Secret`` by its
    caller: kept as a ``Secret`` all the same, so no repr, str, log or
    ``dataclasses.asdict`` dump of the options or of a config shows it, and
    the backends still get it."""
    import dataclasses

    options = ConnectOptions(username="root", password=given)
    cfg = MemberConfig(group="g", warehouse="/wh", table="db.t", coordinator="memory://x",
                       connect=options)
    shown = [repr(options), str(options), f"{options}", repr(cfg), str(cfg),
             repr(cfg.connect_options()), repr(dataclasses.asdict(cfg)),
             json.dumps(dataclasses.asdict(cfg), default=str),
             repr(dataclasses.replace(options, username="other"))]
    for text in shown:
        assert SECRET not in text, text
    assert "password=Secret('***')" in repr(options)
    assert isinstance(options.password, Secret) and options.password.reveal() == SECRET
    assert cfg.connect_options().password == Secret(SECRET)


@pytest.mark.parametrize("given", [12345678, ["hunter2"], object()])
def test_a_password_of_another_type_is_refused_without_its_value(given: Any) -> None:
    with pytest.raises(ConfigError, match="password must be a str or a Secret") as caught:
        ConnectOptions(username="root", password=given)
    for shown in ("12345678", "hunter2", repr(given)):
        assert shown not in str(caught.value)


@pytest.mark.asyncio
async def test_a_running_member_never_shows_its_catalog_secret(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from paimon_group.ops.metrics import MemberCollector
    from paimon_group.ops.report import describe_group

    caplog.set_level(logging.DEBUG)
    wh = tmp_path / "wh"
    make_pk_table(str(wh), "db.t", buckets=2)
    write_rows(str(wh), "db.t", range(10))
    cfg = MemberConfig(group="g", warehouse=str(wh), table="db.t",
                       coordinator=f"memory://secrets-{uuid.uuid4().hex}",
                       catalog_options={"s3.secret-key": SECRET}, session_timeout_s=3,
                       poll_interval_ms=50)
    got = 0
    async with GroupMember(cfg) as member:
        batches = member.batches()
        while got < 10:
            batch = await asyncio.wait_for(batches.__anext__(), timeout=60)
            got += batch.to_arrow().num_rows
        await batches.aclose()
        registry = CollectorRegistry()
        registry.register(MemberCollector(member))
        exposition = generate_latest(registry).decode()
        assert member.core.coordinator is not None and member.table is not None
        report = await describe_group(member.core.coordinator, "g", member.table)
        shown = [repr(member.config), str(member.config), exposition,
                 json.dumps(report, default=str), repr(member.core.coordinator)]
    for text in [*shown, caplog.text]:
        assert SECRET not in text


def test_a_table_error_quoting_an_option_is_scrubbed(monkeypatch: pytest.MonkeyPatch) -> None:
    import pypaimon

    from paimon_group.reading.table import ShardedTable

    def refuse(options: dict[str, str]) -> Any:
        raise ValueError(f"bad catalog options {options}")

    monkeypatch.setattr(pypaimon.CatalogFactory, "create", staticmethod(refuse))
    with pytest.raises(ConfigError) as caught:
        ShardedTable.open("/wh", "db.t", {"s3.secret-key": SECRET})
    _one_line_without_secret(str(caught.value))
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


# -- passwords over plaintext connections -------------------------------------------------


def _refusal(make: Any) -> str:
    with pytest.raises(ConfigError) as caught:
        make()
    message = str(caught.value)
    _one_line_without_secret(message)
    assert "--allow-plaintext-credentials" in message and "unencrypted" in message
    return message


def test_etcd_password_over_plaintext_is_refused_unless_allowed(tmp_path: Path) -> None:
    options = ConnectOptions(username="root", password=Secret(SECRET))
    assert _refusal(lambda: EtcdCoordinator("etcd://127.0.0.1:1/app", options)).startswith(
        "etcd with a username and password")
    EtcdCoordinator("etcd://127.0.0.1:1/app", ConnectOptions(
        username="root", password=Secret(SECRET), allow_plaintext_credentials=True))
    EtcdCoordinator("etcds://127.0.0.1:1/app", options)  # TLS: fine
    EtcdCoordinator("etcd://127.0.0.1:1/app")  # no password: fine


def test_zookeeper_digest_without_tls_is_refused_unless_allowed(tmp_path: Path) -> None:
    digest = ConnectOptions(username="alice", password=Secret(SECRET))
    assert _refusal(lambda: ZooKeeperCoordinator("zk://h:1/x", digest)).startswith(
        "ZooKeeper with digest authentication")
    plain = ConnectOptions(username="alice", password=Secret(SECRET), auth_scheme="sasl",
                           extra={"sasl_mechanism": "PLAIN"})
    _refusal(lambda: ZooKeeperCoordinator("zk://h:1/x", plain))
    ZooKeeperCoordinator("zk://h:1/x", ConnectOptions(
        username="alice", password=Secret(SECRET), allow_plaintext_credentials=True))
    ca = tmp_path / "ca.pem"
    ca.write_text("")
    ZooKeeperCoordinator("zk://h:1/x", ConnectOptions(
        username="alice", password=Secret(SECRET), tls_ca=str(ca)))
    # SASL DIGEST-MD5 answers a challenge: the password never crosses the wire.
    ZooKeeperCoordinator("zk://h:1/x", ConnectOptions(
        username="alice", password=Secret(SECRET), auth_scheme="sasl"))


@pytest.mark.parametrize("coordinator,auth", [
    ("etcd://127.0.0.1:1/pg", None), ("zk://127.0.0.1:1/pg", "digest")])
def test_cli_refuses_a_plaintext_password_before_opening_anything(
    tmp_path: Path, coordinator: str, auth: str | None
) -> None:
    """Refused in one line (exit 2) before the table is opened: the warehouse
    does not even exist, and no coordinator is reached."""
    args = ["run", "--group", "g", "--warehouse", str(tmp_path / "missing"), "--table", "d.t",
            "--handler", "json:dumps", "--coordinator", coordinator,
            "--coordinator-username", "alice"]
    if auth:
        args += ["--coordinator-auth", auth]
    env = {"PAIMON_GROUP_COORDINATOR_PASSWORD": SECRET}
    result = _run(args, env)
    assert result.exit_code == 2
    assert "--allow-plaintext-credentials" in result.output
    _one_line_without_secret(result.output)
    assert not (tmp_path / "missing").exists()


def test_options_turned_into_plain_data_keep_the_password_masked() -> None:
    """``dataclasses.asdict`` (a common way to log or dump a configuration)
    must not unwrap the password."""
    import copy
    import dataclasses
    import pickle

    options = ConnectOptions(username="u", password=Secret(SECRET))
    data = dataclasses.asdict(options)
    assert SECRET not in repr(data) and SECRET not in json.dumps(data, default=str)
    assert SECRET not in f"{options.password}" and SECRET not in str([options.password])
    assert copy.deepcopy(options.password) == options.password
    assert pickle.loads(pickle.dumps(options.password)).reveal() == SECRET
