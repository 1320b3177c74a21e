"""A secret holding ``/``, ``?``, ``#`` or ``@`` in a URL is never shown.

A password or an AWS secret key may hold any of these characters (AWS
secret keys often hold ``/``). Wherever a URL comes in (the command line,
a ``--config`` file, the environment, the Spark source's options,
``MemberConfig``, ``SourceOptions``, the Paimon sink, ``ShardedTable.open``),
a warehouse URI or a coordinator URL carrying ``user:password@`` is refused
in one line that never shows the secret, before anything is joined or
created (no state folder named after the secret); and every URL shown
(errors, reprs) is redacted.
"""

from __future__ import annotations

import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from coordinators import urls
from coordinators.errors import ConfigError
from paimon_group import MemberConfig
from paimon_group.cli import main
from paimon_group.reading.table import ShardedTable
from paimon_group.spark.source.options import SourceOptions
from tests.support.group_procs import REPO
from tests.support.requirements import require
from tests.support.tables import make_pk_table

USER = "AKIAXUSERQ"
SPECIALS = ["/", "?", "#", "@"]
# What must never appear: the user (an access key id) and each side of the secret.
NEVER = (USER, "PWSE", "KRETZZ")


def secret(special: str) -> str:
    return f"PWSE{special}KRETZZ"


def warehouse_uri(special: str) -> str:
    return f"s3://{USER}:{secret(special)}@bucket/wh"


def coordinator_url(kind: str, special: str, tmp_path: Path) -> str:
    return {
        "etcd": f"etcd://{USER}:{secret(special)}@127.0.0.1:1/p",
        "zk": f"zk://{USER}:{secret(special)}@127.0.0.1:1/p",
        "sqlite": f"sqlite://{USER}:{secret(special)}@{tmp_path}/c.sqlite",
    }[kind]


def assert_unseen(text: str) -> None:
    for word in NEVER:
        assert word not in text, text


def assert_refused_unseen(err: BaseException) -> None:
    """One line, no secret, and no cause in its traceback that shows one."""
    assert isinstance(err, ConfigError), repr(err)
    assert "\n" not in str(err), str(err)
    assert_unseen("".join(traceback.format_exception(err)))


@pytest.fixture
def local_wh(tmp_path: Path) -> Path:
    wh = tmp_path / "wh"
    make_pk_table(str(wh), "db.t", buckets=2)
    return wh


def tree(root: Path) -> set[str]:
    return {str(p) for p in root.rglob("*")}


# -- the redaction ---------------------------------------------------------------------


@pytest.mark.parametrize("special", SPECIALS)
@pytest.mark.parametrize("scheme", ["etcd", "etcds", "zk", "sqlite", "s3", "oss"])
def test_redaction_hides_a_secret_whatever_it_holds(scheme: str, special: str) -> None:
    url = f"{scheme}://{USER}:{secret(special)}@host-1:2379/path?password=x#frag"
    assert urls.has_userinfo(url)
    assert urls.redact_url(url) == f"{scheme}://***@host-1:2379/path?password=***#***"


@pytest.mark.parametrize("url", [
    "s3://bucket/a@b/wh",  # an @ in a path after a bucket: no user information
    "sqlite:///tmp/a@b.db",
    "zk://h:2181/app?acl=open",
    "etcd://h1:2379,[::1]:2380/app",
])
def test_urls_without_user_information_are_shown_as_they_are(url: str) -> None:
    assert not urls.has_userinfo(url)
    assert urls.redact_url(url) == url


def test_query_and_connect_parameters_are_masked() -> None:
    """A query parameter without ``=`` may be a bare secret; a Spark Connect
    address carries its token as a ``;`` parameter."""
    assert urls.redact_url("zk://h:1/x?PWSEKRETZZ") == "zk://h:1/x?***"
    assert urls.redact_url("zk://h:1/x?acl=open&PWSEKRETZZ") == "zk://h:1/x?acl=open&***"
    # A Kerberos principal in an ACL entry is no user information.
    assert urls.redact_url("zk://h:1/x?acl=sasl:bob@EXAMPLE.COM:rw").startswith("zk://h:1/x?acl=")
    assert urls.redact_url("sc://h:15002/;token=PWSEKRETZZ") == "sc://h:15002/;token=***"
    assert urls.redact_url("etcd//root:PWSE?KRETZZ@h") == "***@h"


# -- the command line ------------------------------------------------------------------


def _cli(args: list[str], state: Path, env: dict[str, str] | None = None) -> Any:
    state.mkdir(exist_ok=True)
    return CliRunner().invoke(main, args, env={"XDG_STATE_HOME": str(state), **(env or {})})


def _assert_one_line_refusal(result: Any, state: Path) -> None:
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        assert_unseen("".join(traceback.format_exception(result.exception)))
        raise AssertionError(f"raised {type(result.exception).__name__}")
    assert result.exit_code == 2, result.output
    assert_unseen(result.output)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert result.stdout == ""
    assert tree(state) == set()  # no state folder, named after the secret or not


def _cli_cases(special: str, wh: Path, tmp_path: Path) -> dict[str, list[str]]:
    uri = warehouse_uri(special)
    run = ["run", "--group", "g", "--table", "db.t", "--handler", "json:dumps"]
    table = ["--warehouse", str(wh), "--table", "db.t"]
    cases = {
        "run-warehouse": [*run, "--warehouse", uri, "--coordinator", "local"],
        "run-warehouse-etcd": [*run, "--warehouse", uri, "--coordinator", "etcd://127.0.0.1:1"],
        "describe-warehouse": ["describe", "--group", "g", "--warehouse", uri,
                               "--coordinator", "local"],
        "list-warehouse": ["list", "--warehouse", uri, "--coordinator", "local"],
        "demo-warehouse": ["demo", "--warehouse", uri, "--dir", str(tmp_path / "demo")],
    }
    for kind in ("etcd", "zk", "sqlite"):
        url = coordinator_url(kind, special, tmp_path)
        cases[f"run-{kind}"] = [*run, "--warehouse", str(wh), "--coordinator", url]
        cases[f"list-{kind}"] = ["list", "--coordinator", url]
        cases[f"describe-{kind}"] = ["describe", "--group", "g", *table, "--coordinator", url]
    url = coordinator_url("etcd", special, tmp_path)
    cases["reset-etcd"] = ["reset", "--group", "g", *table, "--coordinator", url,
                           "--to-latest"]
    cases["delete-etcd"] = ["delete", "--group", "g", *table, "--coordinator", url]
    cases["members-remove-etcd"] = ["members", "remove", "m1", "--group", "g",
                                    "--coordinator", url]
    return cases


CLI_CASES = list(_cli_cases("/", Path("/w"), Path("/t")))


@pytest.mark.parametrize("special", SPECIALS)
@pytest.mark.parametrize("case", CLI_CASES)
def test_cli_refuses_a_url_with_a_secret_in_one_line(
    local_wh: Path, tmp_path: Path, case: str, special: str
) -> None:
    state = tmp_path / "state"
    before = tree(tmp_path)
    args = _cli_cases(special, local_wh, tmp_path)[case]
    _assert_one_line_refusal(_cli(args, state), state)
    assert tree(tmp_path) - before == {str(state)}


@pytest.mark.parametrize("special", SPECIALS)
@pytest.mark.parametrize("what", ["warehouse", "coordinator"])
def test_a_config_file_or_the_environment_with_a_secret_url_is_refused(
    local_wh: Path, tmp_path: Path, what: str, special: str
) -> None:
    url = warehouse_uri(special) if what == "warehouse" else \
        coordinator_url("etcd", special, tmp_path)
    settings = {"group": "g", "table": "db.t", "handler": "json:dumps",
                "warehouse": str(local_wh), "coordinator": "local", what: url}
    config = tmp_path / "member.toml"
    config.write_text("".join(f'{key} = "{value}"\n' for key, value in settings.items()))
    state = tmp_path / "state"
    _assert_one_line_refusal(_cli(["run", "--config", str(config)], state), state)
    env = {f"PAIMON_GROUP_{key.upper()}": value for key, value in settings.items()}
    _assert_one_line_refusal(_cli(["run"], state, env), state)


@pytest.mark.parametrize("special", SPECIALS)
def test_the_command_refuses_a_warehouse_with_a_secret_before_anything(
    tmp_path: Path, special: str
) -> None:
    """The issue's case, through the real command: no traceback, no state folder."""
    state = tmp_path / "state"
    result = subprocess.run(
        [sys.executable, "-m", "paimon_group", "run", "--group", "g", "--table", "db.t",
         "--handler", "json:dumps", "--warehouse", warehouse_uri(special),
         "--coordinator", "local"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
        env={**_env(), "XDG_STATE_HOME": str(state)})
    assert result.returncode == 2, result.stderr
    assert_unseen(result.stderr + result.stdout)
    assert result.stderr.startswith("error: the warehouse URI s3://***@bucket/wh carries "
                                    "credentials"), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "in a --config file or PAIMON_GROUP_CATALOG_OPTION)" in result.stderr
    assert not state.exists()


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("PAIMON_GROUP_")}


# -- the library -----------------------------------------------------------------------


@pytest.mark.parametrize("special", SPECIALS)
def test_member_config_and_source_options_refuse_a_secret_url(
    local_wh: Path, tmp_path: Path, special: str
) -> None:
    coordinators = [coordinator_url(k, special, tmp_path) for k in ("etcd", "zk", "sqlite")]
    for warehouse, coordinator in [(warehouse_uri(special), "local"),
                                   *((str(local_wh), url) for url in coordinators)]:
        with pytest.raises(ConfigError) as member:
            MemberConfig(group="g", warehouse=warehouse, table="db.t", coordinator=coordinator)
        assert_refused_unseen(member.value)
        with pytest.raises(ConfigError) as source:
            SourceOptions.parse({"group": "g", "warehouse": warehouse, "table": "db.t",
                                 "coordinator": coordinator})
        assert_refused_unseen(source.value)


def test_a_warehouse_refusal_names_the_way_its_entry_point_takes_catalog_options(
    local_wh: Path,
) -> None:
    """The library and the Spark source never point at the command line's ways."""
    warehouse = warehouse_uri("/")
    refusals = {
        "in catalog_options)": [
            lambda: MemberConfig(group="g", warehouse=warehouse, table="db.t"),
            lambda: ShardedTable.open(warehouse, "db.t")],
        'as .option("catalog.<key>", ...))': [
            lambda: SourceOptions.parse({"group": "g", "warehouse": warehouse, "table": "db.t"})],
    }
    for way, makers in refusals.items():
        for make in makers:
            with pytest.raises(ConfigError) as caught:
                make()
            assert str(caught.value).endswith(way), str(caught.value)
            assert "PAIMON_GROUP_CATALOG_OPTION" not in str(caught.value)


@pytest.mark.spark
@pytest.mark.parametrize("special", SPECIALS)
def test_the_spark_source_refuses_a_secret_url_when_the_query_is_defined(
    local_wh: Path, tmp_path: Path, special: str
) -> None:
    """What Spark calls with the reader's options (``format("paimon-group")``)."""
    require("pyspark", "pip install '.[spark]' (tests/run.sh does)")
    from paimon_group.spark.source import PaimonGroupDataSource

    for options in ({"warehouse": warehouse_uri(special)},
                    {"warehouse": str(local_wh),
                     "coordinator": coordinator_url("etcd", special, tmp_path)}):
        with pytest.raises(ConfigError) as caught:
            PaimonGroupDataSource({"group": "g", "table": "db.t", **options})
        assert_refused_unseen(caught.value)


@pytest.mark.parametrize("special", SPECIALS)
def test_the_paimon_sink_and_the_table_refuse_a_warehouse_with_a_secret(special: str) -> None:
    from paimon_group.sink import PaimonSink

    with pytest.raises(ConfigError) as sink:
        PaimonSink(warehouse_uri(special), "db.t")
    assert_refused_unseen(sink.value)
    with pytest.raises(ConfigError) as table:
        ShardedTable.open(warehouse_uri(special), "db.t")
    assert_refused_unseen(table.value)


@pytest.mark.parametrize("special", SPECIALS)
def test_an_endpoint_with_a_secret_is_refused(local_wh: Path, special: str) -> None:
    with pytest.raises(ConfigError) as caught:
        ShardedTable.open(str(local_wh), "db.t",
                          {"s3.endpoint": f"http://{USER}:{secret(special)}@minio:9000"})
    assert_refused_unseen(caught.value)


def test_a_table_that_fails_to_open_is_one_line_with_the_warehouse_redacted() -> None:
    """pypaimon raises what is not an OSError (``RuntimeError: Failed to load
    schema from path: <warehouse>/...``): one line, the URI redacted, no
    traceback of the raw error."""
    from paimon_group.errors import PaimonGroupError

    uri = "s3://bucket:99/wh?token=PWSEKRETZZ"
    with pytest.raises(PaimonGroupError) as caught:
        ShardedTable.open(uri, "db.t", {"s3.endpoint": "http://127.0.0.1:1",
                                        "paimon-group.s3.timeout-s": "1"})
    message = str(caught.value)
    assert message.startswith("cannot open table db.t in warehouse "
                              "s3://bucket:99/wh?token=***"), message
    assert "\n" not in message
    assert_unseen("".join(traceback.format_exception(caught.value)))


# -- reprs -----------------------------------------------------------------------------


def test_reprs_show_no_secret(local_wh: Path) -> None:
    """MemberConfig and SourceOptions: catalog secrets masked, URLs redacted
    (a secret in a ZooKeeper digest ACL of the URL)."""
    url = "zk://127.0.0.1:1/p?acl=digest:bob:PWSE/KRETZZ:rw"
    cfg = MemberConfig(group="g", warehouse=str(local_wh), table="db.t", coordinator=url,
                       catalog_options={"s3.secret-key": secret("/")})
    options = SourceOptions.parse({"group": "g", "warehouse": str(local_wh), "table": "db.t",
                                   "coordinator": url, "catalog.s3.secret-key": secret("/"),
                                   "coordinator_password": secret("?")})
    for text in (repr(cfg), str(cfg), repr(options), str(options),
                 repr(options.member_config())):
        assert_unseen(text)
        assert "zk://127.0.0.1:1/p?acl=" in text and "'s3.secret-key': '***'" in text, text


def test_a_spark_connect_token_is_not_shown() -> None:
    from paimon_group.spark.handler import SparkBatchHandler

    handler = SparkBatchHandler(lambda df, batch: None,
                                remote="sc://h:15002/;token=PWSEKRETZZ")
    assert_unseen(repr(handler))
    assert "token=***" in repr(handler)
