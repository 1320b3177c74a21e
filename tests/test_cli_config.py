"""``paimon-group run`` configuration: every option from a flag, from the environment
(``PAIMON_GROUP_<OPTION>``) and from ``--config`` (TOML or YAML), with precedence
flags > environment > file > defaults.

The option list is read from the click command itself, so an option added later
is covered without touching this file. The command's callback is replaced by
one that records what click parsed (no member is started); one test runs the
real callback with a fake runner to check the options reach the member config.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import pytest
import yaml
from click.testing import CliRunner, Result

from paimon_group import cli
from paimon_group.cli import main
from paimon_group.process import preflight

RUN = cli.run
REQUIRED = {"group", "warehouse", "table"}
SOURCES = ("file", "env", "flag")


@pytest.fixture(autouse=True)
def _keep_signal_handlers() -> Iterator[None]:
    """``run`` in this process sets SIGTERM and SIGINT to stop it before it
    joins (exit 0): pytest's own handlers come back after each test."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)


def run_options() -> list[click.Option]:
    return [p for p in RUN.params if isinstance(p, click.Option) and p.name != "config"]


@dataclass(frozen=True)
class Values:
    """One option's value as each source spells it, and what click should parse."""

    file: Any  # as written in the TOML/YAML file
    env: str
    flag: list[str]  # command-line arguments
    parsed: Any


def flag_name(option: click.Option) -> str:
    return max(option.opts, key=len)


def values_for(option: click.Option, source: str) -> Values:
    name = option.name
    assert name is not None
    index = SOURCES.index(source)
    if option.is_flag:
        # A boolean flag: the file and the environment can say false, a flag only true.
        value = source != "env"
        return Values(value, "true" if value else "false", [flag_name(option)], value)
    if option.multiple:
        items = [f"{source}{i}=v{i}" for i in range(2)]
        args = [a for item in items for a in (flag_name(option), item)]
        return Values(items, " ".join(items), args, tuple(items))
    if isinstance(option.type, click.Choice):
        choices = list(option.type.choices)
        value = choices[index % 2]
        return Values(value, value, [flag_name(option), value], value)
    if option.type is click.INT or isinstance(option.type, click.types.IntParamType):
        value = 100 + 11 * (index + 1)
        return Values(value, str(value), [flag_name(option), str(value)], value)
    if isinstance(option.type, click.types.FloatParamType):
        value = 1.5 + index
        return Values(value, str(value), [flag_name(option), str(value)], value)
    text = f"/tmp/{source}-{name}" if isinstance(option.type, click.Path) else f"{source}-{name}"
    return Values(text, text, [flag_name(option), text], text)


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("PAIMON_GROUP_"):
            monkeypatch.delenv(key)


@pytest.fixture
def parsed(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, Any]]]:
    """What the ``run`` callback receives, one dict per invocation."""
    calls: list[dict[str, Any]] = []

    def record(**kw: Any) -> None:
        calls.append(kw)

    monkeypatch.setattr(RUN, "callback", record)
    yield calls


def invoke(args: list[str], env: dict[str, str] | None = None) -> Result:
    result = CliRunner().invoke(main, ["run", *args], env=env, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result


def required_flags(except_for: str) -> list[str]:
    out: list[str] = []
    for name in sorted(REQUIRED - {except_for}):
        out += [f"--{name}", f"base-{name}"]
    return out


def write_config(path: Path, data: dict[str, Any], *, dashes: bool = False) -> Path:
    data = {(k.replace("_", "-") if dashes else k): v for k, v in data.items()}
    if path.suffix in (".yaml", ".yml"):
        path.write_text(yaml.safe_dump(data))
    else:
        path.write_text(_toml(data))
    return path


def _toml(data: dict[str, Any]) -> str:
    lines = []
    for key, value in data.items():
        lines.append(f"{key} = {json.dumps(value)}" if not isinstance(value, bool)
                     else f"{key} = {'true' if value else 'false'}")
    return "\n".join(lines) + "\n"


OPTIONS = run_options()
IDS = [o.name or "" for o in OPTIONS]


def test_every_run_option_has_its_environment_variable() -> None:
    for option in OPTIONS:
        assert option.name is not None
        expected = "PAIMON_GROUP_" + option.name.upper()
        assert option.envvar == expected, option.name
    # Including the ones the issue names explicitly.
    names = {o.name for o in OPTIONS}
    assert {"metrics_port", "log_format", "coordinator", "member_id", "shards"} <= names


@pytest.mark.parametrize("option", OPTIONS, ids=IDS)
def test_option_from_the_environment(option: click.Option, parsed: list[dict[str, Any]]) -> None:
    v = values_for(option, "flag")  # any value that is not the default
    if option.is_flag:
        v = Values(True, "true", [], True)
    assert option.envvar is not None
    invoke(required_flags(option.name or ""), env={str(option.envvar): v.env})
    assert parsed[-1][option.name or ""] == v.parsed


@pytest.mark.parametrize("suffix", [".toml", ".yaml"])
@pytest.mark.parametrize("option", OPTIONS, ids=IDS)
def test_option_from_the_config_file(
    option: click.Option, suffix: str, tmp_path: Path, parsed: list[dict[str, Any]]
) -> None:
    v = values_for(option, "file")
    for dashes in (False, True):
        path = write_config(tmp_path / f"c{int(dashes)}{suffix}", {option.name or "": v.file},
                            dashes=dashes)
        invoke(["--config", str(path), *required_flags(option.name or "")])
        assert parsed[-1][option.name or ""] == v.parsed


@pytest.mark.parametrize("option", OPTIONS, ids=IDS)
def test_precedence_flag_over_environment_over_file(
    option: click.Option, tmp_path: Path, parsed: list[dict[str, Any]]
) -> None:
    name = option.name or ""
    file_v, env_v, flag_v = (values_for(option, s) for s in SOURCES)
    config = write_config(tmp_path / "c.toml", {name: file_v.file})
    env = {str(option.envvar): env_v.env}
    base = ["--config", str(config), *required_flags(name)]
    invoke(base, env=env)
    assert parsed[-1][name] == env_v.parsed, "the environment beats the file"
    invoke([*base, *flag_v.flag], env=env)
    assert parsed[-1][name] == flag_v.parsed, "a flag beats the environment"
    invoke(["--config", str(config), *required_flags(name), *flag_v.flag])
    assert parsed[-1][name] == flag_v.parsed, "a flag beats the file"


def test_defaults_when_no_source_gives_a_value(parsed: list[dict[str, Any]]) -> None:
    invoke(required_flags(""))
    got = parsed[-1]
    assert got["start"] == "latest-full" and got["poll_interval_ms"] == 1000
    assert got["metrics_port"] is None and got["log_format"] == "text"


def test_config_file_with_everything_and_catalog_options_as_a_table(
    tmp_path: Path, parsed: list[dict[str, Any]]
) -> None:
    path = tmp_path / "member.toml"
    path.write_text(
        'group = "orders"\nwarehouse = "/data/wh"\ntable = "db.orders"\n'
        'metrics-port = 9400\nlog-format = "json"\n'
        '[catalog-option]\n"s3.endpoint" = "http://minio:9000"\n"s3.region" = "eu"\n'
    )
    invoke(["--config", str(path)])
    got = parsed[-1]
    assert (got["group"], got["warehouse"], got["table"]) == ("orders", "/data/wh", ("db.orders",))
    assert got["metrics_port"] == 9400 and got["log_format"] == "json"
    assert sorted(got["catalog_option"]) == ["s3.endpoint=http://minio:9000", "s3.region=eu"]


@pytest.mark.parametrize(
    ("content", "suffix", "words"),
    [
        ('grup = "x"\n', ".toml", "unknown option 'grup'"),
        ("group = [\n", ".toml", "cannot parse"),
        ("- a\n- b\n", ".yaml", "mapping"),
    ],
)
def test_bad_config_files_are_one_clear_error(
    content: str, suffix: str, words: str, tmp_path: Path
) -> None:
    path = tmp_path / f"bad{suffix}"
    path.write_text(content)
    result = CliRunner().invoke(main, ["run", "--config", str(path)])
    assert result.exit_code == 2
    assert words in result.output


def test_missing_config_file_is_one_clear_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["run", "--config", str(tmp_path / "nope.toml")])
    assert result.exit_code == 2 and "cannot read config file" in result.output


def test_options_reach_the_member_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real ``run`` callback, with a fake runner: file, env and flags become one
    MemberConfig; the password comes from the environment and is never shown."""
    started: list[tuple[Any, Any, int | None]] = []
    logging_setup: list[tuple[str, str]] = []

    def fake_runner(config: Any, handler: Any, *, metrics_port: int | None = None,
                    progress_interval_s: float | None = None, table: Any = None) -> None:
        started.append((config, handler, metrics_port))

    import paimon_group.process.runner

    monkeypatch.setattr(paimon_group.process.runner, "run_until_signalled", fake_runner)
    # No table, no coordinator here: the checks before joining are tested with
    # real ones in tests/test_cli_bad_input.py.
    monkeypatch.setattr(preflight, "check_table", lambda *args, **kw: None)
    monkeypatch.setattr(preflight, "probe_coordinator", lambda *args: None)
    monkeypatch.setattr(preflight, "check_not_refused", lambda *args: None)
    monkeypatch.setattr(cli, "setup_logging", lambda fmt, level: logging_setup.append(
        (fmt, level)))
    config = write_config(tmp_path / "member.yaml", {
        "group": "orders", "warehouse": "/data/wh", "table": "db.orders",
        "handler": "json:dumps", "shards": 6, "start": "earliest", "poll_interval_ms": 250,
        "session_timeout_s": 8.0, "metrics_port": 9400, "log_format": "text",
        "coordinator": "etcd://127.0.0.1:2379/pg", "coordinator_username": "pg",
        "allow_plaintext_credentials": True,
    }, dashes=True)
    env = {
        "PAIMON_GROUP_MEMBER_ID": "worker-0",
        "PAIMON_GROUP_LOG_FORMAT": "json",
        "PAIMON_GROUP_COORDINATOR_PASSWORD": "s3cret-pw",
        "PAIMON_GROUP_REBALANCE_DELAY_S": "12.5",
    }
    result = CliRunner().invoke(
        main, ["run", "--config", str(config), "--poll-interval-ms", "50"], env=env,
        catch_exceptions=False)
    assert result.exit_code == 0, result.output
    ((cfg, handler, port),) = started
    assert handler is json.dumps and port == 9400
    assert logging_setup == [("json", "INFO")]
    assert (cfg.group, cfg.warehouse, cfg.table) == ("orders", "/data/wh", "db.orders")
    assert cfg.member_id == "worker-0" and cfg.shards == 6 and cfg.start == "earliest"
    assert cfg.poll_interval_ms == 50 and cfg.session_timeout_s == 8.0
    assert cfg.rebalance_delay_s == 12.5
    assert cfg.coordinator == "etcd://127.0.0.1:2379/pg"
    assert cfg.connect.username == "pg"
    assert cfg.connect.password.reveal() == "s3cret-pw"
    assert "s3cret-pw" not in repr(cfg) and "s3cret-pw" not in result.output


def test_the_password_is_never_a_flag(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["run", "--group", "g", "--warehouse", "/w", "--table",
                                       "d.t", "--coordinator-password", "x"])
    assert result.exit_code == 2 and "No such option" in result.output
    # From a file instead.
    secret = tmp_path / "pw"
    secret.write_text("from-file\n")
    options = cli.build_connect_options({"coordinator_password_file": str(secret)}, 7.0)
    assert options.session_timeout_s == 7.0
    assert options.password is not None and options.password.reveal() == "from-file"
    assert "from-file" not in repr(options)
