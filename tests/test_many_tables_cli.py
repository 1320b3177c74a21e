"""``paimon-group run`` of a group of several tables (docs/many-tables.md):
``--table`` repeated and patterns, from flags, ``PAIMON_GROUP_TABLE`` and
``--config``; the checks made before anything is joined or created, on real
pypaimon tables, through the real command (``python -m paimon_group``): each
bad input is one line, a non-zero exit, and no file (no coordinator, so no
group) appears."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from paimon_group import cli
from paimon_group.cli import main, run_config
from paimon_group.config.subscription import TableSubscription
from paimon_group.process import preflight
from paimon_group.reading.table import ShardedTable
from tests.support.group_procs import REPO
from tests.support.tables import make_append_table, make_pk_table, write_rows

HANDLER = "tests.support.handlers:record"


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """shop.orders (4 buckets, with an ``op`` column), shop.items (bucket-unaware
    append, no ``op``), ops.pending and ops.waiting (postpone buckets without a
    changelog: not readable shard by shard)."""
    wh = tmp_path_factory.mktemp("many-tables") / "wh"
    make_pk_table(str(wh), "shop.orders", buckets=4, row_kind_field=True)
    make_append_table(str(wh), "shop.items", buckets=-1)
    write_rows(str(wh), "shop.items", range(5))
    make_pk_table(str(wh), "ops.pending", buckets=-2)
    make_pk_table(str(wh), "ops.waiting", buckets=-2)
    return wh


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No ``PAIMON_GROUP_*`` of the caller's; the signal handlers ``run`` sets
    in this process put back after each test."""
    for key in list(os.environ):
        if key.startswith("PAIMON_GROUP_"):
            monkeypatch.delenv(key)
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)


def tree(*roots: Path) -> set[str]:
    return {str(p) for root in roots for p in root.rglob("*")}


def run_args(wh: Path, *tables: str, extra: tuple[str, ...] = ()) -> list[str]:
    out = ["run", "--group", "g", "--warehouse", str(wh), "--handler", HANDLER]
    for table in tables:
        out += ["--table", table]
    return [*out, *extra]


# -- bad input: one line, exit 2, nothing created -------------------------------------

BAD = {
    "a-plain-name-missing": (("shop.orders", "shop.nope"), (), {},
                             "table shop.nope not found in warehouse"),
    "two-plain-names-missing": (("shop.nope", "ops.gone", "shop.*"), (), {},
                                "tables shop.nope, ops.gone not found"),
    "no-table-matches": (("nope.*",), (), {}, "--table nope.* matches no table in warehouse"),
    "no-table-matches-in-a-database": (("shop.zz*", "ops.x?"), (), {},
                                       "matches no table in warehouse"),
    "one-table-unreadable": (("shop.*", "ops.pending"), (), {},
                             "table ops.pending uses postpone buckets"),
    "tables-unreadable": (("ops.*",), (), {},
                          "tables ops.pending, ops.waiting cannot be read shard by shard: "
                          "each uses postpone buckets"),
    "a-column-missing-from-one-table": (("shop.*",), ("--columns", "id,op"), {},
                                        "not columns of table shop.items"),
    "shards-with-several-tables": (("shop.orders", "shop.items"), ("--shards", "2"), {},
                                   "--shards 2 is for a group of one table"),
    "shards-with-a-pattern": (("shop.*",), ("--shards", "4"), {},
                              "--shards 4 is for a group of one table"),
    "comma-separated": (("shop.orders,shop.items",), (), {}, "one table or pattern per --table"),
    "a-pattern-without-a-database": (("shop.orders", "orders*"), (), {},
                                     "bad --table 'orders*'"),
    "environment-several": ((), (), {"PAIMON_GROUP_TABLE": "shop.orders  shop.nope"},
                            "table shop.nope not found"),
    "environment-pattern": ((), (), {"PAIMON_GROUP_TABLE": "nope.*"}, "matches no table"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_tables_are_one_line_and_create_nothing(warehouse: Path, tmp_path: Path,
                                                    case: str) -> None:
    tables, extra, env, needle = BAD[case]
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    coordinator = scratch / "c.sqlite"
    before = tree(warehouse, scratch)
    for coordinator_args in ((), ("--coordinator", f"sqlite://{coordinator}")):
        result = subprocess.run(
            [sys.executable, "-m", "paimon_group",
             *run_args(warehouse, *tables, extra=(*extra, *coordinator_args))],
            cwd=REPO, capture_output=True, text=True, timeout=60,
            env={**os.environ, **env})
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert result.returncode == 2, result.stderr
        assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
        assert needle in lines[0], lines[0]
        assert result.stdout == ""
        assert tree(warehouse, scratch) == before, "nothing created: no coordinator, no group"


def test_a_config_file_lists_tables(warehouse: Path, tmp_path: Path) -> None:
    config = tmp_path / "member.toml"
    config.write_text(f'group = "g"\nwarehouse = "{warehouse}"\n'
                      f'table = ["shop.orders", "shop.nope"]\nhandler = "{HANDLER}"\n')
    before = tree(warehouse)
    result = subprocess.run([sys.executable, "-m", "paimon_group", "run", "--config",
                             str(config)], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        f"error: table shop.nope not found in warehouse {warehouse}: "
        "check --warehouse and --table"]
    assert tree(warehouse) == before


# -- help -------------------------------------------------------------------------------


def test_run_help_shows_table_repeatable_and_the_refresh() -> None:
    result = CliRunner().invoke(main, ["run", "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "--table DATABASE.TABLE" in text
    assert "Repeatable: the group reads every table named or matched" in text
    assert "'shop.*'" in text and "PAIMON_GROUP_TABLE may hold several" in text
    assert "--tables-refresh-s FLOAT" in text and "[default: 30.0]" in text
    (table,) = [p for p in cli.run.params if p.name == "table"]
    assert isinstance(table, click.Option) and table.multiple and table.required


def test_other_commands_keep_one_table() -> None:
    """Only ``run`` takes several: describe, reset and delete name one table."""
    for name in ("describe", "reset", "delete"):
        command = main.commands[name]
        (table,) = [p for p in command.params if p.name == "table"]
        assert isinstance(table, click.Option) and not table.multiple, name


# -- the config run builds ---------------------------------------------------------------


def config_of(args: list[str], env: dict[str, str] | None = None) -> Any:
    """The MemberConfig ``run`` builds from ``args`` (its parameters parsed by
    click, nothing opened)."""
    for key, value in (env or {}).items():
        os.environ[key] = value
    try:
        ctx = cli.run.make_context("run", list(args))
    finally:
        for key in env or {}:
            del os.environ[key]
    return run_config(ctx.params)


def base(*tables: str) -> list[str]:
    out = ["--group", "g", "--warehouse", "/data/wh", "--handler", HANDLER]
    for table in tables:
        out += ["--table", table]
    return out


def test_one_plain_name_is_the_single_table_group() -> None:
    cfg = config_of(base("shop.orders"))
    assert cfg.single_table and (cfg.table, cfg.tables) == ("shop.orders", ())
    assert config_of(base("shop.orders", "shop.orders")).single_table
    env = config_of(base(), {"PAIMON_GROUP_TABLE": "shop.orders"})
    assert env.single_table and env.table == "shop.orders"


def test_several_tables_and_patterns_reach_the_member_config() -> None:
    cfg = config_of([*base("shop.orders", "eu_*.events", "shop.items"),
                     "--tables-refresh-s", "5"])
    assert not cfg.single_table
    assert (cfg.table, cfg.tables) == ("shop.orders", ("eu_*.events", "shop.items"))
    assert cfg.subscription == TableSubscription(("shop.orders", "shop.items"),
                                                 ("eu_*.events",))
    assert cfg.tables_refresh_s == 5.0
    pattern = config_of(base("shop.*"))
    assert not pattern.single_table and pattern.subscription.patterns == ("shop.*",)
    assert config_of(base("shop.orders")).tables_refresh_s == 30.0


def test_the_environment_and_a_config_file_give_several(tmp_path: Path) -> None:
    env = config_of(base(), {"PAIMON_GROUP_TABLE": "shop.orders ops.*",
                             "PAIMON_GROUP_TABLES_REFRESH_S": "7.5"})
    assert env.subscription == TableSubscription(("shop.orders",), ("ops.*",))
    assert env.tables_refresh_s == 7.5
    for text, expected in (('"shop.orders"', TableSubscription(("shop.orders",), ())),
                           ('["shop.orders", "ops.*"]',
                            TableSubscription(("shop.orders",), ("ops.*",)))):
        path = tmp_path / "member.toml"
        path.write_text(f"table = {text}\ntables-refresh-s = 12\n")
        cfg = config_of(["--config", str(path), *base()])
        assert cfg.subscription == expected and cfg.tables_refresh_s == 12.0
    yaml_path = tmp_path / "member.yaml"
    yaml_path.write_text(json.dumps({"table": ["shop.a", "shop.b"]}))
    assert config_of(["--config", str(yaml_path), *base()]).tables == ("shop.b",)


def test_run_passes_no_table_for_several_and_the_opened_one_for_one(
        warehouse: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real ``run`` callback up to the runner (replaced): a group of
    several tables is checked from the catalog and starts with no table
    opened (the member lists them); one table is opened once, as before."""
    started: list[tuple[Any, Any]] = []

    def fake_runner(config: Any, handler: Any, *, metrics_port: int | None = None,
                    progress_interval_s: float | None = None, table: Any = None) -> None:
        started.append((config, table))

    import paimon_group.process.runner

    monkeypatch.setattr(paimon_group.process.runner, "run_until_signalled", fake_runner)
    monkeypatch.setattr(preflight, "probe_coordinator", lambda *args: None)
    monkeypatch.setattr(cli, "setup_logging", lambda fmt, level: None)
    checked: list[Any] = []
    real_check = preflight.check_tables
    monkeypatch.setattr(preflight, "check_tables", lambda *a, **kw: checked.append(
        real_check(*a, **kw)))
    coordinator = ["--coordinator", f"sqlite://{tmp_path}/c.sqlite"]
    for tables in (("shop.*",), ("shop.orders", "shop.items"), ("shop.orders",)):
        result = CliRunner().invoke(main, [*run_args(warehouse, *tables), *coordinator,
                                           "--columns", "id,v"], catch_exceptions=False)
        assert result.exit_code == 0, result.output
    (cfg1, none1), (cfg2, none2), (single, table) = started
    assert none1 is None and none2 is None and not cfg1.single_table
    assert cfg2.subscription.plain_names == ("shop.orders", "shop.items")
    assert [listing.names for listing in checked] == [("shop.items", "shop.orders")] * 2
    assert single.single_table and isinstance(table, ShardedTable)
    assert table.identifier == "shop.orders"


def test_check_tables_lists_the_subscription_once(warehouse: Path) -> None:
    listing = preflight.check_tables(str(warehouse), TableSubscription.parse(
        ["shop.orders", "shop.*"]), {}, ("id", "payload"))
    assert listing.names == ("shop.items", "shop.orders") and listing.missing == ()
