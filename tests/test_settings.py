"""Each setting is declared once (``paimon_group.config.settings``) and every
entry point takes its default, flag, environment variable, Spark option name
and help from that declaration: ``MemberConfig``'s fields, the options of
``paimon-group run`` and the Spark source's options. A front end that writes
a declared default again as a literal (``default=10.0``, a dataclass field
``= 10.0``, ``.get(key, 10.0)``, ``or 10.0``) fails here. A setting's former
flags still work, each with one deprecation line on stderr."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path
from typing import Any

import click
import pytest

from paimon_group import MemberConfig
from paimon_group.cli import run
from paimon_group.cli.options import param_name
from paimon_group.config.settings import (
    MEMBER_SETTINGS,
    RUN_SETTINGS,
    SETTINGS,
    SPARK_SETTINGS,
    Setting,
    setting,
)
from paimon_group.spark.source.options import _KNOWN, SourceOptions

REPO = Path(__file__).resolve().parents[1]
# The modules of the entry points: none of them may restate a declared default.
FRONT_ENDS = [
    "paimon_group/cli/__init__.py",
    "paimon_group/cli/options.py",
    "paimon_group/cli/context.py",
    "paimon_group/config/member.py",
    "paimon_group/spark/source/options.py",
]


def _run_option(flag: str) -> click.Option:
    [option] = [p for p in run.params if isinstance(p, click.Option) and flag in p.opts]
    return option


def _field_default(cls: type, name: str) -> Any:
    [f] = [f for f in dataclasses.fields(cls) if f.name == name]
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def test_each_setting_is_declared_once() -> None:
    names = [s.name for s in SETTINGS]
    assert len(names) == len(set(names))
    flags = [f for s in SETTINGS for f in (s.flag, *s.former_flags) if f]
    assert len(flags) == len(set(flags))
    assert all(setting(s.name) is s for s in SETTINGS)


def test_the_member_config_fields_are_the_member_settings_in_order() -> None:
    fields = [f.name for f in dataclasses.fields(MemberConfig)]
    assert [s.name for s in MEMBER_SETTINGS] == [n for n in fields if n in
                                                 {s.name for s in MEMBER_SETTINGS}]
    for s in MEMBER_SETTINGS:
        assert _field_default(MemberConfig, s.name) == s.default, s.name


@pytest.mark.parametrize("s", [s for s in (*MEMBER_SETTINGS, *RUN_SETTINGS) if s.flag],
                         ids=lambda s: s.name)
def test_each_run_option_is_generated_from_its_declaration(s: Setting) -> None:
    assert s.flag is not None
    option = _run_option(s.flag)
    assert option.opts == [s.flag] and option.name == param_name(s.flag)
    assert option.envvar == s.env and option.help == s.help
    assert _parse([])[param_name(s.flag)] == s.default
    if s.default is not None and s.type is not bool:
        assert option.default == s.default
        assert option.show_default == (s.shown_default or True)
    if s.choices:
        assert isinstance(option.type, click.Choice)
        assert tuple(option.type.choices) == s.choices


@pytest.mark.parametrize("s", SPARK_SETTINGS, ids=lambda s: s.name)
def test_each_spark_option_is_its_declaration(s: Setting) -> None:
    assert s.spark in _KNOWN
    assert _field_default(SourceOptions, s.name) == s.default
    parsed = SourceOptions.parse({"group": "g", "warehouse": "/tmp/wh-settings",
                                  "table": "db.t"})
    assert getattr(parsed, s.name) == s.default


def test_the_spark_source_and_the_member_share_their_settings() -> None:
    options = SourceOptions.parse({"group": "g", "warehouse": "/tmp/wh-settings",
                                   "table": "db.t", "session_timeout_s": "7",
                                   "rebalance_delay_s": "0", "start": "earliest"})
    cfg = options.member_config()
    assert (cfg.session_timeout_s, cfg.rebalance_delay_s, cfg.start) == (7.0, 0.0, "earliest")
    assert cfg.connect is not None and cfg.connect.session_timeout_s == 7.0
    assert cfg.start_position.kind.value == "earliest"


def test_a_setting_with_a_unit_says_it_in_its_names() -> None:
    for s in SETTINGS:
        if s.unit:
            assert s.name.endswith("_" + s.unit), s.name
            assert s.flag is None or s.flag.endswith("-" + s.unit), s.flag
            assert s.spark is None or s.spark.endswith("_" + s.unit), s.spark


def test_the_spark_docs_name_every_option() -> None:
    text = (REPO / "docs/spark.md").read_text().split("### Options")[1].split("\n\n")[1]
    named = {n.lower() for n in re.findall(r"`([A-Za-z_]+)`", text)}
    assert {s.spark for s in SPARK_SETTINGS} <= named
    for s in SPARK_SETTINGS:  # a default the table spells out is the declared one
        row = next(line for line in text.splitlines() if f"`{s.spark}`" in line.lower())
        cell = row.split("|")[2].strip()
        if isinstance(s.default, float) and re.fullmatch(r"[\d.]+", cell):
            assert float(cell) == s.default, s.name


# -- no front end restates a declared default ----------------------------------------

def _declared_literals() -> dict[object, list[str]]:
    """Each declared default that could be restated as a literal, with its settings
    (None and booleans are too common to tell; a default computed per host is no
    literal)."""
    out: dict[object, list[str]] = {}
    for s in SETTINGS:
        if s.default is None or isinstance(s.default, bool) or s.shown_default:
            continue
        out.setdefault(s.default, []).append(s.name)
    return out


def _setting_words() -> set[str]:
    return {w for s in SETTINGS for w in (s.name, s.spark, s.flag, *s.former_flags) if w}


def _defaults_in(tree: ast.AST) -> list[ast.Constant]:
    """The literals of ``tree`` in the places a default is written."""
    words = _setting_words()
    found: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "default":
            found.append(node.value)
        elif isinstance(node, ast.ClassDef):
            found += [n.value for n in node.body if isinstance(n, ast.AnnAssign) and n.value]
        elif isinstance(node, ast.arguments):
            found += [*node.defaults, *(d for d in node.kw_defaults if d is not None)]
        elif isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):
            found.append(node.values[-1])
        elif isinstance(node, ast.Call):
            if isinstance(node.func, ast.Attribute) and node.func.attr == "get":
                found += node.args[1:]
            if any(isinstance(a, ast.Constant) and a.value in words for a in node.args):
                found += node.args
    return [n for n in found if isinstance(n, ast.Constant)
            and not isinstance(n.value, bool) and n.value is not None]


def restated_defaults(source: str, path: str = "<text>") -> list[str]:
    """``path:line: value (setting, ...)`` for each declared default written again."""
    declared = _declared_literals()
    out = []
    for node in _defaults_in(ast.parse(source)):
        try:
            names = declared.get(node.value)
        except TypeError:  # an unhashable constant
            names = None
        if names:
            out.append(f"{path}:{node.lineno}: {node.value!r} ({', '.join(names)})")
    return out


@pytest.mark.parametrize("path", FRONT_ENDS)
def test_no_front_end_restates_a_declared_default(path: str) -> None:
    assert restated_defaults((REPO / path).read_text(), path) == []


@pytest.mark.parametrize("text", [
    '@click.option("--session-timeout-s", type=float, default=10.0)\ndef f(): pass',
    "class C:\n    session_timeout_s: float = 10.0",
    'x = opts.get("start", "latest-full")',
    'x = _number(opts, "revoke_timeout_s", 10.0)',
    'x = float(opts.get("hold_timeout_s") or 300.0)',
    "def build(kw, session_timeout_s: float = 10.0): pass",
])
def test_a_restated_default_is_found(text: str) -> None:
    assert restated_defaults(text)


# -- former flags ----------------------------------------------------------------------

BASE = ["--group", "g", "--warehouse", "/tmp/wh-settings", "--table", "db.t",
        "--handler", "json:dumps"]


def _parse(args: list[str]) -> dict[str, Any]:
    with run.make_context("run", [*BASE, *args]) as ctx:
        return dict(ctx.params)


@pytest.mark.parametrize("args", [["--rebalance-delay", "7"], ["--rebalance-delay=7"]])
def test_a_former_flag_works_with_one_deprecation_line(
        args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert _parse(args)["rebalance_delay_s"] == 7.0
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "warning: --rebalance-delay is deprecated: use --rebalance-delay-s"]


def test_the_current_flag_says_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    assert _parse(["--rebalance-delay-s", "7", "--forming-wait-s", "0"])["forming_wait_s"] == 0
    assert capsys.readouterr().err == ""


def test_a_former_variable_works_below_the_flags(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("PAIMON_GROUP_REBALANCE_DELAY", "12.5")
    assert _parse([])["rebalance_delay_s"] == 12.5
    assert _parse(["--rebalance-delay-s", "3"])["rebalance_delay_s"] == 3.0
    assert "PAIMON_GROUP_REBALANCE_DELAY is deprecated" in capsys.readouterr().err
    monkeypatch.setenv("PAIMON_GROUP_REBALANCE_DELAY_S", "4")
    assert _parse([])["rebalance_delay_s"] == 4.0
    assert capsys.readouterr().err == ""


def test_a_former_key_of_a_config_file_works(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "member.toml"
    config.write_text("rebalance-delay = 9\nforming_wait = 2\n")
    params = _parse(["--config", str(config)])
    assert (params["rebalance_delay_s"], params["forming_wait_s"]) == (9, 2)
    assert len(capsys.readouterr().err.splitlines()) == 2
